"""Gemma 4 (model/arch/gemma4.py): sliding and global layers of different head sizes and KV heads, shared-KV layers,
per-layer token embeddings, layer output scales and soft-capped logits. Against the numpy reference
(support/reference_gemma4.py); llama.cpp's own logits are bench/arch_check.py's (it needs llama-cpp-python)."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from support.decode_check import assert_decode_gives
from support.reference_gemma4 import gemma4_logits
from support.tiny_gemma4 import TINY_GEMMA4_MOE, write_tiny_gemma4

import pyinfer
from pyinfer._core import Op

IDS = np.random.default_rng(4).integers(3, 200, 20).tolist()


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(write_tiny_gemma4(tmp_path_factory.mktemp("g4") / "g4.gguf"))


def load(path, **kw):
    return pyinfer.load(path, n_ctx=64, n_threads=2, progress=False, cache_type=kw.pop("cache_type", "f32"), **kw)


def close(got, want, rel=2e-3):
    assert np.abs(got - want).max() < rel * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_reads_its_layers(path):
    c = load(path).config
    assert c.local_layers == (True, False) * 3 and (c.head_dim, c.head_dim_local) == (32, 16)
    assert [c.layer_kv_heads(il) for il in range(6)] == [2, 1] * 3 and c.attn_scale == 1.0
    assert [c.kv_owner(il) for il in range(6)] == [0, 1, 2, 3, 2, 3] and c.kv_shared_from == 4
    assert c.ffn_widths == (96,) * 4 + (192,) * 2 and not c.uniform_ffn
    assert (c.per_layer_embd, c.logit_softcap) == (8, 5.0)
    # K and V of 2 x 16 (sliding) or 1 x 32 (global) values in the 4 layers that keep a cache
    assert c.cached_values_per_token == 4 * 2 * 32


@pytest.mark.parametrize("change", [{}, dict(per_layer=0), dict(shared=0), dict(k_eq_v=True), dict(cap=0.0)],
                         ids=["all", "no-per-layer", "no-shared-kv", "k-eq-v", "no-cap"])
def test_matches_the_reference(tmp_path, change):
    m = load(str(write_tiny_gemma4(tmp_path / "g.gguf", config=change)))
    close(m.eval(IDS, all_logits=True), gemma4_logits(m.gguf, IDS))


def test_an_f16_cache_matches_the_reference_with_one(path):
    m = load(path, cache_type="f16")
    close(m.eval(IDS, all_logits=True), gemma4_logits(m.gguf, IDS, cache_fp16=True))


def test_decode_gives_what_the_prompt_gives(path):
    """One token at a time through the shared layers' borrowed caches and the per-layer inputs of each token."""
    m = load(path)
    want = m.eval(IDS, all_logits=True)
    assert_decode_gives(m, IDS, want)


def test_the_shared_layers_keep_no_cache(path):
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.runtime.model_graph import build_model_graph

    f = open_model(path)
    b = build_model_graph(f, model_config(f), 64)
    ops = [op for op, _ in b.node_ops]
    assert ops.count(Op.ATTENTION) == 6 and ops.count(Op.KV_STORE) == 8 and ops.count(Op.SOFTCAP) == 1


def test_a_quantized_file_agrees_to_quantization_noise(tmp_path):
    m = load(str(write_tiny_gemma4(tmp_path / "q8.gguf", qtype=Q.Q8_0)))
    got, want = m.eval(IDS, all_logits=True), gemma4_logits(m.gguf, IDS)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.995


def test_a_device_load_gives_the_cpus_logits(path):
    """On the stand-in device: the per-layer table's lookup stays in host memory, the rest runs on the device."""
    cpu = load(path).eval(IDS, all_logits=True)
    dev = load(path, device="standin", vram_budget="200M")
    np.testing.assert_allclose(dev.eval(IDS, all_logits=True), cpu, rtol=1e-4, atol=1e-4 * np.abs(cpu).max())
    assert_decode_gives(dev, IDS, cpu)


def test_batched_sequences_give_what_each_gives_alone(path):
    from pyinfer.serve.batch_engine import BatchEngine, SeqWork

    m = load(path)
    be = BatchEngine(m.session.parts(n_threads=2, cache_type="f32"), num_blocks=32, block_size=4, max_seq_len=40,
                     max_batch_tokens=8)
    prompts, tables = [IDS[:7], IDS[3:6], IDS[10:19]], [[0, 1, 2], [3, 4], [5, 6, 7]]
    got = be.step([SeqWork(i, p, 0, t) for i, (p, t) in enumerate(zip(prompts, tables))])
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(got[i], load(path).eval(p), rtol=1e-4, atol=1e-4)
    seqs = [list(p) for p in prompts]
    for step in range(3):
        for i, s in enumerate(seqs):
            s.append(40 + 7 * i + step)
        got = be.step([SeqWork(i, [s[-1]], len(s) - 1, tables[i]) for i, s in enumerate(seqs)])
        for i, s in enumerate(seqs):
            np.testing.assert_allclose(got[i], load(path).eval(s), rtol=1e-4, atol=1e-4)


def test_the_server_interleaves_its_sequences(path):
    """Four greedy completions at once through the OpenAI server (the shared layers read caches the batch's other
    sequences also write): each is what the model generates alone."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from support.serve_helpers import assert_interleaved_equal_alone

    assert_interleaved_equal_alone(path, load, kv_budget=512, cache_type="f32")


def test_neuron_level_sparsity_refuses_layers_of_different_widths(path):
    with pytest.raises(pyinfer.PyinferError, match="widths"):
        load(path, sparsity="threshold")


@pytest.mark.parametrize("tensor,match", [("attn_qkv", "fused attn_qkv"), ("ffn_gate_inp", "ffn_gate_exps")])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, tensor, match):
    import gguf

    p = write_tiny_gemma4(tmp_path / "g.gguf")
    r = gguf.GGUFReader(str(p))
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "gemma4")
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor(f"blk.0.{tensor}.weight", np.zeros((4, 64), np.float32))
    if tensor == "ffn_gate_inp":  # a router and the expert count, no experts
        w.add_uint32("gemma4.expert_count", 4)
        w.add_uint32("gemma4.expert_used_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(pyinfer.PyinferError, match=match):
        load(str(tmp_path / "bad.gguf"))


@pytest.mark.parametrize("fused", [False, True], ids=["gate-and-up", "fused-gate-up"])
def test_the_moe_form_matches_the_reference(tmp_path, fused):
    """26B-A4B's layout: each layer's dense FFN beside its experts, routed from the stream's own norm, each expert's
    output scaled; experts stored apart or with gate and up fused (presented as strided views)."""
    m = load(str(write_tiny_gemma4(tmp_path / "moe.gguf", config=dict(TINY_GEMMA4_MOE, fused=fused))))
    c = m.config
    assert (c.n_expert, c.n_expert_used, c.d_ff_expert, c.expert_output_scale) == (8, 2, 64, True)
    want = m.eval(IDS, all_logits=True)
    close(want, gemma4_logits(m.gguf, IDS))
    assert_decode_gives(m, IDS, want)


@pytest.mark.parametrize("fused", [False, True], ids=["gate-and-up", "fused-gate-up"])
def test_the_moe_form_streams_its_experts_unchanged(tmp_path, monkeypatch, fused):
    """Experts from a store of 8 cache slots (expert streaming, as under --mem-limit; a fused tensor's halves read
    through their strides): the in-RAM logits."""
    from pyinfer.offload import experts as ex

    p = str(write_tiny_gemma4(tmp_path / "moe.gguf", config=dict(TINY_GEMMA4_MOE, fused=fused)))
    want = load(p).eval(IDS, all_logits=True)

    def make(session, ram_budget=None, progress=True):
        plan = ex.ExpertPlan(0, ex.slot_bytes(session.gguf, session.config), [[0, 1], [2], [], [3], [], [5]], 8,
                             "lru")
        return ex.ExpertOffload(session.gguf, session.config, plan)

    monkeypatch.setattr(ex, "make_expert_offload", make)
    m = load(p, mem_limit="4G")
    assert m.session.experts is not None
    np.testing.assert_array_equal(m.eval(IDS, all_logits=True), want)
