"""A numpy reference forward pass of a llama GGUF model: dequantized fp32 weights, fp32 activations
and KV. The C++ engine (Q8 activations, fp16 KV) must agree with it to quantization noise."""
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


def rope(x, pos, heads, hd, base):
    """Adjacent-pair rotation (GGML 'normal' mode). x: [T, heads*hd]."""
    x = x.reshape(len(pos), heads, hd // 2, 2)
    inv = base ** (-2.0 * np.arange(hd // 2) / hd)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    x0, x1 = x[..., 0], x[..., 1]
    out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(len(pos), heads * hd)


def attention(q, k, v, heads, kv_heads, hd):
    T = q.shape[0]
    q = q.reshape(T, heads, hd)
    k = k.reshape(T, kv_heads, hd)
    v = v.reshape(T, kv_heads, hd)
    group = heads // kv_heads
    out = np.zeros_like(q)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for h in range(heads):
        s = q[:, h] @ k[:, h // group].T / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
    return out.reshape(T, heads * hd)


def reference_logits(f: GGUFModelFile, tokens: list[int]) -> np.ndarray:
    """F32 [len(tokens), vocab]."""
    c = f.llama_config()
    embed = dequant(f, "token_embd.weight")
    pos = np.arange(len(tokens))
    x = embed[tokens]
    for il in range(c.n_layers):
        p = f"blk.{il}."
        h = rms_norm(x, dequant(f, p + "attn_norm.weight"), c.norm_eps)
        q = rope(h @ dequant(f, p + "attn_q.weight").T, pos, c.n_heads, c.head_dim, c.rope_base)
        k = rope(h @ dequant(f, p + "attn_k.weight").T, pos, c.n_kv_heads, c.head_dim, c.rope_base)
        v = h @ dequant(f, p + "attn_v.weight").T
        x = x + attention(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim) @ dequant(f, p + "attn_output.weight").T
        h = rms_norm(x, dequant(f, p + "ffn_norm.weight"), c.norm_eps)
        g = h @ dequant(f, p + "ffn_gate.weight").T
        u = h @ dequant(f, p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ dequant(f, p + "ffn_down.weight").T
    h = rms_norm(x, dequant(f, "output_norm.weight"), c.norm_eps)
    head = embed if c.tied_output else dequant(f, "output.weight")
    return h @ head.T
