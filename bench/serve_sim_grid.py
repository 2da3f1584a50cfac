"""The scheduling simulation grid of the serving issue: prediction settings x KV budgets x request
counts, every policy on the same seeded LMSYS-like workload, plus the two-point experiment.

Step cost a + b * (tokens in the step) is fitted from our engine's measured batch times (a batch of
T tokens through the real model; see --fit). Latencies are reported in steps and in seconds.

  python bench/serve_sim_grid.py --workers 2          # ~15 min on 2 cores
Writes bench/results/serving/serve_sim.{json,md} and serve_sim.png."""
from __future__ import annotations

import argparse
import json
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from pyinfer.serve.simulate import intervals, lmsys_like_lengths, simulate

RESULTS = Path(__file__).parent / "results" / "serving"
SETTINGS = [("a", 0.0), ("b", 0.0), ("c", 0.1), ("c", 0.5), ("c", 0.95)]
BUDGETS = {"tight": 4096, "mcsf": 16492, "loose": 65536}
POLICIES = ["hsf", "amax", "amin", "amin-progress", "fcfs", "hedge"]


def fit_step_cost(threads: int = 2) -> dict:
    """Seconds per engine step as a + b * tokens, from batches of T tokens through the real model."""
    import pyinfer

    m = pyinfer.load(None, n_threads=threads, n_ctx=512)
    rng = np.random.default_rng(0)
    ts, secs = [1, 2, 4, 8, 16, 32, 64, 128, 256], []
    for t in ts:
        ids = rng.integers(0, m.config.vocab_size, t).tolist()
        m.eval(ids)  # warm
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            m.eval(ids)
            reps.append(time.perf_counter() - t0)
        secs.append(float(np.median(reps)))
    b, a = np.polyfit(ts, secs, 1)
    return {"a": float(a), "b": float(b), "tokens": ts, "seconds": secs}


def one(job):
    setting, x, budget_name, n, policy, a, b = job
    p, o = lmsys_like_lengths(2000, seed=0)
    p, o = p[:n], o[:n]
    lo, up = intervals(o, setting, x)
    t0 = time.time()
    r = simulate(policy, p, o, lo, up, BUDGETS[budget_name], a=a, b=b)
    return dict(setting=setting + (f"{x}" if setting == "c" else ""), budget=budget_name, kv=BUDGETS[budget_name],
                n=n, policy=policy, avg_latency_steps=r.avg_latency_steps, avg_latency_s=r.avg_latency_s,
                evictions=r.evictions, wasted_tokens=r.wasted_tokens, peak_kv=r.peak_kv_tokens, steps=r.steps,
                wall=time.time() - t0)


def two_point(job):
    """o in {l, u} with equal odds; A_min against H-SF. The paper's bound: (3 - alpha) / 2, alpha = l/u."""
    alpha, budget, policy = job
    rng = np.random.default_rng(1)
    n, u = 1000, 200
    lo = max(1, int(round(alpha * u)))
    o = np.where(rng.random(n) < 0.5, lo, u)
    p = np.minimum(lmsys_like_lengths(n, seed=2)[0], 100)
    r = simulate(policy, p, o, np.full(n, lo), np.full(n, u), budget)
    return dict(alpha=alpha, kv=budget, policy=policy, avg_latency_steps=r.avg_latency_steps, evictions=r.evictions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(range(200, 2001, 200)))
    ap.add_argument("--no-fit", action="store_true", help="skip the engine timing; a = 0, b = 1 (steps only)")
    args = ap.parse_args()
    cost = {"a": 0.0, "b": 1.0} if args.no_fit else fit_step_cost()
    jobs = [(s, x, bn, n, pol, cost["a"], cost["b"]) for s, x in SETTINGS for bn in BUDGETS for n in args.sizes
            for pol in POLICIES]
    tp_jobs = [(al, kv, pol) for al in (0.1, 0.25, 0.5, 0.75) for kv in (4096, 16492) for pol in ("hsf", "amin", "hedge")]
    with Pool(args.workers) as pool:
        rows = pool.map(one, jobs, chunksize=4)
        tp = pool.map(two_point, tp_jobs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serve_sim.json").write_text(json.dumps({"cost": cost, "grid": rows, "two_point": tp}, indent=1))
    write_md(rows, tp, cost)
    plot(rows)
    return 0


def ratios(rows):
    hsf = {(r["setting"], r["budget"], r["n"]): r["avg_latency_steps"] for r in rows if r["policy"] == "hsf"}
    return {(r["setting"], r["budget"], r["n"], r["policy"]): r["avg_latency_steps"] / hsf[(r["setting"], r["budget"], r["n"])]
            for r in rows}


def write_md(rows, tp, cost) -> None:
    rt = ratios(rows)
    settings = sorted({r["setting"] for r in rows}, key=lambda s: (s[0], float(s[1:] or 0)))
    lines = ["# Scheduling simulation (LMSYS-like workload, seeded)", "",
             f"Step cost fitted on our engine (2 threads, SmolLM2-135M): a = {cost['a'] * 1e3:.2f} ms, "
             f"b = {cost['b'] * 1e3:.3f} ms/token. Ratios are average latency (steps) over H-SF's, same cell.", "",
             "## Worst and mean ratio to H-SF over n = 200..2000", "",
             "| setting | KV budget | " + " | ".join(p for p in POLICIES if p != "hsf") + " |",
             "|---|---|" + "---|" * (len(POLICIES) - 1)]
    for s in settings:
        for bn in BUDGETS:
            cells = []
            for p in POLICIES:
                if p == "hsf":
                    continue
                v = [val for (ss, b, n, pp), val in rt.items() if ss == s and b == bn and pp == p]
                cells.append(f"{max(v):.2f} / {np.mean(v):.2f}")
            lines.append(f"| {s} | {bn} ({BUDGETS[bn]}) | " + " | ".join(cells) + " |")
    cells = {(s, b, n) for (s, b, n, _) in rt}
    near = sum(rt[c + ("hedge",)] <= 1.10 for c in cells)
    vs_best = sum(rt[c + ("hedge",)] <= 1.05 * min(rt[c + ("amin",)], rt[c + ("amax",)]) for c in cells)
    amin_a = all(rt[c + ("amin",)] < rt[c + ("amax",)] for c in cells if c[0] in ("a", "b"))
    lines += ["", f"Per cell (setting x budget x n, {len(cells)} cells): hedge within 1.10x of H-SF in {near}; "
              f"hedge within 5% of the better of A_min and A_max in {vs_best}. A_min below A_max in every cell of "
              f"settings (a) and (b): {amin_a}."]
    lines += ["", "Cells: worst / mean ratio. Evictions and wasted tokens at n = 2000:", "",
              "| setting | KV budget | " + " | ".join(f"{p} evict/wasted" for p in ("amin", "amin-progress", "fcfs", "hedge")) + " |",
              "|---|---|---|---|---|---|"]
    for s in settings:
        for bn in BUDGETS:
            cells = []
            for p in ("amin", "amin-progress", "fcfs", "hedge"):
                r = next(r for r in rows if r["setting"] == s and r["budget"] == bn and r["n"] == 2000 and r["policy"] == p)
                cells.append(f"{r['evictions']} / {r['wasted_tokens']}")
            lines.append(f"| {s} | {bn} | " + " | ".join(cells) + " |")
    lines += ["", "## Two-point outputs (o = l or u, equal odds, u = 200, n = 1000)", "",
              "| alpha = l/u | KV | A_min / H-SF | hedge / H-SF | (3 - alpha) / 2 |", "|---|---|---|---|---|"]
    for al in sorted({t["alpha"] for t in tp}):
        for kv in sorted({t["kv"] for t in tp}):
            g = {t["policy"]: t["avg_latency_steps"] for t in tp if t["alpha"] == al and t["kv"] == kv}
            lines.append(f"| {al} | {kv} | {g['amin'] / g['hsf']:.3f} | {g['hedge'] / g['hsf']:.3f} | {(3 - al) / 2:.3f} |")
    (RESULTS / "serve_sim.md").write_text("\n".join(lines) + "\n")


def plot(rows) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rt = ratios(rows)
    settings = sorted({r["setting"] for r in rows}, key=lambda s: (s[0], float(s[1:] or 0)))
    fig, axes = plt.subplots(len(BUDGETS), len(settings), figsize=(3.2 * len(settings), 2.6 * len(BUDGETS)),
                             sharex=True)
    for i, bn in enumerate(BUDGETS):
        for j, s in enumerate(settings):
            ax = axes[i][j]
            for p in POLICIES:
                if p == "hsf":
                    continue
                pts = sorted((n, v) for (ss, b, n, pp), v in rt.items() if ss == s and b == bn and pp == p)
                ax.plot([q[0] for q in pts], [q[1] for q in pts], marker=".", label=p)
            ax.axhline(1.1, color="grey", lw=0.6, ls=":")
            ax.set_yscale("log")
            ax.set_title(f"setting {s}, KV {BUDGETS[bn]}", fontsize=9)
            if j == 0:
                ax.set_ylabel("latency / H-SF")
            if i == len(BUDGETS) - 1:
                ax.set_xlabel("requests")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "serve_sim.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
