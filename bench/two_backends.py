"""Two CPU backend instances, each with its own thread, compute the hot and cold halves of every FFN layer
at the same time (PowerInfer's hybrid executor, a CPU backend standing in for the GPU). Prints how much
of each layer's two halves overlapped in time, the speed against one backend with the same threads, and
draws the per-segment timeline. Results are checked equal to the single-backend run before timing.

  python bench/two_backends.py --layers 6 --d 2048 --ff 8192
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
RESULTS = Path(__file__).parent / "results" / "gpu"


def main() -> int:
    from test_engine_safety import ffn_halves_graph

    from pyinfer import _core

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--plot", default=str(RESULTS / "two_backends.png"))
    args = ap.parse_args()

    b1, out1, _, _ = ffn_halves_graph(False, args.layers, args.d, args.ff)
    one = _core.Engine(b1.graph, max_tokens=4, max_outputs=4, n_threads=2)
    b2, out2, hot, cold = ffn_halves_graph(True, args.layers, args.d, args.ff)
    two = _core.Engine(b2.graph, max_tokens=4, max_outputs=4, backend_threads=[1, 1], placement=b2.placement)
    one.run(4)
    two.run(4)
    assert np.array_equal(one.tensor(out1.id, 4), two.tensor(out2.id, 4)), "two backends differ from one"

    def timed(eng):
        t0 = time.perf_counter()
        eng.run(4)
        return time.perf_counter() - t0

    t_one, t_two = [], []
    for _ in range(args.runs):  # alternating
        t_one.append(timed(one))
        t_two.append(timed(two))
    two.set_timeline(True)
    two.run(4)
    spans = two.timeline()
    segs = two.segments()
    seg_of = {n: i for i, s in enumerate(segs) for n in s["nodes"]}
    shares = []
    for k in range(0, len(hot), 2):
        h, c = spans[seg_of[hot[k]]], spans[seg_of[cold[k]]]
        inter = max(0.0, min(h[3], c[3]) - max(h[2], c[2]))
        shares.append(inter / min(h[3] - h[2], c[3] - c[2]))
    result = {"layers": args.layers, "d": args.d, "ff": args.ff, "runs": args.runs,
              "one_backend_2_threads_ms": statistics.median(t_one) * 1e3,
              "two_backends_1_thread_each_ms": statistics.median(t_two) * 1e3,
              "speed_ratio": statistics.median(t_one) / statistics.median(t_two),
              "overlap_share_per_layer": shares, "timeline": spans}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "two_backends.json").write_text(json.dumps(result, indent=1))
    print(f"one backend, 2 threads: {result['one_backend_2_threads_ms']:.2f} ms; two backends, 1 thread each: "
          f"{result['two_backends_1_thread_each_ms']:.2f} ms (x{result['speed_ratio']:.2f})")
    print("hot/cold halves overlapping, share of the shorter half per layer: "
          + ", ".join(f"{s:.0%}" for s in shares))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for i, backend, t0, t1 in spans:
        if t0 < 0:
            continue
        kind = "hot" if any(n in hot for n in segs[i]["nodes"]) else (
            "cold" if any(n in cold for n in segs[i]["nodes"]) else "merge")
        color = {"hot": "tab:red", "cold": "tab:blue", "merge": "tab:gray"}[kind]
        ax.barh(backend, (t1 - t0) * 1e3, left=t0 * 1e3, color=color, edgecolor="white")
    ax.set_yticks([0, 1], ["backend 0 (cold, merge)", "backend 1 (hot)"])
    ax.set_xlabel("ms from the run's start")
    ax.set_title("Per-segment timeline: hot (red) and cold (blue) halves of each FFN layer")
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"timeline plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
