"""The neuron-aware ops against numpy, for every kernel ISA this CPU can run."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.model.config import Activation
from pyinfer.runtime.graph_builder import single_op_engine

ISAS = _core.available_isas().split(",")
RNG = np.random.default_rng(7)


def active_lists(scores: np.ndarray, thr: float) -> list[np.ndarray]:
    return [np.flatnonzero(np.abs(s) > thr) for s in scores]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.Q4_1, Q.Q8_0, Q.F32])
@pytest.mark.parametrize("density", [1.0, 0.5, 0.05, 0.0])
def test_gather_matmul_writes_only_listed_rows(isa, wtype, density):
    rows, k, n_tok = 101, 96, 2
    w = RNG.standard_normal((rows, k)).astype(np.float32)
    wq = w if wtype == Q.F32 else quants.quantize(w, wtype)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)
    s = (RNG.random((n_tok, rows)) < density).astype(np.float32) * 2.0

    def build(b):
        W = b.weight("w", int(wtype), k, rows, wq)
        dense = b.matmul(W, b.weight("x", int(DType.F32), k, n_tok, x), "dense")
        act = b.active_set(b.weight("s", int(DType.F32), rows, n_tok, s), rows, "act", threshold=1.0)
        X = b.weight("x2", int(DType.F32), k, n_tok, x)
        return dense, act, b.matmul(W, X, "y", active=act)

    eng, (dense, act, y) = single_op_engine(build, max_tokens=4, n_threads=2, isa=isa)
    eng.run(n_tok)
    got, ref, lists = eng.tensor(y.id, n_tok), eng.tensor(dense.id, n_tok), eng.tensor(act.id, n_tok)
    for t, ids in enumerate(active_lists(s, 1.0)):
        assert lists[t, 0] == len(ids)
        np.testing.assert_array_equal(lists[t, 1:1 + len(ids)], ids)
        np.testing.assert_array_equal(got[t, ids], ref[t, ids])  # the same dot products as dense


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.Q4_1, Q.F32, Q.F16])
@pytest.mark.parametrize("density", [1.0, 0.3, 0.0])
def test_down_axpy_matches_numpy(isa, wtype, density):
    n_ff, d, n_tok = 70, 96, 3
    wt = RNG.standard_normal((n_ff, d)).astype(np.float32)
    if wtype == Q.F32:
        wdata, wd = wt, wt
    elif wtype == Q.F16:
        wdata = wt.astype(np.float16)
        wd = wdata.astype(np.float32)
    else:
        wdata = quants.quantize(wt, wtype)
        wd = quants.dequantize(wdata, wtype).reshape(n_ff, d)
    a = (RNG.standard_normal((n_tok, n_ff)) * (RNG.random((n_tok, n_ff)) < density)).astype(np.float32)

    def build(b):
        A = b.weight("a", int(DType.F32), n_ff, n_tok, a)
        act = b.active_set(A, n_ff, "act", threshold=0.0)
        return b.down_axpy(b.weight("w", int(wtype), d, n_ff, wdata), A, act)

    eng, y = single_op_engine(build, max_tokens=4, n_threads=2, isa=isa)
    eng.run(n_tok)
    want = a @ wd
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=1e-5, atol=1e-4 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("relu", [False, True])
def test_gated_act_and_active_set_modes(relu):
    n_ff, n_tok = 64, 2
    g = RNG.standard_normal((n_tok, n_ff)).astype(np.float32)
    u = RNG.standard_normal((n_tok, n_ff)).astype(np.float32)
    cut = RNG.standard_normal((1, n_ff - 8)).astype(np.float32)
    logits = RNG.standard_normal((n_tok, n_ff - 8)).astype(np.float32)

    def build(b):
        G = b.weight("g", int(DType.F32), n_ff, n_tok, g)
        U = b.weight("u", int(DType.F32), n_ff, n_tok, u)
        gate = b.add(G, b.weight("zero", int(DType.F32), n_ff, n_tok, np.zeros_like(g)), name="gate")
        pred = b.active_set(b.weight("l", int(DType.F32), n_ff - 8, n_tok, logits), n_ff, "pred",
                            cut=b.weight("c", int(DType.F32), n_ff - 8, 1, cut), hot=8)
        cats = b.active_set(G, n_ff, "cats", threshold=0.2, gate_act=Activation.SILU)
        cats_gelu = b.active_set(G, n_ff, "cats_gelu", threshold=0.1, gate_act=Activation.GELU_TANH)
        b.gated_act(gate, U, pred, 0.1, act=int(relu))
        return gate, pred, cats, cats_gelu

    eng, (gate, pred, cats, cats_gelu) = single_op_engine(build, max_tokens=4, n_threads=2)
    eng.run(n_tok)
    act = (np.maximum(g, 0) if relu else g / (1 + np.exp(-g))) * u
    for t in range(n_tok):
        ids = np.concatenate([np.arange(8), 8 + np.flatnonzero(logits[t] > cut[0])])
        lst = eng.tensor(pred.id, n_tok)[t]
        np.testing.assert_array_equal(lst[1:1 + lst[0]], ids)
        want = np.where(np.abs(act[t, ids]) > 0.1, act[t, ids], 0)
        np.testing.assert_allclose(eng.tensor(gate.id, n_tok)[t, ids], want, rtol=1e-5, atol=1e-6)
        c = eng.tensor(cats.id, n_tok)[t]
        np.testing.assert_array_equal(c[1:1 + c[0]], np.flatnonzero(np.abs(g[t] / (1 + np.exp(-g[t]))) > 0.2))
        c = eng.tensor(cats_gelu.id, n_tok)[t]  # GELU's lobe bottoms out at -0.17: a cut of 0.1 crosses it
        gelu = 0.5 * g[t] * (1 + np.tanh(0.7978845608 * (g[t] + 0.044715 * g[t] ** 3)))
        np.testing.assert_array_equal(c[1:1 + c[0]], np.flatnonzero(np.abs(gelu) > 0.1))


def test_bad_permutation_is_refused():
    def build(b):
        x = b.weight("x", int(DType.F32), 4, 1, np.ones((1, 4), np.float32))
        return b.scatter_cols(x, b.weight("p", int(DType.I32), 4, 1, np.array([[0, 1, 2, 9]], np.int32)), "y")

    with pytest.raises(ValueError, match="permutation"):
        single_op_engine(build)


def q4t_axpy_reference(a: np.ndarray, nibbles: np.ndarray, scales: np.ndarray, d: int) -> np.ndarray:
    """y = a @ down through a Q4T down as every ISA computes it: per token and 32-neuron group, the group's
    nonzero activations as two int8 digits (c ~= d q + d_lo q_lo, d = amax / 127, d_lo = d / 254, rounded half
    to even, in float32), their integer dots with each column's nibbles, then scale * (d dot + d_lo dot_lo) +
    offset * (sum of the float activations)."""
    n_ff = a.shape[1]
    q = np.stack([nibbles.reshape(n_ff, d // 32, 16) & 15, nibbles.reshape(n_ff, d // 32, 16) >> 4], 2)
    q = q.reshape(n_ff, d).astype(np.int64)
    sc = scales.astype(np.float64)
    y = np.zeros((a.shape[0], d))
    for t in range(a.shape[0]):
        for g in range(n_ff // 32):
            c = a[t, 32 * g:32 * g + 32].astype(np.float32)
            amax = np.abs(c).max()
            if amax == 0:
                continue
            inv = np.float32(127) / amax
            dq = amax / np.float32(127)
            qc = np.rint(c * inv)
            rest = (c.astype(np.float64) - qc.astype(np.float64) * float(dq)).astype(np.float32)  # one rounding: fma
            q_lo = np.clip(np.rint(rest * (inv * np.float32(254))), -127, 127)
            nib = q[32 * g:32 * g + 32]
            dot = qc.astype(np.int64) @ nib * float(dq) + q_lo.astype(np.int64) @ nib * float(dq / np.float32(254))
            y[t] += sc[g, :d] * dot + sc[g, d:] * float(c.astype(np.float64).sum())
    return y


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("src_type", [Q.Q4_1, Q.Q4_0])
def test_q4t_down_is_lossless_and_matches_numpy(isa, src_type):
    from pyinfer.runtime.sparse_ffn import q4t_from_blocks

    d, n_ff, n_tok = 96, 128, 2
    w = RNG.standard_normal((d, n_ff)).astype(np.float32)          # down [d, n_ff]
    blocks = quants.quantize(w, src_type)
    wd = quants.dequantize(blocks, src_type).reshape(d, n_ff)
    nibbles, scales = q4t_from_blocks(blocks, src_type.name, d, n_ff)
    # lossless: rebuild every neuron's column from the neuron-major form
    q = np.stack([nibbles.reshape(n_ff, d // 32, 16) & 15, nibbles.reshape(n_ff, d // 32, 16) >> 4], 2)
    q = q.reshape(n_ff, d).astype(np.float32)
    g = np.arange(n_ff) // 32
    rebuilt = scales[g, :d].astype(np.float32) * q + scales[g, d:].astype(np.float32)
    np.testing.assert_allclose(rebuilt, wd.T, rtol=1e-6, atol=1e-6)

    a = (RNG.standard_normal((n_tok, n_ff)) * (RNG.random((n_tok, n_ff)) < 0.4)).astype(np.float32)
    perm = RNG.permutation(n_ff).astype(np.int32)                  # list ids are permuted neuron ids

    def build(b):
        A = b.weight("a", int(DType.F32), n_ff, n_tok, np.ascontiguousarray(a[:, perm]))  # permuted order
        act = b.active_set(A, n_ff, "act", threshold=0.0)
        return b.down_axpy(b.weight("w", int(DType.Q4T), d, n_ff, nibbles), A, act,
                           scales=b.weight("s", int(DType.F16), 2 * d, n_ff // 32, scales),
                           row_map=b.weight("m", int(DType.I32), n_ff, 1, perm))

    eng, y = single_op_engine(build, max_tokens=4, n_threads=2, isa=isa)
    eng.run(n_tok)
    got, want = eng.tensor(y.id, n_tok), q4t_axpy_reference(a, nibbles, scales, d)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    exact = a @ wd.T  # two int8 digits: as good as float coefficients
    assert np.abs(got - exact).max() < 1e-4 * np.abs(exact).max()

    # The integer sums' worst case: every neuron of every group active, all at the group's largest coefficient,
    # and the largest nibbles (a column's sum is then 32 * 127 * 15, more than 16 bits hold).
    full = np.ones((1, n_ff), np.float32)
    nib15 = np.full_like(nibbles, 0xff)

    def build_full(b):
        A = b.weight("a", int(DType.F32), n_ff, 1, full)
        act = b.active_set(A, n_ff, "act", threshold=0.0)
        return b.down_axpy(b.weight("w", int(DType.Q4T), d, n_ff, nib15), A, act,
                           scales=b.weight("s", int(DType.F16), 2 * d, n_ff // 32, scales))

    eng, y = single_op_engine(build_full, max_tokens=1, n_threads=2, isa=isa)
    eng.run(1)
    want = q4t_axpy_reference(full, nib15, scales, d)
    np.testing.assert_allclose(eng.tensor(y.id, 1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_q4t_down_axpy_is_the_same_bits_on_every_isa():
    """The Q4T axpy sums in integers and ends in the same fused multiply-adds on every ISA."""
    from pyinfer.runtime.sparse_ffn import q4t_from_blocks

    d, n_ff = 256, 512
    rng = np.random.default_rng(5)
    nib, sc = q4t_from_blocks(quants.quantize(rng.standard_normal((d, n_ff)).astype(np.float32), Q.Q4_1), "Q4_1",
                              d, n_ff)
    a = (rng.standard_normal((3, n_ff)) * (rng.random((3, n_ff)) < 0.6)).astype(np.float32)

    def build(b):
        A = b.weight("a", int(DType.F32), n_ff, 3, a)
        act = b.active_set(A, n_ff, "act", threshold=0.0)
        return b.down_axpy(b.weight("w", int(DType.Q4T), d, n_ff, nib), A, act,
                           scales=b.weight("s", int(DType.F16), 2 * d, n_ff // 32, sc))

    outs = []
    for isa in ISAS:
        eng, y = single_op_engine(build, max_tokens=4, n_threads=2, isa=isa)
        eng.run(3)
        outs.append(eng.tensor(y.id, 3).copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", [Q.Q8_0, Q.F32, "q4t"])
def test_batched_down_axpy_tiles_and_chunks_match_numpy(isa, wtype):
    """Enough rows that the column tiles are narrower than a thread's slice, and more tokens than one
    chunk of compacted lists."""
    from pyinfer.runtime.sparse_ffn import q4t_from_blocks

    n_ff, d, n_tok = 4096, 512, 20
    rng = np.random.default_rng(11)
    w = rng.standard_normal((d, n_ff)).astype(np.float32)            # down [d, n_ff]
    a = (rng.standard_normal((n_tok, n_ff)) * (rng.random((n_tok, n_ff)) < 0.3)).astype(np.float32)
    perm = rng.permutation(n_ff).astype(np.int32)

    def build(b):
        A = b.weight("a", int(DType.F32), n_ff, n_tok, np.ascontiguousarray(a[:, perm] if wtype == "q4t" else a))
        act = b.active_set(A, n_ff, "act", threshold=0.0)
        if wtype == "q4t":
            nib, sc = q4t_from_blocks(quants.quantize(w, Q.Q4_1), "Q4_1", d, n_ff)
            return b.down_axpy(b.weight("w", int(DType.Q4T), d, n_ff, nib), A, act,
                               scales=b.weight("s", int(DType.F16), 2 * d, n_ff // 32, sc),
                               row_map=b.weight("m", int(DType.I32), n_ff, 1, perm))
        wt = np.ascontiguousarray(w.T)
        data = wt if wtype == Q.F32 else quants.quantize(wt, wtype)
        return b.down_axpy(b.weight("w", int(wtype), d, n_ff, data), A, act)

    if wtype == "q4t":
        wd = None
    elif wtype == Q.F32:
        wd = w.T
    else:
        wd = quants.dequantize(quants.quantize(np.ascontiguousarray(w.T), wtype), wtype).reshape(n_ff, d)
    eng, y = single_op_engine(build, max_tokens=32, n_threads=2, isa=isa)
    eng.run(n_tok)
    if wd is None:
        want = q4t_axpy_reference(a, *q4t_from_blocks(quants.quantize(w, Q.Q4_1), "Q4_1", d, n_ff), d)
    else:
        want = a @ wd
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def union_graph(scores: np.ndarray, w: np.ndarray, x: np.ndarray, max_tokens: int, max_density: float,
                max_union: float, max_single: float):
    """Active lists from scores, their union, a gather over the union, and one node per path writing
    the same tensor (SiLU * up on the sparse path, ReLU * up on the dense one)."""
    from pyinfer.runtime.graph_builder import Guard

    n_tok, n_ff = scores.shape

    def build(b):
        S = b.weight("s", int(DType.F32), n_ff, n_tok, scores)
        lists = b.active_set(S, n_ff, "lists", threshold=1.0, run_if=Guard(max_tokens=max_tokens))
        union = b.active_union(lists, n_ff, "union", max_tokens, max_density, max_union, max_single)
        W = b.weight("w", int(DType.Q8_0), w.shape[1], n_ff, quants.quantize(w, Q.Q8_0))
        X = b.weight("x", int(DType.F32), x.shape[1], n_tok, x)
        dense = b.matmul(W, X, "dense")
        gathered = b.matmul(W, X, "gathered", active=union)
        path = b.activation("path", n_ff)
        b.gated_mul(S, S, out=path, run_if=Guard(when=union))
        b.gated_mul(S, S, out=path, act=1, run_if=Guard(when=union, sparse=False))
        return lists, union, dense, gathered, path

    return single_op_engine(build, max_tokens=8, n_threads=2)


@pytest.mark.parametrize("case", ["sparse", "too_many_tokens", "lists_too_dense", "union_too_dense",
                                  "single_sparse", "single_too_dense"])
def test_active_union_picks_the_path(case):
    n_tok, n_ff, k = (1 if case.startswith("single") else 4), 96, 64
    rng = np.random.default_rng(5)
    scores = (rng.random((n_tok, n_ff)) < 0.2).astype(np.float32) * 2.0  # ~20% per token, ~60% union
    w = rng.standard_normal((n_ff, k)).astype(np.float32)
    x = rng.standard_normal((n_tok, k)).astype(np.float32)
    # (max tokens, mean density, union density, one token's density)
    limits = {"sparse": (4, 0.5, 0.9, 0.0), "too_many_tokens": (3, 0.5, 0.9, 1.0),
              "lists_too_dense": (4, 0.1, 0.9, 1.0), "union_too_dense": (4, 0.5, 0.3, 1.0),
              "single_sparse": (4, 0.0, 0.0, 0.5), "single_too_dense": (4, 1.0, 1.0, 0.1)}[case]
    eng, (lists, union, dense, gathered, path) = union_graph(scores, w, x, *limits)
    eng.run(n_tok)
    u = eng.tensor(union.id, 1)[0]
    silu = scores * scores / (1 + np.exp(-scores))
    if case not in ("sparse", "single_sparse"):
        assert u[0] == -1
        np.testing.assert_allclose(eng.tensor(path.id, n_tok), np.maximum(scores, 0) * scores)
        return
    want = np.flatnonzero((scores > 1.0).any(axis=0))
    assert u[0] == len(want)
    np.testing.assert_array_equal(u[1:1 + u[0]], want)
    # one gather over the union serves every token: the listed rows equal the dense dot products
    np.testing.assert_array_equal(eng.tensor(gathered.id, n_tok)[:, want], eng.tensor(dense.id, n_tok)[:, want])
    np.testing.assert_allclose(eng.tensor(path.id, n_tok), silu, rtol=1e-6)


def test_when_list_must_come_from_an_earlier_union():
    from pyinfer.runtime.graph_builder import Guard

    def build(b):
        S = b.weight("s", int(DType.F32), 32, 1, np.ones((1, 32), np.float32))
        bogus = b.state("not_a_union", 33, 1, DType.I32)
        return b.gated_mul(S, S, run_if=Guard(when=bogus))

    with pytest.raises(ValueError, match="ActiveUnion"):
        single_op_engine(build)

    def self_guarded(b):  # a union may not be guarded by its own result
        S = b.weight("s", int(DType.F32), 32, 1, np.ones((1, 32), np.float32))
        lists = b.active_set(S, 32, "lists")
        u = b.state("u", 33, 1, DType.I32)
        b.graph.add_node(_core.Op.ACTIVE_UNION, u.id, {"lists": lists.id},
                         {"n_ff": 32, "max_tokens": 4, "max_density": 1.0, "max_union": 1.0, "max_single": 1.0},
                         when_list=u.id)
        return u

    with pytest.raises(ValueError, match="ActiveUnion"):
        single_op_engine(self_guarded)


# Load-time repacking of a down matrix (kernels/repack.cpp) against gguf's numpy decode, transpose and Q8_0
# quantization: the same bytes for every weight type, and one-line errors for bad input.
@pytest.mark.parametrize("qtype", ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_neuron_major_repack_equals_numpy(qtype):
    from support.tiny_model import random_blocks

    rng = np.random.default_rng(3)
    rows, cols, qt = 64, 512, Q[qtype]
    if qtype in ("F32", "F16"):
        raw = rng.standard_normal((rows, cols)).astype(np.float32 if qtype == "F32" else np.float16)
    elif qtype in ("Q4_0", "Q4_1", "Q8_0"):
        raw = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qt)
    else:
        raw = random_blocks(qt, rows, cols, rng)
    raw = np.asarray(raw).view(np.uint8).reshape(rows, -1)
    perm = rng.permutation(cols)[:300].astype(np.int32)
    want = np.ascontiguousarray(quants.dequantize(raw, qt).reshape(rows, cols).T[perm], dtype=np.float32)
    got = _core.neuron_major(raw, getattr(DType, qtype), cols, perm, DType.F32, 3).view(np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(_core.neuron_major(raw, getattr(DType, qtype), cols, perm, DType.Q8_0, 2),
                                  quants.quantize(want, Q.Q8_0))
    with pytest.raises(_core.GraphError, match="out of range"):
        _core.neuron_major(raw, getattr(DType, qtype), cols, np.array([cols], np.int32), DType.F32)
    with pytest.raises(_core.GraphError, match="bytes, not"):
        _core.neuron_major(raw[:, :-2], getattr(DType, qtype), cols, perm, DType.F32)
