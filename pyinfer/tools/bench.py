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

    def as_dict(self) -> dict:
        return asdict(self)


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
        model._forward(ids, depth, np.array([n_tokens - 1]))
    return time.perf_counter() - t0


def fill_depth(model, depth: int, seed: int = 12345) -> np.ndarray:
    """Prefills `depth` pseudo-random tokens (untimed) and returns the last logits, or None for depth 0."""
    if depth == 0:
        return None
    with model._lock:
        return model._forward(_random_ids(model, depth, seed), 0, np.array([depth - 1]))[0]


def bench_decode(model, n_tokens: int, prompt: str = "Once upon a time", depth: int = 0,
                 depth_logits: np.ndarray | None = None) -> tuple[float, int]:
    """Seconds for n_tokens greedy decode steps (end-of-text ignored): after a short prompt, or, with
    `depth`, after the first `depth` cached tokens (whose last logits are `depth_logits`)."""
    with model._lock:
        if depth:
            start, logits = depth, depth_logits
        else:
            ids = model.tokenize(prompt)
            start, logits = len(ids), model._forward(ids, 0, np.array([len(ids) - 1]))[0]
        t0 = time.perf_counter()
        for i in range(n_tokens):
            tok = int(np.argmax(logits))
            logits = model._forward([tok], start + i, np.array([0]))[0]
        return time.perf_counter() - t0, n_tokens


def run_bench(model, prompt_tokens: int = 256, gen_tokens: int = 128, repetitions: int = 3,
              depth: int = 0) -> BenchResult:
    """llama-bench's pp and tg tests; with `depth` (llama-bench -d), both run after `depth` tokens already in
    the cache, which is filled once and kept (each test overwrites only the positions after it)."""
    bench_prefill(model, min(prompt_tokens, 16))  # warm up pages and threads
    logits = fill_depth(model, depth)
    pp = [prompt_tokens / bench_prefill(model, prompt_tokens, seed=i, depth=depth) for i in range(repetitions)]
    tg = [gen_tokens / bench_decode(model, gen_tokens, depth=depth, depth_logits=logits)[0]
          for _ in range(repetitions)]
    return BenchResult(model.n_threads, model.isa, prompt_tokens, gen_tokens, depth, model.cache_type,
                       float(np.median(pp)), float(np.median(tg)), peak_rss_mb(), repetitions)
