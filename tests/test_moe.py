"""Mixture of Experts: the three ops (MoeRoute, MoeMatMul, MoeCombine) against numpy and against the plain
matmul on each expert's rows, for every kernel ISA this CPU runs; then qwen3moe, Mixtral (llama with experts)
and qwen2moe (a shared expert) against the numpy reference forward (tests/reference_llama.py), decode against
prefill, and the refusals. bench/arch_check.py runs the same tiny models against llama.cpp itself."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import pyinfer
from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from support.reference_llama import reference_logits
from support.tiny_model import MOE_KINDS, random_k_blocks, write_tiny_arch

ISAS = _core.available_isas().split(",")
RNG = np.random.default_rng(26)
IDS = list(range(3, 51))  # 48 positions


def route_reference(logits: np.ndarray, k: int, norm: bool, sigmoid: bool = False, scale: float = 0.0,
                    bias: np.ndarray | None = None):
    """(weights [T, k], ids [T, k]): the top k of softmax (or sigmoid) of the logits (plus `bias` for choosing
    only), best first."""
    probs = 1 / (1 + np.exp(-logits)) if sigmoid else np.exp(logits - logits.max(-1, keepdims=True))
    if not sigmoid:
        probs /= probs.sum(-1, keepdims=True)
    ids = np.argsort(-(probs if bias is None else probs + bias), -1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, -1)
    if norm:
        w /= np.maximum(w.sum(-1, keepdims=True), 6.103515625e-5)
    return w * (scale or 1.0), ids


@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("norm", [False, True])
def test_route_picks_the_top_k(norm, sigmoid, biased):
    """With a selection bias (GLM-4.5's exp_probs_b) the experts are chosen by probability plus bias and weighted
    by the probability alone."""
    n_tok, n_exp, k = 9, 16, 4
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32) * 3
    bias = (RNG.standard_normal((1, n_exp)) * 0.5).astype(np.float32) if biased else None

    def build(b):
        x = b.weight("logits", int(DType.F32), n_exp, n_tok, logits)
        bt = b.weight("bias", int(DType.F32), n_exp, 1, bias) if biased else None
        return b.moe_route(x, k, norm=norm, gating=int(sigmoid), scale=2.5, bias=bt)

    eng, route = single_op_engine(build, max_tokens=n_tok, n_threads=2)
    eng.run(n_tok)
    got = eng.tensor(route.id, n_tok)
    w, ids = route_reference(logits.astype(np.float64), k, norm, sigmoid, 2.5, bias)
    if biased:  # the bias changes some choices: the test is not the unbiased one again
        assert (ids != route_reference(logits.astype(np.float64), k, norm, sigmoid, 2.5)[1]).any()
    np.testing.assert_array_equal(got[:, k:], ids)
    np.testing.assert_allclose(got[:, :k], w, rtol=1e-5)


def test_route_softmax_of_the_chosen():
    """gpt-oss's gating: the top k logits, then the softmax over those k only."""
    n_tok, n_exp, k = 7, 32, 4
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32) * 3

    def build(b):
        return b.moe_route(b.weight("logits", int(DType.F32), n_exp, n_tok, logits), k, norm=False, gating=2)

    eng, route = single_op_engine(build, max_tokens=n_tok, n_threads=2)
    eng.run(n_tok)
    got = eng.tensor(route.id, n_tok)
    ids = np.argsort(-logits, -1, kind="stable")[:, :k]
    top = np.take_along_axis(logits.astype(np.float64), ids, -1)
    w = np.exp(top - top[:, :1])
    np.testing.assert_array_equal(got[:, k:], ids)
    np.testing.assert_allclose(got[:, :k], w / w.sum(-1, keepdims=True), rtol=1e-6)


def test_route_survives_nan_and_infinite_logits():
    """A NaN logit is never chosen over a number; a row with no usable logit gets equal weights, not NaN."""
    logits = np.array([[np.nan, 1.0, 3.0, 2.0], [np.nan] * 4, [np.inf, np.inf, 0, 0]], np.float32)

    def build(b):
        return b.moe_route(b.weight("logits", int(DType.F32), 4, 3, logits), 2)

    eng, route = single_op_engine(build, max_tokens=3)
    eng.run(3)
    got = eng.tensor(route.id, 3)
    assert list(got[0, 2:]) == [2, 3] and np.isfinite(got).all()
    np.testing.assert_allclose(got[1, :2], [0.5, 0.5])
    assert set(got[1, 2:]).issubset(range(4)) and set(got[2, 2:]).issubset(range(4))


def _expert_weights(qtype: Q, n_exp: int, rows: int, cols: int) -> np.ndarray:
    """Raw blocks of n_exp experts of [rows, cols], merged as GGUF stores them: [n_exp * rows, row bytes]."""
    if qtype in (Q.Q4_K, Q.Q6_K):
        return random_k_blocks(qtype, n_exp * rows, cols, RNG)
    w = RNG.standard_normal((n_exp * rows, cols)).astype(np.float32) * 0.3
    return w if qtype == Q.F32 else quants.quantize(w, qtype)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("n_tok", [1, 2, 13])
@pytest.mark.parametrize("per_slot", [False, True])
@pytest.mark.parametrize("n_threads", [2, 3])
def test_expert_matmul_equals_the_plain_matmul_on_each_chosen_expert(isa, qtype, n_tok, per_slot, n_threads):
    """Slot s of token t is exactly what MatMul gives on expert route[t].id[s]'s rows (the same kernel on the
    same bytes), whether a token runs alone (decode) or its expert's tokens are gathered (prefill); `per_slot`:
    each slot reads its own segment of x (the down projection). Threads split the chosen experts' rows laid end
    to end, so their cuts fall inside experts (40 rows, cut on 16-row boundaries)."""
    n_exp, k, rows, cols = 6, 3, 40, 256
    w = _expert_weights(qtype, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, k * cols if per_slot else cols)).astype(np.float32)
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32)

    def build(b):
        W = b.weight("experts", int(qtype), cols, n_exp * rows, w)
        X = b.weight("x", int(DType.F32), x.shape[1], n_tok, x)
        route = b.moe_route(b.weight("logits", int(DType.F32), n_exp, n_tok, logits), k)
        experts = [b.view(W, f"e{e}", rows=rows, row_offset=e * rows) for e in range(n_exp)]
        segments = [b.view(X, f"x{s}", cols=cols, col_offset=s * cols) for s in range(k)] if per_slot else [X] * k
        plain = tuple(b.matmul(experts[e], segments[s], f"plain{e}.{s}") for e in range(n_exp) for s in range(k))
        return (route, b.moe_matmul(W, X, route, n_exp, k, "moe")) + plain

    eng, (route, got, *plain) = single_op_engine(build, max_tokens=n_tok, n_threads=n_threads, isa=isa)
    eng.run(n_tok)
    ids = eng.tensor(route.id, n_tok)[:, k:].astype(int)
    y = eng.tensor(got.id, n_tok).reshape(n_tok, k, rows)
    for t in range(n_tok):
        for s in range(k):
            want = eng.tensor(plain[ids[t, s] * k + s].id, n_tok)[t]
            np.testing.assert_array_equal(y[t, s], want, err_msg=f"token {t} slot {s}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_0, Q.Q4_K])
@pytest.mark.parametrize("n_tok", [1, 3])
@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("gate_fn", [1, 2])
def test_a_gate_cut_expert_matmul_computes_only_the_rows_that_pass(isa, qtype, n_tok, n_threads, gate_fn):
    """CATS inside the experts: a one-token run computes exactly the rows whose |act(gate)| passes their expert's
    cut (the plain matmul's numbers) and leaves the others 0; runs of more tokens compute every row."""
    n_exp, k, rows, cols = 6, 3, 40, 256
    w = _expert_weights(qtype, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, cols)).astype(np.float32)
    gate = RNG.standard_normal((n_tok, k * rows)).astype(np.float32)
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32)
    thr = RNG.uniform(0.05, 0.6, n_exp).astype(np.float32)
    bounds = _core.gate_cut_bounds(gate_fn, thr)

    def build(b):
        W = b.weight("experts", int(qtype), cols, n_exp * rows, w)
        X = b.weight("x", int(DType.F32), cols, n_tok, x)
        G = b.weight("gate", int(DType.F32), k * rows, n_tok, gate)
        cut = b.weight("cut", int(DType.F32), 3, n_exp, bounds)
        route = b.moe_route(b.weight("logits", int(DType.F32), n_exp, n_tok, logits), k)
        return (route, b.moe_matmul(W, X, route, n_exp, k, "cut", gate=G, cut=cut, gate_fn=gate_fn),
                b.moe_matmul(W, X, route, n_exp, k, "plain"))

    eng, (route, got, plain) = single_op_engine(build, max_tokens=n_tok, n_threads=n_threads, isa=isa)
    eng.run(n_tok)
    ids = eng.tensor(route.id, n_tok)[:, k:].astype(int)
    y, want = eng.tensor(got.id, n_tok), eng.tensor(plain.id, n_tok)
    if n_tok > 1:
        np.testing.assert_array_equal(y, want)
        return
    act = gate[0] / (1 + np.exp(-gate[0])) if gate_fn == 1 else \
        0.5 * gate[0] * (1 + np.tanh(0.7978845608 * (gate[0] + 0.044715 * gate[0] ** 3)))
    on = np.abs(act) > np.repeat(thr[ids[0]], rows)
    assert 0 < on.sum() < on.size
    np.testing.assert_array_equal(y[0], np.where(on, want[0], 0))


@pytest.mark.parametrize("bad,match", [("no_cut", "together"), ("cut_shape", r"\[n_expert, 3\]"),
                                       ("gate_fn", "gate_fn"), ("gate_cols", "columns"), ("per_slot_x", "one input")])
def test_a_bad_gate_cut_is_refused(bad, match):
    n_exp, k, rows, cols = 4, 2, 8, 32

    def build(b):
        W = b.weight("experts", int(DType.F32), cols, n_exp * rows, np.zeros((n_exp * rows, cols), np.float32))
        X = b.weight("x", int(DType.F32), k * cols if bad == "per_slot_x" else cols, 1,
                     np.zeros((1, k * cols if bad == "per_slot_x" else cols), np.float32))
        route = b.moe_route(b.weight("logits", int(DType.F32), n_exp, 1, np.zeros((1, n_exp), np.float32)), k)
        gc = k * rows + (1 if bad == "gate_cols" else 0)
        G = b.weight("gate", int(DType.F32), gc, 1, np.zeros((1, gc), np.float32))
        n_cut = n_exp + (1 if bad == "cut_shape" else 0)
        cut = None if bad == "no_cut" else b.weight("cut", int(DType.F32), 3, n_cut, np.zeros((n_cut, 3), np.float32))
        return b.moe_matmul(W, X, route, n_exp, k, "y", gate=G, cut=cut, gate_fn=0 if bad == "gate_fn" else 1)

    with pytest.raises(ValueError, match=match):
        single_op_engine(build, max_tokens=1)


def test_gate_cut_bounds_agree_with_the_activation():
    g = np.linspace(-12, 12, 20001).astype(np.float32)
    for fn, act in ((1, g / (1 + np.exp(-g))), (2, 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g ** 3))))):
        for t in (0.01, 0.1, 0.2, 0.5, 2.0):
            hi, lo, mid = _core.gate_cut_bounds(fn, [t])[0]
            on = (g > hi) | ((g > lo) & (g < mid))
            near = np.abs(np.abs(act) - t) < 1e-4  # bisection to float precision: the boundary itself may differ
            assert (on == (np.abs(act) > t))[~near].all()


@pytest.mark.parametrize("shared", [False, True])
def test_combine_weights_the_slots(shared):
    n_tok, k, d = 5, 3, 48
    experts = RNG.standard_normal((n_tok, k * d)).astype(np.float32)
    logits = RNG.standard_normal((n_tok, 8)).astype(np.float32)
    sh = RNG.standard_normal((n_tok, d)).astype(np.float32)
    gate = RNG.standard_normal((n_tok, 1)).astype(np.float32)

    def build(b):
        route = b.moe_route(b.weight("logits", int(DType.F32), 8, n_tok, logits), k)
        e = b.weight("experts", int(DType.F32), k * d, n_tok, experts)
        s = b.weight("shared", int(DType.F32), d, n_tok, sh) if shared else None
        g = b.weight("gate", int(DType.F32), 1, n_tok, gate) if shared else None
        return route, b.moe_combine(e, route, k, shared=s, shared_gate=g)

    eng, (route, y) = single_op_engine(build, max_tokens=n_tok, n_threads=2)
    eng.run(n_tok)
    w = eng.tensor(route.id, n_tok)[:, :k]
    want = np.einsum("ts,tsd->td", w, experts.reshape(n_tok, k, d))
    if shared:
        want += sh / (1 + np.exp(-gate))
    np.testing.assert_allclose(eng.tensor(y.id, n_tok), want, rtol=1e-5, atol=1e-6)


def test_a_route_must_come_from_moe_route():
    """Expert ids index weight memory: a tensor any other op wrote is refused as a route when the graph is built."""
    def build(b):
        W = b.weight("experts", int(DType.F32), 32, 4 * 8, np.zeros((32, 32), np.float32))
        X = b.weight("x", int(DType.F32), 32, 2, np.zeros((2, 32), np.float32))
        fake = b.add(b.weight("r", int(DType.F32), 4, 2, np.zeros((2, 4), np.float32)),
                     b.weight("r2", int(DType.F32), 4, 2, np.zeros((2, 4), np.float32)))
        return b.moe_matmul(W, X, fake, 4, 2, "moe")

    with pytest.raises(ValueError, match="MoeRoute"):
        single_op_engine(build, max_tokens=2)


# ---- whole models --------------------------------------------------------------------------------------
def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return {(k, q): str(write_tiny_arch(d / f"{k}-{q.name}.gguf", k, seed=3, qtype=q))
            for k in MOE_KINDS for q in (Q.F32, Q.Q8_0)}


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_prefill_matches_the_reference(paths, kind):
    """F32: within 1% of the fp32 reference and the same top-1 everywhere, except at positions whose routing
    the reference found within 0.001 of a tie (fp16 KV noise may take the other expert there). SmallThinker's router
    reads the un-normed stream, which carries the cache's fp16 rounding on: its reference rounds K and V alike."""
    m = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, progress=False)
    assert m.config.is_moe and m.config.n_expert == 8 and m.config.n_expert_used == 2
    got = m.eval(IDS, all_logits=True)
    margins: list = []
    ref = reference_logits(m.gguf, IDS, n_ctx=64, margins=margins, cache_fp16=kind == "smallthinker")
    clear = np.min(margins, axis=0) > 1e-3
    assert clear.sum() >= 36
    assert rel_err(got[clear], ref[clear]) < 0.01
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 47 / 48


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_quantized_experts_follow_the_reference(paths, kind):
    """Q8_0 experts also take Q8 activations, which move the routing of near ties: the bar is correlation."""
    m = pyinfer.load(paths[kind, Q.Q8_0], n_ctx=64, n_threads=2, progress=False)
    got, ref = m.eval(IDS, all_logits=True), reference_logits(m.gguf, IDS, n_ctx=64)
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.98


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_decode_matches_prefill(paths, kind):
    """One token at a time (the chosen experts alone) against the whole prompt at once (tokens grouped by
    expert): the same numbers, since each row's dot product is the same."""
    full = pyinfer.load(paths[kind, Q.Q8_0], n_ctx=64, n_threads=2, progress=False).eval(IDS[:16], all_logits=True)
    one = pyinfer.load(paths[kind, Q.Q8_0], n_ctx=64, n_threads=2, progress=False)
    steps = np.stack([one.eval(IDS[:i + 1]) for i in range(16)])
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5 * np.abs(full).max())


def test_threads_do_not_change_the_answer(paths):
    a = pyinfer.load(paths["qwen3moe", Q.Q8_0], n_ctx=64, n_threads=1, progress=False).eval(IDS, all_logits=True)
    b = pyinfer.load(paths["qwen3moe", Q.Q8_0], n_ctx=64, n_threads=2, progress=False).eval(IDS, all_logits=True)
    np.testing.assert_array_equal(a, b)


def test_generate_runs(paths):
    m = pyinfer.load(paths["mixtral", Q.Q8_0], n_ctx=64, n_threads=2, progress=False)
    assert m.generate("the", max_tokens=6, temperature=0) is not None


def test_neuron_sparsity_is_refused_by_name(paths, tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(pyinfer.PyinferError, match="Mixture-of-Experts"):
        pyinfer.load(paths["qwen3moe", Q.F32], n_ctx=64, sparsity=str(tmp_path / "plan.npz"), progress=False)


@pytest.mark.parametrize("kind", ["qwen3moe", "mixtral"])
def test_cuts_inside_the_experts_follow_the_reference(paths, tmp_path, monkeypatch, kind):
    """`auto` with a target: per-expert cuts calibrated on the bundled text; decode (one token a run) then
    matches the reference forward that drops each chosen expert's neurons below their cut, and skips about the
    target's share of them on other text."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    m = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, sparsity="auto", target=0.5, progress=False)
    cuts = m.session.expert_cuts
    assert m.sparsity is None and cuts is not None and cuts.thresholds.shape == (m.config.n_layers, 8)
    assert (cuts.thresholds > 0).all() and (cuts.tokens >= 8).mean() > 0.5
    steps = np.concatenate([m.forward([IDS[i]], i, [0]) for i in range(24)])  # one token a run: decode
    margins, kept = [], []
    ref = reference_logits(m.gguf, IDS[:24], n_ctx=64, margins=margins, expert_cuts=cuts.thresholds, kept=kept)
    dense = reference_logits(m.gguf, IDS[:24], n_ctx=64)
    clear = np.min(margins, axis=0) > 1e-3
    # A cut is a step: a neuron within float noise of its cut may fall either side (the reference sums in a
    # different order), so a few positions may differ by more than noise. Most are the reference's.
    err = np.abs(steps - ref).max(1) / np.abs(ref).max(1)
    assert np.median(err[clear]) < 0.005 and (err[clear] < 0.01).mean() >= 0.85
    assert (steps.argmax(1) == ref.argmax(1))[clear].mean() >= 0.9
    assert rel_err(ref, dense) > 0.05  # the cuts change the answer: the comparison above is not dense vs dense
    assert 0.3 < 1 - np.mean(kept) < 0.7
    # Cached: a second load reads the same cuts; prefill (many tokens a run) stays dense.
    again = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, sparsity="auto", target=0.5, progress=False)
    np.testing.assert_array_equal(again.session.expert_cuts.thresholds, cuts.thresholds)
    full = again.eval(IDS[:24], all_logits=True)
    assert rel_err(full[clear], dense[clear]) < 0.01


def test_cuts_inside_the_experts_are_cpu_only(paths, tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(pyinfer.PyinferError, match="CPU only"):
        pyinfer.load(paths["qwen3moe", Q.F32], n_ctx=64, sparsity="auto", target=0.5, device="standin",
                     vram_budget="1M", progress=False)


def test_auto_sparsity_runs_the_experts_dense(paths, tmp_path, monkeypatch):
    """`auto` (the CLI's default) on a MoE model: its experts are the sparsity; no neuron plan is made."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    m = pyinfer.load(paths["qwen3moe", Q.F32], n_ctx=64, sparsity="auto", progress=False)
    assert m.sparsity is None
    assert m.generate("the", max_tokens=3, temperature=0) is not None


def test_expert_tensors_of_the_wrong_shape_are_refused(tmp_path):
    path = write_tiny_arch(tmp_path / "bad.gguf", "qwen3moe", config={"d_ff_expert": 64},
                           extra=lambda w: w.add_expert_feed_forward_length(32))
    with pytest.raises(pyinfer.PyinferError, match="expert_feed_forward_length"):
        pyinfer.load(str(path), n_ctx=64, progress=False)


def test_more_experts_used_than_there_are_is_refused(tmp_path):
    path = write_tiny_arch(tmp_path / "bad.gguf", "mixtral", extra=lambda w: w.add_expert_used_count(9))
    with pytest.raises(pyinfer.PyinferError, match="expert_used_count"):
        pyinfer.load(str(path), n_ctx=64, progress=False)


def test_the_old_per_expert_layout_is_refused_by_name(tmp_path):
    def per_expert(w):
        w.add_tensor("blk.0.ffn_gate.0.weight", np.zeros((64, 64), np.float32))

    path = write_tiny_arch(tmp_path / "old.gguf", "mixtral", extra=per_expert)
    with pytest.raises(pyinfer.PyinferError, match="old Mixtral layout"):
        pyinfer.load(str(path), n_ctx=64, progress=False)


# ---- experts streamed from the model file -----------------------------------------------------------------
def _streamed(path, monkeypatch, slots: int, resident=None, policy="lru", prefetch=True, **load):
    """A model whose experts come from an ExpertStore of `slots` cache slots (and `resident` per layer), as a
    memory limit too small for the model sets it up."""
    from pyinfer.offload import experts as ex

    def make(session, ram_budget=None, progress=True):
        cfg = session.config
        plan = ex.ExpertPlan(0, ex.slot_bytes(session.gguf, cfg), resident or [[] for _ in range(cfg.n_layers)],
                             slots, policy)
        return ex.ExpertOffload(session.gguf, cfg, plan, prefetch=prefetch)

    monkeypatch.setattr(ex, "make_expert_offload", make)
    return pyinfer.load(path, n_ctx=64, n_threads=2, mem_limit="4G", progress=False, **load)


def test_streamed_experts_with_cuts_give_the_in_ram_answer(paths, monkeypatch, tmp_path):
    """Cuts inside the experts read the store's slots as they read the mapped tensors: decode logits equal."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    path = paths["qwen3moe", Q.Q8_0]
    ram = pyinfer.load(path, n_ctx=64, n_threads=2, sparsity="auto", target=0.5, progress=False)
    streamed = _streamed(path, monkeypatch, 8, sparsity="auto", target=0.5)
    assert streamed.session.experts is not None and streamed.session.expert_cuts is not None
    for m in (ram, streamed):
        m.forward(IDS[:8], 0, [7])
    for i in range(8, 20):
        np.testing.assert_array_equal(streamed.forward([IDS[i]], i, [0]), ram.forward([IDS[i]], i, [0]))


@pytest.mark.parametrize("kind,policy,prefetch", [("qwen3moe", "lru", True), ("qwen3moe", "lfu", True),
                                                  ("qwen3moe", "lru", False), ("glm4moe", "lru", True),
                                                  ("gpt-oss", "lru", True)])
def test_streamed_experts_give_the_in_ram_answer(paths, monkeypatch, kind, policy, prefetch):
    """8 cache slots for 2 layers of 8 experts: decode evicts and reads again, prefill needs every slot; the
    logits are the in-RAM run's bit for bit (with the next layer's experts read ahead or not), and the store's
    counts add up. GLM-4.5's first layer is dense: the store holds its two MoE layers only."""
    path = paths[kind, Q.Q8_0]
    resident = [[], [0, 1], [2]] if kind == "glm4moe" else [[0, 1], [2]]
    ram = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    want_prefill = ram.eval(IDS[:20], all_logits=True)
    ram2 = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    want_decode = np.stack([ram2.eval(IDS[:i + 1]) for i in range(12)])

    m = _streamed(path, monkeypatch, slots=8, resident=resident, policy=policy, prefetch=prefetch)
    np.testing.assert_array_equal(m.eval(IDS[:20], all_logits=True), want_prefill)
    m2 = _streamed(path, monkeypatch, slots=8, resident=resident, policy=policy, prefetch=prefetch)
    store = m2.session.experts.store
    store.reset_stats()
    np.testing.assert_array_equal(np.stack([m2.eval(IDS[:i + 1]) for i in range(12)]), want_decode)
    st = m2.session.experts.report(tokens=12)
    assert st["fetches"] == 12 * 2 and st["requests"] == st["resident_hits"] + st["cache_hits"] + st["misses"]
    assert st["misses"] > 0 and st["bytes_read"] > 0 and 0 < st["hit_rate"] < 1
    assert np.asarray(store.chosen()).sum() == st["requests"]
    if prefetch:  # layer 0 predicts layer 1 in every step; the last layer predicts nothing
        assert st["predicted"] > 0 and 0 <= st["predicted_right"] <= st["predicted"]
        assert 0 <= st["prefetch_used"] <= st["prefetched"] and st["prefetch_failures"] == 0
        assert st["prefetch_bytes"] <= st["bytes_read"] and st["prediction_accuracy"] is not None
    else:
        assert st["predicted"] == st["prefetched"] == 0 and st["prediction_accuracy"] is None


def test_a_cache_smaller_than_one_run_is_an_error_not_a_crash(paths, monkeypatch):
    m = _streamed(paths["qwen3moe", Q.Q8_0], monkeypatch, slots=1)
    with pytest.raises(pyinfer.PyinferError, match="expert cache has 1 slots"):
        m.eval(IDS[:20])


@pytest.mark.parametrize("direct_io", [True, False])
def test_the_store_holds_the_files_bytes(paths, direct_io):
    """After a fetch, each chosen expert's bytes in RAM are the slice of the merged tensor in the file, read
    around the page cache (O_DIRECT, the pages around them) or through it (exactly them)."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex

    f = open_model(paths["mixtral", Q.Q8_0])
    cfg = model_config(f)
    off = ex.ExpertOffload(f, cfg, ex.ExpertPlan(0, ex.slot_bytes(f, cfg), [[5], []], 2, "lru"), direct_io=direct_io)
    assert off.store.stats()["direct_io"] == (direct_io and off.store.stats()["direct_io"])
    route = np.array([[0.6, 0.4, 3, 6]], np.float32)
    off.store.fetch(1, route, 2)
    assert off.store.stats()["bytes_read"] == sum(_read_bytes(f, 1, e, off.store.stats()["direct_io"]) for e in (3, 6))
    for part_i, part in enumerate(ex.PARTS):
        t = np.asarray(f.tensors[f"blk.1.ffn_{part}_exps.weight"].data).reshape(cfg.n_expert, -1)
        for e in (3, 6):
            assert off.store.expert(1, part_i, e) == t[e].tobytes()
        assert off.store.expert(1, part_i, 4) is None
    assert off.store.expert(0, 0, 5) == np.asarray(f.tensors["blk.0.ffn_gate_exps.weight"].data).reshape(8, -1)[5].tobytes()


def test_resident_experts_follow_the_routing_profile(paths):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex

    f = open_model(paths["qwen3moe", Q.Q8_0])
    cfg = model_config(f)
    slot = ex.slot_bytes(f, cfg)
    profile = np.zeros((2, 8))
    profile[0, 3], profile[1, 5], profile[1, 6] = 50, 40, 30
    plan = ex.plan_experts(f, cfg, 40 * slot, max_tokens=4, profile=profile)
    assert plan.resident == [[3], [5, 6]] and plan.cache_slots == 37
    assert ex.plan_experts(f, cfg, 20 * slot, 4).resident == [[], []]
    with pytest.raises(pyinfer.PyinferError, match="one layer of a run may choose 8 experts"):
        ex.plan_experts(f, cfg, 5 * slot, max_tokens=4)


def test_the_routing_profile_counts_every_choice(paths):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.sparsity.expert_profile import profile_routing

    f = open_model(paths["mixtral", Q.Q8_0])
    prof = profile_routing(f, model_config(f), list(range(3, 259)) * 2, n_threads=2, progress=False)
    assert prof["counts"].shape == (2, 8) and (prof["counts"].sum(1) == 512 * 2).all()
    assert ((0 <= prof["reuse"]) & (prof["reuse"] <= 1)).all()


def test_a_leading_dense_layer_leaves_the_profile_shares_as_shares(paths):
    """GLM-4.5's and DeepSeek's first layer routes nothing: its row is zero, and the reuse of the layers with experts
    is still a share of their choices (it was divided by nothing, 15076% in a bench's log)."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.sparsity.expert_profile import describe_profile, profile_routing

    f = open_model(paths["deepseek2", Q.Q8_0])
    prof = profile_routing(f, model_config(f), list(range(3, 131)), n_threads=2, progress=False)
    assert (prof["counts"][0] == 0).all() and (prof["counts"][1:].sum(1) == 128 * 2).all()
    assert ((0 <= prof["reuse"]) & (prof["reuse"] <= 1)).all() and prof["reuse"][1:].max() > 0
    assert "(layers 0%" not in describe_profile(prof)


def test_cuda_without_a_gpu_says_why(paths):
    from pyinfer.place.device import cuda_devices

    if _core.cuda_built() and cuda_devices():
        pytest.skip("this machine has a GPU (tests/test_cuda_ops.py runs MoE there)")
    with pytest.raises(pyinfer.PyinferError, match="CUDA"):
        pyinfer.load(paths["qwen3moe", Q.F32], n_ctx=64, device="cuda", progress=False)


def test_the_standin_needs_a_budget(paths):
    with pytest.raises(pyinfer.PyinferError, match="needs a vram_budget"):
        pyinfer.load(paths["qwen3moe", Q.F32], n_ctx=64, device="standin", progress=False)


# ---- --ram-budget: experts streamed from the expert bundle file --------------------------------------------
@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """qwen3moe with experts of 2048 neurons (Q8_0, 136 KiB a part): a slot is many pages, so a budget can hold
    one layer's choice of a run and still be below the model."""
    return str(write_tiny_arch(tmp_path_factory.mktemp("moe-wide") / "wide.gguf", "qwen3moe", seed=3, qtype=Q.Q8_0,
                               config={"d_ff_expert": 2048}))


def _shared_and_slot(path):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex

    f = open_model(path)
    cfg = model_config(f)
    return f.weight_bytes - ex.expert_bytes(f, cfg), ex.slot_bytes(f, cfg)


def test_a_ram_budget_streams_experts_from_the_bundle_file(wide, tmp_path, monkeypatch):
    """A RAM budget below the model's weights: the experts stream from an expert bundle file written once into
    the cache (each expert one page-aligned read of exactly its pages), and prefill and decode equal the in-RAM
    run bit for bit; a second load finds the file and does not write it again."""
    from pyinfer.offload import expert_bundles as eb

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    path = wide
    shared, slot = _shared_and_slot(path)
    budget = shared + 10 * slot  # 10 of the 16 experts, a layer's 8 among them
    ram = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    want_prefill = ram.eval(IDS[:20], all_logits=True)
    want_decode = np.stack([ram.eval(IDS[:i + 1]) for i in range(10)])
    m = pyinfer.load(path, n_ctx=64, n_threads=2, ram_budget=budget, progress=False)
    off = m.session.experts
    assert off is not None and off.source == "bundle"
    bundle = eb.expert_bundle_path(tmp_path, m.session.gguf)
    assert bundle.is_file() and bundle.stat().st_size == eb.bundle_bytes(m.session.gguf, m.config)
    np.testing.assert_array_equal(m.eval(IDS[:20], all_logits=True), want_prefill)
    off.store.reset_stats()
    np.testing.assert_array_equal(np.stack([m.eval(IDS[:i + 1]) for i in range(10)]), want_decode)
    st = off.report(tokens=10)
    assert st["misses"] > 0 and st["source"] == "bundle"
    layout = eb.read_expert_layout(bundle, m.session.gguf, m.config)
    per_expert = sum(-(-n // 4096) * 4096 for n in layout.layers[0]["expert_bytes"])  # every layer alike here
    assert st["bytes_read"] == (st["misses"] + st["prefetched"]) * per_expert
    assert st["expert_slot_bytes"] == per_expert < slot  # no spare pages: every expert starts on one
    mtime = bundle.stat().st_mtime_ns
    pyinfer.load(path, n_ctx=64, n_threads=2, ram_budget=budget, progress=False)
    assert bundle.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("direct_io", [True, False])
def test_the_bundle_file_holds_each_experts_bytes(paths, tmp_path, direct_io):
    """Read through the store from the bundle file, each expert's bytes are the slice of the merged tensor in
    the GGUF, with O_DIRECT or through the page cache; a bundle expert is one read of its pages."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import expert_bundles as eb
    from pyinfer.offload import experts as ex

    f = open_model(paths["mixtral", Q.Q8_0])
    cfg = model_config(f)
    layout = eb.open_or_write_expert_bundles(tmp_path, f, cfg, progress=False)
    slot = ex.slot_bytes(f, cfg, layout.store_layers())
    off = ex.ExpertOffload(f, cfg, ex.ExpertPlan(0, slot, [[5], []], 2, "lru"), direct_io=direct_io, bundle=layout)
    off.store.fetch(1, np.array([[0.6, 0.4, 3, 6]], np.float32), 2)
    pages = sum(-(-n // 4096) * 4096 for n in layout.layers[1]["expert_bytes"])
    exact = sum(layout.layers[1]["expert_bytes"])
    assert off.store.stats()["bytes_read"] == 2 * (pages if off.store.stats()["direct_io"] else exact)
    for part_i, part in enumerate(ex.PARTS):
        t = np.asarray(f.tensors[f"blk.1.ffn_{part}_exps.weight"].data).reshape(cfg.n_expert, -1)
        for e in (3, 6):
            assert off.store.expert(1, part_i, e) == t[e].tobytes()
        assert off.store.expert(1, part_i, 4) is None
    t = np.asarray(f.tensors["blk.0.ffn_down_exps.weight"].data).reshape(cfg.n_expert, -1)
    assert off.store.expert(0, 2, 5) == t[5].tobytes()


def test_a_foreign_or_truncated_bundle_file_is_rebuilt(paths, tmp_path):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import expert_bundles as eb

    f = open_model(paths["qwen3moe", Q.Q8_0])
    cfg = model_config(f)
    path = eb.expert_bundle_path(tmp_path, f)
    good = eb.open_or_write_expert_bundles(tmp_path, f, cfg, progress=False)
    data = path.read_bytes()
    path.write_bytes(data[:-4096])  # truncated
    assert eb.read_expert_layout(path, f, cfg) is None
    assert eb.open_or_write_expert_bundles(tmp_path, f, cfg, progress=False).layers == good.layers
    assert path.read_bytes() == data
    path.write_bytes(b"PYINFEXP" + b"\xff" * 100)  # foreign
    assert eb.read_expert_layout(path, f, cfg) is None
    other = open_model(paths["mixtral", Q.Q8_0])  # another model's bundle file at this model's path
    path.write_bytes(eb.open_or_write_expert_bundles(tmp_path / "o", other, model_config(other), False)
                     .path.read_bytes())
    assert eb.read_expert_layout(path, f, cfg) is None


def test_no_room_for_the_bundle_file_reads_the_model_file(wide, tmp_path, monkeypatch, capsys):
    """Where the bundle file cannot be written (its size checked against the free disk first), the experts are
    read from the GGUF's merged tensors instead, with a one-line warning, and give the same answer."""
    import collections

    from pyinfer.offload import expert_bundles as eb

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(eb.shutil, "disk_usage", lambda p: collections.namedtuple("u", "total used free")(1, 1, 10))
    path = wide
    shared, slot = _shared_and_slot(path)
    want = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False).eval(IDS[:12])
    m = pyinfer.load(path, n_ctx=64, n_threads=2, ram_budget=shared + 10 * slot)
    assert m.session.experts.source == "gguf"
    assert "experts are read from the model file instead" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.experts*"))
    np.testing.assert_array_equal(m.eval(IDS[:12]), want)


def test_ram_budget_edges_for_experts(wide, tmp_path, monkeypatch):
    """Below the minimum (the shared weights and one layer's choice of a run): a one-line error naming it; at
    or above the model's weights: nothing streams; a neuron plan file or neuron shares: refused by name."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    path = wide
    shared, slot = _shared_and_slot(path)
    with pytest.raises(pyinfer.PyinferError, match="below this model's minimum of") as e:
        pyinfer.load(path, n_ctx=64, ram_budget=shared + 3 * slot, progress=False)
    assert "\n" not in str(e.value)
    from pyinfer.model.arch import model_config, open_model

    whole = open_model(path).weight_bytes
    assert pyinfer.load(path, n_ctx=64, ram_budget=whole, progress=False).session.experts is None
    with pytest.raises(pyinfer.PyinferError, match="give a Mixture-of-Experts model its RAM budget as a size"):
        pyinfer.load(path, n_ctx=64, ram_budget=str(tmp_path / "plan.json"), progress=False)
    with pytest.raises(pyinfer.PyinferError, match="expert cache takes what its RAM budget leaves"):
        pyinfer.load(path, n_ctx=64, ram_budget="1G", neuron_cache=0.5, progress=False)


def test_expert_paged_weights_are_read_only_by_the_expert_matmul(paths):
    """An expert store's table holds one pointer per expert: a plain matmul over it, or an expert matmul that
    counts its experts differently, is refused when the graph is built (it would read past the table)."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex
    from pyinfer.runtime.graph_builder import GraphBuilder

    f = open_model(paths["qwen3moe", Q.Q8_0])
    cfg = model_config(f)
    off = ex.ExpertOffload(f, cfg, ex.ExpertPlan(0, ex.slot_bytes(f, cfg), [[], []], 8, "lru"))

    def engine(build):
        b = GraphBuilder()
        b.graph.pin(build(b).id)
        return _core.Engine(b.graph, max_tokens=4, max_outputs=4)

    def x_and_route(b, n_exp=8):
        x = b.weight("x", int(DType.F32), 64, 4, np.ones((4, 64), np.float32))
        return x, b.moe_route(b.weight("l", int(DType.F32), n_exp, 4, np.ones((4, n_exp), np.float32)), 2)

    with pytest.raises(ValueError, match="paged by expert"):
        engine(lambda b: b.matmul(off.weight(b, 0, "gate"), x_and_route(b)[0], "y"))
    with pytest.raises(ValueError, match="different expert count|different number of experts"):
        engine(lambda b: b.moe_matmul(off.weight(b, 0, "gate"), *x_and_route(b, 4), 4, 2, "y"))


def test_a_guarded_route_is_refused():
    """A route skipped in some runs would leave its readers the ids of another run."""
    from pyinfer._core import RunIf
    from pyinfer.runtime.graph_builder import Guard

    def build(b):
        logits = b.weight("l", int(DType.F32), 8, 2, np.ones((2, 8), np.float32))
        route = b.activation("route", 4)
        b._node(_core.Op.MOE_ROUTE, route, {"logits": logits}, {"n_expert": 8, "k": 2, "gating": 0, "norm": 1,
                                                                "scale": 0.0}, run_if=Guard(RunIf.SINGLE_TOKEN))
        return route

    with pytest.raises(ValueError, match="run in every run"):
        single_op_engine(build, max_tokens=2)


def test_a_failed_fetch_leaves_no_expert_half_loaded(paths):
    """A run that needs more slots than there are fails before any slot changes hands: the next runs read the
    right bytes."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex

    f = open_model(paths["mixtral", Q.Q8_0])
    cfg = model_config(f)
    off = ex.ExpertOffload(f, cfg, ex.ExpertPlan(0, ex.slot_bytes(f, cfg), [[], []], 3, "lru"))
    with pytest.raises(ValueError, match="expert cache has 3 slots"):
        off.store.fetch(0, np.array([[0.5, 0.5, 1, 2], [0.5, 0.5, 3, 4]], np.float32), 2)
    assert all(off.store.expert(0, 0, e) is None for e in range(8))
    off.store.fetch(0, np.array([[0.5, 0.5, 1, 2]], np.float32), 2)
    t = np.asarray(f.tensors["blk.0.ffn_gate_exps.weight"].data).reshape(8, -1)
    assert off.store.expert(0, 0, 1) == t[1].tobytes() and off.store.expert(0, 0, 2) == t[2].tobytes()


# ---- reading the next layer's experts ahead ---------------------------------------------------------------
def _store(path, slots: int, resident=None):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.offload import experts as ex

    f = open_model(path)
    cfg = model_config(f)
    off = ex.ExpertOffload(f, cfg, ex.ExpertPlan(0, ex.slot_bytes(f, cfg), resident or [[], []], slots, "lru"))
    return f, off.store


def _read_bytes(f, il: int, e: int, direct: bool) -> int:
    """What the store reads for expert e of layer il: each part's exact bytes, or with O_DIRECT the whole pages
    around them (where they end inside the file)."""
    total = 0
    for part in ("gate", "up", "down"):
        start, nbytes, _ = f._ranges[f"blk.{il}.ffn_{part}_exps.weight"]
        n = nbytes // 8
        at = int(start) + e * n
        whole = -(-(at % 4096 + n) // 4096) * 4096
        total += whole if direct and at - at % 4096 + whole <= f.path.stat().st_size else n
    return total


def _route(*ids):
    return np.array([[0.5, 0.5, *ids]], np.float32)


def test_a_prefetch_reads_the_predicted_experts_for_the_next_fetch(paths):
    """What a prefetch read is the file's bytes, the next fetch of that layer finds it (a cache hit, counted as
    used read-ahead), and the prediction's accuracy counts the chosen experts it named."""
    f, store = _store(paths["mixtral", Q.Q8_0], slots=6)
    store.fetch(0, _route(1, 2), 2)
    store.prefetch(1, _route(3, 6), 2)
    store.fetch(1, _route(3, 7), 2)            # waits for the read-ahead; 7 was not predicted
    st = store.stats()
    assert st["prefetched"] == 2 and st["prefetch_used"] == 1 and st["prefetch_failures"] == 0
    assert st["predicted"] == 2 and st["predicted_right"] == 1
    assert st["cache_hits"] == 1 and st["misses"] == 3      # 1, 2 and 7 on demand; 3 read ahead
    assert st["prefetch_bytes"] == sum(_read_bytes(f, 1, e, st["direct_io"]) for e in (3, 6))
    for part in ("gate", "up", "down"):
        t = np.asarray(f.tensors[f"blk.1.ffn_{part}_exps.weight"].data).reshape(8, -1)
        for e in (3, 6, 7):
            assert store.expert(1, ("gate", "up", "down").index(part), e) == t[e].tobytes()


def test_a_prefetch_never_evicts_the_experts_being_computed(paths):
    """With every slot held by the last fetch's experts, read-ahead has no room and reads nothing: the layer
    being computed keeps its experts, and the next fetch reads the predicted ones itself."""
    f, store = _store(paths["mixtral", Q.Q8_0], slots=2)
    store.fetch(0, _route(1, 2), 2)
    store.prefetch(1, _route(3, 4), 2)
    t = np.asarray(f.tensors["blk.0.ffn_gate_exps.weight"].data).reshape(8, -1)
    assert store.expert(0, 0, 1) == t[1].tobytes() and store.expert(0, 0, 2) == t[2].tobytes()
    assert store.stats()["prefetched"] == 0
    store.fetch(1, _route(3, 4), 2)
    assert store.stats()["misses"] == 4 and store.stats()["predicted_right"] == 2


def test_a_failed_read_ahead_is_forgotten_and_read_again(paths, tmp_path):
    """Read-ahead from a file cut short fails on its own thread: the next fetch says why (one error, no crash),
    no slot claims the expert, and once the file is whole again the expert is read right."""
    import shutil

    path = tmp_path / "m.gguf"
    shutil.copy(paths["mixtral", Q.Q8_0], path)
    whole = path.read_bytes()
    f, store = _store(str(path), slots=4)
    start = min(int(f._ranges[f"blk.1.ffn_{p}_exps.weight"][0]) for p in ("gate", "up", "down"))
    with open(path, "r+b") as fh:
        fh.truncate(start)
    store.prefetch(1, _route(3, 6), 2)
    with pytest.raises(RuntimeError, match="is shorter than its"):
        store.fetch(1, _route(3, 6), 2)
    assert store.stats()["prefetch_failures"] == 1
    assert all(store.expert(1, p, e) is None for p in range(3) for e in range(8))
    path.write_bytes(whole)
    store.fetch(1, _route(3, 6), 2)
    t = np.asarray(f.tensors["blk.1.ffn_up_exps.weight"].data).reshape(8, -1)
    assert store.expert(1, 1, 3) == t[3].tobytes() and store.expert(1, 1, 6) == t[6].tobytes()


def test_a_store_with_read_ahead_in_flight_closes_cleanly(paths):
    f, store = _store(paths["mixtral", Q.Q8_0], slots=6)
    store.prefetch(1, _route(3, 6), 2)
    del store  # joins the read-ahead thread before the cache it reads into is unmapped


def test_the_graph_predicts_each_next_layer_from_the_stream(paths, monkeypatch):
    """With read-ahead on, the graph applies layer 1's FFN norm and router to layer 0's stream and prefetches
    for layer 1 only (the last layer predicts nothing)."""
    m = _streamed(paths["qwen3moe", Q.Q8_0], monkeypatch, slots=16)
    store = m.session.experts.store
    store.reset_stats()
    for i in range(6):
        m.eval(IDS[:i + 1])
    st = store.stats()
    assert st["fetches"] == 6 * 2
    assert st["predicted"] == np.asarray(store.chosen())[1].sum()  # every layer-1 fetch had a prediction


# ---- experts placed on two backends (place/expert_placement.py, runtime/moe_ffn.split_moe_ffn) ---------------
@pytest.mark.parametrize("local", [[1, 4, 5], [4]])
@pytest.mark.parametrize("n_tok", [1, 2, 13])
def test_a_split_route_keeps_this_sides_experts_and_the_matmul_leaves_the_rest_at_zero(n_tok, local):
    """Each side's route keeps the slots whose expert it holds (weight, local id) and zeroes the others (id -1);
    the expert matmul over a local merged tensor gives those slots exactly what the whole tensor gives, and 0
    elsewhere, decode and grouped alike."""
    n_exp, k, rows, cols = 6, 3, 40, 256
    w = _expert_weights(Q.Q4_0, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, cols)).astype(np.float32)
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32)
    emap = np.full((1, n_exp), -1, np.int32)  # `local`: fewer experts than a token chooses is allowed
    emap[0, local] = np.arange(len(local))
    per = w.reshape(n_exp, -1)

    def build(b):
        route = b.moe_route(b.weight("logits", int(DType.F32), n_exp, n_tok, logits), k)
        X = b.weight("x", int(DType.F32), cols, n_tok, x)
        whole = b.moe_matmul(b.weight("experts", int(Q.Q4_0), cols, n_exp * rows, w), X, route, n_exp, k, "whole")
        part = b.moe_route_split(route, b.weight("map", int(DType.I32), n_exp, 1, emap), len(local), k, "part")
        mine = b.weight("mine", int(Q.Q4_0), cols, len(local) * rows, np.ascontiguousarray(per[local]))
        return route, part, whole, b.moe_matmul(mine, X, part, len(local), k, "local")

    eng, (route, part, whole, got) = single_op_engine(build, max_tokens=n_tok, n_threads=2)
    eng.run(n_tok)
    r, p = eng.tensor(route.id, n_tok), eng.tensor(part.id, n_tok)
    ids = r[:, k:].astype(int)
    here = np.isin(ids, local)
    np.testing.assert_array_equal(p[:, k:], np.where(here, emap[0][ids], -1))
    np.testing.assert_array_equal(p[:, :k], np.where(here, r[:, :k], 0))
    y, ref = eng.tensor(got.id, n_tok).reshape(n_tok, k, rows), eng.tensor(whole.id, n_tok).reshape(n_tok, k, rows)
    np.testing.assert_array_equal(y[here], ref[here])
    assert (y[~here] == 0).all()


def test_a_split_route_refuses_a_map_of_the_wrong_size_and_is_no_whole_route():
    def route(b):
        return b.moe_route(b.weight("logits", int(DType.F32), 8, 2, np.zeros((2, 8), np.float32)), 2)

    def emap(b, n):
        return b.weight(f"map{n}", int(DType.I32), n, 1, np.zeros((1, n), np.int32))

    with pytest.raises(ValueError, match="an entry per expert of the route"):
        single_op_engine(lambda b: b.moe_route_split(route(b), emap(b, 4), 4, 2, "p"), max_tokens=2)
    with pytest.raises(ValueError, match="split once"):
        single_op_engine(lambda b: b.moe_route_split(b.moe_route_split(route(b), emap(b, 8), 4, 2, "p"),
                                                     emap(b, 4), 4, 2, "q"), max_tokens=2)
    with pytest.raises(ValueError, match="not one backend's share"):
        single_op_engine(lambda b: b.expert_fetch(b.moe_route_split(route(b), emap(b, 8), 4, 2, "p"), 0),
                         max_tokens=2)


def _profile(cfg, hot):
    counts = np.ones((cfg.n_layers, cfg.n_expert))
    for il, es in enumerate(hot):
        counts[il, es] = 100.0
    return counts


def test_the_expert_program_is_optimal_and_splits_only_what_pays(paths):
    """On a tiny model the program's answer is the brute force's optimum (CPU time moved, less a synchronization
    for every layer not placed whole), and the greedy fill is never better than the program."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.place import expert_placement as ep
    from pyinfer.place.gpu_placement import GpuCosts
    from pyinfer.place.knapsack import PrefixKnapsack

    f = open_model(paths["qwen3moe", Q.Q8_0])
    cfg = model_config(f)
    counts = _profile(cfg, [[2, 5], [0]])
    per = ep.expert_bytes(f, cfg)
    minimum = sum(ep.fixed_bytes(f, cfg, 64).values())
    spb = 1e-9
    share = ep.route_shares(cfg, counts)
    for n_fit, sync in ((3, 0.0), (3, share[1].max() * per[1] * spb * 1.5), (9, 0.0)):
        costs = GpuCosts(spb, sync)
        p = ep.place_experts(f, cfg, minimum + n_fit * per[0] + 10, 64, costs, counts)
        order = [np.argsort(-share[il], kind="stable") for il in range(cfg.n_layers)]
        value = [list(share[il][o] * per[il] * spb) for il, o in enumerate(order)]
        best = -1.0  # the brute force over every prefix of each layer and the head: time saved net of syncs
        items = [[float(b)] * cfg.n_expert for b in per] + [[float(ep.head_bytes(f))]]
        prog = PrefixKnapsack(items, value + [[ep.head_bytes(f) * spb]], float(n_fit * per[0] + 10))
        for kept in np.ndindex(*(len(g) + 1 for g in items)):
            if prog.check(list(kept)):
                best = max(best, prog.value(list(kept)) - sync * sum(k < cfg.n_expert for k in kept[:-1]))
        assert p.net_seconds == pytest.approx(best, abs=1e-15)
        assert sum(map(len, p.gpu_experts)) <= n_fit and p.expert_bytes_on_gpu <= n_fit * per[0]
        assert p.net_seconds >= p.greedy["net_seconds"] - 1e-15
        if n_fit == 3 and sync == 0:  # the hot experts first
            assert set(p.gpu_experts[0]) >= {2, 5} or set(p.gpu_experts[1]) >= {0}
    with pytest.raises(pyinfer.PyinferError, match="below the minimum"):
        ep.place_experts(f, cfg, minimum - 1, 64, GpuCosts(spb, 0.0), counts)


def test_room_left_holds_the_experts_the_profile_never_saw(paths):
    """Experts no profiled token chose are worth nothing to the program, yet a later prompt may choose them: with
    room for every expert, every expert is placed and no layer is split; with room for part, the room left after
    the program's answer still takes whole layers first."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.place import expert_placement as ep
    from pyinfer.place.gpu_placement import GpuCosts

    f = open_model(paths["qwen3moe", Q.Q8_0])
    cfg = model_config(f)
    counts = np.zeros((cfg.n_layers, cfg.n_expert))
    counts[:, :3] = 10.0  # five of eight experts per layer never chosen
    per = ep.expert_bytes(f, cfg)
    minimum = sum(ep.fixed_bytes(f, cfg, 64).values())
    everything = minimum + sum(per) * cfg.n_expert + ep.head_bytes(f) + 10
    p = ep.place_experts(f, cfg, everything, 64, GpuCosts(1e-9, 0.0), counts)
    assert all(len(g) == cfg.n_expert for g in p.gpu_experts) and not p.split_layers
    one_layer_more = minimum + ep.head_bytes(f) + (3 * cfg.n_layers + cfg.n_expert - 3) * per[0] + 10
    p = ep.place_experts(f, cfg, one_layer_more, 64, GpuCosts(1e-9, 0.0), counts)
    assert sorted(map(len, p.gpu_experts)) == [3] * (cfg.n_layers - 1) + [cfg.n_expert]
    assert p.mass_on_gpu == pytest.approx(1.0)


@pytest.mark.parametrize("kind", MOE_KINDS)
@pytest.mark.parametrize("share", [0.0, 0.4, 1.0])
def test_experts_split_with_the_standin_device_give_the_cpu_answer(paths, monkeypatch, kind, share):
    """The stand-in device (a second CPU backend with memory of its own) computes the placed experts while the
    CPU computes the rest: prefill and decode logits equal the CPU's (to float rounding: the two weighted sums
    add in another order), with none, some and all of the experts placed. In prefill, away from routing ties: where
    the fp32 reference finds a router within 0.001 of a tie (this random model has one at 9e-5, position 15), that
    rounding may take the other expert, as in test_prefill_matches_the_reference."""
    from pyinfer.place import expert_placement as ep
    from pyinfer.sparsity import expert_profile as ex

    path = paths[kind, Q.Q8_0]
    cpu = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    want = cpu.eval(IDS[:20], all_logits=True)
    cfg = cpu.config
    monkeypatch.setattr(ex, "cached_profile", lambda session, progress: {"counts": _profile(cfg, [[1, 6], [3]])})
    from pyinfer.model.arch import model_config, open_model

    f = open_model(path)
    minimum = sum(ep.fixed_bytes(f, cfg, 64).values())
    budget = minimum + int(share * sum(ep.expert_bytes(f, cfg)) * cfg.n_expert) + (1 if share else 0)
    if share == 1:
        budget += ep.head_bytes(f)  # the head is worth more per byte than a rarely chosen expert
    m = pyinfer.load(path, n_ctx=64, n_threads=2, device="standin", vram_budget=budget, progress=False)
    placed = m.session.placement.report["gpu_experts"]
    moe_layers = sum(cfg.moe_layer(il) for il in range(cfg.n_layers))  # (GLM-4.5's first layer is dense)
    assert sum(map(len, placed)) == (0 if share == 0 else moe_layers * cfg.n_expert if share == 1 else
                                     sum(map(len, placed)))
    if share == 0.4:
        assert 0 < sum(map(len, placed)) < moe_layers * cfg.n_expert and m.session.placement.report["split_layers"]
    margins: list = []
    reference_logits(cpu.gguf, IDS[:20], n_ctx=64, margins=margins)
    clear = np.min(margins, axis=0) > 1e-3
    assert clear.sum() >= 14
    np.testing.assert_allclose(m.eval(IDS[:20], all_logits=True)[clear], want[clear], rtol=2e-5, atol=2e-5)
    m2 = pyinfer.load(path, n_ctx=64, n_threads=2, device="standin", vram_budget=budget, progress=False)
    ram = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    for i in range(6):
        np.testing.assert_allclose(m2.eval(IDS[:i + 1]), ram.eval(IDS[:i + 1]), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("direct_io", [True, False])
def test_experts_in_the_files_last_page_are_read_whole(tmp_path, direct_io):
    """An expert whose page-aligned range would run past the end of the file is read exactly (through the page
    cache), the others around it as usual; every expert's bytes come back, unaligned offsets included."""
    from pyinfer import _core

    rng = np.random.default_rng(5)
    n_exp, sizes = 4, [3000, 5000, 1234]
    start = [100, 100 + 4 * 3000 + 7, 100 + 4 * 3000 + 7 + 4 * 5000 + 13]
    end = start[2] + 4 * sizes[2]   # the file ends where the last part's last expert does
    data = rng.integers(0, 256, end, dtype=np.uint8)
    path = tmp_path / "experts.bin"
    path.write_bytes(data.tobytes())
    layer = {"n_expert": n_exp, "file_offsets": start, "expert_bytes": sizes, "resident": [0]}
    store = _core.ExpertStore(str(path), [layer], 3, direct_io=direct_io)
    store.fetch(0, np.array([[0.3, 0.3, 0.4, 1, 2, 3]], np.float32), 3)
    for e in range(n_exp):
        for p in range(3):
            want = data[start[p] + e * sizes[p]:start[p] + (e + 1) * sizes[p]].tobytes()
            assert store.expert(0, p, e) == want, (e, p)


def test_a_layer_with_fewer_device_experts_than_a_token_chooses_runs_split(paths, tmp_path):
    """A placement file that gives a layer's device side one expert (k = 2): its share of the route holds one
    local expert and a -1 in most slots, and the logits still equal the CPU's."""
    import json

    from pyinfer.model.arch import model_config, open_model
    from pyinfer.place import expert_placement as ep
    from pyinfer.place.gpu_placement import GpuCosts

    path = paths["qwen3moe", Q.Q8_0]
    f = open_model(path)
    cfg = model_config(f)
    p = ep.place_experts(f, cfg, 1 << 30, 64, GpuCosts(1e-10, 0.0)).summary()
    p["gpu_experts"] = [[3], [0, 2, 5]]
    out = tmp_path / "experts.json"
    out.write_text(json.dumps(p))
    want = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False).eval(IDS[:20], all_logits=True)
    m = pyinfer.load(path, n_ctx=64, n_threads=2, device="standin", vram_budget=str(out), progress=False)
    np.testing.assert_allclose(m.eval(IDS[:20], all_logits=True), want, rtol=2e-5, atol=2e-5)


def test_a_limit_that_holds_the_whole_moe_streams_nothing(paths):
    """A memory limit with room for every expert maps the model as without a limit: no expert store, and no random
    read advice left on the mapping (gpt-oss-20b's shape at 20 GiB read 4 KiB a fault: 0.86 tok/s for 9)."""
    # (the limit plans only; CI's interpreter with torch imported already takes 1.1 GB of it)
    m = pyinfer.load(paths["qwen3moe", Q.Q8_0], n_ctx=64, n_threads=2, mem_limit="6G", progress=False)
    assert m.session.memory is not None and not m.session.memory.offload and m.session.experts is None
    ram = pyinfer.load(paths["qwen3moe", Q.Q8_0], n_ctx=64, n_threads=2, progress=False)
    np.testing.assert_array_equal(m.eval(IDS[:8], all_logits=True), ram.eval(IDS[:8], all_logits=True))
