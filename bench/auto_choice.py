"""`--sparsity auto` never decodes slower than dense (issue 28): on SmolLM2-135M, Gemma 3 270M and
Qwen2.5-Coder-0.5B (where installed), what `auto` chose on this machine (its own timing of the threshold plan, its
gate-first candidate, the input-sparse plan within the quality bound (issue 51) and dense, made
once on first load and cached with the plan; where the whole threshold plan loses, each layer's FFN timed sparse
and dense and a mix of the layers where sparse pays), then decode of the model as `auto` loads it, of each candidate
plan, and of `--sparsity off`: steps interleaved in rounds with the order flipped, each engine's speed from the
20th percentile of its step times (auto_choice.interleaved_tok_s: on a shared machine whole-run totals of two
identical engines differ by up to 28%), each ratio to off as the median of comparisons and the lowest; and
the perplexity of each candidate's sparse path against dense on WikiText-2 (what a user pays where it is kept),
beside the held-out calibration-text change `auto` judged it by.

    python bench/auto_choice.py --rounds 3 --tokens 128 --ppl-windows 8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "sparsity"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def models() -> list[tuple[str, str]]:
    from pyinfer.model.pull import installed_default_model, installed_gemma_model, installed_qwen_coder_model

    out = [("SmolLM2-135M Q4_1", installed_default_model()), ("Gemma 3 270M Q4_K_M", installed_gemma_model()),
           ("Qwen2.5-Coder-0.5B Q8_0", installed_qwen_coder_model())]
    return [(n, str(p)) for n, p in out if p]


def plot_layer_ratios(rows: list[dict], path: Path) -> bool:
    """Per model, each layer's dense-over-sparse FFN time (above the bar: tried sparse in a mix)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from pyinfer.sparsity.auto_choice import LAYER_KEEP_AT

    rows = [r for r in rows if r.get("layer_ratios")]
    if not rows:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 3.6), squeeze=False)
    for ax, r in zip(axes[0], rows):
        lr = r["layer_ratios"]
        ax.bar(range(len(lr)), lr, color=["tab:green" if x >= LAYER_KEEP_AT else "tab:gray" for x in lr])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(LAYER_KEEP_AT, color="tab:green", lw=0.8, ls="--", label=f"tried sparse at {LAYER_KEEP_AT}x")
        ax.set_title(f"{r['model']}: auto chose {r['chose']}", fontsize=10)
        ax.set_ylim(0, max(1.15, max(lr) + 0.05))
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("layer")
        ax.set_ylabel("dense FFN time / sparse FFN time")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ppl-windows", type=int, default=8, help="WikiText-2 windows of 512 tokens (0: skip)")
    ap.add_argument("--tag", default="auto_choice")
    args = ap.parse_args()
    found = models()  # from the cache the models were pulled into, before it moves
    os.environ["PYINFER_CACHE"] = tempfile.mkdtemp(prefix="pyinfer-auto-")  # calibrated and timed afresh
    import numpy as np

    import pyinfer
    from pyinfer.runtime.sparse_ffn import SparseRuns
    from pyinfer.sparsity.auto_choice import LAYER_KEEP_AT, interleaved_tok_s, machine_key
    from pyinfer.sparsity.input_choice import input_plan_path
    from pyinfer.sparsity.resolve import AUTO_TARGET, auto_plan_path, gate_candidate_path
    from pyinfer.tools.perplexity import perplexity

    text = (DATA / "wikitext-2-raw-test.txt").read_text() if args.ppl_windows else ""
    rows = []
    for name, path in found:
        auto = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity="auto", progress=True)
        choice = auto.session.auto_choice
        dense = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity="off", progress=False)
        assert auto.generate("Once upon a time", max_tokens=8, temperature=0) and choice is not None
        plan_path = auto_plan_path(dense.gguf.fingerprint(), AUTO_TARGET)
        plans = {"threshold": str(plan_path), "gate": str(gate_candidate_path(plan_path)),
                 "input": str(input_plan_path(dense.gguf.fingerprint(), auto.options.sparsity_quality))}
        if "input_tok_s" not in choice:  # not a candidate (nothing within the bound): not timed here either
            plans.pop("input")
        plans = {k: p for k, p in plans.items() if Path(p).is_file()}
        ids = np.asarray(auto.tokenize("Once upon a time, in a small village by the sea, " * 20)[:16 + args.tokens],
                         np.int32)
        engines = {"auto": auto.session.build(16 + args.tokens, 16, SparseRuns()),
                   "off": dense.session.build(16 + args.tokens, 16, SparseRuns())}
        for k, p in plans.items():  # each candidate as a plan file: kept whatever auto chose
            engines[k] = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity=p,
                                      progress=False).session.build(16 + args.tokens, 16, SparseRuns())
        rates: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(args.rounds):  # each a comparison of its own: the spread across them is the figure's
            r = interleaved_tok_s(engines, ids, 16, args.tokens // 4, 4)
            for k in rates:
                rates[k].append(r[k])
        row = {"model": name, "chose": choice["chose"], "timed_sparse_tok_s": choice["sparse_tok_s"],
               "timed_dense_tok_s": choice["dense_tok_s"], "timed_ratio": choice["ratio"],
               "timed_gate_tok_s": choice.get("gate_tok_s"), "timed_gate_ratio": choice.get("gate_ratio"),
               "layer_ratios": choice.get("layer_ratios"), "sparse_layers": choice.get("sparse_layers"),
               "timed_layers_ratio": choice.get("layers_ratio"), "timed_input_tok_s": choice.get("input_tok_s"),
               "timed_input_ratio": choice.get("input_ratio"), "input_levels": choice.get("input_levels"),
               "heldout_changes": (choice.get("quality") or {}).get("changes"),
               "off_tok_s": statistics.median(rates["off"]), "rates": rates}
        for k in rates:
            if k != "off":
                ratios = [a / o for a, o in zip(rates[k], rates["off"])]
                row.update({f"{k}_tok_s": statistics.median(rates[k]), f"{k}_vs_off": statistics.median(ratios),
                            f"{k}_vs_off_lowest": min(ratios)})
        if args.ppl_windows:
            p_dense = perplexity(dense, text, 512, args.ppl_windows, progress=False).perplexity
            row.update(ppl_dense=p_dense)
            for k, p in plans.items():  # the plan itself, every token through the sparse path
                m = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity=p, emulate_prefill=True,
                                 progress=False)
                pk = perplexity(m, text, 512, args.ppl_windows, progress=False).perplexity
                row.update({f"ppl_{k}": pk, f"ppl_{k}_delta": pk / p_dense - 1})
            if choice["chose"] == "layers":  # the mix auto keeps, every token through its sparse layers
                m = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity=auto.sparsity,
                                 emulate_prefill=True, progress=False)
                row["ppl_as_loaded"] = perplexity(m, text, 512, args.ppl_windows, progress=False).perplexity
            else:
                row["ppl_as_loaded"] = row.get({"sparse": "ppl_threshold", "gate": "ppl_gate",
                                                 "input": "ppl_input"}.get(
                    choice["chose"], ""), p_dense)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "rates"}), file=sys.stderr)
    meta = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds, "ppl_windows": args.ppl_windows,
            "machine": rows and machine_key(args.threads),
            "date": time.strftime("%Y-%m-%d")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# `--sparsity auto` against dense decode ({meta['machine']})", "",
             "`auto`'s own timing at first load (2 measurements of 6 interleaved rounds of 24 steps, 20th percentile "
             "of step times; the plans' lowest ratio to dense decides), "
             f"then the model as `auto` loaded it and each candidate plan against `--sparsity off`: {args.rounds} "
             f"comparisons, each 4 interleaved rounds of {args.tokens // 4} steps per engine, 20th percentile of step "
             "times; median ratio and the lowest. Threshold: |act(gate) * up| cut at 40% (gate and up dense, down "
             "sparse); gate-first: the same plan behind a |act(gate)| cut that keeps 96% of its neurons (gate dense, up "
             "and down read only where the cut passes); input: the deepest cut of down's input within the +3% "
             "held-out bound (its level in the last column). `auto` keeps no plan past that bound. Perplexity: "
             f"WikiText-2, {args.ppl_windows} windows of 512, each plan's sparse path against dense.", "",
             "| model | auto chose | its timing: threshold / gate-first / input / dense tok/s | auto / off (lowest) | "
             "threshold / off (lowest) | gate-first / off (lowest) | input / off (lowest) | held-out change: "
             "threshold / gate-first / input | WikiText-2 ΔPPL: threshold / gate-first / input | PPL as loaded | "
             "input cut |", "|---|---|---|---|---|---|---|---|---|---|---|"]

    def vs(r, k):
        return f"{r[k + '_vs_off']:.3f}x ({r[k + '_vs_off_lowest']:.3f})" if k + "_vs_off" in r else "-"

    for r in rows:
        gate = f"{r['timed_gate_tok_s']:.1f}" if r.get("timed_gate_tok_s") else "-"
        inp = f"{r['timed_input_tok_s']:.1f}" if r.get("timed_input_tok_s") else "-"
        d = " / ".join(f"{r[f'ppl_{k}_delta']:+.2%}" if f"ppl_{k}_delta" in r else "-"
                       for k in ("threshold", "gate", "input"))
        h = r.get("heldout_changes") or {}
        held = " / ".join(f"{h[k]:+.2%}" if k in h else "-" for k in ("sparse", "gate", "input"))
        loaded = f"{r['ppl_as_loaded']:.3f}" if "ppl_as_loaded" in r else "-"
        cut = ", ".join(f"{k} {v:.0%}" for k, v in (r.get("input_levels") or {}).items()) or "-"
        lines.append(f"| {r['model']} | {r['chose']} | {r['timed_sparse_tok_s']:.1f} / {gate} / {inp} / "
                     f"{r['timed_dense_tok_s']:.1f} | {vs(r, 'auto')} | {vs(r, 'threshold')} | {vs(r, 'gate')} | "
                     f"{vs(r, 'input')} | {held} | {d} | {loaded} | {cut} |")
    lines += ["", "Per layer (timed where the whole threshold plan lost): each layer's dense FFN time over its sparse "
              "FFN time on the same decode steps (node timing, 4 alternating rounds, median; above "
              f"{LAYER_KEEP_AT} the layer is tried sparse "
              "in a mix).", ""]
    for r in rows:
        lr = r.get("layer_ratios")
        if lr:
            lines.append(f"- {r['model']}: lowest {min(lr):.2f}, median {statistics.median(lr):.2f}, highest "
                         f"{max(lr):.2f} over {len(lr)} layers; tried sparse: {r.get('sparse_layers') or 'none'}"
                         + (f" (mix timed at {r['timed_layers_ratio']:.3f}x dense)" if r.get("timed_layers_ratio")
                            else ""))
        else:
            lines.append(f"- {r['model']}: not timed per layer (the whole plan cleared the bar)")
    if plot_layer_ratios(rows, RESULTS / f"{args.tag}_layers.png"):
        lines += ["", f"![per-layer FFN time, dense over sparse]({args.tag}_layers.png)"]
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
