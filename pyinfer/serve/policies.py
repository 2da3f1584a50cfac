"""Scheduling policies from arXiv 2508.14544 and its baselines, as plain ordering rules.

Each policy says (1) the output length it plans for, (2) the order it admits in, (3) the order it
evicts in and (4) what it learns from an eviction. Scheduler does the rest.

Pinned-down choices (they change results; see the serving issue):
- A_min plans a running request at max(õ_i, a_i + 1) ("refined by progress"): a request that has
  outlived its pseudo lower bound is expected to emit at least one more token. On eviction õ_i
  becomes max(õ_i, a_i). Eviction order: ascending õ_i, ties broken by a seeded random draw.
- A_max admits in ascending u_i (ties: arrival), so with equal intervals it is arrival order.
- FCFS checks only the current step and preempts the newest arrival first (vLLM's recompute)."""
from __future__ import annotations

import random

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


class AMax(Policy):
    name = "amax"

    def planned_len(self, r: Request) -> int:
        return r.upper

    def admission_key(self, r: Request):
        return (r.upper, r.arrival, r.id)


class AMin(Policy):
    name = "amin"

    def __init__(self, seed: int = 0, refine_running: bool = True):
        self.rng = random.Random(seed)
        self.refine_running = refine_running
        self._tiebreak: dict[int, float] = {}

    def planned_len(self, r: Request) -> int:
        return max(r.pseudo_lower, r.generated + 1) if self.refine_running else r.pseudo_lower

    def admission_key(self, r: Request):
        return (r.pseudo_lower, r.arrival, r.id)

    def victim_key(self, r: Request):
        tb = self._tiebreak.setdefault(r.id, self.rng.random())
        return (r.pseudo_lower, tb)

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


POLICIES = {"amin": AMin, "amax": AMax, "hsf": HindsightSF, "fcfs": FCFS}


def make_policy(name: str, seed: int = 0) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown scheduler '{name}' (choose from {', '.join(POLICIES)})")
    return AMin(seed) if name == "amin" else POLICIES[name]()
