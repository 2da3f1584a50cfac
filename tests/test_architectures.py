"""Each architecture of model/arch/ against the numpy reference (tests/reference_llama.py, written from
llama.cpp's graphs): prefill and decode logits, sparse decode, and the refusals that keep a file from running
wrongly. bench/arch_check.py runs the same tiny models against llama.cpp itself."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import pyinfer
from pyinfer.model.arch import ARCHITECTURES
from support.reference_llama import reference_logits
from support.tiny_model import write_tiny_arch

KINDS = ("llama3", "qwen2", "qwen3", "phi3")
IDS = list(range(3, 51))  # 48 positions


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    return {(k, q): str(write_tiny_arch(d / f"{k}-{q.name}.gguf", k, seed=len(k), qtype=q))
            for k in KINDS for q in (Q.F32, Q.Q8_0)}


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_matches_the_reference(paths, kind, qtype):
    m = pyinfer.load(paths[kind, qtype], n_ctx=64, n_threads=2, progress=False)
    got = m.eval(IDS, all_logits=True)
    ref = reference_logits(m.gguf, IDS, n_ctx=64)
    if qtype == Q.F32:  # an fp16 KV cache against fp32 everywhere: the bar
        assert rel_err(got, ref) < 0.01
        assert (got.argmax(1) == ref.argmax(1)).mean() == 1.0
    else:  # Q8_0 weights also take Q8 activations (llama.cpp's integer dot), which the reference does not
        assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.999
        assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("kind", KINDS)
def test_decode_matches_prefill(paths, kind):
    m = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, progress=False)
    full = m.eval(IDS[:12], all_logits=True)
    one = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, progress=False)
    steps = np.stack([one.eval(IDS[:i + 1])[None, :][0] for i in range(12)])  # each call extends the cache
    np.testing.assert_allclose(steps, full, rtol=1e-4, atol=1e-4 * np.abs(full).max())


def test_phi3_long_factors_beyond_the_original_context(paths):
    """Phi-3's LongRoPE: `short` factors up to the original context (128 here), `long` beyond it, decided by
    the context the model is loaded with, as llama.cpp does."""
    short = pyinfer.load(paths["phi3", Q.F32], n_ctx=64, progress=False)
    long = pyinfer.load(paths["phi3", Q.F32], n_ctx=256, progress=False)
    a, b = short.eval(IDS, all_logits=True), long.eval(IDS, all_logits=True)
    assert rel_err(b, reference_logits(long.gguf, IDS, n_ctx=256)) < 0.01
    assert rel_err(a, b) > 0.01  # the factors differ, so the logits do


def test_llama3_rope_factors_are_used(paths, tmp_path):
    """Llama 3.1's rope_freqs.weight changes the answer (ignored, it gave logits 43% off llama.cpp's)."""
    from support.tiny_model import write_tiny_llama

    with_f = pyinfer.load(paths["llama3", Q.F32], n_ctx=64, progress=False).eval(IDS, all_logits=True)
    ref_without = reference_logits(pyinfer.load(paths["llama3", Q.F32], n_ctx=64, progress=False).gguf, IDS)
    assert rel_err(with_f, ref_without) < 0.01
    # The same weights without the factors answer differently.
    plain = str(write_tiny_arch(tmp_path / "plain.gguf", "qwen2", seed=6))  # any model without factors
    assert "rope_freqs.weight" not in pyinfer.load(plain, n_ctx=64, progress=False).gguf.tensors


@pytest.mark.parametrize("kind", KINDS)
def test_sparse_decode_runs_on_every_architecture(paths, kind, tmp_path, monkeypatch):
    """`auto` calibrates, and sparse decode stays close to dense and differs from it (it is sparse)."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    dense = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, progress=False)
    sparse = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, sparsity="auto", target=0.3, progress=False)
    assert sparse.sparsity is not None and len(sparse.sparsity.layers) == dense.config.n_layers
    a = np.stack([dense.eval(IDS[:i + 1]) for i in range(8)])
    b = np.stack([sparse.eval(IDS[:i + 1]) for i in range(8)])
    assert 0 < rel_err(b, a) < 0.5
    assert sparse.generate("the", max_tokens=4, temperature=0) is not None


def test_qwen3_head_size_is_its_own_key(paths):
    c = pyinfer.load(paths["qwen3", Q.F32], n_ctx=64, progress=False).config
    assert c.head_dim == 32 and c.n_heads * c.head_dim == 2 * c.d_model and c.qk_norm and c.rope_neox


def test_a_fused_qkv_of_the_wrong_size_is_refused(tmp_path):
    p = write_tiny_arch(tmp_path / "bad.gguf", "phi3", bad_qkv_rows=16)
    with pytest.raises(pyinfer.PyinferError, match="attn_qkv"):
        pyinfer.load(str(p), n_ctx=64, progress=False)


def test_registry_lists_what_runs():
    assert set(ARCHITECTURES) == {"llama", "gemma3", "qwen2", "qwen3", "phi3", "qwen2moe", "qwen3moe", "olmoe", "granitemoe", "glm4moe", "gpt-oss", "deepseek2", "smallthinker", "qwen35", "qwen35moe", "qwen3next", "gemma4"}


def test_linear_rope_scaling(tmp_path):
    """rope.scaling linear (llama.cpp: every pair's frequency times 1 / factor); type none never scales."""
    from support.tiny_model import write_tiny_llama

    def scaled(kind, factor):
        return lambda w: (w.add_string("llama.rope.scaling.type", kind), w.add_float32("llama.rope.scaling.factor", factor))

    paths = {k: str(write_tiny_llama(tmp_path / f"{k}.gguf", matrix_type=Q.F32, embed_type=Q.F32, extra=e))
             for k, e in (("plain", None), ("linear", scaled("linear", 4.0)), ("none", scaled("none", 4.0)))}
    got = {k: pyinfer.load(p, n_ctx=64, progress=False).eval(IDS, all_logits=True) for k, p in paths.items()}
    ref = reference_logits(pyinfer.load(paths["linear"], n_ctx=64, progress=False).gguf, IDS)
    assert rel_err(got["linear"], ref) < 0.01 and rel_err(got["linear"], got["plain"]) > 0.01
    np.testing.assert_array_equal(got["none"], got["plain"])


def test_gemma3_scales_only_its_global_layers(tmp_path):
    """Gemma 3 4B-27B carry rope.scaling linear 8: llama.cpp applies it to the global layers only."""
    from support.tiny_model import write_tiny_gemma3

    f32 = {k: Q.F32 for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    path = str(write_tiny_gemma3(tmp_path / "g.gguf", types=f32))
    scaled = tmp_path / "g8.gguf"
    write_tiny_gemma3(scaled, types=f32, extra=lambda w: (w.add_string("gemma3.rope.scaling.type", "linear"),
                                                          w.add_float32("gemma3.rope.scaling.factor", 8.0)))
    ids = IDS[:20]
    m = pyinfer.load(str(scaled), n_ctx=64, progress=False)
    got = m.eval(ids, all_logits=True)
    assert rel_err(got, reference_logits(m.gguf, ids)) < 0.01
    assert rel_err(got, pyinfer.load(path, n_ctx=64, progress=False).eval(ids, all_logits=True)) > 1e-3
    assert [m.config.layer_freq_scale(i) for i in range(7)] == [1, 1, 1, 1, 1, 0.125, 1]


@pytest.mark.parametrize("kind", KINDS)
def test_predictors_train_and_run_on_every_architecture(kind, tmp_path, monkeypatch):
    """A ReLU-gated model of each architecture (pyinfer.ffn_activation=relu): `auto` profiles it, trains each
    layer's predictor and decodes through them (the hybrid and offloaded FFNs read the same plan)."""
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path / "cache"))
    path = str(write_tiny_arch(tmp_path / f"{kind}-relu.gguf", kind, seed=9,
                               extra=lambda w: w.add_string("pyinfer.ffn_activation", "relu")))
    m = pyinfer.load(path, n_ctx=64, n_threads=2, sparsity="auto", progress=False)
    assert m.sparsity.mode == "relu" and m.sparsity.has_predictors
    assert m.generate("the", max_tokens=4, temperature=0) is not None
    assert any(int(u[0]) >= 0 for u in m.layer_unions())  # the last decode step ran sparse somewhere


@pytest.mark.parametrize("kind", ["qwen2", "phi3"])
def test_the_split_graph_runs_every_architecture(paths, kind):
    """On the stand-in device (a second CPU backend in its own memory space), q/k/v biases, fused-tensor views
    and RoPE factors run where the placement puts them, and the logits are the CPU's."""
    cpu = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, progress=False).eval(IDS, all_logits=True)
    dev = pyinfer.load(paths[kind, Q.F32], n_ctx=64, n_threads=2, device="standin", vram_budget="200M",
                       progress=False)
    assert dev.n_copies > 0
    np.testing.assert_allclose(dev.eval(IDS, all_logits=True), cpu, rtol=1e-4, atol=1e-4 * np.abs(cpu).max())
