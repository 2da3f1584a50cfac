"""Tensor views: rows and columns of another tensor's memory, read and written by ops through their strides."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import GraphBuilder, single_op_engine

ISAS = _core.available_isas().split(",")
RNG = np.random.default_rng(7)


@pytest.mark.parametrize("isa", ISAS)
def test_column_views_of_an_activation_are_read_and_written(isa):
    """q and k as column slices of one fused qkv result; two matmuls write the two halves of one output."""
    n_tok, d = 5, 32
    w_qkv = RNG.standard_normal((3 * d, d)).astype(np.float32)
    w_a, w_b = (RNG.standard_normal((d, d)).astype(np.float32) for _ in range(2))
    x = RNG.standard_normal((n_tok, d)).astype(np.float32)

    def build(b: GraphBuilder):
        X = b.weight("x", int(DType.F32), d, n_tok, x)
        qkv = b.matmul(b.weight("w_qkv", int(DType.F32), d, 3 * d, w_qkv), X, "qkv")
        q = b.view(qkv, "q", cols=d)
        k = b.view(qkv, "k", cols=d, col_offset=d)
        s = b.add(q, k, name="q_plus_k")
        out = b.activation("out", 2 * d)
        b.matmul(b.weight("w_a", int(DType.F32), d, d, w_a), q, "a", out=b.view(out, "out.a", cols=d, col_offset=d))
        b.matmul(b.weight("w_b", int(DType.F32), d, d, w_b), k, "b", out=b.view(out, "out.b", cols=d))
        return s, out

    eng, (s, out) = single_op_engine(build, max_tokens=8, n_threads=2, isa=isa)
    eng.run(n_tok)
    qkv = x @ w_qkv.T
    q, k = qkv[:, :d], qkv[:, d:2 * d]
    np.testing.assert_allclose(eng.tensor(s.id, n_tok), q + k, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(eng.tensor(out.id, n_tok), np.concatenate([k @ w_b.T, q @ w_a.T], 1),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_0, Q.F16])
def test_row_and_column_views_of_a_weight(isa, wtype):
    """Rows [16, 48) and columns [32, 96) of a weight in its stored type: the same bytes, fewer of them."""
    rows, k, n_tok = 64, 128, 3
    w = RNG.standard_normal((rows, k)).astype(np.float32)
    wq = quants.quantize(w, wtype) if wtype != Q.F16 else w.astype(np.float16)
    wd = (quants.dequantize(wq, wtype).reshape(rows, k) if wtype != Q.F16 else wq.astype(np.float32))
    x = RNG.standard_normal((n_tok, 64)).astype(np.float32)

    def build(b: GraphBuilder):
        W = b.weight("w", int(wtype), k, rows, wq)
        part = b.view(W, "w.part", cols=64, rows=32, col_offset=32, row_offset=16)
        return b.matmul(part, b.weight("x", int(DType.F32), 64, n_tok, x), "y")

    eng, y = single_op_engine(build, max_tokens=8, n_threads=2, isa=isa)
    eng.run(n_tok)
    want = x @ wd[16:48, 32:96].T
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=0.02, atol=0.02 * np.abs(want).max())
    # Bit for bit the result of the same bytes copied out into a weight of their own.
    packed = np.ascontiguousarray(_slice_bytes(wq, wtype, k, 16, 48, 32, 96))
    ref, y_ref = single_op_engine(lambda b: b.matmul(b.weight("w", int(wtype), 64, 32, packed),
                                                     b.weight("x", int(DType.F32), 64, n_tok, x), "y"),
                                  max_tokens=8, n_threads=2, isa=isa)
    ref.run(n_tok)
    np.testing.assert_array_equal(ref.tensor(y_ref.id, n_tok), eng.tensor(y.id, n_tok))


def _slice_bytes(wq, wtype, k, r0, r1, c0, c1):
    """The stored bytes of rows [r0, r1) and columns [c0, c1) (whole blocks)."""
    dt = DType(int(wtype))
    raw = np.asarray(wq).view(np.uint8).reshape(-1, _core.row_bytes(dt, k))
    return raw[r0:r1, _core.row_bytes(dt, c0):_core.row_bytes(dt, c1)]


def test_views_that_leave_their_base_are_refused():
    b = GraphBuilder()
    w = b.weight("w", int(DType.F32), 64, 8, np.zeros((8, 64), np.float32))
    ids = b.input("tokens")
    with pytest.raises(ValueError, match="ends past its base"):
        b.view(w, "v", cols=64, rows=4, row_offset=5)
    with pytest.raises(ValueError, match="ends past its base"):
        b.graph.add_view("v", w.id, 32, 8, 160, 256)
    with pytest.raises(ValueError, match="rows overlap"):
        b.graph.add_view("v", w.id, 64, 2, 0, 128)
    with pytest.raises(ValueError, match="ids and inputs cannot be viewed"):
        b.graph.add_view("v", ids.id, 1)
    q = b.weight("q", int(DType.Q8_0), 64, 2, np.zeros(2 * 68, np.uint8))
    with pytest.raises(ValueError, match="whole Q8_0 blocks"):
        b.graph.add_view("v", q.id, 32, 1, 4, 0)
    a = b.activation("a", 64)
    with pytest.raises(ValueError, match="within each base row"):
        b.graph.add_view("v", a.id, 64, 0, 4, 0)
    with pytest.raises(ValueError, match="out of range"):
        b.graph.add_view("v", 999, 8)
