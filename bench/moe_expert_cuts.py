"""Decode speed of a Mixture of Experts with cuts inside its experts (CATS per expert: up read only for the neurons
whose |act(gate)| passes their expert's calibrated cut) against the experts run whole, in RAM, side by side in
one process: every config is loaded once (the same file mapping), configs alternate within every round (the
order flips each round), and each figure is the median of per-round ratios to `off`.

Default model: bench/moe_synthetic.py's Qwen3-30B-A3B-shaped file (its gate and up compute on random weights,
its down adds exact zeros, so every config must decode the same tokens: checked once before timing). Random
weights: speeds and bytes, never quality; the quality of the cuts is tests/test_moe.py's (the reference forward).

  python bench/moe_expert_cuts.py --targets 0.3 0.5 0.7 --rounds 5 --tokens 64   # -> bench/results/moe/moe_expert_cuts.*
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import pyinfer  # noqa: E402
from compare_llamacpp import pyinfer_decode  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "moe"
PROMPT = "Once upon a time"


def expert_bytes_per_token(m, density: float) -> float:
    """Bytes of expert weights one decode token reads: gate and down whole, up for the `density` share of each
    chosen expert's neurons, over every layer."""
    from pyinfer.offload.experts import expert_names

    g = m.session.gguf
    cfg = m.config
    parts = [g.tensor(n).data.nbytes / cfg.n_expert for n in expert_names(0)]  # gate, up, down of one expert
    return cfg.n_layers * cfg.n_expert_used * (parts[0] + density * parts[1] + parts[2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="/tmp/pyinfer-moe/qwen3moe-30b-a3b-shape-q4_0.gguf")
    ap.add_argument("--targets", nargs="+", type=float, default=[0.3, 0.5, 0.7],
                    help="shares of each chosen expert's neurons cut in decode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64, help="greedy decode steps per measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="moe_expert_cuts")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()
    if "PYINFER_CACHE" not in os.environ and args.model.startswith("/tmp/pyinfer-moe/"):
        os.environ["PYINFER_CACHE"] = "/tmp/pyinfer-moe/cache"  # moe_synthetic.py's routing profile and cuts

    names = ["off"] + [f"cut {t:.0%}" for t in args.targets]
    models = {"off": pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, progress=False)}
    for t, name in zip(args.targets, names[1:]):
        models[name] = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, sparsity="auto", target=t)
    prompt = models["off"].tokenize(PROMPT)

    # Once, before timing: the synthetic model's experts add zeros, so every config decodes the same tokens
    # (another model's cuts change its answer; then only the prefill, dense in every config, is compared).
    _, want = pyinfer_decode(models["off"], prompt, 8)
    synthetic = "shape" in Path(args.model).name
    for name, m in models.items():
        _, got = pyinfer_decode(m, prompt, 8)
        if synthetic:
            assert got == want, f"{name} decodes other tokens than off on the synthetic model"
        d = models["off"].forward(prompt, 0, np.array([len(prompt) - 1]))[0]
        a = m.forward(prompt, 0, np.array([len(prompt) - 1]))[0]
        np.testing.assert_allclose(a, d, rtol=1e-4, atol=1e-4 * float(np.abs(d).max()))

    tok_s: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            seconds, _ = pyinfer_decode(models[name], prompt, args.tokens)
            tok_s[name].append(args.tokens / seconds)
        print(f"round {r + 1}: " + ", ".join(f"{n} {tok_s[n][-1]:.2f}" for n in names) + " tok/s", file=sys.stderr)

    rows = []
    for t, name in zip([0.0] + args.targets, names):
        ratios = [a / b for a, b in zip(tok_s[name], tok_s["off"])]
        cuts = models[name].session.expert_cuts
        rows.append({"config": name, "target": t, "tok_s": statistics.median(tok_s[name]),
                     "tok_s_low": min(tok_s[name]), "tok_s_high": max(tok_s[name]),
                     "ratio": statistics.median(ratios), "ratio_low": min(ratios), "ratio_high": max(ratios),
                     "expert_mb_per_token": expert_bytes_per_token(models[name], 1.0 - t) / 1e6,
                     "cuts": cuts.summary() if cuts is not None else None, "runs": tok_s[name]})
    meta = {"model": Path(args.model).name, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
            "machine": platform.processor() or platform.machine(), "isa": pyinfer._core.available_isas()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Cuts inside the experts: {Path(args.model).name}, in RAM", "",
             f"{args.threads} threads, {args.tokens} greedy decode tokens, {args.rounds} rounds alternating in one "
             "process, medians (lowest-highest); ratio = median of per-round ratios to `off`. `expert MB/token`: "
             "the bytes of expert weights a decode token reads (gate and down whole, up for the share of neurons "
             "kept, at the target's density).", "",
             "| config | decode tok/s | / off | expert MB/token |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['tok_s']:.2f} ({r['tok_s_low']:.2f}-{r['tok_s_high']:.2f}) | "
                     f"{r['ratio']:.3f}x ({r['ratio_low']:.3f}-{r['ratio_high']:.3f}) | "
                     f"{r['expert_mb_per_token']:.0f} |")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps({"meta": meta, "rows": rows}) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
