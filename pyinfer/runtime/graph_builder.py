"""A thin, typed layer over `_core.Graph`: creates result tensors of the right shape for each op,
so model code reads like a forward pass."""
from __future__ import annotations

from dataclasses import dataclass

from .. import _core
from .._core import DType, Op, RowMode, Storage

_INTEGER_DOT_WEIGHTS = {DType.Q4_0, DType.Q4_1, DType.Q8_0}


@dataclass(frozen=True)
class T:
    """Handle of a graph tensor: id plus the shape facts later ops need."""
    id: int
    cols: int
    dtype: DType
    rows: RowMode
    n_rows: int = 0  # for fixed-row tensors (weights, state)


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = _core.Graph()
        self._quantized: dict[int, T] = {}  # f32 activation id -> its Q8A copy (valid until it is rewritten)

    # ---- tensors ----------------------------------------------------------------------
    def weight(self, name: str, dtype: int, cols: int, rows: int, data) -> T:
        dt = DType(dtype)
        return T(self.graph.add_weight(name, dt, cols, rows, data), cols, dt, RowMode.FIXED, rows)

    def activation(self, name: str, cols: int, dtype: DType = DType.F32, rows: RowMode = RowMode.TOKENS) -> T:
        # An op over a fixed-row tensor (a test feeding weights as inputs) still yields one row per token.
        rows = RowMode.TOKENS if rows == RowMode.FIXED else rows
        return T(self.graph.add_tensor(name, dtype, cols, rows, Storage.SCRATCH), cols, dtype, rows)

    def state(self, name: str, cols: int, n_rows: int, dtype: DType = DType.F16) -> T:
        return T(self.graph.add_tensor(name, dtype, cols, RowMode.FIXED, Storage.STATE, n_rows), cols, dtype,
                 RowMode.FIXED, n_rows)

    def input(self, name: str, rows: RowMode = RowMode.TOKENS) -> T:
        return T(self.graph.add_tensor(name, DType.I32, 1, rows, Storage.INPUT), 1, DType.I32, rows)

    def _node(self, op: Op, dst: T, src: list[T], ints=(), floats=()) -> T:
        self.graph.add_node(op, dst.id, [s.id for s in src], list(ints), list(floats))
        self._quantized.pop(dst.id, None)
        return dst

    # ---- ops ----------------------------------------------------------------------------
    def get_rows(self, table: T, ids: T, name: str) -> T:
        return self._node(Op.GET_ROWS, self.activation(name, table.cols, rows=ids.rows), [table, ids])

    def rms_norm(self, x: T, weight: T, eps: float, name: str) -> T:
        return self._node(Op.RMS_NORM, self.activation(name, x.cols, rows=x.rows), [x, weight], floats=[eps])

    def quantize(self, x: T) -> T:
        """Q8A copy of an activation, shared by every matmul that reads it."""
        q = self._quantized.get(x.id)
        if q is None:
            q = self._node(Op.QUANTIZE, self.activation(f"q8({x.id})", x.cols, DType.Q8A, x.rows), [x])
            self._quantized[x.id] = q
        return q

    def matmul(self, w: T, x: T, name: str) -> T:
        src = self.quantize(x) if w.dtype in _INTEGER_DOT_WEIGHTS else x
        return self._node(Op.MAT_MUL, self.activation(name, w.n_rows, rows=x.rows), [w, src])

    def rope(self, x: T, positions: T, heads: int, head_dim: int, base: float) -> T:
        return self._node(Op.ROPE, x, [x, positions], ints=[heads, head_dim], floats=[base])

    def kv_store(self, cache: T, x: T, positions: T) -> T:
        return self._node(Op.KV_STORE, cache, [x, positions])

    def attention(self, q: T, k_cache: T, v_cache: T, positions: T, heads: int, kv_heads: int, head_dim: int,
                  name: str) -> T:
        out = self.activation(name, q.cols, rows=q.rows)
        return self._node(Op.ATTENTION, out, [q, k_cache, v_cache, positions], ints=[heads, kv_heads, head_dim],
                          floats=[head_dim ** -0.5])

    def add(self, a: T, b: T, out: T | None = None, name: str = "add") -> T:
        return self._node(Op.ADD, out or self.activation(name, a.cols, rows=a.rows), [a, b])

    def silu_mul(self, gate: T, up: T, out: T | None = None, name: str = "silu_mul") -> T:
        return self._node(Op.SILU_MUL, out or self.activation(name, gate.cols, rows=gate.rows), [gate, up])

    def select_rows(self, x: T, row_ids: T, name: str) -> T:
        return self._node(Op.SELECT_ROWS, self.activation(name, x.cols, rows=row_ids.rows), [x, row_ids])


def single_op_engine(build, max_tokens: int = 16, n_threads: int = 1, isa: str = "auto"):
    """Builds a small graph with `build(builder) -> T | tuple[T, ...]`, pins the returned tensors so
    they stay readable, and returns (engine, outputs). Used by op tests and kernel benchmarks."""
    b = GraphBuilder()
    out = build(b)
    for t in (out if isinstance(out, tuple) else (out,)):
        b.graph.pin(t.id)
    return _core.Engine(b.graph, max_tokens=max_tokens, max_outputs=max_tokens, n_threads=n_threads, isa=isa), out
