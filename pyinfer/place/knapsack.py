"""The placement program shared by offload (which neurons stay in RAM) and the GPU (which neurons it computes):
a knapsack over neuron groups where each layer keeps a prefix of its groups, solved as a mixed-integer program
with HiGHS, beside the greedy fill it is compared against and a brute force the tests check both with.

Variables: x[il, g] = 1 when group g of layer il is placed (in fast memory, on the GPU). Each layer's groups
are in the plan's hot-first order, so x[il, g] <= x[il, g - 1] keeps the hottest. Constraints and terms:
- capacity:  sum_lg bytes[il][g] x[il, g] <= capacity
- whole bonus (offload): a binary y[il] <= x[il, last] earns bonus[il] when the layer is placed whole (a whole
  layer saves its per-token read request);
- split cost (GPU, PowerInfer's communication constraint): a layer split between the two sides must save more
  than its synchronization and transfer cost, sum_g saving[il][g] x[il, g] >= cost[il] (x[il, 0] - x[il, last]):
  with none of the layer placed, or all of it, nothing is required.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class PrefixKnapsack:
    """The program's data. Per layer il and group g (hot-first): bytes and value; optional per-layer terms."""
    group_bytes: list[list[float]]
    group_value: list[list[float]]
    capacity: float
    whole_bonus: list[float] | None = None          # per layer, earned when every group is placed
    split_saving: list[list[float]] | None = None   # per layer and group, what placing it saves (seconds)
    split_cost: list[float] | None = None           # per layer, what a split costs (seconds)

    def check(self, kept: list[int]) -> bool:
        """Whether keeping prefixes of `kept` groups is feasible."""
        used = sum(sum(b[:k]) for b, k in zip(self.group_bytes, kept))
        if used > self.capacity * (1 + 1e-9) + 1e-6:
            return False
        if self.split_cost is not None:
            for il, k in enumerate(kept):
                n = len(self.group_bytes[il])
                if 0 < k < n and sum(self.split_saving[il][:k]) < self.split_cost[il] - 1e-12:
                    return False
        return True

    def value(self, kept: list[int]) -> float:
        v = sum(sum(vs[:k]) for vs, k in zip(self.group_value, kept))
        if self.whole_bonus is not None:
            v += sum(b for b, k, g in zip(self.whole_bonus, kept, self.group_bytes) if k == len(g) and k > 0)
        return float(v)

    def used(self, kept: list[int]) -> float:
        return float(sum(sum(b[:k]) for b, k in zip(self.group_bytes, kept)))


@dataclass
class KnapsackAnswer:
    kept: list[int]              # per layer: groups placed (a prefix)
    value: float
    used: float
    solver: str                  # "highs", "greedy" or "brute force"
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def solve_greedy(p: PrefixKnapsack) -> KnapsackAnswer:
    """Best value per byte first among each layer's next group (prefixes only), until nothing more fits; a
    split layer that would not save its cost is emptied at the end (what a solver without the constraint
    leaves)."""
    import heapq

    t0 = time.perf_counter()
    kept = [0] * len(p.group_bytes)
    used = 0.0

    def push(heap, il):
        g = kept[il]
        if g < len(p.group_bytes[il]):
            heapq.heappush(heap, (-p.group_value[il][g] / max(p.group_bytes[il][g], 1e-30), il))

    heap: list[tuple[float, int]] = []
    for il in range(len(kept)):
        push(heap, il)
    while heap:
        _, il = heapq.heappop(heap)
        b = p.group_bytes[il][kept[il]]
        if used + b <= p.capacity:
            kept[il] += 1
            used += b
            push(heap, il)
    if p.split_cost is not None:
        for il, k in enumerate(kept):
            if 0 < k < len(p.group_bytes[il]) and sum(p.split_saving[il][:k]) < p.split_cost[il]:
                kept[il] = 0
    return KnapsackAnswer(kept, p.value(kept), p.used(kept), "greedy", time.perf_counter() - t0)


def solve_brute_force(p: PrefixKnapsack) -> KnapsackAnswer:
    """Every combination of prefixes (small instances only: the tests' reference optimum)."""
    t0 = time.perf_counter()
    best: tuple[float, list[int]] = (-1.0, [0] * len(p.group_bytes))
    for kept in itertools.product(*(range(len(b) + 1) for b in p.group_bytes)):
        if p.check(list(kept)):
            v = p.value(list(kept))
            if v > best[0] + 1e-12:
                best = (v, list(kept))
    return KnapsackAnswer(best[1], p.value(best[1]), p.used(best[1]), "brute force", time.perf_counter() - t0)


@contextlib.contextmanager
def _quiet_stdout():
    """HiGHS prints its banner on stdout when the first solver is made; stdout may carry --json."""
    fd = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


def _rows(p: PrefixKnapsack, xcol: list[list[int]], ycol: list[int], inf: float):
    """The constraint rows (columns, coefficients, lower, upper)."""
    rows = [([c for cols in xcol for c in cols], [float(b) for bs in p.group_bytes for b in bs], -inf,
             float(p.capacity))]
    for il, cols in enumerate(xcol):
        rows += [([cols[g], cols[g - 1]], [1.0, -1.0], -inf, 0.0) for g in range(1, len(cols))]
        if ycol:
            rows.append(([ycol[il], cols[-1]], [1.0, -1.0], -inf, 0.0))
        if p.split_cost is not None and len(cols) > 1:
            coef = [float(s) for s in p.split_saving[il]]
            coef[0] -= p.split_cost[il]
            coef[-1] += p.split_cost[il]
            rows.append((cols, coef, 0.0, inf))
    return rows


def solve_highs(p: PrefixKnapsack, time_limit: float = 10.0) -> KnapsackAnswer:
    """The program, solved by HiGHS. Without an optimum in `time_limit` seconds it answers with the best of
    HiGHS's incumbent (its gap in `info`) and the greedy fill; without HiGHS, the greedy fill (saying why)."""
    t0 = time.perf_counter()
    try:
        import highspy
    except ImportError:
        a = solve_greedy(p)
        a.info["fallback"] = "highspy is not installed"
        return a
    xcol, col = [], 0
    for bs in p.group_bytes:
        xcol.append(list(range(col, col + len(bs))))
        col += len(bs)
    ycol = list(range(col, col + len(xcol))) if p.whole_bonus is not None else []
    n_col = col + len(ycol)
    cost = np.zeros(n_col)
    for il, vs in enumerate(p.group_value):
        cost[xcol[il]] = vs
        if ycol:
            cost[ycol[il]] = p.whole_bonus[il]
    inf = highspy.kHighsInf
    rows = _rows(p, xcol, ycol, inf)
    entries: list[list[tuple[int, float]]] = [[] for _ in range(n_col)]  # the matrix, column-wise
    for r, (cols, coefs, _, _) in enumerate(rows):
        for c, v in zip(cols, coefs):
            entries[c].append((r, v))
    start, index, value = [0], [], []
    for e in entries:
        index += [r for r, _ in e]
        value += [v for _, v in e]
        start.append(len(index))
    with _quiet_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    # One thread: these programs solve in seconds at most, the answer is deterministic, and no solver threads
    # linger beside the engine's (the TSan run sees none).
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_col, len(rows)
    lp.col_cost_ = cost
    lp.col_lower_, lp.col_upper_ = np.zeros(n_col), np.ones(n_col)
    lp.row_lower_ = np.array([r[2] for r in rows])
    lp.row_upper_ = np.array([r[3] for r in rows])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n_col
    lp.sense_ = highspy.ObjSense.kMaximize
    h.passModel(lp)
    h.run()
    optimal = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    kept = None
    if optimal or h.getInfo().primal_solution_status == 2:  # 2: a feasible incumbent
        x = np.round(np.asarray(h.getSolution().col_value)).astype(int)
        kept = [int(x[cols].sum()) for cols in xcol]
    if not optimal:
        a = solve_greedy(p)
        why = f"HiGHS: {h.modelStatusToString(h.getModelStatus())}"
        if kept is None or not p.check(kept) or p.value(kept) < a.value:
            a.info["fallback"] = why
            return a
        return KnapsackAnswer(kept, p.value(kept), p.used(kept), "highs", time.perf_counter() - t0,
                              {"variables": n_col, "constraints": len(rows), "stopped": why,
                               "gap": float(h.getInfo().mip_gap)})
    return KnapsackAnswer(kept, p.value(kept), p.used(kept), "highs", time.perf_counter() - t0,
                          {"variables": n_col, "constraints": len(rows)})


def group_sizes(n: int, group: int) -> list[int]:
    """Neurons per group of one layer (the last group takes the remainder)."""
    sizes = [group] * (n // group)
    if n % group:
        sizes.append(n % group)
    return sizes


def group_sums(values: np.ndarray, sizes: list[int]) -> list[float]:
    """Per group: the sum of its neurons' values."""
    edges = np.cumsum([0] + sizes)
    v = np.asarray(values, dtype=np.float64)
    return [float(v[edges[g]:edges[g + 1]].sum()) for g in range(len(sizes))]
