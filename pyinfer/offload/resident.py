"""Which neurons stay in RAM under a budget: the placement program of `place/knapsack.py` with the bytes a
neuron saves reading as its value, and a bonus for a layer kept whole (it saves its per-token read request:
the request latency in bytes at the measured bandwidth), which the greedy fill (best value per byte first)
does not see. The GPU's placement (`place/gpu_placement.py`) is the same program with another capacity and
cost."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..place.knapsack import KnapsackAnswer, PrefixKnapsack, group_sizes, group_sums, solve_greedy, solve_highs


@dataclass
class ResidentChoice:
    counts: list[int]            # per layer: neurons kept (a prefix of the hot-first order)
    value: float                 # objective reached
    bytes: int                   # capacity used
    solver: str                  # "highs" or "greedy"
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _program(n_ff: list[int], bundle_bytes: list[int], capacity: int, group: int,
             value_per_neuron: list[np.ndarray] | None, layer_bonus: float) -> tuple[PrefixKnapsack, list[list[int]]]:
    """Default value: every byte kept is a byte not read (a streamed tail is read whole every token)."""
    sizes = [group_sizes(n, group) for n in n_ff]
    values = [[float(s * b) for s in ss] if value_per_neuron is None else group_sums(value_per_neuron[il], ss)
              for il, (ss, b) in enumerate(zip(sizes, bundle_bytes))]
    p = PrefixKnapsack([[float(s * b) for s in ss] for ss, b in zip(sizes, bundle_bytes)], values, capacity,
                       whole_bonus=[layer_bonus] * len(n_ff) if layer_bonus else None)
    return p, sizes


def _choice(a: KnapsackAnswer, sizes: list[list[int]]) -> ResidentChoice:
    counts = [int(sum(s[:k])) for s, k in zip(sizes, a.kept)]
    return ResidentChoice(counts, a.value, int(a.used), a.solver, a.seconds, a.info)


def greedy_resident(n_ff: list[int], bundle_bytes: list[int], capacity: int, group: int = 32,
                    value_per_neuron: list[np.ndarray] | None = None) -> ResidentChoice:
    """Best value per byte first, each layer's groups in order, skipping what no longer fits."""
    p, sizes = _program(n_ff, bundle_bytes, capacity, group, value_per_neuron, 0.0)
    return _choice(solve_greedy(p), sizes)


def solve_resident(n_ff: list[int], bundle_bytes: list[int], capacity: int, group: int = 32,
                   value_per_neuron: list[np.ndarray] | None = None, layer_bonus: float = 0.0,
                   time_limit: float = 10.0) -> ResidentChoice:
    """The program, solved by HiGHS (the greedy answer, saying why in `info`, where it cannot be)."""
    p, sizes = _program(n_ff, bundle_bytes, capacity, group, value_per_neuron, layer_bonus)
    return _choice(solve_highs(p, time_limit), sizes)
