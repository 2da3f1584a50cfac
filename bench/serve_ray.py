"""`pyinfer serve` on Ray Serve against the plain server, on this machine: the soak workload (bench/serve_soak.py
without its hostile phase: whole and streamed completions and chats, slow readers, hang-ups, 5% malformed) at a
fixed concurrency, through the official `openai` client, for
  plain     `pyinfer serve -t 2`                 (no Ray: the baseline)
  ray 1x2   `pyinfer serve --replicas 1 -t 2`   (one replica of 2 threads)
  ray 2x1   `pyinfer serve --replicas 2 -t 1`   (two replicas of 1 thread each)
in alternating rounds. Per run: requests/s, p50/p99 latency, each replica's share (its requests_total from the
front's /metrics), seconds from the command's start to its first answer, and the memory of the whole process
tree (the sum of RSS and of PSS, which counts shared pages once) when idle after start-up and at its peak.

  python bench/serve_ray.py --requests 300 --concurrency 64 --rounds 3   # -> bench/results/serving/serve_ray.{json,md}
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_proc import free_port  # noqa: E402
from serve_soak import KEY, soak  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "serving"
CONFIGS = {"plain": ("-t", "2"), "ray 1x2": ("--replicas", "1", "-t", "2"), "ray 2x1": ("--replicas", "2", "-t", "1")}


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """(sum of RSS, sum of PSS) of the tree, in MB."""
    rss = pss = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def first_answer(base: str, proc, limit_s: float = 180.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            r = httpx.post(base + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1},
                           headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("no answer")


def shares(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=10).text
    return {s.labels["replica"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "pyinfer_replica_requests_total"}


def run_one(name: str, n: int, concurrency: int, seed: int, kv_budget: int) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pyinfer.cli", "serve", "--port", str(port), "--api-key", KEY,
                             "--kv-budget", str(kv_budget), *CONFIGS[name]], stderr=subprocess.DEVNULL,
                            cwd=tempfile.gettempdir(), env=dict(os.environ, PYTHONSAFEPATH="1"))
    try:
        first_answer(base, proc)
        startup = time.monotonic() - t0
        time.sleep(2.0)  # replicas' first reports, and the start-up transients settle
        idle = tree_memory_mb(proc.pid)
        before = shares(base) if name != "plain" else {}
        peak = [idle]
        done = threading.Event()

        def sample():
            while not done.wait(0.5):
                peak.append(tree_memory_mb(proc.pid))

        threading.Thread(target=sample, daemon=True).start()
        t1 = time.monotonic()
        r = asyncio.run(soak(base, proc.pid, n, concurrency, seed, hostile_phase=False))
        wall = time.monotonic() - t1
        done.set()
        after = shares(base) if name != "plain" else {}
        served = {rep: after[rep] - before.get(rep, 0) for rep in after}
        return dict(config=name, requests=n, concurrency=concurrency, seconds=round(wall, 2),
                    requests_per_s=round(n / wall, 2), p50_s=r["p50_s"], p99_s=r["p99_s"], failed=r["failed"],
                    completed=r["completed"], well_formed=r["well_formed"], failures=r["failures"][:5],
                    replica_share=sorted(round(v / max(1, sum(served.values())), 3) for v in served.values()),
                    startup_s=round(startup, 2), idle_rss_mb=round(idle[0], 1), idle_pss_mb=round(idle[1], 1),
                    peak_rss_mb=round(max(p[0] for p in peak), 1), peak_pss_mb=round(max(p[1] for p in peak), 1),
                    processes=len(tree(proc.pid)))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-budget", type=int, default=8192, help="per replica (and of the plain server)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args()
    names = args.configs.split(",")
    runs = []
    for rnd in range(args.rounds):
        for name in (names if rnd % 2 == 0 else names[::-1]):  # alternating order, round by round
            r = run_one(name, args.requests, args.concurrency, seed=rnd, kv_budget=args.kv_budget)
            r["round"] = rnd
            runs.append(r)
            print(f"round {rnd} {name}: {r['requests_per_s']} req/s, p50 {r['p50_s']:.2f} s, p99 {r['p99_s']:.2f} s, "
                  f"share {r['replica_share']}, start {r['startup_s']} s, PSS {r['idle_pss_mb']} MB idle",
                  file=sys.stderr)

    def med(name, key):
        vals = [r[key] for r in runs if r["config"] == name]
        return statistics.median(vals), min(vals), max(vals)

    summary = {n: {k: med(n, k) for k in ("requests_per_s", "p50_s", "p99_s", "startup_s", "idle_rss_mb",
                                           "idle_pss_mb", "peak_rss_mb", "peak_pss_mb")} for n in names}
    out = dict(date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(), requests=args.requests,
               concurrency=args.concurrency, rounds=args.rounds, kv_budget=args.kv_budget, runs=runs, summary=summary)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "serve_ray.json").write_text(json.dumps(out, indent=1))
    base = summary[names[0]]["requests_per_s"][0]
    lines = [f"# pyinfer serve on Ray Serve: the soak workload ({args.requests} requests, {args.concurrency} "
             f"concurrent, no hostile phase), {args.rounds} alternating rounds, medians [min-max], {os.cpu_count()} "
             "cores", "",
             f"| config | req/s | vs {names[0]} | p50 s | p99 s | replica shares | first answer s | tree PSS idle / "
             "peak MB | tree RSS idle / peak MB | failed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        s = summary[n]
        share = [r["replica_share"] for r in runs if r["config"] == n][-1]
        lines.append(f"| {n} | {s['requests_per_s'][0]:.2f} [{s['requests_per_s'][1]:.2f}-{s['requests_per_s'][2]:.2f}] | "
                     f"{s['requests_per_s'][0] / base:.2f}x | {s['p50_s'][0]:.2f} | {s['p99_s'][0]:.2f} | "
                     f"{share or '-'} | {s['startup_s'][0]:.1f} | {s['idle_pss_mb'][0]:.0f} / {s['peak_pss_mb'][0]:.0f} | "
                     f"{s['idle_rss_mb'][0]:.0f} / {s['peak_rss_mb'][0]:.0f} | "
                     f"{sum(r['failed'] for r in runs if r['config'] == n)} |")
    (RESULTS / "serve_ray.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(out) if args.json else "\n".join(lines))
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
