"""The linear-attention layer with a recurrent state (Qwen3.5's gated DeltaNet; llama.cpp's qwen35.cpp on
delta-net-base.cpp), built from the conv and delta-rule ops: h projected to the conv's q, k, v channels, the output
gate z, beta and alpha; the causal conv1d (its last K - 1 inputs kept per sequence) and SiLU; the gated delta rule
over each head's S x S state; each head RMS-normed, times SiLU(z); the output projection. Both states live in
`state` tensors of one row per sequence (ModelGraph.n_states), never in the KV cache; a sequence's row starts from
zeros at its position 0."""
from __future__ import annotations

import numpy as np

from .._core import DType
from ..errors import UnsupportedModelError
from ..model.config import Activation
from .graph_builder import T


def f32_weight(m, name: str) -> T:
    """A small weight the recurrent ops read as F32 (the conv's taps): F16 files' widened once at load."""
    g = m.gguf.tensor(name)
    if g.type_name == "F32":
        return m.w(name)
    if g.type_name != "F16":
        raise UnsupportedModelError(f"{name} in {g.type_name} is not supported (F32 or F16)")
    data = np.asarray(m.weight_source(name, g.data)).astype(np.float32).reshape(g.rows, g.cols)
    return m.b.weight(name + ".f32", int(DType.F32), g.cols, g.rows, data)


def decay_weight(m, il: int) -> T:
    """F32 [2, v_heads]: the layer's dt bias, then its A (negative): the delta rule's decay parameters, one weight."""
    p = f"blk.{il}."
    rows = [np.asarray(m.weight_source(p + part, m.gguf.tensor(p + part).data), np.float32).reshape(-1)
            for part in ("ssm_dt.bias", "ssm_a")]
    return m.b.weight(p + "ssm_decay", int(DType.F32), rows[0].size, 2, np.stack(rows))


def gated_delta_net(m, h: T, il: int) -> T:
    b, c, p = m.b, m.cfg, f"blk.{il}."
    S, hk, hv, K = c.ssm_head_dim, c.ssm_k_heads, c.ssm_v_heads, c.ssm_conv_kernel
    channels = c.ssm_conv_channels
    qkv = m.linear(h, p + "attn_qkv.weight", "qkv_mixed")           # F32 [T, channels]
    z = m.linear(h, p + "attn_gate.weight", "z")                    # F32 [T, hv * S]
    beta = m.linear(h, p + "ssm_beta.weight", "beta")               # F32 [T, hv]
    alpha = m.linear(h, p + "ssm_alpha.weight", "alpha")            # F32 [T, hv]
    conv_state = b.state(f"conv_state.{il}", channels * (K - 1), m.n_states, DType.F32)
    conv = b.ssm_conv(qkv, f32_weight(m, p + "ssm_conv1d.weight"), conv_state, m.positions, "qkv_conv",
                      rows=m.state_rows)
    state = b.state(f"delta_state.{il}", hv * S * S, m.n_states, DType.F32)
    o = b.delta_net(conv, beta, alpha, decay_weight(m, il), state, m.positions, hk, hv, S, c.norm_eps, "delta",
                    rows=m.state_rows, grouped=c.ssm_grouped_heads)   # F32 [T, hv * S]
    m.norm(o, p + "ssm_norm.weight", "delta_normed", out=o, segment=S)
    o = b.gated_mul(z, o, out=o, act=Activation.SILU)
    return m.linear(o, p + "ssm_out.weight", "linear_attn_out")
