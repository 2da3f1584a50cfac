"""numpy references of the recurrent layers (Qwen3.5's gated DeltaNet), written from llama.cpp's graph
(src/models/qwen35.cpp, delta-net-base.cpp) and HF's Qwen3-Next: the causal conv1d with its rolling state and the
gated delta rule, one sequence at a time, in float64."""
from __future__ import annotations

import numpy as np


def ssm_conv(x: np.ndarray, w: np.ndarray, silu: bool = True) -> np.ndarray:
    """x [T, C] of one sequence from a zero state, w [C, K] (oldest tap first) -> [T, C]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    K = w.shape[1]
    padded = np.concatenate([np.zeros((K - 1, x.shape[1])), x])
    y = np.stack([(padded[t:t + K].T * w).sum(1) for t in range(len(x))])
    return y / (1 + np.exp(-y)) if silu else y


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """llama.cpp's build_gdn_l2_norm over the last axis: rms_norm with eps / n, times 1 / sqrt(n)."""
    n = x.shape[-1]
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps / n) / np.sqrt(n)


def delta_net(qkv, beta, alpha, dt_bias, a, k_heads: int, v_heads: int, S: int, eps: float,
              grouped: bool = False) -> np.ndarray:
    """One sequence from a zero state: qkv [T, (2 Hk + Hv) S], beta / alpha [T, Hv] -> [T, Hv S]. v head h reads
    q / k head h % Hk (ggml's repeat), or with `grouped` h // (Hv / Hk) (Qwen3-Next's repeat-interleave)."""
    qkv = np.asarray(qkv, np.float64)
    T = len(qkv)
    q = l2_norm(qkv[:, :k_heads * S].reshape(T, k_heads, S), eps)
    k = l2_norm(qkv[:, k_heads * S:2 * k_heads * S].reshape(T, k_heads, S), eps)
    v = qkv[:, 2 * k_heads * S:].reshape(T, v_heads, S)
    b = 1 / (1 + np.exp(-np.asarray(beta, np.float64)))
    z = np.asarray(alpha, np.float64) + dt_bias
    g = np.where(z > 20, z, np.log1p(np.exp(np.minimum(z, 20)))) * a
    state = np.zeros((v_heads, S, S))  # state[h][i][j]: key dimension i, value dimension j
    out = np.zeros((T, v_heads, S))
    for t in range(T):
        for h in range(v_heads):
            kh = h // (v_heads // k_heads) if grouped else h % k_heads
            st = state[h] * np.exp(g[t, h])
            d = (v[t, h] - k[t, kh] @ st) * b[t, h]
            st = st + np.outer(k[t, kh], d)
            state[h] = st
            out[t, h] = q[t, kh] @ st / np.sqrt(S)
    return out.reshape(T, v_heads * S)


def qwen35_logits(f, tokens: list[int], margins: list | None = None) -> np.ndarray:
    """F32 [len(tokens), vocab] of a `qwen35` file from its own tensors (gguf's reader): per layer, a gated DeltaNet
    (qwen35.cpp's build_layer_attn_linear) or gated full attention (q's rows per head: query then gate; QK-norm, NEOX
    RoPE of the first rope.dimension_count values), then post_attention_norm and the SwiGLU FFN (qwen35moe: experts,
    softmax top-k renormalized, and the sigmoid-gated shared expert; `margins` as reference_llama.moe)."""
    from .reference_llama import Weights, attention, head_norm, moe, rms_norm, rope

    from pyinfer.model.arch import model_config

    c = model_config(f)
    W = Weights(f.path)
    n_rot = c.rope_dims or c.head_dim
    x = W["token_embd.weight"][tokens].astype(np.float32)
    pos = np.arange(len(tokens))
    T = len(tokens)
    for il in range(c.n_layers):
        p = f"blk.{il}."
        h = rms_norm(x, W[p + "attn_norm.weight"], c.norm_eps)
        if c.is_recurrent(il):
            S, hk, hv = c.ssm_head_dim, c.ssm_k_heads, c.ssm_v_heads
            conv = ssm_conv(h @ W[p + "attn_qkv.weight"].T, W[p + "ssm_conv1d.weight"])
            if p + "ssm_ba.weight" in W:  # Qwen3-Next: per key head, its value heads' beta rows, then their alpha rows
                ba = (h @ W[p + "ssm_ba.weight"].T).reshape(T, hk, 2, hv // hk)
                beta, alpha = ba[:, :, 0].reshape(T, hv), ba[:, :, 1].reshape(T, hv)
            else:
                beta, alpha = h @ W[p + "ssm_beta.weight"].T, h @ W[p + "ssm_alpha.weight"].T
            o = delta_net(conv, beta, alpha, W[p + "ssm_dt.bias"], W[p + "ssm_a"], hk, hv, S, c.norm_eps,
                          grouped=f.architecture == "qwen3next")
            o = head_norm(o.astype(np.float32), W[p + "ssm_norm.weight"], hv, c.norm_eps)
            z = h @ W[p + "attn_gate.weight"].T
            o = (o * z / (1 + np.exp(-z))) @ W[p + "ssm_out.weight"].T
        else:
            qg = (h @ W[p + "attn_q.weight"].T).reshape(T, c.n_heads, 2, c.head_dim)
            q, gate = qg[:, :, 0].reshape(T, -1), qg[:, :, 1].reshape(T, -1)
            k, v = h @ W[p + "attn_k.weight"].T, h @ W[p + "attn_v.weight"].T
            q = head_norm(q, W[p + "attn_q_norm.weight"], c.n_heads, c.norm_eps)
            k = head_norm(k, W[p + "attn_k_norm.weight"], c.n_kv_heads, c.norm_eps)
            q = rope(q, pos, c.n_heads, c.head_dim, c.rope_base, True, n_rot=n_rot)
            k = rope(k, pos, c.n_kv_heads, c.head_dim, c.rope_base, True, n_rot=n_rot)
            o = attention(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim)
            o = (o / (1 + np.exp(-gate))) @ W[p + "attn_output.weight"].T
        x = x + o.astype(np.float32)
        h = rms_norm(x, W[p + "post_attention_norm.weight"], c.norm_eps)
        if c.is_moe:
            x = x + moe(h, W, p, c.activation, c.n_expert_used, norm=True, margins=margins)
            continue
        g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
    h = rms_norm(x, W["output_norm.weight"], c.norm_eps)
    head = W["token_embd.weight"] if c.tied_output else W["output.weight"]
    return h @ head.T
