"""Which neurons stay in fast memory: a knapsack over neuron groups, solved as a mixed-integer program
with HiGHS, and the greedy baseline it is compared against.

Each layer's neurons are in the plan's hot-first order and split into groups of `group` neurons; a layer
keeps a prefix of its groups (x[l, g] <= x[l, g - 1]), so the hottest stay. Keeping group g of layer l
costs its bytes and is worth value[l][g] (expected bytes not read per token). A layer kept whole also
saves its per-token read request (`layer_bonus`, the request latency in bytes at the measured bandwidth):
a binary y[l] <= x[l, last] earns it. That bonus is what the greedy fill (best value per byte first) does
not see. The same program, with the GPU's capacity and a transfer cost, places neurons on a GPU.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ResidentChoice:
    counts: list[int]            # per layer: neurons kept (a prefix of the hot-first order)
    value: float                 # objective reached
    bytes: int                   # capacity used
    solver: str                  # "highs" or "greedy"
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _groups(n_ff: int, group: int) -> list[int]:
    """Neurons per group of one layer (the last group takes the remainder)."""
    sizes = [group] * (n_ff // group)
    if n_ff % group:
        sizes.append(n_ff % group)
    return sizes


def _counts(sizes: list[list[int]], kept: list[int]) -> list[int]:
    return [int(sum(s[:k])) for s, k in zip(sizes, kept)]


def greedy_resident(n_ff: list[int], bundle_bytes: list[int], capacity: int, group: int = 32,
                    value_per_neuron: list[np.ndarray] | None = None) -> ResidentChoice:
    """Best value per byte first, each layer's groups in order, skipping what no longer fits."""
    t0 = time.perf_counter()
    sizes = [_groups(n, group) for n in n_ff]
    vals = _group_values(sizes, bundle_bytes, value_per_neuron)
    order = sorted(((v / (s * b), l, g) for l, (ss, vs, b) in enumerate(zip(sizes, vals, bundle_bytes))
                    for g, (s, v) in enumerate(zip(ss, vs))), key=lambda e: (-e[0], e[1], e[2]))
    kept = [0] * len(n_ff)
    used, value = 0, 0.0
    for _, l, g in order:
        cost = sizes[l][g] * bundle_bytes[l]
        if g == kept[l] and used + cost <= capacity:
            kept[l] += 1
            used += cost
            value += vals[l][g]
    return ResidentChoice(_counts(sizes, kept), value, used, "greedy", time.perf_counter() - t0)


def _group_values(sizes, bundle_bytes, value_per_neuron):
    """Default: every byte kept is a byte not read (a streamed tail is read whole every token)."""
    out = []
    for l, (ss, b) in enumerate(zip(sizes, bundle_bytes)):
        if value_per_neuron is None:
            out.append([float(s * b) for s in ss])
        else:
            v = np.asarray(value_per_neuron[l], dtype=np.float64)
            edges = np.cumsum([0] + ss)
            out.append([float(v[edges[g]:edges[g + 1]].sum()) for g in range(len(ss))])
    return out


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


def solve_resident(n_ff: list[int], bundle_bytes: list[int], capacity: int, group: int = 32,
                   value_per_neuron: list[np.ndarray] | None = None, layer_bonus: float = 0.0,
                   time_limit: float = 10.0) -> ResidentChoice:
    """The program above, solved by HiGHS. Falls back to the greedy answer (and says so in `info`) when
    HiGHS is missing or does not reach an optimum in `time_limit` seconds."""
    t0 = time.perf_counter()
    try:
        import highspy
    except ImportError:
        c = greedy_resident(n_ff, bundle_bytes, capacity, group, value_per_neuron)
        c.info["fallback"] = "highspy is not installed"
        return c
    sizes = [_groups(n, group) for n in n_ff]
    vals = _group_values(sizes, bundle_bytes, value_per_neuron)
    # Columns: every x[l, g], then every y[l]. Rows: capacity, prefix order, y[l] <= x[l, last].
    xcol = []
    col = 0
    for ss in sizes:
        xcol.append(list(range(col, col + len(ss))))
        col += len(ss)
    ycol = list(range(col, col + len(sizes)))
    n_col = col + len(sizes)
    cost = np.zeros(n_col)
    for l, vs in enumerate(vals):
        cost[xcol[l]] = vs
        cost[ycol[l]] = layer_bonus
    rows: list[tuple[list[int], list[float], float, float]] = []
    inf = highspy.kHighsInf
    weights = [float(s * b) for ss, b in zip(sizes, bundle_bytes) for s in ss]
    rows.append((list(range(col)), weights, -inf, float(capacity)))
    for l, cols in enumerate(xcol):
        for g in range(1, len(cols)):
            rows.append(([cols[g], cols[g - 1]], [1.0, -1.0], -inf, 0.0))
        rows.append(([ycol[l], cols[-1]], [1.0, -1.0], -inf, 0.0))
    # Column-wise sparse matrix.
    entries: list[list[tuple[int, float]]] = [[] for _ in range(n_col)]
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
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        c = greedy_resident(n_ff, bundle_bytes, capacity, group, value_per_neuron)
        c.info["fallback"] = f"HiGHS: {h.modelStatusToString(h.getModelStatus())}"
        return c
    x = np.round(np.asarray(h.getSolution().col_value)).astype(int)
    kept = [int(x[cols].sum()) for cols in xcol]
    used = int(sum(sum(sizes[l][:k]) * bundle_bytes[l] for l, k in enumerate(kept)))
    return ResidentChoice(_counts(sizes, kept), float(h.getInfo().objective_function_value), used, "highs",
                          time.perf_counter() - t0, {"variables": n_col, "constraints": len(rows)})
