"""Input-major copies of a weight [d_out, d_in] (row i = input i's column), the rows an input-sparse projection's
axpy reads (runtime/input_sparse.py) and the neuron-major down of an input-sparse plan's FFN (runtime/sparse_ffn.py).

Q8_0 rows for quantized weights: one Q8_0 rounding of the original (under 1/254 of a block's largest weight),
8.5 bits a weight (a Q4_K matrix's copy is 1.9x its bytes), each row's scales inside the row. Two formats were
measured before it and dropped: Q4T (nibbles, 5 bits a weight; unpacking and pairing rows at run time cost about
three times a dense GEMV's work per weight) and Q8T (int8 rows, the scales of each 32 inputs in a side table, an
integer dot4): a group's side row of scales (2 bytes per output) is read whenever one of its 32 inputs is active,
which at the densities decode sees (3-30% of down's inputs on Qwen2.5-Coder-0.5B) is more bytes than the row
itself; Qwen2.5-Coder-0.5B's 24 downs at 80% took 2.1 ms a token through Q8T, 0.9 ms through Q8_0 rows, against
1.9-2.3 ms dense (the same 64 tokens, each a one-token sequence). F32 for float weights.
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


def copy_layout(t) -> tuple[DType, tuple[int, int], type]:
    """(type, array shape, numpy type) of the input-major copy of tensor `t` [out, in] (all of its inputs): Q8_0
    rows for quantized weights (each 32 outputs of an input share one fp16 scale, so the scales travel with the
    row), F32 for float ones and for rows no multiple of 32."""
    if t.type_name not in _FLOAT and t.rows % 32 == 0:
        return DType.Q8_0, (t.cols, t.rows // 32 * 34), np.uint8
    return DType.F32, (t.cols, t.rows), np.float32


def transposed_weight(gguf: GGUFModelFile, name: str, order: np.ndarray | None = None) -> tuple[DType, np.ndarray]:
    """(type, rows) of the input-major copy of weight `name` [out, in] (copy_layout): row k = input order[k]
    (every input in file order by default)."""
    t = gguf.tensor(name)
    dt, _, np_type = copy_layout(t)
    order = np.arange(t.cols, dtype=np.int32) if order is None else np.ascontiguousarray(order, dtype=np.int32)
    rows = _core.neuron_major(raw_rows(gguf, name), DType(t.dtype_id), t.cols, order, dt, physical_cores())
    return dt, rows.view(np_type).reshape(len(order), -1)


def by_input_weight(b: GraphBuilder, gguf: GGUFModelFile, weight: str, tag: str = "") -> T:
    """The graph's input-major copy of `weight`, from the builder's source of copies (b.input_copies: made in RAM
    here by default; mapped from files under a memory limit, offload/input_copies.py)."""
    t = gguf.tensor(weight)
    dt, rows = (b.input_copies or transposed_weight)(gguf, weight)
    return b.weight(weight + ".by_input" + tag, int(dt), t.rows, t.cols, rows)
