"""Qwen 3.5 (model/arch/qwen35.py, runtime/recurrent.py): gated DeltaNet layers with a recurrent state per sequence
beside gated full-attention ones. Against the numpy reference (support/reference_recurrent.py); llama.cpp's own
logits are bench/arch_check.py's (it needs llama-cpp-python)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from support.decode_check import assert_decode_gives
from support.reference_llama import reference_logits
from support.tiny_hybrid import write_tiny_qwen35

import pyinfer
from pyinfer._core import Op

IDS = np.random.default_rng(3).integers(3, 200, 20).tolist()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(write_tiny_qwen35(tmp_path_factory.mktemp("q35") / "q35.gguf"))


def load(path, **kw):
    return pyinfer.load(path, n_ctx=64, n_threads=2, progress=False, cache_type="f32", **kw)


def test_reads_its_layers(path):
    c = load(path).config
    assert c.recurrent_layers == (True, True, True, False) and c.attention_layers == 1
    assert (c.ssm_conv_kernel, c.ssm_head_dim, c.ssm_k_heads, c.ssm_v_heads) == (4, 16, 2, 4)
    assert c.attn_output_gate and c.qk_norm and c.rope_dims == 8
    # a sequence's state: 3 layers of a 3-input conv window over 128 channels and 4 heads of 16 x 16
    assert c.state_floats_per_sequence == 3 * (3 * 128 + 4 * 16 * 16)


def test_matches_the_reference(path):
    m = load(path)
    want = reference_logits(m.gguf, IDS)
    got = m.eval(IDS, all_logits=True)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_decode_carries_the_state_the_prompt_left(path):
    """A prompt, then one token at a time: the state each run leaves is the next one's start."""
    m = load(path)
    want = m.eval(IDS, all_logits=True)
    assert_decode_gives(m, IDS, want)


def test_a_shorter_prefix_is_run_again_not_rewound(path):
    """A state cannot go back to an earlier position: forward(start < cached) re-runs the prefix; a new prompt
    sharing part of the last one gives what a fresh model gives."""
    m = load(path)
    want = m.eval(IDS, all_logits=True)
    m.eval(IDS)
    np.testing.assert_allclose(m.forward(IDS[5:], 5, np.arange(15)), want[5:], rtol=1e-4,
                               atol=1e-4 * np.abs(want).max())
    other = IDS[:10] + [7, 8, 9]
    fresh = load(path).eval(other)
    m.eval(IDS)
    np.testing.assert_allclose(m._prefill(other), fresh, rtol=1e-4, atol=1e-4 * np.abs(fresh).max())


@pytest.mark.parametrize("ssm_head_dim", [16, 32])
def test_a_device_load_keeps_each_state_where_its_node_runs(tmp_path, ssm_head_dim):
    """On the stand-in device the conv and, for heads of whole warps, the delta rule run on the device with their
    states in its memory; heads of 16 keep the delta rule on the CPU. Prompt and decode give the CPU's logits."""
    p = str(write_tiny_qwen35(tmp_path / "q.gguf", config={"ssm_head_dim": ssm_head_dim}))
    cpu = load(p).eval(IDS, all_logits=True)
    dev = load(p, device="standin", vram_budget="200M")
    np.testing.assert_allclose(dev.eval(IDS, all_logits=True), cpu, rtol=1e-4, atol=1e-4 * np.abs(cpu).max())
    assert_decode_gives(dev, IDS, cpu)
    assert dev.n_copies > 0


def test_a_quantized_file_agrees_to_quantization_noise(tmp_path):
    p = str(write_tiny_qwen35(tmp_path / "q8.gguf", qtype=Q.Q8_0))
    m = load(p)
    want = reference_logits(m.gguf, IDS)
    got = m.eval(IDS, all_logits=True)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.995  # 8-bit activations on a 64-wide model


def test_the_graph_has_no_kv_cache_for_recurrent_layers(path):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.runtime.model_graph import build_model_graph

    f = open_model(path)
    b = build_model_graph(f, model_config(f), 64)
    ops = [op for op, _ in b.node_ops]
    assert ops.count(Op.ATTENTION) == 1 and ops.count(Op.DELTA_NET) == 3 and ops.count(Op.SSM_CONV) == 3


@pytest.mark.parametrize("change,match", [
    (dict(sections=(1, 1, 1, 1)), "fourth section"),
    (dict(ssm_k_heads=3), "multiple of group_count"),
])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, change, match):
    p = write_tiny_qwen35(tmp_path / "bad.gguf", config=change)
    with pytest.raises(pyinfer.PyinferError, match=match):
        load(str(p))


def test_batched_sequences_give_what_each_gives_alone(path):
    """Four sequences over one paged cache and four state rows, prompts and decode steps interleaved in one batch;
    one finishes and a fifth takes its state row, which starts again from zeros."""
    from pyinfer.serve.batch_engine import BatchEngine, SeqWork

    m = load(path)
    be = BatchEngine(m.session.parts(n_threads=2, cache_type="f32"), num_blocks=64, block_size=4, max_seq_len=40,
                     max_batch_tokens=8)
    assert be.state_blocks >= 1
    prompts = [IDS[:7], IDS[3:6], IDS[10:19], IDS[1:2]]
    tables = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]]
    got = be.step([SeqWork(i, p, 0, t) for i, (p, t) in enumerate(zip(prompts, tables))])
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(got[i], load(path).eval(p), rtol=1e-4, atol=1e-4)
    seqs = [list(p) for p in prompts]
    for step in range(3):
        work = []
        for i, s in enumerate(seqs):
            s.append(40 + 7 * i + step)
            work.append(SeqWork(i, [s[-1]], len(s) - 1, tables[i]))
        got = be.step(work)
        for i, s in enumerate(seqs):
            np.testing.assert_allclose(got[i], load(path).eval(s), rtol=1e-4, atol=1e-4)
    be.release(1)
    got = be.step([SeqWork(4, IDS[:5], 0, [10, 11]), SeqWork(0, [9], len(seqs[0]), tables[0])])
    np.testing.assert_allclose(got[4], load(path).eval(IDS[:5]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0], load(path).eval(seqs[0] + [9]), rtol=1e-4, atol=1e-4)
    with pytest.raises(pyinfer.PyinferError, match="starts at position 0"):
        be.step([SeqWork(9, [1], 3, [12])])


def test_the_server_interleaves_hybrid_sequences(path):
    """Four greedy completions at once through the OpenAI server: each is what the model generates alone."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from support.serve_helpers import assert_interleaved_equal_alone

    assert_interleaved_equal_alone(path, load, kv_budget=512, cache_type="f32")


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return str(write_tiny_qwen35(tmp_path_factory.mktemp("q35moe") / "q35moe.gguf", moe=True))


def test_the_moe_form_matches_the_reference(moe_path):
    m = load(moe_path)
    c = m.config
    assert c.is_moe and (c.n_expert, c.n_expert_used, c.d_ff_expert, c.d_ff_shared) == (8, 2, 64, 96)
    assert c.expert_norm and c.shared_expert_gated and c.recurrent_layers == (True, True, True, False)
    want = reference_logits(m.gguf, IDS)
    got = m.eval(IDS, all_logits=True)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_the_moe_form_streams_its_experts_unchanged(moe_path, monkeypatch):
    """Experts from a store of 8 cache slots (expert streaming, as under --mem-limit): the in-RAM logits."""
    from pyinfer.offload import experts as ex

    want = load(moe_path).eval(IDS, all_logits=True)

    def make(session, ram_budget=None, progress=True):
        plan = ex.ExpertPlan(0, ex.slot_bytes(session.gguf, session.config), [[0, 1], [2], [], [3]], 8, "lru")
        return ex.ExpertOffload(session.gguf, session.config, plan)

    monkeypatch.setattr(ex, "make_expert_offload", make)
    m = load(moe_path, mem_limit="4G")
    assert m.session.experts is not None
    np.testing.assert_array_equal(m.eval(IDS, all_logits=True), want)


def test_qwen3next_reads_its_own_layout(tmp_path):
    """Qwen3-Next: value head h reads key head h // 2, beta and alpha from one fused ssm_ba, plain NEOX RoPE."""
    p = str(write_tiny_qwen35(tmp_path / "next.gguf", arch="qwen3next"))
    m = load(p)
    assert m.config.ssm_grouped_heads and m.config.is_moe
    assert "blk.0.ssm_beta.weight" in m.gguf.tensors and "blk.0.ssm_ba.weight" not in m.gguf.tensors
    want = reference_logits(m.gguf, IDS)
    got = m.eval(IDS, all_logits=True)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
