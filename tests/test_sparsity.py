"""Sparse FFN path: exactness against dense, modes on tiny ReLU and SwiGLU models, the sidecar file."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import pyinfer
from pyinfer.runtime.sampling import Sampler, SamplingParams
from pyinfer.errors import PyinferError
from pyinfer.sparsity.plan import LayerPlan, Predictor, SparsityFileError, SparsityPlan
from support.plans import FF, L, TOKENS, all_active_plan, decode_logits
from support.tiny_model import write_tiny_llama



@pytest.fixture(scope="module")
def float_model_path(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("f32") / "tiny-f32.gguf", seed=3, matrix_type=Q.F32,
                                embed_type=Q.F32))




def test_all_active_predictor_reproduces_dense_logits(float_model_path):
    dense = pyinfer.load(float_model_path, n_threads=2, n_ctx=64)
    fp = dense.gguf.fingerprint()
    sparse = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=all_active_plan(fp))
    ref = decode_logits(dense, TOKENS)
    np.testing.assert_allclose(decode_logits(sparse, TOKENS), ref, rtol=1e-4, atol=1e-4)
    # prefill stays dense (through the permuted copies and back)
    np.testing.assert_allclose(sparse.eval(TOKENS, all_logits=True), dense.eval(TOKENS, all_logits=True),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["contrib", "gate"])
def test_threshold_only_zero_threshold_is_dense(float_model_path, mode):
    dense = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    plan = all_active_plan(dense.gguf.fingerprint(), mode=mode)
    for lp in plan.layers:
        lp.predictor, lp.hot = None, 0
    sparse = pyinfer.load(float_model_path, n_threads=1, n_ctx=64, sparsity=plan)
    np.testing.assert_allclose(decode_logits(sparse, TOKENS), decode_logits(dense, TOKENS), rtol=1e-4, atol=1e-4)


def test_emulated_prefill_matches_token_by_token_decode(float_model_path):
    """The batched evaluation path (used for perplexity) computes exactly what sparse decode does."""
    dense = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    plan = all_active_plan(dense.gguf.fingerprint(), threshold=0.05)
    rng = np.random.default_rng(1)
    for lp in plan.layers:  # a predictor that drops some neurons
        lp.predictor.cut = rng.choice([-1.0, 1.0], FF - lp.hot).astype(np.float32)
    dec = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=plan)
    emu = pyinfer.load(float_model_path, n_threads=2, n_ctx=64, sparsity=plan, emulate_prefill=True)
    got = decode_logits(dec, TOKENS)
    np.testing.assert_allclose(emu.eval(TOKENS, all_logits=True), got, rtol=1e-4, atol=1e-4)
    assert np.abs(got - decode_logits(dense, TOKENS)).max() > 1e-3  # and it really is sparse


def test_a_sparse_load_without_a_ram_budget_never_enters_offload(float_model_path, tmp_path):
    """offload/ (bundle files, neuron caches, I/O) is on the path of a load that streams, and of no other."""
    import subprocess
    import sys

    fp = pyinfer.load(float_model_path, n_threads=1, n_ctx=64).gguf.fingerprint()
    plan = all_active_plan(fp, threshold=0.05).save(tmp_path / "plan.npz")
    code = ("import sys, pyinfer; m = pyinfer.load(sys.argv[1], n_threads=1, n_ctx=64, sparsity=sys.argv[2], "
            "progress=False); m.eval([5, 17, 33]); assert m.sparsity is not None; "
            "print(sorted(n for n in sys.modules if n.startswith('pyinfer.offload')))")
    out = subprocess.run([sys.executable, "-c", code, float_model_path, str(plan)], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def relu_model_path(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("relu") / "tiny-relu.gguf", seed=5, matrix_type=Q.F32,
                                embed_type=Q.F32, ffn_activation="relu"))


def test_relu_mode_is_exact(relu_model_path, float_model_path):
    dense = pyinfer.load(relu_model_path, n_threads=1, n_ctx=64)
    assert dense.config.ffn_relu
    silu_twin = pyinfer.load(float_model_path, n_threads=1, n_ctx=64)
    assert not silu_twin.config.ffn_relu
    ref = decode_logits(dense, TOKENS)
    thr_only = all_active_plan(dense.gguf.fingerprint(), mode="relu")
    for lp in thr_only.layers:
        lp.predictor, lp.hot = None, 0
    np.testing.assert_allclose(decode_logits(pyinfer.load(relu_model_path, n_threads=2, n_ctx=64, sparsity=thr_only),
                                             TOKENS), ref, rtol=1e-4, atol=1e-4)
    with_pred = all_active_plan(dense.gguf.fingerprint(), mode="relu")
    np.testing.assert_allclose(decode_logits(pyinfer.load(relu_model_path, n_threads=2, n_ctx=64,
                                                          sparsity=with_pred), TOKENS), ref, rtol=1e-4, atol=1e-4)


def test_quantized_swiglu_sparse_path_runs_and_stays_close(tiny_model_path):
    dense = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = all_active_plan(dense.gguf.fingerprint())
    for down in ("q8_0", "q4_1"):
        sparse = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down)
        a, b = decode_logits(sparse, TOKENS), decode_logits(dense, TOKENS)
        # only the re-quantized neuron-major down (and float vs Q8 activations) differs
        assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.99


# ---- sidecar file -------------------------------------------------------------------------------
def test_sidecar_round_trip_and_errors(tmp_path, tiny_model_path):
    plan = all_active_plan("abc123" * 8, threshold=0.25)
    plan.layers[1].gate_threshold = 0.125
    path = plan.save(tmp_path / "plan.npz")
    back = SparsityPlan.load(path, "abc123" * 8, L, FF)
    assert back.mode == plan.mode and back.has_predictors
    for a, b in zip(plan.layers, back.layers):
        np.testing.assert_array_equal(a.perm, b.perm)
        np.testing.assert_array_equal(a.predictor.w2_q8, b.predictor.w2_q8)
        np.testing.assert_array_equal(a.predictor.cut, b.predictor.cut)
        assert (a.threshold, a.hot, a.gate_threshold) == (b.threshold, b.hot, b.gate_threshold)
    with pytest.raises(SparsityFileError, match="different model"):
        SparsityPlan.load(path, "f" * 48)
    with pytest.raises(SparsityFileError, match="layers"):
        SparsityPlan.load(path, n_layers=L + 1)
    with pytest.raises(SparsityFileError, match="not found"):
        SparsityPlan.load(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SparsityFileError, match="not a pyinfer sparsity file"):
        SparsityPlan.load(bad)
    # a plan for another model is refused by load()
    with pytest.raises(PyinferError, match="different model"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=path)


def test_sidecar_version_mismatch(tmp_path):
    import json

    path = all_active_plan("x" * 48).save(tmp_path / "plan.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(bytes(arrays["header"]).decode())
    header["version"] = 99
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(SparsityFileError, match="version 99"):
        SparsityPlan.load(path)


def test_profile_thresholds_hit_the_target():
    from pyinfer.sparsity.profile import Profile

    rng = np.random.default_rng(0)
    prof = Profile.empty("contrib", 1, 64, "fp", {})
    vals = np.abs(rng.standard_normal((4000, 64))) * np.linspace(0.1, 2.0, 64)  # neuron 63 fires most
    prof.add(0, vals.astype(np.float32), vals.astype(np.float32))
    for target in (0.3, 0.5, 0.7):
        t = prof.thresholds(target)[0]
        assert abs((vals < t).mean() - target) < 0.01
    order = prof.hot_first_order(prof.thresholds(0.5))[0]
    assert order[0] >= 56 and order[-1] <= 4  # coarse per-neuron bins: near-ties may swap
    cut = prof.gate_cuts(prof.thresholds(0.5), 0.95)[0]
    kept = (vals > cut)[vals > prof.thresholds(0.5)[0]].mean()
    assert kept >= 0.95


def test_predictor_training_reaches_recall_on_learnable_labels():
    from pyinfer.sparsity.predictor import TrainConfig, train_layer

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    y = (x @ w) > 0.5                                   # a linear rule: learnable
    freq = y.mean(0)
    order = np.argsort(-freq)
    pred, hot = train_layer(x, y[:, order], freq[order], TrainConfig(fixed_rank=32, epochs=10), 100.0)
    assert pred.stats["recall"] >= 0.9
    assert pred.stats["predicted_density"] < 0.8
    assert pred.w1_q8.shape[0] == 32 and pred.w2_q8.shape[0] == 96 - hot


def test_auto_calibrates_once_then_uses_the_cache(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert m.sparsity is not None and m.sparsity.mode == "contrib"
    assert m.sparsity.target == 0.4 and all(lp.threshold > 0 for lp in m.sparsity.layers)
    # the plan and its gate-first candidate (beside them: the input-sparse candidate and its profile)
    cached = sorted((p for p in (tmp_path / "sparsity").glob("*.npz") if "-input-" not in p.name),
                    key=lambda p: len(p.name))
    assert len(cached) == 2 and cached[1].name == cached[0].stem + "-gate.npz"
    gate = SparsityPlan.load(cached[1])
    assert gate.mode == "contrib" and gate.target == 0.4 and gate.info["auto_candidate"] == "gate"
    assert [lp.threshold for lp in gate.layers] == [lp.threshold for lp in m.sparsity.layers]
    assert all(lp.gate_threshold > 0 for lp in gate.layers) and gate.info["gate_recall"] == 0.96
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert [lp.threshold for lp in again.sparsity.layers] == [lp.threshold for lp in m.sparsity.layers]
    # The cached plan is the same plan: both models decode the same sparse tokens, which a dense model need not.
    ids = m.tokenize("hello")

    def decode(model, t):  # one token after the prompt: the sparse path
        model.eval(ids)
        return model.forward([t], len(ids), np.array([0]))[0]

    for t in (3, 7, 11):
        np.testing.assert_array_equal(decode(again, t), decode(m, t))
    assert len(list(m._token_stream(ids, 4, Sampler(SamplingParams(0.0))))) >= 1


def test_auto_on_a_relu_model_trains_predictors(relu_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    m = pyinfer.load(relu_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert m.sparsity.mode == "relu" and m.sparsity.has_predictors
    assert all(lp.threshold == 0.0 for lp in m.sparsity.layers)


# ---- GELU-gated FFNs (Gemma 3) ------------------------------------------------------------------
def test_gelu_model_sparse_paths(tmp_path, monkeypatch):
    """A GeGLU model: the all-active plans reproduce dense decode (a gate-first one too), `auto` calibrates with
    the |GELU(g) u| criterion and emulated prefill equals token-by-token sparse decode, and so does its gate-first
    (CATS) candidate, which cuts on |GELU(g)|."""
    from support.tiny_model import TINY_GEMMA3, write_tiny_gemma3

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    path = str(write_tiny_gemma3(tmp_path / "g.gguf", seed=2, types={k: Q.F32 for k in
                                 ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}))
    dense = pyinfer.load(path, n_threads=2, n_ctx=64)
    ff = TINY_GEMMA3["d_ff"]
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(TINY_GEMMA3["n_layers"]):
        pred = Predictor(quants.quantize(np.zeros((32, TINY_GEMMA3["d_model"]), np.float32), Q.Q8_0),
                         np.zeros(32, np.float32), quants.quantize(np.zeros((ff - 16, 32), np.float32), Q.Q8_0),
                         np.full(ff - 16, -1.0, np.float32), {"recall": 1.0})
        layers.append(LayerPlan(rng.permutation(ff).astype(np.int32), 0.0, 16, pred))
    plan = SparsityPlan("contrib", 0.0, layers, dense.gguf.fingerprint())
    sparse = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=plan)
    ref = decode_logits(dense, TOKENS)
    # Only float summation order differs (axpy over neurons vs the dense down), through seven layers.
    np.testing.assert_allclose(decode_logits(sparse, TOKENS), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())
    for lp in plan.layers:  # gate first, cut at 0: every neuron whose GELU is not exactly 0 runs
        lp.predictor, lp.hot = None, 0
    gate_all = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=SparsityPlan("gate", 0.0, layers, plan.fingerprint))
    np.testing.assert_allclose(decode_logits(gate_all, TOKENS), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())

    auto = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity="auto", target=0.5, progress=False)
    assert auto.sparsity.mode == "contrib" and all(lp.gate_threshold == 0 for lp in auto.sparsity.layers)
    emu = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity="auto", target=0.5, progress=False,
                       emulate_prefill=True)
    got = decode_logits(auto, TOKENS)
    np.testing.assert_allclose(emu.eval(TOKENS, all_logits=True), got, rtol=1e-4, atol=1e-4)
    assert np.abs(got - decode_logits(dense, TOKENS)).max() > 1e-4  # it really is sparse
    gate_file = next((tmp_path / "cache" / "sparsity").glob("*-gate.npz"))
    gate = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=str(gate_file), progress=False)
    assert all(lp.threshold > 0 and lp.gate_threshold > 0 for lp in gate.sparsity.layers)
    emu = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=str(gate_file), progress=False, emulate_prefill=True)
    got = decode_logits(gate, TOKENS)
    np.testing.assert_allclose(emu.eval(TOKENS, all_logits=True), got, rtol=1e-4, atol=1e-4)
    assert np.abs(got - decode_logits(dense, TOKENS)).max() > 1e-4
    with pytest.raises(PyinferError, match="CATS"):
        from pyinfer.model.config import Activation
        from pyinfer.sparsity.recorder import criterion
        criterion("gate", np.zeros((1, 4)), np.zeros((1, 4)), Activation.RELU2)


# ---- PowerInfer's model files --------------------------------------------------------------------
def test_powerinfer_file_runs_its_own_predictors(tmp_path):
    """A file in PowerInfer's converter layout (PWRI magic, fc1/fc2 predictors, transposed down, threshold
    key): it loads as a ReLU model, its dense path equals the numpy reference with down = down_t^T, and
    sparsity="auto" uses its predictors (no calibration) exactly as numpy computes them: neuron j runs
    when (fc2 relu(fc1 x))[j] >= threshold, with the Q8_0 predictor weights the engine holds."""
    from gguf import GGMLQuantizationType as GQ

    from support.reference_llama import reference_logits
    from support.tiny_model import write_tiny_llama

    path = str(write_tiny_llama(tmp_path / "pwri.gguf", seed=7, matrix_type=Q.F32, embed_type=Q.F32,
                                powerinfer=dict(rank=32, threshold=0.25)))
    assert open(path, "rb").read(4) == b"PWRI"
    dense = pyinfer.load(path, n_threads=2, n_ctx=64)
    assert dense.gguf.powerinfer and dense.config.activation == pyinfer.model.config.Activation.RELU
    np.testing.assert_allclose(dense.eval(TOKENS, all_logits=True), reference_logits(dense.gguf, TOKENS),
                               rtol=1e-3, atol=1e-3)

    sparse = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    plan = sparse.sparsity
    assert plan.info["calibration"] == "powerinfer predictors" and plan.info["sparse_threshold"] == 0.25
    got = decode_logits(sparse, TOKENS)

    # numpy: the same forward with each layer's FFN restricted to the predicted neurons
    g = dense.gguf
    c = dense.config

    def deq(name):
        t = g.tensor(name)
        return quants.dequantize(np.asarray(t.data), GQ[t.type_name]).reshape(t.rows, t.cols).astype(np.float64)

    from support import reference_llama as R

    def q8(a):  # the engine's activation rounding before an integer dot: 8 bits per 32 values
        b = a.reshape(len(a), -1, 32)
        amax = np.abs(b).max(-1, keepdims=True)
        return (np.rint(b * np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0)) * amax / 127).reshape(a.shape)

    def predicted_ffn_logits():
        emb = deq("token_embd.weight")
        x = emb[TOKENS]
        pos = np.arange(len(TOKENS))
        for il in range(c.n_layers):
            p = f"blk.{il}."
            h = R.rms_norm(x, deq(p + "attn_norm.weight")[0], c.norm_eps)
            q = R.rope(h @ deq(p + "attn_q.weight").T, pos, c.n_heads, c.head_dim, c.rope_base)
            k = R.rope(h @ deq(p + "attn_k.weight").T, pos, c.n_kv_heads, c.head_dim, c.rope_base)
            v = h @ deq(p + "attn_v.weight").T
            x = x + R.attention(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim) @ deq(p + "attn_output.weight").T
            h = R.rms_norm(x, deq(p + "ffn_norm.weight")[0], c.norm_eps)
            pred = plan.layers[il].predictor
            w1 = quants.dequantize(pred.w1_q8, GQ.Q8_0).reshape(pred.rank, -1)
            w2 = quants.dequantize(pred.w2_q8, GQ.Q8_0).reshape(c.d_ff, pred.rank)
            active = (q8(np.maximum(q8(h) @ w1.T, 0)) @ w2.T) >= 0.25
            gate = np.maximum(h @ deq(p + "ffn_gate.weight").T, 0) * (h @ deq(p + "ffn_up.weight").T) * active
            x = x + gate @ deq(p + "ffn_down_t.weight")
        h = R.rms_norm(x, deq("output_norm.weight")[0], c.norm_eps)
        return h @ emb.T

    want = predicted_ffn_logits()
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 2e-3 * scale  # a near-tie score could flip one neuron: none here
    assert np.abs(got - decode_logits(dense, TOKENS)).max() > 1e-3 * scale  # and the predictor did skip some


def test_the_same_prompt_twice_gives_the_same_tokens_on_a_sparse_model(tiny_model_path):
    # The second call reuses the cached prompt; its last token must not be rerun alone (one token runs
    # sparse, the prompt ran dense), or greedy decoding would change between two identical calls.
    from support.plans import varying_predictor_plan

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=varying_predictor_plan(m.gguf.fingerprint()))
    ids = m.tokenize("Once upon a time there was")
    first = m._prefill(ids)  # the logits generate() samples the first token from
    np.testing.assert_array_equal(m._prefill(ids), first)
    assert m.generate(ids, max_tokens=10, temperature=0) == m.generate(ids, max_tokens=10, temperature=0)
    # A prompt one token longer than a micro-batch: its last token does not run alone the first time either.
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=600, sparsity=m.sparsity)
    ids = [int(t) for t in np.random.default_rng(0).integers(1, m.config.vocab_size, 513)]
    first = m._prefill(ids)
    np.testing.assert_array_equal(m._prefill(ids), first)


def test_auto_decodes_dense_where_its_plan_is_not_faster_and_remembers_why(tiny_model_path, tmp_path, monkeypatch):
    """Timed against dense once per machine: a plan that does not beat dense by the bar is not used (the choice
    and both speeds are kept with the cached plan and not measured again); an explicit target or a plan file
    keeps the plan without timing it."""
    from pyinfer.sparsity import auto_choice
    from pyinfer.sparsity.plan import SparsityPlan
    from pyinfer.sparsity.resolve import auto_plan_path

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "KEEP_AT", float("inf"))  # nothing is fast enough
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    c = m.session.auto_choice
    assert m.sparsity is None and c["chose"] == "dense" and c["sparse_tok_s"] > 0 and c["dense_tok_s"] > 0
    path = auto_plan_path(m.session.gguf.fingerprint(), 0.4)
    assert SparsityPlan.load(path).info["auto_choice"]["chose"] == "dense"

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(auto_choice, "measure_choice", no_measuring)
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert again.sparsity is None and again.session.auto_choice == c
    explicit = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", target=0.4, progress=False)
    assert explicit.sparsity is not None and explicit.session.auto_choice is None
    assert pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=str(path), progress=False).sparsity is not None
    # Another machine (or thread count) measures again.
    monkeypatch.setattr(auto_choice, "measure_choice", lambda s, p, g=None, **k: dict(c, chose="sparse", machine="x"))
    other = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity="auto", progress=False)
    assert other.sparsity is not None and other.session.auto_choice["chose"] == "sparse"


def test_auto_keeps_a_plan_that_decodes_faster(tiny_model_path, tmp_path, monkeypatch):
    from pyinfer.sparsity import auto_choice

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "KEEP_AT", 0.0)
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert m.sparsity is not None and m.session.auto_choice["chose"] == "sparse"
    assert m.session.auto_choice["machine"] == auto_choice.machine_key(2)


def test_a_plans_dense_layers_decode_dense_and_are_kept_in_its_file(tiny_model_path, tmp_path):
    """A layer marked dense runs the dense FFN (all marked: the dense model's logits, bit for bit); the marks
    survive the plan file."""
    from support.plans import varying_predictor_plan

    from pyinfer.sparsity.plan import SparsityPlan

    dense = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(dense.gguf.fingerprint())
    n = len(plan.layers)
    want = decode_logits(dense, TOKENS)
    all_dense = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan.with_dense_layers(range(n)))
    np.testing.assert_array_equal(decode_logits(all_dense, TOKENS), want)
    assert plan.dense_layers == []  # the copy, not the plan, is marked
    mixed = plan.with_dense_layers([1])
    sparse = decode_logits(pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan), TOKENS)
    got = decode_logits(pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=mixed), TOKENS)
    assert not np.array_equal(got, want) and not np.array_equal(got, sparse)  # layer 0 sparse, layer 1 dense
    loaded = SparsityPlan.load(mixed.save(tmp_path / "mixed.npz"))
    assert loaded.dense_layers == [1]
    np.testing.assert_array_equal(decode_logits(pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64,
                                                             sparsity=loaded), TOKENS), got)


def test_each_layers_ffn_is_timed_on_its_own(tiny_model_path):
    """Node timing summed per layer: every FFN took time, and timing off then on starts again from zero."""
    from pyinfer.sparsity.auto_choice import decode_ffn_seconds

    from pyinfer.runtime.sparse_ffn import SparseRuns
    from pyinfer.runtime.running import build_running

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    run = build_running(m.session.parts(n_threads=2, sparsity=None), 32, 16, SparseRuns())
    ids = np.array(TOKENS * 3, np.int32)
    seconds = decode_ffn_seconds(run, ids, 8, 6)
    assert seconds.shape == (m.config.n_layers,) and np.all(seconds > 0)
    run.set_op_timing(True)
    assert np.all(run.ffn_seconds() == 0)


def test_auto_keeps_sparse_decode_in_the_layers_where_it_pays(tiny_model_path, tmp_path, monkeypatch):
    """The whole plan loses, one layer's sparse FFN beats its dense one: the mix (that layer sparse, the other
    dense) is timed, kept, said, cached with the plan and not measured again."""
    from pyinfer.sparsity import auto_choice

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "KEEP_AT", 1.03)
    speeds = {"dense": 100.0, "sparse": 90.0, "gate": 80.0, "layers": 110.0, "input": 95.0}  # tok/s by engine
    monkeypatch.setattr(auto_choice, "interleaved_tok_s",
                        lambda engines, *a: {k: speeds[k] for k in engines})
    monkeypatch.setattr(auto_choice, "layer_ratios", lambda *a, **k: np.array([1.3, 0.7]))
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    c = m.session.auto_choice
    assert c["chose"] == "layers" and c["sparse_layers"] == [0] and c["layer_ratios"] == [1.3, 0.7]
    assert c["layers_ratio"] == pytest.approx(1.1) and m.sparsity.dense_layers == [1]
    assert "in 1 of 2 layers" in auto_choice.describe(c)
    monkeypatch.setattr(auto_choice, "measure_choice", lambda *a, **k: pytest.fail("measured again"))
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert again.sparsity.dense_layers == [1] and again.session.auto_choice == c
    # A mix slower than the bar: dense, and why.
    monkeypatch.undo()
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "slow"))
    monkeypatch.setattr(auto_choice, "KEEP_AT", 1.03)
    speeds["layers"] = 101.0
    monkeypatch.setattr(auto_choice, "interleaved_tok_s", lambda engines, *a: {k: speeds[k] for k in engines})
    monkeypatch.setattr(auto_choice, "layer_ratios", lambda *a, **k: np.array([1.3, 0.7]))
    slow = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert slow.sparsity is None and slow.session.auto_choice["chose"] == "dense"
    # No layer pays: no mix is built or timed.
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "none"))
    monkeypatch.setattr(auto_choice, "layer_ratios", lambda *a, **k: np.array([0.9, 0.8]))
    none = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    c = none.session.auto_choice
    assert c["chose"] == "dense" and "layers_tok_s" not in c and "no layer" in auto_choice.describe(c)


def test_auto_choice_bars(monkeypatch):
    """The threshold plan must beat dense by KEEP_AT; the gate-first plan, which costs more perplexity, must beat
    the better of the other two by GATE_KEEP_AT (and dense by KEEP_AT)."""
    from pyinfer.sparsity import auto_choice
    from pyinfer.sparsity.auto_choice import choose

    monkeypatch.setattr(auto_choice, "KEEP_AT", 1.03)  # the shipped bars (the test fixture lowers them)
    monkeypatch.setattr(auto_choice, "GATE_KEEP_AT", 1.03)

    assert choose({"sparse": 1.02}) == "dense"
    assert choose({"sparse": 1.04}) == "sparse"
    assert choose({"sparse": 1.04, "gate": 1.06}) == "sparse"  # not 3% above the threshold plan
    assert choose({"sparse": 1.04, "gate": 1.08}) == "gate"
    assert choose({"sparse": 0.90, "gate": 1.04}) == "gate"
    assert choose({"sparse": 0.90, "gate": 1.02}) == "dense"
    assert choose({"sparse": 0.90, "layers": 1.04}) == "layers"  # the mix of the layers where sparse pays
    assert choose({"sparse": 0.90, "layers": 1.02}) == "dense"
    assert choose({"sparse": 1.05, "layers": 1.04}) == "sparse"
    assert choose({"sparse": 0.90, "layers": 1.04, "gate": 1.06}) == "layers"
    # The input-sparse plan spends the whole quality bound: 3% above the best of the others, and dense.
    monkeypatch.setattr(auto_choice, "INPUT_KEEP_AT", 1.03)
    assert choose({"sparse": 1.04, "input": 1.06}) == "sparse"
    assert choose({"sparse": 1.04, "input": 1.08}) == "input"
    assert choose({"sparse": 0.90, "gate": 1.04, "input": 1.06}) == "gate"
    assert choose({"sparse": 0.90, "input": 1.02}) == "dense"
    # A plan past the quality bound is never kept, however fast.
    assert choose({"sparse": 1.30, "input": 1.10}, allowed={"dense", "input"}) == "input"
    assert choose({"sparse": 1.30, "layers": 1.2}, allowed={"dense"}) == "dense"


def test_auto_weighs_the_input_sparse_plan_within_the_quality_bound(tiny_model_path, tmp_path, monkeypatch):
    """On a SwiGLU model `auto` times the input-sparse plan (chosen within the bound on held-out calibration text)
    beside its threshold plan; kept, it is the plan the model runs, the choice stores every candidate's held-out
    perplexity change, and the next load measures nothing. A plan past the bound is timed but not kept."""
    from pyinfer.sparsity import auto_choice

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "INPUT_KEEP_AT", 0.0)
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", sparsity_quality=50.0, progress=False)
    c = m.session.auto_choice
    assert c["chose"] == "input" and m.sparsity.mode == "input" and c["input_tok_s"] > 0 and c["input_levels"]
    q = c["quality"]
    assert q["bound_pct"] == 50.0 and q["dense_ppl"] > 0 and set(q["changes"]) >= {"sparse", "input"}
    assert q["changes"]["input"] * 100 <= 50.0 and "input-sparse" in auto_choice.describe(c)
    monkeypatch.setattr(auto_choice, "measure_choice", lambda *a, **k: pytest.fail("measured again"))
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", sparsity_quality=50.0,
                         progress=False)
    assert again.sparsity.mode == "input" and again.session.auto_choice == c
    # Another bound weighs again; here every plan but dense is past it.
    monkeypatch.undo()
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "KEEP_AT", 0.0)
    monkeypatch.setattr(auto_choice, "input_candidate", lambda *a, **k: None)
    monkeypatch.setattr(auto_choice, "quality_changes",
                        lambda s, plans, known=None: ({k: 0.5 for k, p in plans.items() if p is not None}, 10.0))
    bounded = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    c = bounded.session.auto_choice
    assert bounded.sparsity is None and c["chose"] == "dense" and c["quality"]["bound_pct"] == 3.0
    assert "past the +3% held-out perplexity bound: threshold plan +50.0%" in auto_choice.describe(c)


def test_auto_keeps_its_gate_first_candidate_where_that_is_fastest(tiny_model_path, tmp_path, monkeypatch):
    """The gate-first candidate is timed with the threshold plan; kept, it is the plan the model runs, and
    the stored choice says so (and is not measured again). A cache from before the candidate existed keeps
    its two-way choice."""
    from pyinfer.sparsity import auto_choice
    from pyinfer.sparsity.resolve import auto_plan_path, gate_candidate_path

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    monkeypatch.setattr(auto_choice, "GATE_KEEP_AT", 0.0)
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    c = m.session.auto_choice
    assert c["chose"] == "gate" and m.sparsity.layers[0].gate_threshold > 0 and c["gate_tok_s"] > 0
    assert "gate-first" in auto_choice.describe(c)
    monkeypatch.setattr(auto_choice, "measure_choice", lambda *a, **k: pytest.fail("measured again"))
    again = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert again.sparsity.layers[0].gate_threshold > 0 and again.session.auto_choice == c
    # An older cache: the plan without its candidate file weighs (and stored) only threshold against dense.
    path = auto_plan_path(m.session.gguf.fingerprint(), 0.4)
    gate_candidate_path(path).unlink()
    monkeypatch.setattr(auto_choice, "measure_choice", lambda s, p, g=None, **k: dict(
        {k: v for k, v in c.items() if not k.startswith("gate")}, chose="sparse"))
    old = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity="auto", progress=False)
    assert old.sparsity.layers[0].gate_threshold == 0 and old.session.auto_choice["chose"] == "sparse"
