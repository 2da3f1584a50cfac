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
    """Ours: A_min when the predicted intervals say nothing, a hedged shortest-first when they do.

    It watches finished requests (a real server sees their true lengths too; running requests' true
    lengths are never read). If the interval midpoints sqrt(l*u) of finished requests correlate with
    their true lengths (log-log Pearson r >= `min_corr`), intervals are informative and it plans each
    request at the q-quantile of finished lengths inside its window [max(õ_i, a_i + 1), u_i], admits
    shortest plan first, and on overflow evicts the least-progressed request (the least wasted work).
    Otherwise (e.g. every request predicted [1, 1000]) it behaves exactly as A_min, which is the better
    bet without information. Before `warmup` requests have finished it also behaves as A_min.
    A third regime: when most finished requests ran to their upper bound (a client whose max_tokens is
    the real length), u is the best estimate, and it plans with u and evicts nothing, as A_max does."""
    name = "hedge"

    def __init__(self, seed: int = 0, quantile: float = 0.25, warmup: int = 20, min_corr: float = 0.3,
                 tight_upper: float = 0.5):
        self.quantile, self.warmup, self.min_corr, self.tight_upper = quantile, warmup, min_corr, tight_upper
        self.amax = AMax()
        self._at_upper = 0
        self._upper_is_tight = False
        self.amin = AMin(seed)
        self._lengths: list[int] = []
        self._mids: list[float] = []
        self._sorted = None
        self._informative = False
        self._dirty = False

    def _refresh(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        lengths = np.asarray(self._lengths, dtype=float)
        self._sorted = np.sort(lengths)
        mids = np.log(np.asarray(self._mids))
        self._informative = bool(len(lengths) >= self.warmup and mids.std() > 1e-9 and
                                 np.corrcoef(mids, np.log(lengths))[0, 1] >= self.min_corr)
        self._upper_is_tight = len(lengths) >= 8 and self._at_upper >= self.tight_upper * len(lengths)

    @property
    def informative(self) -> bool:
        self._refresh()
        return self._informative

    @property
    def upper_is_tight(self) -> bool:
        self._refresh()
        return self._upper_is_tight

    def planned_len(self, r: Request) -> int:
        if self.upper_is_tight:
            return self.amax.planned_len(r)
        if not self.informative:
            return self.amin.planned_len(r)
        lo = max(r.pseudo_lower, r.generated + 1)
        s = self._sorted
        i0, i1 = np.searchsorted(s, lo, "left"), np.searchsorted(s, r.upper, "right")
        if lo >= r.upper or i1 <= i0:
            return lo
        return int(s[i0 + min(i1 - i0 - 1, int(self.quantile * (i1 - i0)))])

    def admission_key(self, r: Request):
        if self.upper_is_tight:
            return self.amax.admission_key(r)
        return (self.planned_len(r), r.arrival, r.id) if self.informative else self.amin.admission_key(r)

    def victim_key(self, r: Request):
        return (r.generated, -self.planned_len(r), -r.id) if self.informative else self.amin.victim_key(r)

    def on_evict(self, r: Request) -> None:
        self.amin.on_evict(r)

    def on_finish(self, r: Request) -> None:
        self._at_upper += r.generated >= r.upper
        self._lengths.append(r.generated)
        self._mids.append((r.lower * r.upper) ** 0.5)
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
