"""Scheduling policies from arXiv 2508.14544 and its baselines, as plain ordering rules.

Each policy says (1) the output length it plans for, (2) the order it admits in, (3) the order it
evicts in and (4) what it learns from an eviction. Scheduler does the rest.

Pinned-down choices (they change results; see the serving issue):
- A_min plans a running request at max(õ_i, a_i + 1): a request that has outlived its pseudo lower
  bound is expected to emit at least one more token. On eviction õ_i becomes max(õ_i, a_i).
- Eviction order, the choice the paper leaves open: "amin" (the paper's letter) evicts in ascending
  õ_i, where õ_i changes only on eviction, ties broken by a seeded random draw; "amin-progress" ranks
  running requests by õ_i refined by their progress, max(õ_i, a_i), so the least-progressed go first.
- A_max admits in ascending u_i (ties: arrival), so with equal intervals it is arrival order.
- FCFS checks only the current step and preempts the newest arrival first (vLLM's recompute)."""
from __future__ import annotations

import random

import numpy as np

from .request import Request


class Policy:
    name = "base"
    future_aware = True  # check every future step of the plan, not just the next one

    def planned_len(self, r: Request) -> int:
        raise NotImplementedError

    def admission_key(self, r: Request):
        return (r.arrival, r.id)

    def victim_key(self, r: Request):
        return (-r.arrival, -r.id)

    def on_evict(self, r: Request) -> None:
        pass

    def on_finish(self, r: Request) -> None:
        """Called once per finished request, with r.generated its true output length."""

    def forget(self, r: Request) -> None:
        """Called once when a request leaves the scheduler (finished or aborted): drop what is kept per request."""


class AMax(Policy):
    name = "amax"

    def planned_len(self, r: Request) -> int:
        return r.upper

    def admission_key(self, r: Request):
        return (r.upper, r.arrival, r.id)


class AMin(Policy):
    name = "amin"

    def __init__(self, seed: int = 0, refine_running: bool = False):
        self.rng = random.Random(seed)
        self.refine_running = refine_running
        self._tiebreak: dict[int, float] = {}

    def planned_len(self, r: Request) -> int:
        return max(r.pseudo_lower, r.generated + 1)

    def admission_key(self, r: Request):
        return (r.pseudo_lower, r.arrival, r.id)

    def victim_key(self, r: Request):
        tb = self._tiebreak.setdefault(r.id, self.rng.random())
        return (max(r.pseudo_lower, r.generated) if self.refine_running else r.pseudo_lower, tb)

    def on_evict(self, r: Request) -> None:
        r.pseudo_lower = max(r.pseudo_lower, r.generated)
        self._tiebreak.pop(r.id, None)

    def forget(self, r: Request) -> None:
        self._tiebreak.pop(r.id, None)


class HindsightSF(Policy):
    """Knows every true length: shortest first under the exact memory profile (simulation only)."""
    name = "hsf"

    def planned_len(self, r: Request) -> int:
        if r.true_len is None:
            raise ValueError("H-SF needs true output lengths (simulation only)")
        return r.true_len

    def admission_key(self, r: Request):
        return (r.true_len, r.arrival, r.id)


class FCFS(Policy):
    name = "fcfs"
    future_aware = False

    def planned_len(self, r: Request) -> int:
        return r.generated + 1


class Hedge(Policy):
    """Ours. Plans each request at what similar finished requests needed, admits by expected memory-time
    area, and picks eviction victims by whether the intervals carry information.

    It watches finished requests only (a server sees their true lengths too; running requests' true
    lengths are never read).
    - Plan: the `quantile` (median) of the true lengths of the `k` finished requests whose intervals
      are nearest in (log l, log u) (ties included), restricted to the request's window
      [max(õ_i, a_i + 1), u_i]. In setting (a) every interval ties, so this is the length distribution
      conditioned on the progress so far; with bins it is the bin's distribution; with [(1-x)o, (1+x)o]
      the neighbours' lengths sit near o. Before `warmup` requests have finished: l (u/l)^`prior`, a
      quarter of the way from l to u in log scale (A_min's optimism, hedged: under-reserving costs an
      eviction, over-reserving idles memory for everyone).
    - Admission: ascending expected remaining area (s_i + a_i + L/2) L with L = plan - a_i: the KV
      memory a request will hold integrated over the steps it still needs (MC-SF's ordering, arXiv
      2502.07115), so a short answer to a long prompt does not jump a short answer to a short one.
    - Eviction: the least-progressed request (least wasted work) while interval midpoints correlate with
      true lengths (log-log Pearson r >= `min_corr`) or before warmup; otherwise (every request
      [1, 1000]) the largest KV holder s_i + a_i: nothing else tells the jobs apart, lengths' hazard
      falls with progress, so big holders are the likely long ones, and they free the most. Requests
      evicted before go last, so a long one cannot be restarted forever (o in {l, u} would thrash).
    - When most finished requests ran to their upper bound (a client whose max_tokens is the real
      length), u is the best estimate: it plans with u and admits by u, as A_max does, and an overflow
      (from admissions made before it noticed) evicts the largest remaining area."""
    name = "hedge"

    def __init__(self, seed: int = 0, quantile: float = 0.5, k: int = 32, warmup: int = 20, prior: float = 0.25,
                 min_corr: float = 0.3, tight_upper: float = 0.5, refresh: float = 0.05, history: int = 4096):
        self.quantile, self.k, self.warmup, self.prior = quantile, k, warmup, prior
        self.min_corr, self.tight_upper, self.refresh = min_corr, tight_upper, refresh
        self.history = history  # finished requests remembered: a long-running server forgets the oldest
        self.amax = AMax()
        self._seen = 0  # finished requests ever
        self._lengths: list[int] = []
        self._feats: list[tuple[float, float]] = []  # (log l, log u) of each remembered finished request
        self._at_upper: list[bool] = []
        self._informative = self._upper_is_tight = False
        self._dirty = False
        self._neighbours: dict[tuple[int, int], tuple[int, np.ndarray]] = {}  # interval -> (n seen, lengths)

    def _refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        n = len(self._lengths)
        mids = np.asarray(self._feats).sum(axis=1)  # 2 log sqrt(l u)
        self._informative = bool(n >= self.warmup and mids.std() > 1e-9 and
                                 np.corrcoef(mids, np.log(self._lengths))[0, 1] >= self.min_corr)
        self._upper_is_tight = n >= 8 and sum(self._at_upper) >= self.tight_upper * n

    @property
    def informative(self) -> bool:
        self._refresh()
        return self._informative

    @property
    def upper_is_tight(self) -> bool:
        self._refresh()
        return self._upper_is_tight

    def _similar_lengths(self, r: Request) -> np.ndarray:
        """Sorted true lengths of the finished requests nearest r's interval; recomputed once the finished
        count has grown by `refresh` (shared by every request with the same interval)."""
        n, key = len(self._lengths), (r.lower, r.upper)
        cached = self._neighbours.get(key)
        if cached is None or self._seen >= cached[0] * (1 + self.refresh) + 1:
            if len(self._neighbours) >= self.history:
                self._neighbours.clear()
            f = np.asarray(self._feats)
            d = np.abs(f[:, 0] - np.log(r.lower)) + np.abs(f[:, 1] - np.log(r.upper))
            kth = np.partition(d, min(self.k, n) - 1)[min(self.k, n) - 1]
            cached = (self._seen, np.sort(np.asarray(self._lengths)[d <= kth + 1e-12]))
            self._neighbours[key] = cached
        return cached[1]

    def planned_len(self, r: Request) -> int:
        if self.upper_is_tight:
            return self.amax.planned_len(r)
        lo = max(r.pseudo_lower, r.generated + 1)
        if lo >= r.upper:
            return lo
        if len(self._lengths) < self.warmup:
            return max(lo, min(r.upper, round(r.lower * (r.upper / r.lower) ** self.prior)))
        s = self._similar_lengths(r)
        i0, i1 = np.searchsorted(s, lo, "left"), np.searchsorted(s, r.upper, "right")
        return lo if i1 <= i0 else int(s[i0 + min(i1 - i0 - 1, int(self.quantile * (i1 - i0)))])

    def _area(self, r: Request) -> float:
        left = max(1, self.planned_len(r) - r.generated)
        return (r.prompt_len + r.generated + left / 2) * left

    def admission_key(self, r: Request):
        if self.upper_is_tight:
            return self.amax.admission_key(r)
        return (self._area(r), r.arrival, r.id)

    def victim_key(self, r: Request):
        if self.upper_is_tight:  # plans are the lengths: give up the one that would hold the most
            return (-self._area(r), r.id)
        if self.informative or len(self._lengths) < self.warmup:
            return (r.generated, -r.id)
        return (r.evictions, -(r.prompt_len + r.generated), r.id)

    def on_evict(self, r: Request) -> None:
        r.pseudo_lower = max(r.pseudo_lower, r.generated)

    def on_finish(self, r: Request) -> None:
        self._seen += 1
        self._at_upper.append(r.generated >= r.upper)
        self._lengths.append(r.generated)
        self._feats.append((float(np.log(r.lower)), float(np.log(r.upper))))
        if len(self._lengths) >= 2 * self.history:  # amortized: drop the older half at once
            del self._at_upper[:-self.history], self._lengths[:-self.history], self._feats[:-self.history]
        self._dirty = True


POLICIES = {"amin": AMin, "amax": AMax, "hsf": HindsightSF, "fcfs": FCFS, "hedge": Hedge}


def make_policy(name: str, seed: int = 0, **kwargs) -> Policy:
    if name == "amin-progress":  # the other reading of the paper's eviction order
        return AMin(seed, refine_running=True)
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler '{name}' (choose from {', '.join(POLICIES)})")
    if name in ("amin", "hedge"):
        return POLICIES[name](seed, **kwargs)
    return POLICIES[name]()
