"""Would a co-activation order of the bundle file cut what the neuron store reads? (issue 11's cluster order)

The bundle file keeps each layer's neurons in the sparsity plan's hot-first order. LLM in a flash and
PowerInfer-2 suggest placing neurons that fire together next to each other so one read fetches several. This
script measures what that would buy on the real model before the store is taught a second order:

1. records the predictor's active union per layer for every token of a teacher-forced pass over calibration
   text (pride-and-prejudice) and, separately, over evaluation text (WikiText-2);
2. orders each layer's cold tail (the neurons past the budget's resident prefix) from the calibration unions:
   a greedy chain (start at the most frequent neuron, append the one that fired most often with the last two)
   or a spectral order (Fiedler vector of the normalized co-firing graph), over the whole tail or in bands of
   512 ranks (which keeps the order close to hot-first, as the resident prefix and read-ahead window want);
3. replays the evaluation unions through the store's read merging (offload/trace_replay.py) for each order,
   and for each merge gap, and reports bytes and requests per token against the bytes the fired neurons need.

It needs a plan with predictors (the auto plan of SmolLM2 has none, so nothing is read by list):
    pyinfer profile -f ../shared/data/pride-and-prejudice.txt -o smol.profile.npz
    pyinfer train-predictors --profile smol.profile.npz -f ../shared/data/tinyshakespeare.txt -o smol.pred.npz
    python bench/cluster_order.py --sparsity smol.pred.npz [--cal-tokens 400] [--eval-tokens 200]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "sparsity"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def teacher_unions(model, text: str, n: int) -> list[list[np.ndarray]]:
    """Per token, per layer: the active union (hot-first ids) of a one-token-at-a-time pass over `text`."""
    from pyinfer.runtime.running import last_unions

    ids = model.tokenize(text)[:n]
    out = []
    with model._lock:
        for pos, tok in enumerate(ids):
            model.forward([tok], pos, np.array([0]))
            out.append(last_unions(model))
    return out


def cofiring(trace, il: int, n_ff: int) -> tuple[np.ndarray, np.ndarray]:
    """(C [n_ff, n_ff] co-firing counts, freq [n_ff]) of layer il over the trace."""
    a = np.zeros((len(trace), n_ff), np.float32)
    for t, step in enumerate(trace):
        a[t, step[il]] = 1
    return a.T @ a, a.sum(0)


def greedy_chain(c: np.ndarray, freq: np.ndarray, idx: np.ndarray) -> list[int]:
    left = set(idx.tolist())
    cur = int(idx[np.argmax(freq[idx])])
    order: list[int] = []
    while left:
        order.append(cur)
        left.discard(cur)
        if not left:
            break
        cand = np.fromiter(left, int)
        score = c[cur, cand] + (0.5 * c[order[-2], cand] if len(order) > 1 else 0) + 1e-3 * freq[cand]
        cur = int(cand[np.argmax(score)])
    return order


def spectral(c: np.ndarray, freq: np.ndarray, idx: np.ndarray) -> list[int]:
    s = c[np.ix_(idx, idx)]
    d = np.sqrt(np.maximum(np.diag(s), 1))
    s = s / d[:, None] / d[None, :]
    _, v = np.linalg.eigh(np.diag(s.sum(1)) - s)
    return idx[np.argsort(v[:, 1], kind="stable")].tolist()


def file_slots(cal, layout, resident, method, band) -> list[np.ndarray]:
    """Per layer: slot_of[k], the file position of hot-first neuron k under the co-activation order."""
    slots = []
    for il, e in enumerate(layout.layers):
        n, r = e["n_ff"], resident[il]
        c, freq = cofiring(cal, il, n)
        order = list(range(r))
        step = band or max(n - r, 1)
        for s in range(r, n, step):
            order += method(c, freq, np.arange(s, min(s + step, n)))
        slot = np.empty(n, np.int64)
        slot[np.array(order, dtype=np.int64)] = np.arange(n)
        slots.append(slot)
    return slots


def replay_reads(trace, layout, resident, slots, gap: int) -> dict:
    """Bytes and requests per token the store's merged listed reads take for the trace's cold neurons."""
    from pyinfer.offload.trace_replay import merged_ranges

    nbytes = reqs = need = 0
    for step in trace[1:]:
        for il, ids in enumerate(step):
            e = layout.layers[il]
            cold = ids[ids >= resident[il]]
            if len(cold) == 0:
                continue
            offs = sorted(e["file_offset"] + int(slots[il][k]) * e["bundle_bytes"] for k in cold)
            b, q = merged_ranges(offs, e["bundle_bytes"], gap=gap)
            nbytes, reqs, need = nbytes + b, reqs + q, need + len(cold) * e["bundle_bytes"]
    n = max(len(trace) - 1, 1)
    return {"read_mb_per_token": nbytes / n / 1e6, "reads_per_token": reqs / n, "needed_mb_per_token": need / n / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparsity", default="auto", help="sparsity plan with predictors (default: auto)")
    ap.add_argument("--ffn-share", type=float, default=0.5, help="share of the FFN bytes in the RAM budget")
    ap.add_argument("--cal-tokens", type=int, default=400)
    ap.add_argument("--eval-tokens", type=int, default=200)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    import pyinfer
    from pyinfer.offload.offloaded_ffn import minimum_budget

    probe = pyinfer.load(None, n_threads=2, sparsity=args.sparsity, ram_budget="64G", progress=False)
    layout = probe.offload.layout
    if not any(probe.offload.selective(il) for il in range(probe.config.n_layers)):
        print("the sparsity plan has no predictor layers: nothing is read by list", file=sys.stderr)
        return 1
    ffn = sum(e["n_ff"] * e["bundle_bytes"] for e in layout.layers)
    budget = minimum_budget(probe.gguf, probe.sparsity, layout) + int(args.ffn_share * ffn)
    del probe
    model = pyinfer.load(None, n_threads=2, sparsity=args.sparsity, ram_budget=budget, progress=False)
    resident = model.offload.plan.resident
    t0 = time.perf_counter()
    cal = teacher_unions(model, (DATA / "pride-and-prejudice.txt").read_text()[20000:60000], args.cal_tokens)
    ev = teacher_unions(model, (DATA / "wikitext-2-raw-test.txt").read_text()[:40000], args.eval_tokens)
    hot_first = [np.arange(e["n_ff"]) for e in layout.layers]
    rows = [{"order": "hot-first (shipped)", "merge_gap": gap, **replay_reads(ev, layout, resident, hot_first, gap)}
            for gap in (8192, 0, 32768)]
    for method in (greedy_chain, spectral):
        for band in (512, 0):
            slots = file_slots(cal, layout, resident, method, band)
            rows.append({"order": f"{method.__name__}, {'bands of 512' if band else 'whole tail'}", "merge_gap": 8192,
                         **replay_reads(ev, layout, resident, slots, 8192)})
    base = rows[0]
    for r in rows:
        r["bytes_vs_hot_first"] = r["read_mb_per_token"] / base["read_mb_per_token"]
        r["reads_vs_hot_first"] = r["reads_per_token"] / base["reads_per_token"]
    meta = {"model": Path(model.path).name, "sparsity": args.sparsity, "budget": budget, "ffn_share": args.ffn_share,
            "cal_tokens": len(cal), "eval_tokens": len(ev), "seconds": round(time.perf_counter() - t0, 1),
            "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d")}
    lines = [f"# Bundle order: co-activation vs hot-first ({meta['model']}, budget {budget / 2**20:.1f} MiB = "
             f"minimum + {args.ffn_share:.0%} of FFN bytes)", "",
             f"Orders learned from {len(cal)} tokens of pride-and-prejudice; replayed on {len(ev)} tokens of "
             "WikiText-2. Needed: the fired cold neurons' bundle bytes (no order reads less).", "",
             "| order | merge gap KiB | MB read / token | reads / token | needed MB / token | bytes vs shipped | "
             "reads vs shipped |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['order']} | {r['merge_gap'] // 1024} | {r['read_mb_per_token']:.2f} | {r['reads_per_token']:.1f} "
              f"| {r['needed_mb_per_token']:.2f} | {r['bytes_vs_hot_first']:.3f} | {r['reads_vs_hot_first']:.3f} |"
              for r in rows]
    print("\n".join(lines))
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "cluster_order.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (RESULTS / "cluster_order.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
