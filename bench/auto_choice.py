"""`--sparsity auto` never decodes slower than dense (issue 28): on SmolLM2-135M and Gemma 3 270M, what `auto`
chose on this machine (its own timing, made once on first load and cached with the plan), then decode of the
model as `auto` loads it against `--sparsity off`: steps of the two interleaved in rounds with the order flipped,
each engine's speed from the 20th percentile of its step times (auto_choice.interleaved_tok_s: on a shared
machine whole-run totals of two identical engines differ by up to 28%), the ratio per round's median and its
lowest; and the perplexity of the calibrated plan's sparse path against dense on WikiText-2 (what a user
would pay had it been kept).

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

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def models() -> list[tuple[str, str]]:
    from pyinfer.model.pull import installed_default_model, installed_gemma_model

    out = [("SmolLM2-135M Q4_1", installed_default_model()), ("Gemma 3 270M Q4_K_M", installed_gemma_model())]
    return [(n, str(p)) for n, p in out if p]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ppl-windows", type=int, default=8, help="WikiText-2 windows of 512 tokens (0: skip)")
    ap.add_argument("--tag", default="auto_choice")
    args = ap.parse_args()
    os.environ["PYINFER_CACHE"] = tempfile.mkdtemp(prefix="pyinfer-auto-")  # calibrated and timed afresh
    import numpy as np

    import pyinfer
    from pyinfer.runtime.sparse_ffn import SparseRuns
    from pyinfer.sparsity.auto_choice import interleaved_tok_s
    from pyinfer.tools.perplexity import perplexity

    text = (DATA / "wikitext-2-raw-test.txt").read_text() if args.ppl_windows else ""
    rows = []
    for name, path in models():
        auto = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity="auto", progress=True)
        choice = auto.session.auto_choice
        dense = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity="off", progress=False)
        assert auto.generate("Once upon a time", max_tokens=8, temperature=0) and choice is not None
        ids = np.asarray(auto.tokenize("Once upon a time, in a small village by the sea, " * 20)[:16 + args.tokens],
                         np.int32)
        engines = {"auto": auto.session.build(16 + args.tokens, 16, SparseRuns()),
                   "off": dense.session.build(16 + args.tokens, 16, SparseRuns())}
        rates: dict[str, list[float]] = {"auto": [], "off": []}
        for _ in range(args.rounds):  # each a comparison of its own: the spread across them is the figure's
            r = interleaved_tok_s(engines, ids, 16, args.tokens // 4, 4)
            for k in rates:
                rates[k].append(r[k])
        ratios = [a / o for a, o in zip(rates["auto"], rates["off"])]
        row = {"model": name, "chose": choice["chose"], "timed_sparse_tok_s": choice["sparse_tok_s"],
               "timed_dense_tok_s": choice["dense_tok_s"], "timed_ratio": choice["ratio"],
               "auto_tok_s": statistics.median(rates["auto"]), "off_tok_s": statistics.median(rates["off"]),
               "auto_vs_off": statistics.median(ratios), "auto_vs_off_lowest": min(ratios), "rates": rates}
        if args.ppl_windows:
            plan = pyinfer.load(path, n_threads=args.threads, n_ctx=1024, sparsity="auto", target=0.4,
                                emulate_prefill=True, progress=False)  # the plan itself, kept by the target
            p_sparse = perplexity(plan, text, 512, args.ppl_windows, progress=False).perplexity
            p_dense = perplexity(dense, text, 512, args.ppl_windows, progress=False).perplexity
            row.update(ppl_plan=p_sparse, ppl_dense=p_dense, ppl_delta=p_sparse / p_dense - 1,
                       ppl_as_loaded=p_sparse if choice["chose"] == "sparse" else p_dense)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "rates"}), file=sys.stderr)
    meta = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds, "ppl_windows": args.ppl_windows,
            "machine": rows and __import__("pyinfer.sparsity.auto_choice", fromlist=["x"]).machine_key(args.threads),
            "date": time.strftime("%Y-%m-%d")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# `--sparsity auto` against dense decode ({meta['machine']})", "",
             "`auto`'s own timing at first load (6 interleaved rounds of 24 steps, 20th percentile of step times), "
             f"then the model as `auto` loaded it against `--sparsity off`: {args.rounds} comparisons, each 4 "
             f"interleaved rounds of {args.tokens // 4} steps per engine, 20th percentile of step times; median "
             "ratio and the lowest. Perplexity: WikiText-2, "
             f"{args.ppl_windows} windows of 512, the calibrated plan's sparse path against dense.", "",
             "| model | auto chose | its timing: sparse / dense tok/s | auto / off decode (lowest) | "
             "plan's perplexity delta | perplexity as loaded |", "|---|---|---|---|---|---|"]
    for r in rows:
        ppl = (f"{r['ppl_delta']:+.2%}", f"{r['ppl_as_loaded']:.3f}") if "ppl_delta" in r else ("-", "-")
        lines.append(f"| {r['model']} | {r['chose']} | {r['timed_sparse_tok_s']:.1f} / {r['timed_dense_tok_s']:.1f} "
                     f"({r['timed_ratio']:.2f}x) | {r['auto_vs_off']:.3f}x ({r['auto_vs_off_lowest']:.3f}) | {ppl[0]} | "
                     f"{ppl[1]} |")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
