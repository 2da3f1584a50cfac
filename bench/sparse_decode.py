"""Single-sequence decode speed of the `auto` sparsity plan against dense, side by side in one process.

Configs alternate within every round (the order flips each round); the figure is the median of per-round
ratios to dense. Two controls separate sparsity from where the weights live:
  - `dense-anon`: the dense model with its weights copied into anonymous memory, as the sparse model's
    permuted gate/up and neuron-major down copies are (the dense model reads the memory-mapped file);
  - `--idle-models N`: N more models loaded and idle in the process, as bench/sparsity_curve.py has.

  python bench/sparse_decode.py --rounds 9 --tokens 128     # -> bench/results/sparsity/sparse_decode.{json,md}
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import pyinfer  # noqa: E402
from compare_llamacpp import pyinfer_decode  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "sparsity"
PROMPT = "Once upon a time"


def load_anonymous(path: str, threads: int):
    """The dense model with every weight copied out of the file mapping (anonymous pages: --no-mmap)."""
    return pyinfer.load(path, n_threads=threads, n_ctx=512, mmap=False)


def check(models: dict, prompt: list[int]) -> None:
    """Once, before timing: the dense configs decode the same tokens; auto's first step is close to dense."""
    _, want = pyinfer_decode(models["dense"], prompt, 8)
    _, anon = pyinfer_decode(models["dense-anon"], prompt, 8)
    assert anon == want, "dense-anon decodes other tokens than dense"
    d = models["dense"].forward(prompt, 0, np.array([len(prompt) - 1]))[0]
    a = models["auto"].forward(prompt, 0, np.array([len(prompt) - 1]))[0]  # prefill: dense in both
    np.testing.assert_allclose(a, d, rtol=1e-4, atol=1e-4 * float(np.abs(d).max()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=128, help="greedy decode steps per measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--idle-models", type=int, default=0, help="extra models loaded and left idle")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()

    path = str(pyinfer.model.pull.resolve_model(None))
    models = {"dense": pyinfer.load(path, n_threads=args.threads, n_ctx=512),
              "auto": pyinfer.load(path, n_threads=args.threads, n_ctx=512, sparsity="auto", progress=False),
              "dense-anon": load_anonymous(path, args.threads)}
    idle = [pyinfer.load(path, n_threads=args.threads, n_ctx=512, sparsity="auto", progress=False)
            for _ in range(args.idle_models)]
    prompt = models["dense"].tokenize(PROMPT)
    check(models, prompt)
    speeds = {k: [] for k in models}
    for r in range(args.rounds):
        for k in (list(models) if r % 2 == 0 else list(models)[::-1]):
            sec, _ = pyinfer_decode(models[k], prompt, args.tokens)
            speeds[k].append(args.tokens / sec)
    rows = [dict(config=k, decode_tok_s=statistics.median(v),
                 vs_dense=statistics.median(a / b for a, b in zip(v, speeds["dense"])),
                 per_round_vs_dense=[round(a / b, 4) for a, b in zip(v, speeds["dense"])]) for k, v in speeds.items()]
    meta = dict(threads=args.threads, rounds=args.rounds, tokens=args.tokens, idle_models=len(idle),
                machine=platform.processor() or platform.machine(), date=time.strftime("%Y-%m-%d"),
                model=Path(path).name, plan="auto (threshold 40%)")
    result = {"meta": meta, "rows": rows}
    suffix = f"_idle{len(idle)}" if idle else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"sparse_decode{suffix}.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Single-sequence decode, auto plan vs dense ({args.threads} threads, {args.rounds} rounds of "
             f"{args.tokens} tokens, {len(idle)} idle models)", "",
             "| config | decode tok/s | vs dense (median of rounds) | per round |", "|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['decode_tok_s']:.1f} | {r['vs_dense']:.3f} | "
              f"{min(r['per_round_vs_dense']):.3f}-{max(r['per_round_vs_dense']):.3f} |" for r in rows]
    (RESULTS / f"sparse_decode{suffix}.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
