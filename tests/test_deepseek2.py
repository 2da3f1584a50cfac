"""DeepSeek-V2's latent attention and DeepSeek-V3's routing (model/arch/deepseek2.py): against the numpy reference
in its textbook form, one cached latent row per token, batched sequences over a paged cache, and the older layout
refused by name. The MoE tests (test_moe.py) run the V2-Lite layout through every expert path."""
import numpy as np
import pytest
from support.reference_llama import reference_logits
from support.tiny_model import write_tiny_arch

import pyinfer
from pyinfer.serve.batch_engine import BatchEngine, SeqWork

V3 = {"q_lora_rank": 24, "v3": True}  # low-rank q, sigmoid routing with a selection bias in 4 groups of which 2 count


@pytest.fixture(scope="module")
def v3_path(tmp_path_factory):
    return write_tiny_arch(tmp_path_factory.mktemp("ds") / "deepseek2-v3.gguf", "deepseek2", config=V3)


def test_v3_layout_matches_the_reference(v3_path):
    m = pyinfer.load(str(v3_path), n_threads=2, n_ctx=64, progress=False)
    c = m.config
    assert (c.q_lora_rank, c.expert_groups, c.expert_gating, c.expert_bias) == (24, (4, 2), 1, True)
    ids = np.random.default_rng(1).integers(0, c.vocab_size, 24).tolist()
    want = reference_logits(m.gguf, ids)
    got = m.eval(ids, all_logits=True)
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_decode_token_by_token_matches_prefill(v3_path):
    """Decode reads the latent rows prefill cached (one 48-value row per token and layer, key and value)."""
    m = pyinfer.load(str(v3_path), n_threads=2, n_ctx=64, progress=False)
    ids = [5, 9, 13, 40, 41, 7, 8, 60, 61, 3]
    whole = m.eval(ids, all_logits=True)
    steps = np.stack([m.forward([t], i, np.array([0], np.int32))[0] for i, t in enumerate(ids)])
    np.testing.assert_allclose(steps, whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())


def test_the_cache_holds_one_latent_row_per_token(v3_path):
    """Per token and layer: kv_lora_rank + rope values once (f16), not heads x (k + v) as in multi-head form."""
    m = pyinfer.load(str(v3_path), n_threads=1, n_ctx=64, progress=False)
    c = m.config
    assert c.kv_width == c.kv_lora_rank + c.rope_dims and c.kv_values_per_token == c.kv_width
    latent_rows = c.n_layers * 64 * c.kv_width * 2
    assert latent_rows <= m.memory()["kv_bytes"] < latent_rows + 1024  # (and a few bytes of other state)


def test_sequences_batched_over_a_paged_cache_give_what_they_give_alone(v3_path):
    m = pyinfer.load(str(v3_path), n_threads=2, n_ctx=128, progress=False)
    be = BatchEngine(m.session.parts(n_threads=2), num_blocks=12, block_size=4, max_seq_len=40, max_batch_tokens=8)
    a, b = [5, 9, 13, 40, 41, 7, 8], [60, 61, 3]
    ta, tb = [7, 2, 9], [4, 11]
    got = be.step([SeqWork(0, a, 0, ta), SeqWork(1, b, 0, tb)])
    np.testing.assert_allclose(got[0], m.eval(a), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], m.eval(b), rtol=1e-4, atol=1e-4)
    got = be.step([SeqWork(0, [17], len(a), ta), SeqWork(1, [18], len(b), tb)])
    np.testing.assert_allclose(got[0], m.eval(a + [17]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], m.eval(b + [18]), rtol=1e-4, atol=1e-4)


def test_a_q8_0_cache_needs_latent_rows_of_whole_blocks(v3_path, tmp_path):
    with pytest.raises(pyinfer.PyinferError, match="q8_0 KV cache needs cached heads of a multiple of 32 values"):
        pyinfer.load(str(v3_path), n_ctx=64, cache_type="q8_0", progress=False)  # rows of 32 + 16
    wide = write_tiny_arch(tmp_path / "wide.gguf", "deepseek2", config={"rope_dims": 32, "head_dim": 64})
    m = pyinfer.load(str(wide), n_threads=2, n_ctx=64, cache_type="q8_0", progress=False)
    ids = [5, 9, 13, 40, 41, 7]
    want = reference_logits(m.gguf, ids)
    got = m.eval(ids, all_logits=True)
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_v2_lite_without_the_q_lora_rank_key_is_q_direct(tmp_path):
    """llama.cpp's converter writes no q_lora_rank for V2-Lite (its config says null): the file reads as q direct,
    the same model as one that states 0."""
    stated = pyinfer.load(str(write_tiny_arch(tmp_path / "zero.gguf", "deepseek2")), n_threads=2, n_ctx=64,
                          progress=False)
    unstated = pyinfer.load(str(write_tiny_arch(tmp_path / "none.gguf", "deepseek2", config={"q_lora_rank": None})),
                            n_threads=2, n_ctx=64, progress=False)
    assert unstated.gguf.get("deepseek2.attention.q_lora_rank") is None and unstated.config.q_lora_rank == 0
    ids = [5, 9, 13, 40, 41, 7]
    np.testing.assert_array_equal(unstated.eval(ids, all_logits=True), stated.eval(ids, all_logits=True))


def test_the_older_conversion_is_refused_by_name(tmp_path):
    def old_layout(w):  # a file as converters before the k_b / v_b split wrote it
        w.add_tensor("blk.0.attn_kv_b.weight", np.zeros((4 * 64, 32), np.float32))
    path = write_tiny_arch(tmp_path / "old.gguf", "deepseek2", extra=old_layout)
    with pytest.raises(pyinfer.PyinferError, match="attn_kv_b .*convert it again"):
        pyinfer.load(str(path), progress=False)
