"""A numpy reference forward pass of a llama or Gemma 3 GGUF model: dequantized fp32 weights, fp32
activations and KV. The C++ engine (Q8 activations, fp16 KV) must agree with it to quantization noise.
Written from the architectures' definitions, independently of pyinfer's graph code."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants

from pyinfer.model.gguf_file import GGUFModelFile


def dequant(f: GGUFModelFile, name: str) -> np.ndarray:
    t = f.tensor(name)
    a = quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name])
    return a.reshape(t.rows, t.cols).astype(np.float32) if t.rows > 1 else a.reshape(-1).astype(np.float32)


def rms_norm(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def rope(x, pos, heads, hd, base, neox=False):
    """Adjacent-pair rotation (GGML 'normal' mode), or halves (NEOX: i with i + hd/2). x: [T, heads*hd]."""
    if neox:  # the same rotation after moving element i + hd/2 next to element i
        xi = x.reshape(len(pos), heads, 2, hd // 2).transpose(0, 1, 3, 2).reshape(len(pos), heads * hd)
        r = rope(xi, pos, heads, hd, base).reshape(len(pos), heads, hd // 2, 2)
        return r.transpose(0, 1, 3, 2).reshape(len(pos), heads * hd)
    x = x.reshape(len(pos), heads, hd // 2, 2)
    inv = base ** (-2.0 * np.arange(hd // 2) / hd)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    x0, x1 = x[..., 0], x[..., 1]
    out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(len(pos), heads * hd)


def attention(q, k, v, heads, kv_heads, hd, window=0, scale=None):
    T = q.shape[0]
    q = q.reshape(T, heads, hd)
    k = k.reshape(T, kv_heads, hd)
    v = v.reshape(T, kv_heads, hd)
    group = heads // kv_heads
    out = np.zeros_like(q)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    if window:  # query i sees keys i - window + 1 .. i
        mask = mask + np.tril(np.full((T, T), -np.inf, dtype=np.float32), -window)
    for h in range(heads):
        s = q[:, h] @ k[:, h // group].T * (hd ** -0.5 if scale is None else scale) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
    return out.reshape(T, heads * hd)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gated_act(act, g):
    """The gate's activation, from the model's Activation (SiLU, ReLU or GELU-tanh)."""
    from pyinfer.model.config import Activation

    if act == Activation.GELU_TANH:
        return gelu_tanh(g)
    if act == Activation.RELU:
        return np.maximum(g, 0)
    assert act == Activation.SILU, act
    return g / (1 + np.exp(-g))


def head_norm(x, w, heads, eps):
    """RMS norm of each head on its own (Gemma 3's QK-norm). x: [T, heads*hd]."""
    T = x.shape[0]
    return rms_norm(x.reshape(T, heads, -1), w, eps).reshape(T, -1)


def reference_logits(f: GGUFModelFile, tokens: list[int]) -> np.ndarray:
    """F32 [len(tokens), vocab]. Gemma 3 differs from llama in: embeddings times sqrt(d_model), QK-norm, NEOX
    RoPE, five sliding-window layers (RoPE base 10000) per global one, norms after attention and after
    the FFN, and GELU(tanh) gating."""
    c = f.llama_config()
    gemma = f.architecture == "gemma3"
    embed = dequant(f, "token_embd.weight")
    pos = np.arange(len(tokens))
    x = embed[tokens] * (np.float32(np.sqrt(c.d_model)) if gemma else 1)
    for il in range(c.n_layers):
        p = f"blk.{il}."
        local = gemma and (il + 1) % 6 != 0
        base = 10000.0 if local else c.rope_base
        h = rms_norm(x, dequant(f, p + "attn_norm.weight"), c.norm_eps)
        q = h @ dequant(f, p + "attn_q.weight").T
        k = h @ dequant(f, p + "attn_k.weight").T
        if gemma:
            q = head_norm(q, dequant(f, p + "attn_q_norm.weight"), c.n_heads, c.norm_eps)
            k = head_norm(k, dequant(f, p + "attn_k_norm.weight"), c.n_kv_heads, c.norm_eps)
        q = rope(q, pos, c.n_heads, c.head_dim, base, neox=gemma)
        k = rope(k, pos, c.n_kv_heads, c.head_dim, base, neox=gemma)
        v = h @ dequant(f, p + "attn_v.weight").T
        window = int(f.get("gemma3.attention.sliding_window", 0)) if local else 0
        o = attention(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim, window) @ dequant(f, p + "attn_output.weight").T
        if gemma:
            o = rms_norm(o, dequant(f, p + "post_attention_norm.weight"), c.norm_eps)
        x = x + o
        h = rms_norm(x, dequant(f, p + "ffn_norm.weight"), c.norm_eps)
        g = h @ dequant(f, p + "ffn_gate.weight").T
        u = h @ dequant(f, p + "ffn_up.weight").T
        y = (gated_act(c.activation, g) * u) @ dequant(f, p + "ffn_down.weight").T
        if gemma:
            y = rms_norm(y, dequant(f, p + "post_ffw_norm.weight"), c.norm_eps)
        x = x + y
    h = rms_norm(x, dequant(f, "output_norm.weight"), c.norm_eps)
    head = embed if c.tied_output else dequant(f, "output.weight")
    return h @ head.T
