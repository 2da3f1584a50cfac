"""Input-major copies of a weight [d_out, d_in] (row i = input i's column), the rows an input-sparse projection's
axpy reads (runtime/input_sparse.py) and the neuron-major down of an input-sparse plan's FFN (runtime/sparse_ffn.py).

Q8T for quantized weights: 8-bit rows, the scales of each 32 inputs in a side table (the weight's own blocks
for Q8_0, a Q8_0 rounding of the others: 8.5 bits a weight, so a Q4_K matrix's copy is 1.9x its bytes). Q4T
(nibbles, 5 bits a weight) was measured first: its axpy unpacks nibbles and pairs rows at run time, about three
times a dense GEMV's work per weight; at 30% of a 1.5B down's inputs it took 1.4x the dense matmul's time,
where Q8T's integer dot4 took 0.9-1.4x on this noisy 2-core VM (bench/results/sparsity/input_*.md). F32 for
float weights.
"""
from __future__ import annotations

import numpy as np

from .. import _core
from .._core import DType
from ..model.gguf_file import GGUFModelFile
from .graph_builder import GraphBuilder, T
from .threads import physical_cores

_FLOAT = ("F32", "F16", "BF16")


def raw_rows(gguf: GGUFModelFile, name: str) -> np.ndarray:
    """The tensor's bytes as U8 [rows, row_bytes] (a view of the mapped file)."""
    t = gguf.tensor(name)
    return np.asarray(t.data).view(np.uint8).reshape(t.rows, -1)


def q8t_from_q8_0(data: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 matrix [rows, cols] as Q8T of its transpose, losslessly: bytes + 128 U8 [cols, rows] and the
    blocks' scales F16 [cols / 32, rows]."""
    raw = np.asarray(data).view(np.uint8).reshape(rows, cols // 32, 34)
    scales = np.ascontiguousarray(raw[..., :2].copy().view(np.float16)[..., 0].T)
    qs = raw[..., 2:].reshape(rows, cols)
    return np.ascontiguousarray(qs.T ^ np.uint8(0x80)), scales


def q8t_from_float(wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Input-major floats [cols, rows] (row i = input i) as Q8T: each 32 inputs of one output quantized as a Q8_0
    block of the original matrix (scale amax / 127, fp16), so a 4-6 bit source loses under 1/254 of a block's
    largest weight."""
    cols, rows = wt.shape
    x = wt.reshape(cols // 32, 32, rows)
    d = np.abs(x).max(axis=1) / 127.0                                  # [cols / 32, rows]
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint(x * inv[:, None, :]), -127, 127).astype(np.int16)
    return np.ascontiguousarray((q + 128).astype(np.uint8).reshape(cols, rows)), d.astype(np.float16)


def transposed_weight(gguf: GGUFModelFile, name: str) -> tuple[DType, np.ndarray, np.ndarray | None]:
    """(type, rows, Q8T scales or None) of the input-major copy of weight `name` [out, in]: row i = input i. Q8T
    for quantized weights (the integer axpy: bench/results/sparsity/input_*.md), F32 for float ones."""
    t = gguf.tensor(name)
    if t.type_name == "Q8_0" and t.rows % 32 == 0:
        rows, scales = q8t_from_q8_0(raw_rows(gguf, name), t.rows, t.cols)
        return DType.Q8T, rows, scales
    wt = _core.neuron_major(raw_rows(gguf, name), DType(t.dtype_id), t.cols, np.arange(t.cols, dtype=np.int32),
                            DType.F32, physical_cores()).view(np.float32).reshape(t.cols, t.rows)
    if t.type_name in _FLOAT or t.rows % 32:
        return DType.F32, wt, None  # float weights, or rows no multiple of 32: exact F32
    rows, scales = q8t_from_float(wt)
    return DType.Q8T, rows, scales


def by_input_weight(b: GraphBuilder, gguf: GGUFModelFile, weight: str, tag: str = "") -> tuple[T, T | None]:
    """The graph's input-major copy of `weight` and its Q4T scales (or None)."""
    t = gguf.tensor(weight)
    dt, rows, scales = transposed_weight(gguf, weight)
    w_t = b.weight(weight + ".by_input" + tag, int(dt), t.rows, t.cols, rows)
    if scales is None:
        return w_t, None
    return w_t, b.weight(weight + ".by_input_scales" + tag, int(DType.F16), scales.shape[1], t.cols // 32, scales)
