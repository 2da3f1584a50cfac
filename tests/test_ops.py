"""Every op against a numpy reference, for every kernel ISA this CPU can run (test-backend-ops)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType, RowMode
from pyinfer.runtime.graph_builder import GraphBuilder, single_op_engine
from support.op_cases import act_scheme_name, llamacpp_q8, offset_correction

ISAS = _core.available_isas().split(",")
RNG = np.random.default_rng(1234)


def q8a_reference(x: np.ndarray, weight=None):
    """Emulates the engine's activation quantization (support/op_cases.llamacpp_q8): per 32 values, d = amax/127,
    q = rint(x*127/amax); with `weight` (a GGML type), as llama.cpp quantizes activations for that type
    (kernels/act_quant.h). q [rows, blocks, 32] and d [rows, blocks, 1] per block of 32."""
    blocks = llamacpp_q8(x, act_scheme_name(weight) if weight is not None else "own")
    return blocks[..., 2:].astype(np.int32), blocks[..., :1]


def run_single(build, n_tokens, isa, max_tokens=16, **run_kw):
    eng, out = single_op_engine(build, max_tokens=max_tokens, n_threads=2, isa=isa)
    eng.run(n_tokens, **run_kw)
    return eng, out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize("n_tok", [1, 3, 4, 9])
def test_matmul_quantized_exact(isa, wtype, n_tok):
    rows, k = 70, 128  # rows not a multiple of the 4-row/16-row tiles
    w = RNG.standard_normal((rows, k)).astype(np.float32)
    wq = quants.quantize(w, wtype)
    wd = quants.dequantize(wq, wtype).reshape(rows, k)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)

    def build(b):
        W = b.weight("w", int(wtype), k, rows, wq)
        X = b.weight("x", int(DType.F32), k, n_tok, x)  # fixed rows: n_tok
        return b.matmul(W, X, "y")

    # The weight-side tensor X is fixed-row, so the matmul output has TOKENS rows = n_tok.
    eng, y = run_single(build, n_tok, isa)
    got = eng.tensor(y.id, n_tok)
    q, d = q8a_reference(x, wtype)
    xq = (q * d).reshape(n_tok, k)          # what the integer dot sees
    want = xq @ wd.T
    want = want + offset_correction(x, wq, wtype, rows, k)  # Q4_1: llama.cpp's Q8_1 sums
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def _float_weights(w: np.ndarray, wtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """(stored data, its F32 value) of `w` as F32, F16 or BF16 (the top half of each F32, truncated)."""
    if wtype == Q.F32:
        return w, w
    if wtype == Q.F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    bf = (w.view(np.uint32) >> 16).astype(np.uint16)
    return bf, (bf.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.F32, Q.F16, Q.BF16])
@pytest.mark.parametrize("n_tok", [1, 2, 5, 9])
@pytest.mark.parametrize("k", [64, 70])
def test_matmul_float_weights(isa, wtype, n_tok, k):
    """Every ISA's float-weight tiles (rows x tokens, a row tail, a k that is no multiple of 8) against numpy."""
    rows = 33
    wdata, wf = _float_weights(RNG.standard_normal((rows, k)).astype(np.float32), wtype)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)
    eng, y = run_single(lambda b: b.matmul(b.weight("w", int(wtype), k, rows, wdata),
                                           b.weight("x", int(DType.F32), k, n_tok, x), "y"), n_tok, isa)
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), x @ wf.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_q8a_blocks(isa):
    n_tok, k = 3, 96
    x = (RNG.standard_normal((n_tok, k)) * 3).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block must give d = 0, q = 0
    eng, q8 = run_single(lambda b: b.quantize(b.weight("x", int(DType.F32), k, n_tok, x)), n_tok, isa)
    raw = eng.tensor(q8.id, n_tok).reshape(n_tok, k // 32, 40)
    d = raw[..., :4].copy().view(np.float32)[..., 0]
    s = raw[..., 4:8].copy().view(np.float32)[..., 0]
    qs = raw[..., 8:].view(np.int8).astype(np.int32)
    q_ref, d_ref = q8a_reference(x)
    np.testing.assert_array_equal(qs, q_ref)
    np.testing.assert_allclose(d, d_ref[..., 0], rtol=1e-7)
    np.testing.assert_allclose(s, d_ref[..., 0] * q_ref.sum(-1), rtol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
def test_rms_norm_add_silu_mul(isa):
    n_tok, k = 4, 80
    a = RNG.standard_normal((n_tok, k)).astype(np.float32)
    c = RNG.standard_normal((n_tok, k)).astype(np.float32)
    g = RNG.standard_normal(k).astype(np.float32)

    def build(b):
        A = b.weight("a", int(DType.F32), k, n_tok, a)
        C = b.weight("c", int(DType.F32), k, n_tok, c)
        G = b.weight("g", int(DType.F32), k, 1, g)
        n = b.rms_norm(A, G, 1e-5, "n")
        s = b.add(A, C, name="s")
        m = b.gated_mul(A, C, name="m")
        return n, s, m

    eng, (n, s, m) = run_single(build, n_tok, isa)
    want_n = a / np.sqrt((a.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(eng.tensor(n.id, n_tok), want_n, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(eng.tensor(s.id, n_tok), a + c, rtol=1e-6)
    np.testing.assert_allclose(eng.tensor(m.id, n_tok), a / (1 + np.exp(-a)) * c, rtol=1e-5, atol=1e-6)


def test_rms_norm_rounds_as_llamacpp():
    """Bit for bit ggml's rms_norm then its mul: float squares summed in double, a float mean, a float scale, x times
    it, times the weight. The norm's output is quantized next; an ulp apart can flip an 8-bit value there."""
    n_tok, k = 16, 256
    a = (RNG.standard_normal((n_tok, k)) * np.geomspace(1e-3, 1e3, n_tok)[:, None]).astype(np.float32)
    g = RNG.standard_normal(k).astype(np.float32)
    eng, n = run_single(lambda b: b.rms_norm(b.weight("a", int(DType.F32), k, n_tok, a),
                                             b.weight("g", int(DType.F32), k, 1, g), 1e-6, "n"), n_tok, "auto")
    mean = (np.cumsum((a * a).astype(np.float64), axis=-1)[:, -1] / k).astype(np.float32)  # summed in order
    scale = np.float32(1) / np.sqrt(mean + np.float32(1e-6))
    np.testing.assert_array_equal(eng.tensor(n.id, n_tok), (a * scale[:, None]) * g)


@pytest.mark.parametrize("isa", ISAS)
def test_rope_matches_reference(isa):
    from support.reference_llama import rope

    n_tok, heads, hd = 5, 3, 16
    x = RNG.standard_normal((n_tok, heads * hd)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 2047], dtype=np.int32)

    def build(b):
        X = b.weight("x", int(DType.F32), heads * hd, n_tok, x.copy())
        y = b.add(X, b.weight("z", int(DType.F32), heads * hd, n_tok, np.zeros_like(x)), name="y")
        return b.rope(y, b.weight("p", int(DType.I32), 1, n_tok, pos), heads, hd, 10000.0)

    eng, y = run_single(build, n_tok, isa)
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), rope(x, pos, heads, hd, 10000.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_get_rows_and_select_rows(isa):
    vocab, k = 40, 64
    table = RNG.standard_normal((vocab, k)).astype(np.float32)
    tq = quants.quantize(table, Q.Q8_0)
    ids = np.array([3, 0, 39, 3], dtype=np.int32)
    pick = np.array([2, 0], dtype=np.int32)

    def build(b):
        T = b.weight("t", int(Q.Q8_0), k, vocab, tq)
        e = b.get_rows(T, b.weight("ids", int(DType.I32), 1, 4, ids), "e")
        out_ids = b.input("o", RowMode.OUTPUTS)
        b.graph.input_out_ids = out_ids.id
        return e, b.select_rows(e, out_ids, "sel")

    b = GraphBuilder()
    e, sel = build(b)
    b.graph.pin(e.id)
    b.graph.pin(sel.id)
    eng = _core.Engine(b.graph, max_tokens=8, max_outputs=8, n_threads=2, isa=isa)
    eng.run(4, out_ids=pick)
    deq = quants.dequantize(tq, Q.Q8_0).reshape(vocab, k)
    np.testing.assert_array_equal(eng.tensor(e.id, 4), deq[ids])
    np.testing.assert_array_equal(eng.tensor(sel.id, 2), deq[ids][pick])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n_tok", [1, 6])
def test_kv_store_and_attention(isa, n_tok):
    from support.reference_llama import attention

    heads, kv_heads, hd, n_ctx = 6, 2, 32, 16
    q = RNG.standard_normal((n_tok, heads * hd)).astype(np.float32)
    k = RNG.standard_normal((n_tok, kv_heads * hd)).astype(np.float32)
    v = RNG.standard_normal((n_tok, kv_heads * hd)).astype(np.float32)
    pos = np.arange(n_tok, dtype=np.int32)

    def build(b):
        P = b.weight("p", int(DType.I32), 1, n_tok, pos)
        kc = b.state("kc", kv_heads * hd, n_ctx)
        vc = b.state("vc", kv_heads * hd, n_ctx)
        b.kv_store(kc, b.weight("k", int(DType.F32), kv_heads * hd, n_tok, k), P)
        b.kv_store(vc, b.weight("v", int(DType.F32), kv_heads * hd, n_tok, v), P)
        return b.attention(b.weight("q", int(DType.F32), heads * hd, n_tok, q), kc, vc, P, heads, kv_heads, hd, "o")

    eng, o = run_single(build, n_tok, isa)
    # The cache is fp16: round K and V the same way in the reference.
    k16, v16 = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(eng.tensor(o.id, n_tok), attention(q, k16, v16, heads, kv_heads, hd),
                               rtol=1e-4, atol=1e-5)


def test_bad_graph_and_run_inputs_raise_valueerror():
    b = GraphBuilder()
    x = b.weight("x", int(DType.F32), 64, 2, np.zeros((2, 64), np.float32))
    w = b.weight("w", int(DType.F32), 32, 8, np.zeros((8, 32), np.float32))  # wrong K
    b.graph.add_node(_core.Op.MAT_MUL, b.activation("y", 8).id, {"weight": w.id, "x": x.id})
    with pytest.raises(ValueError, match="columns"):
        _core.Engine(b.graph)
    with pytest.raises(ValueError, match="mat_mul has no source 'w'; its sources: weight, x, active"):
        b.graph.add_node(_core.Op.MAT_MUL, b.activation("y2", 8).id, {"w": w.id, "x": x.id})
    with pytest.raises(ValueError, match="rope has no parameter 'theta'; its parameters: heads, head_dim, mode, base"):
        b.graph.add_node(_core.Op.ROPE, b.activation("y3", 8).id, {"x": x.id}, {"theta": 1e4})
    assert _core.op_signature(_core.Op.DOWN_AXPY)["sources"] == ["down", "act", "active", "scales", "row_map",
                                                                 "union_list"]
    assert ("scale", "float") in _core.op_signature(_core.Op.ATTENTION)["params"]
    with pytest.raises(ValueError, match="not available"):
        _core.Engine(GraphBuilder().graph, isa="no-such-isa")
    with pytest.raises(ValueError, match="bytes"):
        GraphBuilder().weight("w", int(DType.Q4_1), 64, 4, np.zeros(10, np.uint8))


def test_silu_mul_is_within_two_ulp_of_float64():
    """The dense FFN's SiLU (a polynomial exp, the same bits on every table) against float64, from the clamp
    (|g| > 87) inward."""
    g = np.concatenate([np.linspace(-100, 100, 4001), RNG.standard_normal(4000) * 6]).astype(np.float32)[None, :]
    u = np.ones_like(g)
    want = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64)))
    for isa in ISAS:
        eng, y = run_single(lambda b: b.gated_mul(b.weight("g", int(DType.F32), g.shape[1], 1, g),
                                                  b.weight("u", int(DType.F32), g.shape[1], 1, u), act=0), 1, isa)
        got = eng.tensor(y.id, 1).astype(np.float64)
        big = np.abs(want) > 1e-30
        assert np.max(np.abs(got[big] - want[big]) / np.abs(want[big])) < 2.5e-7, isa


@pytest.mark.parametrize("act", [0, 1, 2, 3, 4])
def test_gated_activations_match_numpy_and_agree_across_isas(act):
    """SiLU, ReLU, GELU(tanh, through the fp16 table), ReLU^2 and dReLU; every ISA gives the same values."""
    n_tok, k = 3, 203  # a tail after the 8-wide SIMD loop
    g = (RNG.standard_normal((n_tok, k)) * 4).astype(np.float32)
    g[0, :4] = [-11.0, 11.0, -10.0, 10.0]  # the table's edges
    u = RNG.standard_normal((n_tok, k)).astype(np.float32)
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
    want = {0: g / (1 + np.exp(-g)) * u, 1: np.maximum(g, 0) * u, 2: gelu * u, 3: np.maximum(g, 0) ** 2 * u,
            4: np.maximum(g, 0) * np.maximum(u, 0)}[act]
    outs = []
    for isa in ISAS:
        eng, y = run_single(lambda b: b.gated_mul(b.weight("g", int(DType.F32), k, n_tok, g),
                                                  b.weight("u", int(DType.F32), k, n_tok, u), act=act), n_tok, isa)
        outs.append(eng.tensor(y.id, n_tok))
        np.testing.assert_allclose(outs[-1], want, rtol=2e-3, atol=2e-3)  # GELU: inputs rounded to fp16
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
