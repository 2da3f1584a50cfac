"""Tiny random Qwen 3.5 (`qwen35`) files in llama.cpp's layout (its tensor names and keys, as convert_hf_to_gguf.py
writes them): gated DeltaNet layers and gated full-attention ones, for tests and for equality with llama.cpp."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter

from .tiny_model import TINY, _add_shape, _add_tiny_vocab, _copy_vocab, add_random, finish

# 4 layers: 0-2 linear attention, 3 full attention (full_attention_interval 4); attention heads of 32 with 8 rotary
# values (M-RoPE sections 2, 1, 1); DeltaNet heads of 16, 2 key heads read by 4 value heads, a conv of 4 taps.
TINY_QWEN35 = dict(TINY, n_layers=4, head_dim=32, rope_dims=8, sections=(2, 1, 1, 0), interval=4, conv_kernel=4,
                   ssm_head_dim=16, ssm_k_heads=2, ssm_v_heads=4, n_expert=0, n_expert_used=2, d_ff_expert=64,
                   d_ff_shared=96)
# qwen35moe: every layer's FFN 8 experts of 64, 2 per token, renormalized, and a gated shared expert of 96.
TINY_QWEN35_MOE = dict(TINY_QWEN35, n_expert=8)


def write_tiny_qwen35(path: Path, seed: int = 0, qtype: Q = Q.F32, config: dict | None = None, vocab_from=None,
                      context: int = 256, moe: bool = False, arch: str = "qwen35") -> Path:
    """`qtype`: the matrices' type (the conv's taps, A, dt and the norms stay F32, as llama.cpp's quantizer keeps
    them); `vocab_from`: a GGUF whose tokenizer is copied (llama.cpp's vocab files), else the tiny vocabulary. `moe`:
    a `qwen35moe` file (TINY_QWEN35_MOE's experts). `arch` "qwen3next": Qwen3-Next's layout (experts, beta and alpha
    fused in ssm_ba, no M-RoPE sections)."""
    from gguf import GGUFReader

    rng = np.random.default_rng(seed)
    nxt = arch == "qwen3next"
    moe = moe or nxt
    c = dict(TINY_QWEN35_MOE if moe else TINY_QWEN35, **(config or {}))
    w = GGUFWriter(str(path), arch if nxt else "qwen35moe" if moe else "qwen35")
    _add_shape(w, c, context)
    hd, S, hk, hv = c["head_dim"], c["ssm_head_dim"], c["ssm_k_heads"], c["ssm_v_heads"]
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(c["rope_dims"])
    if not nxt:
        w.add_rope_dimension_sections(list(c["sections"]))
    w.add_ssm_conv_kernel(c["conv_kernel"])
    w.add_ssm_state_size(S)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(hv * S)
    w.add_full_attention_interval(c["interval"])
    if moe:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
        w.add_expert_feed_forward_length(c["d_ff_expert"])
        w.add_expert_shared_feed_forward_length(c["d_ff_shared"])
    n_vocab = _copy_vocab(w, GGUFReader(str(vocab_from))) if vocab_from is not None else _add_tiny_vocab(w)
    d, ff = c["d_model"], c["d_ff"]

    def add(name: str, shape: tuple, scale: float = 0.2):
        add_random(w, rng, name, shape, qtype if len(shape) >= 2 else Q.F32, scale)

    def norm(name: str, n: int):
        w.add_tensor(name, (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32))

    add("token_embd.weight", (n_vocab, d), 1.0)
    channels = (2 * hk + hv) * S
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        norm(p + "attn_norm.weight", d)
        norm(p + "post_attention_norm.weight", d)
        if (il + 1) % c["interval"]:
            add(p + "attn_qkv.weight", (channels, d))
            add(p + "attn_gate.weight", (hv * S, d))
            w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((channels, c["conv_kernel"])) * 0.5)
                         .astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.standard_normal(hv).astype(np.float32))
            w.add_tensor(p + "ssm_a", (-np.exp(0.5 * rng.standard_normal(hv))).astype(np.float32))
            if nxt:  # per key head: its value heads' beta rows, then their alpha rows
                add(p + "ssm_ba.weight", (2 * hv, d), 0.3)
            else:
                add(p + "ssm_beta.weight", (hv, d), 0.3)
                add(p + "ssm_alpha.weight", (hv, d), 0.3)
            norm(p + "ssm_norm.weight", S)
            add(p + "ssm_out.weight", (d, hv * S))
        else:
            add(p + "attn_q.weight", (2 * c["n_heads"] * hd, d))  # per head: its query rows, then its gate's
            add(p + "attn_k.weight", (c["n_kv_heads"] * hd, d))
            add(p + "attn_v.weight", (c["n_kv_heads"] * hd, d))
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
            add(p + "attn_output.weight", (d, c["n_heads"] * hd))
        if moe:
            n, fe, fs = c["n_expert"], c["d_ff_expert"], c["d_ff_shared"]
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n, d)) * 0.5).astype(np.float32))
            add(p + "ffn_gate_exps.weight", (n, fe, d))
            add(p + "ffn_up_exps.weight", (n, fe, d))
            add(p + "ffn_down_exps.weight", (n, d, fe))
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(d) * 0.5).astype(np.float32))
            add(p + "ffn_gate_shexp.weight", (fs, d))
            add(p + "ffn_up_shexp.weight", (fs, d))
            add(p + "ffn_down_shexp.weight", (d, fs))
        else:
            add(p + "ffn_gate.weight", (ff, d))
            add(p + "ffn_up.weight", (ff, d))
            add(p + "ffn_down.weight", (d, ff))
    norm("output_norm.weight", d)
    add("output.weight", (n_vocab, d), 0.5)
    return finish(w, path)
