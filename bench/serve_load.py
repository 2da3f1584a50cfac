"""Load generator: replays the LMSYS-like workload against a real `pyinfer serve` on loopback.

For each scheduler it starts the server (real model, small KV budget so that memory binds), sends
--requests requests with at most --concurrency in flight, polls /metrics throughout, and checks that
no request is lost and the KV budget is never exceeded. Then it measures aggregate decode tokens/s of
the batch engine at batch 1, 4, 8 and 16, in process.

  python bench/serve_load.py --requests 200 --concurrency 32 --kv-budget 2048
Writes bench/results/serving/serve_load.{json,md}."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from pyinfer.serve.metrics import parse_metrics
from pyinfer.serve.simulate import lmsys_like_lengths

sys.path.insert(0, str(Path(__file__).parent))
from batch_decode import batch_throughput  # noqa: E402
from serve_proc import running_server  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "serving"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def workload(n: int, tokenizer, seed: int = 0):
    """Prompts cut from calibration text to the sampled prompt lengths; max_tokens = sampled output length."""
    p_len, o_len = lmsys_like_lengths(n, seed=seed)
    ids = tokenizer.encode((DATA / "pride-and-prejudice.txt").read_text()[:400_000])
    rng = np.random.default_rng(seed)
    out = []
    for s, o in zip(p_len, o_len):
        start = int(rng.integers(0, len(ids) - s - 1))
        out.append((tokenizer.decode(ids[start:start + s]), int(o)))
    return out


async def run_load(base: str, work, concurrency: int, kv_budget: int, timeout: float) -> dict:
    sem = asyncio.Semaphore(concurrency)
    lat, toks, errors = [], [], []
    kv_seen = []
    done = asyncio.Event()

    async with httpx.AsyncClient(timeout=timeout) as client:
        async def poll():
            while not done.is_set():
                vals = parse_metrics((await client.get(base + "/metrics")).text)
                kv_seen.append(vals["pyinfer_kv_used_tokens"])
                await asyncio.sleep(0.25)

        async def one(prompt, max_tokens):
            async with sem:
                t0 = time.perf_counter()
                try:
                    r = await client.post(base + "/v1/completions", json={
                        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "seed": len(lat)})
                    if r.status_code != 200:
                        errors.append(r.text[:200])
                        return
                    toks.append(r.json()["usage"]["completion_tokens"])
                    lat.append(time.perf_counter() - t0)
                except httpx.HTTPError as e:
                    errors.append(repr(e))

        poller = asyncio.create_task(poll())
        t0 = time.perf_counter()
        await asyncio.gather(*(one(p, m) for p, m in work))
        wall = time.perf_counter() - t0
        done.set()
        await poller
        vals = parse_metrics((await client.get(base + "/metrics")).text)
    return dict(requests=len(work), completed=len(lat), errors=len(errors), error_samples=errors[:3],
                avg_latency_s=statistics.mean(lat) if lat else None, p50_latency_s=statistics.median(lat) if lat else None,
                tokens=sum(toks), wall_s=wall, tokens_per_s=sum(toks) / wall, kv_max_polled=max(kv_seen or [0]),
                kv_peak=vals["pyinfer_kv_peak_tokens"], kv_budget=vals["pyinfer_kv_budget_tokens"],
                evictions=vals["pyinfer_evictions_total"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--kv-budget", type=int, default=2048)
    ap.add_argument("--schedulers", nargs="+", default=["fcfs", "amax", "amin", "hedge"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="per request, seconds")
    ap.add_argument("--merge", action="store_true",
                    help="update only these schedulers in an existing serve_load.json (keeps its batch figures)")
    args = ap.parse_args()
    import pyinfer

    tok = pyinfer.load(None, n_threads=1, n_ctx=16).tokenizer
    work = workload(args.requests, tok)
    old = json.loads((RESULTS / "serve_load.json").read_text()) if args.merge else None
    results = dict(old["load"]) if old else {}
    for policy in args.schedulers:
        with running_server("--kv-budget", str(args.kv_budget), "--scheduler", policy, "-t", str(args.threads)) as (base, _):
            results[policy] = asyncio.run(run_load(base, work, args.concurrency, args.kv_budget, args.timeout))
            print(policy, json.dumps(results[policy]), file=sys.stderr)
    batch = {int(k): v for k, v in old["batch_decode_tok_s"].items()} if old else batch_throughput(args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = dict(requests=args.requests, concurrency=args.concurrency, kv_budget=args.kv_budget, threads=args.threads,
                date=time.strftime("%Y-%m-%d"))
    (RESULTS / "serve_load.json").write_text(json.dumps({"meta": meta, "load": results, "batch_decode_tok_s": batch},
                                                        indent=1))
    lines = [f"# pyinfer serve under load ({args.requests} requests, concurrency {args.concurrency}, "
             f"KV budget {args.kv_budget} tokens, {args.threads} threads, SmolLM2-135M Q4_1)", "",
             "| scheduler | completed | errors | avg latency s | p50 s | tokens/s | evictions | KV peak / budget |",
             "|---|---|---|---|---|---|---|---|"]
    for p, r in results.items():
        lines.append(f"| {p} | {r['completed']}/{r['requests']} | {r['errors']} | {r['avg_latency_s']:.2f} | "
                     f"{r['p50_latency_s']:.2f} | {r['tokens_per_s']:.1f} | {int(r['evictions'])} | "
                     f"{int(r['kv_peak'])} / {int(r['kv_budget'])} |")
    lines += ["", "Aggregate decode tokens/s of the batch engine (in process, dense; with sparsity: "
              "batch_decode.md):", "", "| batch | tokens/s |", "|---|---|"]
    lines += [f"| {b} | {v:.1f} |" for b, v in batch.items()]
    (RESULTS / "serve_load.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
