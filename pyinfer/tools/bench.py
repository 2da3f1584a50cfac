"""Prefill and decode throughput plus peak RSS, like llama-bench's pp/tg tests."""
from __future__ import annotations

import resource
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class BenchResult:
    threads: int
    isa: str
    prompt_tokens: int
    gen_tokens: int
    depth: int          # tokens already in the KV cache when each test starts
    cache_type: str
    prefill_tok_s: float
    decode_tok_s: float
    peak_rss_mb: float
    repetitions: int
    offload: dict | None = None  # under a RAM budget: the plan and the decode test's I/O (offload_stats)
    experts: dict | None = None  # a Mixture of Experts streaming its experts: hit rate, bytes read per token

    def as_dict(self) -> dict:
        return asdict(self)


def offload_stats(model, store_stats: dict, tokens: int, seconds: float) -> dict:
    """Bytes read per token, the share of FFN bytes served from RAM, and how much of the read time the
    compute hid: a decode step waits only for the part of each read its compute did not cover."""
    plan = model.offload.plan
    read_s, wait_s = store_stats["read_seconds"], store_stats["wait_seconds"]
    return {**plan.summary(), "direct_io": store_stats["direct_io"], "io_engine": store_stats["io_engine"],
            "bytes_read_per_token": store_stats["bytes_read"] / max(tokens, 1),
            "ram_hit_rate": plan.resident_bytes / max(plan.ffn_bytes, 1),
            # selective layers: listed neurons found resident, of all listed; cold ones found in the neuron cache
            "listed_hit_rate": (store_stats["listed_hits"] / listed if (listed := store_stats["listed_hits"]
                                + store_stats["cache_hits"] + store_stats["window_hits"]
                                + store_stats["listed_neurons"]) else None),
            "window_hit_rate": store_stats["window_hits"] / listed if listed and sum(plan.window) else None,
            "cache_hit_rate": (store_stats["cache_hits"] / cold if (cold := store_stats["cache_hits"]
                               + store_stats["listed_neurons"]) and plan.cache_bytes else None),
            "read_seconds_per_token": read_s / max(tokens, 1), "wait_seconds_per_token": wait_s / max(tokens, 1),
            "io_hidden_share": max(0.0, 1.0 - wait_s / read_s) if read_s > 0 else 1.0,
            "read_bandwidth_mb_s": store_stats["bytes_read"] / read_s / 1e6 if read_s > 0 else None,
            "decode_seconds": seconds,
            "predicted_tok_s": model.offload.predicted["predicted_tok_s"] if model.offload.predicted else None}


def peak_rss_mb() -> float:
    """Peak resident set of this process. On Linux VmHWM, which exec resets; ru_maxrss would
    carry over the high-water mark of a large parent that spawned us."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


def _random_ids(model, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.config.vocab_size, n).tolist()


def bench_prefill(model, n_tokens: int, seed: int = 0, depth: int = 0) -> float:
    """Seconds to evaluate n_tokens pseudo-random tokens after the first `depth` tokens of the cache (which the
    caller filled: see fill_depth)."""
    ids = _random_ids(model, n_tokens, seed)
    t0 = time.perf_counter()
    with model._lock:
        model.forward(ids, depth, np.array([n_tokens - 1]))
    return time.perf_counter() - t0


def fill_depth(model, depth: int, seed: int = 12345) -> np.ndarray:
    """Prefills `depth` pseudo-random tokens (untimed) and returns the last logits, or None for depth 0."""
    if depth == 0:
        return None
    with model._lock:
        return model.forward(_random_ids(model, depth, seed), 0, np.array([depth - 1]))[0]


def bench_decode(model, n_tokens: int, prompt: str = "Once upon a time", depth: int = 0,
                 depth_logits: np.ndarray | None = None) -> tuple[float, int]:
    """Seconds for n_tokens greedy decode steps (end-of-text ignored): after a short prompt, or, with
    `depth`, after the first `depth` cached tokens (whose last logits are `depth_logits`)."""
    with model._lock:
        if depth:
            start, logits = depth, depth_logits
        else:
            ids = model.tokenize(prompt)
            start, logits = len(ids), model.forward(ids, 0, np.array([len(ids) - 1]))[0]
        t0 = time.perf_counter()
        for i in range(n_tokens):
            tok = int(np.argmax(logits))
            logits = model.forward([tok], start + i, np.array([0]))[0]
        return time.perf_counter() - t0, n_tokens


def run_bench(model, prompt_tokens: int = 256, gen_tokens: int = 128, repetitions: int = 3,
              depth: int = 0) -> BenchResult:
    """llama-bench's pp and tg tests; with `depth` (llama-bench -d), both run after `depth` tokens already in
    the cache, which is filled once and kept (each test overwrites only the positions after it)."""
    bench_prefill(model, min(prompt_tokens, 16))  # warm up pages and threads
    logits = fill_depth(model, depth)
    pp = [prompt_tokens / bench_prefill(model, prompt_tokens, seed=i, depth=depth) for i in range(repetitions)]
    offload = getattr(model, "offload", None)
    if offload is not None:
        offload.store.reset_stats()
    experts = getattr(model.session, "experts", None)
    if experts is not None:
        experts.store.reset_stats()
    seconds = [bench_decode(model, gen_tokens, depth=depth, depth_logits=logits)[0] for _ in range(repetitions)]
    tg = [gen_tokens / s for s in seconds]
    io = None
    if offload is not None:  # the decode tests' reads (and the short prompt before each)
        io = offload_stats(model, offload.store.stats(), gen_tokens * repetitions, sum(seconds))
    return BenchResult(model.n_threads, model.isa, prompt_tokens, gen_tokens, depth, model.cache_type,
                       float(np.median(pp)), float(np.median(tg)), peak_rss_mb(), repetitions, io,
                       experts.report(gen_tokens * repetitions) if experts is not None else None)
