"""`pyinfer plan`: measure this machine, then predict decode speed under a RAM budget (PowerInfer-2's planner,
reduced to the choices this engine has: the I/O queue depth, the neuron cache's share of the budget and,
through the resident-set program, which neurons stay).

Cost model per token, from measured parameters:
  compute  c = decode seconds not spent waiting for reads (a short calibration decode of this model)
  stream   s = bytes of streamed tails / read bandwidth at large chunks, queue depth 1 (the read-ahead thread);
               it runs under the compute, so a step takes max(c, s)
  demand   d = expected listed bytes of selective layers / bandwidth at their mean read size and the I/O
               threads' queue depth; nothing hides it
  tok/s = 1 / (max(c, s) + d)
The neuron cache's share is chosen by replaying the calibration decode's active unions (a trace) through
each candidate split: the resident prefixes the program keeps, then an LRU cache of the rest, counting the
cold neurons that would still be read.
"""
from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .trace_replay import Replay, replay

CHUNKS = (4096, 16384, 65536, 262144, 1 << 20)
DEPTHS = (1, 2, 4, 8)


def measure_reads(path: str, seconds: float = 0.25, chunks=CHUNKS, depths=DEPTHS) -> dict:
    """MB/s of random aligned reads of `path` per (chunk bytes, threads), O_DIRECT where allowed (so the page
    cache does not flatter the disk). {"direct": bool, "table": {chunk: {depth: MB/s}}}."""
    size = os.path.getsize(path) // 4096 * 4096
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
        direct = True
    except OSError:
        fd, direct = os.open(path, os.O_RDONLY), False
    table: dict[int, dict[int, float]] = {}
    rng = np.random.default_rng(0)
    try:
        for chunk in chunks:
            if chunk > size:
                continue
            table[chunk] = {}
            for depth in depths:
                done = [0] * depth
                stop = time.perf_counter() + seconds
                offsets = [rng.integers(0, size // 4096 - chunk // 4096 + 1, 4096) * 4096 for _ in range(depth)]

                def worker(i, chunk=chunk, done=done, stop=stop, offsets=offsets):
                    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
                    k = 0
                    while time.perf_counter() < stop:
                        done[i] += os.preadv(fd, [buf], int(offsets[i][k % len(offsets[i])]))
                        k += 1

                t0 = time.perf_counter()
                threads = [threading.Thread(target=worker, args=(i,)) for i in range(depth)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                table[chunk][depth] = sum(done) / (time.perf_counter() - t0) / 1e6
    finally:
        os.close(fd)
    return {"direct": direct, "table": table}


def bandwidth(reads: dict, chunk: float, depth: int) -> float:
    """Bytes/s at a read size (interpolated in log size between measured chunks) and queue depth."""
    table = reads["table"]
    sizes = sorted(int(c) for c in table)
    d = min((int(k) for k in table[sizes[0]]), key=lambda k: abs(k - depth))

    def at(c):
        return table[c][d] if d in table[c] else table[str(c)][str(d)]

    chunk = min(max(chunk, sizes[0]), sizes[-1])
    for lo, hi in zip(sizes, sizes[1:]):
        if lo <= chunk <= hi:
            w = (np.log(chunk) - np.log(lo)) / (np.log(hi) - np.log(lo))
            return float(np.exp((1 - w) * np.log(at(lo)) + w * np.log(at(hi)))) * 1e6
    return float(at(sizes[0])) * 1e6


@dataclass
class Prediction:
    budget: int
    compute_s: float
    stream_s: float
    demand_s: float
    tok_s: float
    streamed_bytes: int
    demand_bytes: int
    notes: dict = field(default_factory=dict)


def listed_read_bytes(layout) -> float:
    """Bytes one listed neuron's read costs: its bundle rounded up to pages (merged neighbours share pages,
    as the store merges ranges across small gaps)."""
    bundle = max(e["bundle_bytes"] for e in layout.layers)
    return max(4096.0, float(np.ceil(bundle / 4096) * 4096))


def predict(offload_plan, plan, layout, compute_s: float, reads: dict, io_threads: int = 4, trace=None,
            max_range: int = 256 * 1024, merge_gap: int = 8192) -> Prediction:
    """Tokens per second of one offload plan (offloaded_ffn.OffloadPlan) from the measured parameters. With a
    decode trace, the listed reads are those the store would merge for the trace's unions (replay); without,
    each expected neuron is read on its own."""
    from .offloaded_ffn import neuron_values, selective_layers

    values = neuron_values(plan, layout)
    sel = selective_layers(plan)
    window = offload_plan.window or [0] * len(sel)
    stream = demand = 0.0
    for v, k, s, w, e in zip(values, offload_plan.resident, sel, window, layout.layers):
        if s:  # the window is read ahead whole, the rest as it fires
            stream += w * e["bundle_bytes"]
            demand += float(v[k + w:].sum())
        else:
            stream += float(v[k:].sum())
    bundle = max(e["bundle_bytes"] for e in layout.layers)
    per_read = listed_read_bytes(layout)
    stream_s = stream / bandwidth(reads, 1 << 20, 1) if stream else 0.0
    demand_pages = demand / bundle * per_read if demand else 0.0
    demand_s = demand_pages / bandwidth(reads, per_read, io_threads) if demand else 0.0
    notes = {}
    if trace and any(sel):
        slot = max(e["bundle_bytes"] for e, s in zip(layout.layers, sel) if s)
        r = replay(trace, layout, offload_plan.resident, sel, offload_plan.cache_bytes // slot, window, max_range,
                   merge_gap)
        demand_pages, demand_s = r.read_bytes, demand_seconds(r, reads, io_threads)
        notes = {"replayed_reads_per_token": r.requests, "cache_hit_rate": r.cache_hits / (r.cache_hits + r.cold_reads)
                 if r.cache_hits + r.cold_reads else 0.0}
    t = max(compute_s, stream_s) + demand_s
    return Prediction(offload_plan.budget, compute_s, stream_s, demand_s, 1.0 / t, int(stream), int(demand_pages),
                      notes)


def timed_decode(model, tokens: int, warmup: int = 0) -> tuple[float, float]:
    """(seconds, seconds spent waiting for reads) of `tokens` greedy decode steps after a short prompt and
    `warmup` untimed steps (which fill the read-ahead ring and the neuron cache)."""
    ids = model.tokenize("Once upon a time")
    with model._lock:
        logits = model.forward(ids, 0, np.array([len(ids) - 1]))[0]
        pos = len(ids)
        for i in range(warmup + tokens):
            if i == warmup:
                if model.offload is not None:
                    model.offload.store.reset_stats()
                t0 = time.perf_counter()
            logits = model.forward([int(np.argmax(logits))], pos, np.array([0]))[0]
            pos += 1
        total = time.perf_counter() - t0
    wait = model.offload.store.stats()["wait_seconds"] if model.offload is not None else 0.0
    return total, wait


def calibrate_compute(model, tokens: int = 16) -> float:
    """Seconds per decode token not spent waiting for reads, from a short greedy decode."""
    total, wait = timed_decode(model, tokens)
    return (total - wait) / tokens


def demand_seconds(r: Replay, reads: dict, io_threads: int) -> float:
    """Listed reads take their bytes at the bandwidth measured for their mean range size and queue depth."""
    if r.requests <= 0:
        return 0.0
    return r.read_bytes / bandwidth(reads, r.read_bytes / r.requests, io_threads)


CACHE_SHARES = (0.0, 0.1, 0.25, 0.5)
WINDOW_SHARES = (0.0, 0.1, 0.25, 0.5, 1.0)
MAX_RANGES = (64 * 1024, 256 * 1024, 1024 * 1024)  # read cluster sizes: where listed reads are cut
# Listed page ranges closer than this are read as one: the gap's bytes are read to save a request.
MERGE_GAPS = (0, 8192, 32768)
READ_KEYS = ("cache_share", "window_share", "max_range", "merge_gap")  # what the read split sets
DEFAULT_SPLIT = {"cache_share": 0.0, "window_share": 0.0, "max_range": MAX_RANGES[1], "merge_gap": MERGE_GAPS[1]}


def choose_read_split(model, trace, reads: dict, compute_s: float, io_threads: int) -> tuple[dict, list[dict]]:
    """For the selective layers: the neuron cache's share of the budget, the read-ahead window, the read
    cluster size and the merge gap (each swept with the others at their defaults) with the best predicted tok/s
    at this budget, and the table behind the choice."""
    from ..errors import PyinferError
    from .offloaded_ffn import plan_offload, selective_layers

    off = model.offload
    sel = selective_layers(model.sparsity)
    if not any(sel) or len(trace) < 2:
        return dict(DEFAULT_SPLIT), []
    slot = max(e["bundle_bytes"] for e, s in zip(off.layout.layers, sel) if s)
    rows = []
    base = DEFAULT_SPLIT
    splits = ([dict(base, cache_share=c) for c in CACHE_SHARES] + [dict(base, window_share=w) for w in WINDOW_SHARES]
              + [dict(base, max_range=m) for m in MAX_RANGES] + [dict(base, merge_gap=g) for g in MERGE_GAPS])
    splits = [s for i, s in enumerate(splits) if s not in splits[:i]]
    for split in splits:
        cache, window, max_range, gap = (split[k] for k in READ_KEYS)
        try:
            p = plan_offload(model.gguf, model.sparsity, off.layout, off.plan.budget, off.ring_slots, cache, window)
        except PyinferError:  # the window's buffers do not fit this budget
            continue
        r = replay(trace, off.layout, p.resident, sel, p.cache_bytes // slot, p.window, max_range, gap)
        pred = predict(p, model.sparsity, off.layout, compute_s, reads, io_threads, trace, max_range, gap)
        listed = r.cache_hits + r.cold_reads + r.window_hits
        rows.append({**split, "cache_bytes": p.cache_bytes,
                     "resident_bytes": p.resident_bytes, "cold_reads_per_token": r.cold_reads,
                     "read_bytes_per_token": r.read_bytes, "reads_per_token": r.requests,
                     "stream_s": pred.stream_s, "demand_s": pred.demand_s,
                     "cache_hit_rate": r.cache_hits / (r.cache_hits + r.cold_reads) if r.cold_reads + r.cache_hits
                     else 0.0, "window_hit_rate": r.window_hits / listed if listed else 0.0, "tok_s": pred.tok_s})
    best = max(rows, key=lambda r: r["tok_s"])
    return {k: best[k] for k in READ_KEYS}, rows


def measure_decode(model, tokens: int = 16) -> float:
    """Decode tokens per second, reads included, after a short warm-up (the read-ahead ring and cache fill)."""
    return tokens / timed_decode(model, tokens, warmup=4)[0]


def as_dict(p: Prediction) -> dict:
    return asdict(p)


# ---- the plan file ---------------------------------------------------------------------------------------
FORMAT = "pyinfer-offload-plan"


def best_depth(reads: dict, read_bytes: float) -> int:
    """The I/O thread count with the best measured bandwidth at this read size."""
    depths = sorted({int(d) for row in reads["table"].values() for d in row})
    return max(depths, key=lambda d: bandwidth(reads, read_bytes, d))


def make_plan(model, reads: dict, compute_s: float, budgets: list[int], trace=None) -> dict:
    """The plan for model.offload's budget, plus predictions for `budgets` (a sweep); with a decode trace,
    the neuron cache's share too."""
    from ..errors import PyinferError
    from .offloaded_ffn import plan_offload

    off = model.offload
    io_threads = best_depth(reads, listed_read_bytes(off.layout))
    main = predict(off.plan, model.sparsity, off.layout, compute_s, reads, io_threads, trace)
    split, split_rows = choose_read_split(model, trace or [], reads, compute_s, io_threads)
    sweep = []
    for b in budgets:
        try:
            p = plan_offload(model.gguf, model.sparsity, off.layout, b, off.ring_slots)
        except PyinferError as e:  # below the minimum: say so in the sweep
            sweep.append({"budget": b, "error": str(e)})
            continue
        sweep.append(as_dict(predict(p, model.sparsity, off.layout, compute_s, reads, io_threads, trace)))
    return {"format": FORMAT, "version": 1, "fingerprint": model.gguf.fingerprint(), "budget": off.plan.budget,
            "ring_slots": off.ring_slots, "io_threads": io_threads, **split, "read_sweep": split_rows,
            "predicted_tok_s": next((r["tok_s"] for r in split_rows if all(r[k] == v for k, v in split.items())),
                                    main.tok_s),
            "prediction": as_dict(main), "compute_s_per_token": compute_s, "reads": reads, "sweep": sweep,
            "resident_neurons": off.plan.resident}


def read_plan(path: str, fingerprint: str) -> dict:
    from ..tools.json_file import read_bound_json

    return read_bound_json(path, FORMAT, fingerprint, "offload plan", "pyinfer plan")
