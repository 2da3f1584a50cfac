"""Aggregate decode tokens/s of the batch engine on the real model, by batch size: dense, the `auto`
sparsity plan with the measured break-even (`SparseRuns()`: sparse while the batch's active lists and
their union are sparse enough, else dense), and the same plan forced sparse in every run. All
engines alternate in one process; ratios are medians of per-round ratios to dense.

  python bench/batch_decode.py --rounds 3          # -> bench/results/serving/batch_decode.{json,md}
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "serving"
BATCHES = (1, 2, 4, 8, 16)
BLOCK = 16


def make_engines(threads: int, configs: list[str]) -> tuple[object, dict]:
    import pyinfer
    from pyinfer.runtime.sparse_ffn import SparseRuns
    from pyinfer.serve.batch_engine import BatchEngine
    from pyinfer.sparsity.resolve import resolve_sparsity

    m = pyinfer.load(None, n_threads=threads, n_ctx=16)
    plan = resolve_sparsity("auto", m.gguf, m.config, m.tokenizer.encode, None, threads, progress=False)
    settings = {"dense": (None, SparseRuns()), "auto": (plan, SparseRuns()),
                "forced sparse": (plan, SparseRuns.every_token(16))}
    engines = {c: BatchEngine(m.session.parts(n_threads=threads, sparsity=settings[c][0]), 16 * max(BATCHES), BLOCK,
                              256, runs=settings[c][1]) for c in configs}
    engines["_plan"] = plan
    return m, engines


def check_engines(m, engines: dict) -> None:
    """Once, before timing: every engine's logits for two sequences (one run) equal the single-sequence model's:
    dense for `dense` and `auto` (a batch of prompts takes the dense path), every token sparse for `forced sparse`."""
    import numpy as np

    import pyinfer
    from pyinfer.serve.batch_engine import SeqWork

    plan = engines.pop("_plan")
    prompts = [m.tokenize("Once upon a time, in a small village,"), m.tokenize("The capital of France is")]
    sparse_ref = pyinfer.Model(m.path, n_threads=m.n_threads, n_ctx=64, sparsity=plan, emulate_prefill=True)
    for name, be in engines.items():
        ref = sparse_ref if name == "forced sparse" else m
        got = be.step([SeqWork(i, p, 0, list(range(i * BLOCK, i * BLOCK + BLOCK))) for i, p in enumerate(prompts)])
        for i, p in enumerate(prompts):
            want = ref.eval(p)
            err = float(np.abs(got[i] - want).max() / np.abs(want).max())
            if err > 1e-3 or int(got[i].argmax()) != int(want.argmax()):
                raise AssertionError(f"{name}: batch logits of sequence {i} differ from the model's ({err:.3g})")


def decode_rate(m, be, bsz: int, steps: int) -> tuple[float, float]:
    """(tokens/s over `steps` decode steps of `bsz` sequences, share of FFN layers run sparse)."""
    from pyinfer.serve.batch_engine import SeqWork

    tables = [list(range(i * BLOCK, i * BLOCK + BLOCK)) for i in range(bsz)]
    prompt = m.tokenize("Once upon a time, in a small village,")
    be.step([SeqWork(i, prompt, 0, tables[i]) for i in range(bsz)])
    sparse = 0.0
    t0 = time.perf_counter()
    for k in range(steps):
        be.step([SeqWork(i, [42 + k + i], len(prompt) + k, tables[i]) for i in range(bsz)])
        sparse += be.sparse_layers()
    return bsz * steps / (time.perf_counter() - t0), sparse / steps


def batch_throughput(threads: int, steps: int = 48) -> dict[int, float]:
    """Dense aggregate decode tokens/s at batch 1, 4, 8, 16 (used by serve_load.py)."""
    m, engines = make_engines(threads, ["dense"])
    check_engines(m, engines)
    return {b: decode_rate(m, engines["dense"], b, steps)[0] for b in (1, 4, 8, 16)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    configs = ["dense", "auto", "forced sparse"]
    m, engines = make_engines(args.threads, configs)
    check_engines(m, engines)
    rates = {(c, b): [] for c in configs for b in BATCHES}
    sparse_share = {}
    for r in range(args.rounds):
        for b in BATCHES:
            for c in configs:  # alternate engines within each batch size and round
                tps, share = decode_rate(m, engines[c], b, args.steps)
                rates[(c, b)].append(tps)
                sparse_share[(c, b)] = share
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = []
    for b in BATCHES:
        dense = rates[("dense", b)]
        for c in configs:
            ratio = statistics.median(x / d for x, d in zip(rates[(c, b)], dense))
            rows.append(dict(config=c, batch=b, tokens_per_s=statistics.median(rates[(c, b)]), vs_dense=ratio,
                             sparse_layer_share=sparse_share[(c, b)]))
    meta = dict(threads=args.threads, rounds=args.rounds, steps=args.steps, machine=platform.processor() or platform.machine(),
                date=time.strftime("%Y-%m-%d"), model="SmolLM2-135M-Instruct Q4_1", plan="auto (threshold 40%)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "batch_decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Batched decode on the real model ({args.threads} threads, median of {args.rounds} rounds, "
             f"{args.steps} steps each)", "",
             "`auto`: the auto plan with the break-even of `SparseRuns()`; `forced sparse`: the same plan sparse "
             "in every run. sparse layers: share of FFN layer-runs that took the sparse path.", "",
             "| batch | config | tokens/s | vs dense | sparse layers |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['config']} | {r['tokens_per_s']:.1f} | {r['vs_dense']:.3f} | "
              f"{r['sparse_layer_share']:.2f} |" for r in rows]
    (RESULTS / "batch_decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
