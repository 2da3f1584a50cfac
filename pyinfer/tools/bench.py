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


def bench_prefill(model, n_tokens: int, seed: int = 0) -> float:
    """Seconds to evaluate n_tokens pseudo-random tokens from an empty cache."""
    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, n_tokens).tolist()
    t0 = time.perf_counter()
    model.eval(ids)
    return time.perf_counter() - t0


def bench_decode(model, n_tokens: int, prompt: str = "Once upon a time") -> tuple[float, int]:
    """Seconds for n_tokens greedy decode steps after a short prompt (end-of-text ignored)."""
    ids = model.tokenize(prompt)
    logits = model._forward(ids, 0, np.array([len(ids) - 1]))[0]
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        tok = int(np.argmax(logits))
        logits = model._forward([tok], len(model._cached), np.array([0]))[0]
    return time.perf_counter() - t0, n_tokens


def run_bench(model, prompt_tokens: int = 256, gen_tokens: int = 128, repetitions: int = 3) -> BenchResult:
    bench_prefill(model, min(prompt_tokens, 16))  # warm up pages and threads
    pp = [prompt_tokens / bench_prefill(model, prompt_tokens, seed=i) for i in range(repetitions)]
    tg = [gen_tokens / bench_decode(model, gen_tokens)[0] for _ in range(repetitions)]
    return BenchResult(model.n_threads, model.isa, prompt_tokens, gen_tokens, float(np.median(pp)),
                       float(np.median(tg)), peak_rss_mb(), repetitions)
