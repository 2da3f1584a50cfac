"""Tiny random Gemma 4 (`gemma4`) files in llama.cpp's layout (the tensor names and keys its convert_hf_to_gguf.py
writes): sliding and global layers of different head sizes and KV heads, the global layers' proportional RoPE
factors, shared-KV layers, per-layer token embeddings, double-wide FFNs in the shared layers, layer output scales and
soft-capped logits; for tests and for equality with llama.cpp."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from .tiny_model import TINY, _add_tiny_vocab, _copy_vocab, add_random, finish

# 6 layers, sliding / global alternating; the last 2 share the caches of layers 2 (sliding) and 3 (global) and run
# double-wide FFNs. Sliding heads of 16 values (2 KV heads, all rotated, base 10000), global ones of 32 (1 KV head,
# a quarter of the pairs rotated, base 1e6); a window of 5; 8 per-layer values per layer; logits capped at 5.
TINY_GEMMA4 = dict(TINY, n_layers=6, d_model=64, d_ff=96, n_heads=4, head_dim=32, head_dim_local=16, kv_heads=1,
                   kv_heads_local=2, window=5, shared=2, per_layer=8, cap=5.0, rope_base=1e6, rope_base_local=1e4,
                   eps=1e-6, rotated_pairs=4, k_eq_v=False, scale=0.2, qk_scale=1.0, out_scale=True,
                   n_expert=0, n_expert_used=2, d_ff_expert=64, fused=False)
# The MoE form (26B-A4B's layout): every layer its dense FFN beside 8 experts of 64, 2 per token.
TINY_GEMMA4_MOE = dict(TINY_GEMMA4, n_expert=8, per_layer=0, shared=0)


def write_tiny_gemma4(path: Path, seed: int = 0, qtype: Q = Q.F32, config: dict | None = None, vocab_from=None,
                      context: int = 256, local: list[bool] | None = None) -> Path:
    """`qtype`: the matrices' type (norms, the RoPE factors and the output scales stay F32); `config` overrides
    TINY_GEMMA4 (scale: the matrices' standard deviation; qk_scale: q and k norms' weights around qk_scale /
    head size^(1/4), so q.k is about 1 / sqrt(head size) times the unnormed dot, as Gemma 4's trained norms make its
    unscaled attention; per_layer 0: no per-layer embeddings, shared 0: every layer its own cache, k_eq_v: the global
    layers without attn_v, their value k's projection; n_expert > 0: the MoE form, with fused: its experts' gate and
    up in one ffn_gate_up_exps); `vocab_from`: a GGUF whose tokenizer is copied; `local`: each layer's kind (default:
    sliding and global alternating)."""
    from gguf import GGUFReader

    rng = np.random.default_rng(seed)
    c = dict(TINY_GEMMA4, **(config or {}))
    L, d, heads = c["n_layers"], c["d_model"], c["n_heads"]
    local = list(local) if local is not None else [il % 2 == 0 for il in range(L)]
    shared_from = L - c["shared"] if c["shared"] else L
    widths = [c["d_ff"] if il < shared_from else 2 * c["d_ff"] for il in range(L)]
    w = GGUFWriter(str(path), "gemma4")
    w.add_block_count(L)
    w.add_context_length(context)
    w.add_embedding_length(d)
    w.add_feed_forward_length(widths)
    w.add_head_count(heads)
    w.add_head_count_kv([c["kv_heads_local"] if s else c["kv_heads"] for s in local])
    w.add_rope_freq_base(c["rope_base"])
    w.add_rope_freq_base_swa(c["rope_base_local"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_key_length_swa(c["head_dim_local"])
    w.add_value_length_swa(c["head_dim_local"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_dimension_count_swa(c["head_dim_local"])
    w.add_sliding_window(c["window"])
    w.add_sliding_window_pattern(local)
    w.add_shared_kv_layers(c["shared"])
    w.add_embedding_length_per_layer_input(c["per_layer"])
    if c["cap"]:
        w.add_final_logit_softcapping(c["cap"])
    n_e, fe = c["n_expert"], c["d_ff_expert"]
    if n_e:
        w.add_expert_count(n_e)
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_feed_forward_length(fe)
    n_vocab = _copy_vocab(w, GGUFReader(str(vocab_from))) if vocab_from is not None else _add_tiny_vocab(w)

    def add(name: str, shape: tuple, scale: float = c["scale"]):
        # rows too short for qtype's blocks stay F32, as llama.cpp's quantizer leaves them
        block = 32 if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1) else 256
        add_random(w, rng, name, shape, qtype if shape[-1] % block == 0 else Q.F32, scale)

    def norm(name: str, n: int, scale: float = 1.0):
        w.add_tensor(name, (scale * (1.0 + 0.2 * rng.standard_normal(n))).astype(np.float32))

    add("token_embd.weight", (n_vocab, d), 1.0)
    hd_full, pairs = c["head_dim"], c["rotated_pairs"]
    w.add_tensor("rope_freqs.weight", np.array([1.0] * pairs + [1e30] * (hd_full // 2 - pairs), np.float32))
    n_pl = c["per_layer"]
    if n_pl:
        add("per_layer_token_embd.weight", (n_vocab, L * n_pl), 1.0)
        add("per_layer_model_proj.weight", (L * n_pl, d))
        norm("per_layer_proj_norm.weight", n_pl)
    for il in range(L):
        p = f"blk.{il}."
        hd = c["head_dim_local"] if local[il] else hd_full
        kvw = (c["kv_heads_local"] if local[il] else c["kv_heads"]) * hd
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(p + name + ".weight", d)
        add(p + "attn_q.weight", (heads * hd, d))
        norm(p + "attn_q_norm.weight", hd, c["qk_scale"] * hd ** -0.25)
        if il < shared_from:
            add(p + "attn_k.weight", (kvw, d))
            if not (c["k_eq_v"] and not local[il]):
                add(p + "attn_v.weight", (kvw, d))
            norm(p + "attn_k_norm.weight", hd, c["qk_scale"] * hd ** -0.25)
        add(p + "attn_output.weight", (d, heads * hd))
        add(p + "ffn_gate.weight", (widths[il], d))
        add(p + "ffn_up.weight", (widths[il], d))
        add(p + "ffn_down.weight", (d, widths[il]))
        if n_e:
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_e, d)) * 0.5).astype(np.float32))
            w.add_tensor(p + "ffn_gate_inp.scale", (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
            for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                norm(p + name + ".weight", d)
            if c["fused"]:
                add(p + "ffn_gate_up_exps.weight", (n_e, 2 * fe, d))
            else:
                add(p + "ffn_gate_exps.weight", (n_e, fe, d))
                add(p + "ffn_up_exps.weight", (n_e, fe, d))
            add(p + "ffn_down_exps.weight", (n_e, d, fe))
            w.add_tensor(p + "ffn_down_exps.scale", (0.5 + rng.random(n_e)).astype(np.float32))
        if n_pl:
            add(p + "inp_gate.weight", (n_pl, d))
            add(p + "proj.weight", (d, n_pl))
            norm(p + "post_norm.weight", d)
        if c["out_scale"]:
            w.add_tensor(p + "layer_output_scale.weight", np.array([0.5 + rng.random()], np.float32))
    norm("output_norm.weight", d)
    return finish(w, path)
