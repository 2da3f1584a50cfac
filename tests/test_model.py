"""The whole C++ forward pass against the numpy reference, on a tiny random model and on the real one."""
import numpy as np
import pytest

import pyinfer
from pyinfer.errors import PyinferError
from support.reference_llama import reference_logits


def _agree(got: np.ndarray, want: np.ndarray, min_corr: float):
    corr = np.corrcoef(got.ravel(), want.ravel())[0, 1]
    assert corr > min_corr, f"logit correlation {corr}"
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8


@pytest.mark.parametrize("isa", pyinfer._core.available_isas().split(","))
def test_tiny_model_matches_numpy_reference(tiny_model_path, isa):
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, isa=isa)
    ids = m.tokenize("the cat in the hat is a thing")
    _agree(m.eval(ids, all_logits=True), reference_logits(m.gguf, ids), 0.9995)


@pytest.fixture(scope="module")
def tiny_gemma_path(tmp_path_factory) -> str:
    from support.tiny_model import write_tiny_gemma3

    return str(write_tiny_gemma3(tmp_path_factory.mktemp("gemma") / "tiny-gemma3.gguf"))


@pytest.mark.parametrize("isa", pyinfer._core.available_isas().split(","))
def test_tiny_gemma3_matches_numpy_reference(tiny_gemma_path, isa):
    """Every Gemma 3 feature (scaled embeddings, QK-norm, NEOX RoPE, sliding-window local layers with their
    own RoPE base, post norms, GELU, K-quant and Q5_0 weights) against the numpy forward, over more tokens
    than the window so the local layers drop keys."""
    m = pyinfer.load(tiny_gemma_path, n_threads=2, n_ctx=64, isa=isa)
    assert m.config.arch == "gemma3" and m.config.activation == pyinfer.model.config.Activation.GELU_TANH
    assert m.config.head_dim * m.config.n_heads != m.config.d_model
    ids = m.tokenize("the cat in the hat is a thing that the thin hat is in")
    assert len(ids) > 2 * m.config.sliding_window
    _agree(m.eval(ids, all_logits=True), reference_logits(m.gguf, ids), 0.9995)


def test_real_gemma3_matches_numpy_reference(gemma_model):
    ids = gemma_model.tokenize("The capital of France is Paris. The capital of Italy is")
    assert ids[0] == gemma_model.tokenizer.bos_id
    want = reference_logits(gemma_model.gguf, ids)
    got = gemma_model.eval(ids, all_logits=True)
    _agree(got, want, 0.995)
    assert got[-1].argmax() == want[-1].argmax()
    assert "Rome" in gemma_model.generate("The capital of France is Paris. The capital of Italy is", max_tokens=4,
                                          temperature=0)


# Batching must not change a token's numbers: the tile kernels sum in the same order as decode's. AMX does not
# (tests/test_amx.py compares it on its own), so these take the best other table.
EXACT_ISA = next(i for i in pyinfer._core.available_isas().split(",") if i != "amx")


@pytest.mark.parametrize("model_path", ["tiny_model_path", "tiny_gemma_path"])
def test_batched_prefill_equals_token_by_token(model_path, request):
    """On Gemma 3 the decode steps also pass its window: they must see the keys the batched prefill saw."""
    m = pyinfer.load(request.getfixturevalue(model_path), n_threads=2, n_ctx=64, isa=EXACT_ISA)
    ids = m.tokenize("the theme in the thin hat the theme")
    full = m.eval(ids, all_logits=True)
    step = [m.forward([t], i, np.array([0]))[0] for i, t in enumerate(ids)]
    np.testing.assert_allclose(full, np.stack(step), rtol=1e-4, atol=1e-4)


def test_chunked_prefill_equals_single_batch(tiny_model_path, monkeypatch):
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, isa=EXACT_ISA)
    ids = (m.tokenize("the theme in the thin hat") * 3)[:40]
    whole = m.eval(ids, all_logits=True)
    m._max_batch = 7  # same engine, smaller micro-batches
    np.testing.assert_allclose(m.eval(ids, all_logits=True), whole, rtol=1e-4, atol=1e-4)


def test_real_model_matches_numpy_reference(real_model):
    ids = real_model.tokenize("The capital of France is Paris. The capital of Italy is")
    want = reference_logits(real_model.gguf, ids)
    got = real_model.eval(ids, all_logits=True)
    _agree(got, want, 0.995)
    assert got[-1].argmax() == want[-1].argmax()


def test_real_model_greedy_generation_is_deterministic(real_model):
    a = real_model.generate("The capital of France is", max_tokens=12, temperature=0)
    b = real_model.generate("The capital of France is", max_tokens=12, temperature=0)
    assert a == b and "Paris" in a
    assert "".join(real_model.stream("The capital of France is", max_tokens=12, temperature=0)) == a


def test_seeded_sampling_is_reproducible(real_model):
    kw = dict(max_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=7)
    assert real_model.generate("Once upon a time", **kw) == real_model.generate("Once upon a time", **kw)


def test_stop_strings_cut_output(real_model):
    full = real_model.generate("1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert " 6" in full
    cut = real_model.generate("1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6"])
    assert cut == full[:full.index(" 6")]


def test_chat_uses_the_models_template(real_model):
    text = real_model.render_chat([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    reply = real_model.chat([{"role": "user", "content": "Write one sentence about cats."}], max_tokens=24,
                            temperature=0)
    assert reply.strip() and "<|im_end|>" not in reply and "<|im_start|>" not in reply


def test_eval_last_equals_all_logits_last_row(real_model):
    ids = real_model.tokenize("Hello world, this is a test")
    np.testing.assert_allclose(real_model.eval(ids), real_model.eval(ids, all_logits=True)[-1], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("cache", ["q8_0", "f32"])
def test_other_caches_track_the_f16_cache(tmp_path, cache):
    """The q8_0 cache rounds K and V to 8 bits per 32 values, the f32 cache not at all: logits move a little, the
    argmax rarely (test_attention checks the op itself, prefill and decode)."""
    from support.tiny_model import write_tiny_llama

    path = write_tiny_llama(tmp_path / "hd32.gguf", config={"n_heads": 2, "n_kv_heads": 1})
    ids = list(np.random.default_rng(3).integers(0, 200, 120))
    f16 = pyinfer.load(str(path), n_threads=2, n_ctx=128).eval(ids, all_logits=True)
    other = pyinfer.load(str(path), n_threads=2, n_ctx=128, cache_type=cache).eval(ids, all_logits=True)
    assert np.abs(other - f16).max() / np.abs(f16).max() < 0.05
    assert (other.argmax(-1) == f16.argmax(-1)).mean() > 0.9


def test_bad_cache_type_is_one_line(tiny_model_path):
    with pytest.raises(PyinferError, match="cache_type must be one of f16, q8_0, f32"):
        pyinfer.load(tiny_model_path, cache_type="q4_0")
    with pytest.raises(PyinferError, match="multiple of 32"):  # the tiny model's heads have 16 values
        pyinfer.load(tiny_model_path, cache_type="q8_0")


def _mapped(t) -> bool:
    return isinstance(t.data, np.memmap) or isinstance(t.data.base, np.memmap)


def test_no_mmap_reads_the_weights_into_memory(tiny_model_path):
    """load(mmap=False), llama.cpp's --no-mmap: the same logits, no weight left in the file mapping, every tensor
    64-byte aligned in the one buffer, and the memory report counts them as weights in RAM."""
    ids = [1, 5, 9, 13, 40]
    mapped = pyinfer.load(tiny_model_path, n_ctx=32, mmap=True)
    owned = pyinfer.load(tiny_model_path, n_ctx=32, mmap=False)
    np.testing.assert_array_equal(owned.eval(ids, all_logits=True), mapped.eval(ids, all_logits=True))
    assert not any(_mapped(t) for t in owned.gguf.tensors.values())
    assert all(_mapped(t) for t in mapped.gguf.tensors.values())
    assert all(t.data.ctypes.data % 64 == 0 for t in owned.gguf.tensors.values())
    assert owned.gguf.read_bytes == sum(t.data.nbytes for t in owned.gguf.tensors.values())
    assert owned.memory()["resident_weight_bytes"] >= owned.gguf.read_bytes


def test_weights_are_read_into_memory_by_default_only_where_the_model_runs_whole_in_ram(tiny_model_path,
                                                                                         monkeypatch):
    """The default (mmap None): read where the model runs whole in RAM on the CPU and fits half the available
    memory; mapped under a limit or a budget, on a device, for a file too large, or where the memory is unknown."""
    from pyinfer import session

    assert not any(_mapped(t) for t in pyinfer.load(tiny_model_path, n_ctx=32).gguf.tensors.values())
    assert session.reads_into_memory(tiny_model_path, None, None, "cpu")
    assert not session.reads_into_memory(tiny_model_path, "1G", None, "cpu")
    assert not session.reads_into_memory(tiny_model_path, None, "10M", "cpu")
    assert not session.reads_into_memory(tiny_model_path, None, None, "standin")
    assert not session.reads_into_memory("no/such/file.gguf", None, None, "cpu")
    monkeypatch.setattr(session.os.path, "getsize", lambda p: 1 << 60)
    assert not session.reads_into_memory(tiny_model_path, None, None, "cpu")
