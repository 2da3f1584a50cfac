"""Simulator: the real Scheduler objects driven by a simulated clock.

A step costs a + b * (tokens processed in it: one per decoding request plus admitted prompts).
Workload: LMSYS-Chat-1M-like lengths (paper's statistics: prompt 1-468, mean 41, median 11;
output 1-883, mean 85, median 43), fitted as lognormals clipped to the range: the median fixes mu,
sigma is solved so the clipped sample mean matches. Everything is seeded."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .policies import make_policy
from .request import Request
from .scheduler import Scheduler

PROMPT_STATS = dict(lo=1, hi=468, mean=41.0, median=11.0)
OUTPUT_STATS = dict(lo=1, hi=883, mean=85.0, median=43.0)


def _fit_sigma(lo, hi, mean, median, seed=0) -> float:
    z = np.random.default_rng(seed).standard_normal(200_000)
    a, b = 0.1, 4.0
    for _ in range(50):  # clipped mean grows with sigma
        mid = (a + b) / 2
        m = np.clip(np.rint(median * np.exp(mid * z)), lo, hi).mean()
        a, b = (mid, b) if m < mean else (a, mid)
    return (a + b) / 2


def lmsys_like_lengths(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for st in (PROMPT_STATS, OUTPUT_STATS):
        sigma = _fit_sigma(**st)
        out.append(np.clip(np.rint(st["median"] * np.exp(sigma * rng.standard_normal(n))), st["lo"], st["hi"])
                   .astype(int))
    return out[0], out[1]


def intervals(true_len: np.ndarray, setting: str, x: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(a) every request [1, 1000]; (b) the 100-wide bin holding o; (c) [(1-x)o, (1+x)o]."""
    if setting == "a":
        return np.ones_like(true_len), np.full_like(true_len, 1000)
    if setting == "b":
        k = (true_len - 1) // 100
        return 100 * k + 1, 100 * (k + 1)
    if setting == "c":
        return (np.maximum(1, np.floor((1 - x) * true_len)).astype(int),
                np.maximum(1, np.ceil((1 + x) * true_len)).astype(int))
    raise ValueError(f"unknown prediction setting {setting!r}")


@dataclass
class SimResult:
    policy: str
    n: int
    kv_budget: int
    avg_latency_steps: float
    avg_latency_s: float
    total_latency_steps: int
    steps: int
    evictions: int
    wasted_tokens: int
    peak_kv_tokens: int


def simulate(policy: str, prompt_len, true_len, lower, upper, kv_budget: int, a: float = 0.0, b: float = 1.0,
             seed: int = 0, max_steps: int = 10_000_000, state_tokens: int = 0, **policy_kwargs) -> SimResult:
    """`state_tokens`: what each running request's recurrent state costs in tokens of the budget (hybrid models)."""
    sched = Scheduler(make_policy(policy, seed, **policy_kwargs), kv_budget, state_blocks=state_tokens)
    for i, (s, o, lo, up) in enumerate(zip(prompt_len, true_len, lower, upper)):
        sched.add_request(Request(i, int(s), int(lo), int(up), true_len=int(o)))
    clock, finish_time, peak = 0.0, {}, 0
    while sched.has_unfinished():
        out = sched.schedule()
        if sched.step > max_steps:
            raise RuntimeError(f"{policy}: no progress after {max_steps} steps")
        held = out.kv_tokens + state_tokens * len(out.running)
        assert held <= kv_budget, "KV budget exceeded"  # invariant, every step
        peak = max(peak, held)
        clock += a + b * (len(out.running) + out.prefill_tokens)
        done = [rid for rid in out.running if sched.request(rid).generated + 1 == sched.request(rid).true_len]
        for rid in done:
            finish_time[rid] = clock
        sched.update_from_output(done)
    reqs = list(sched.finished)
    total = sum(r.finish_step for r in reqs)  # all requests arrive at step 0
    return SimResult(policy, len(reqs), kv_budget, total / len(reqs), sum(finish_time.values()) / len(reqs), total,
                     sched.step, sum(r.evictions for r in reqs), sum(r.wasted_tokens for r in reqs), peak)
