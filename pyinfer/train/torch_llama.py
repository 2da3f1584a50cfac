"""A llama-architecture model in PyTorch holding a GGUF's weights, dequantized to fp32: the teacher (the
model's own activation) and the student (ReLU on the gate: ReGLU, as ReluLLaMA did). Its math is
tests/reference_llama.py's: RMSNorm, GGML's adjacent-pair RoPE (the converter permuted Q and K for it),
grouped-query attention, a gated FFN. Only the FFN weights train; everything else is frozen."""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from ..errors import PyinferError
from ..model.arch import model_config
from ..model.gguf_file import GGUFModelFile

FFN_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


def dequant(gguf: GGUFModelFile, name: str) -> np.ndarray:
    """F32 [rows, cols] (or [cols] for a vector) of a GGUF tensor."""
    t = gguf.tensor(name)
    a = quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name]).astype(np.float32)
    return a.reshape(t.rows, t.cols) if t.rows > 1 else a.reshape(-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, hd]; cos/sin: [T, hd / 2]. Rotates adjacent pairs (GGML's normal mode)."""
    x = x.unflatten(-1, (-1, 2))
    x0, x1 = x[..., 0], x[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


class Llama(nn.Module):
    """`activation`: "silu" (the teacher) or "relu" (the student). forward() returns the final normed hidden
    states [B, T, d]; the head is applied in vocabulary chunks by the loss (distill.py)."""

    def __init__(self, gguf: GGUFModelFile, activation: str = "silu", dtype: torch.dtype = torch.float32):
        super().__init__()
        cfg = model_config(gguf)
        if gguf.architecture != "llama" or cfg.post_norms or cfg.qk_norm:
            raise PyinferError(f"relufy supports the llama architecture; this model is {gguf.architecture}")
        self.cfg, self.activation = cfg, activation

        def frozen(name):
            return nn.Parameter(torch.from_numpy(dequant(gguf, name)).to(dtype), requires_grad=False)

        self.embed = frozen("token_embd.weight")                          # [vocab, d]
        self.head = self.embed if cfg.tied_output else frozen("output.weight")
        self.out_norm = frozen("output_norm.weight")
        self.blocks = nn.ModuleList()
        for il in range(cfg.n_layers):
            p = f"blk.{il}."
            blk = nn.Module()
            for name in ("attn_norm", "ffn_norm"):
                setattr(blk, name, frozen(p + name + ".weight"))
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                setattr(blk, name, frozen(p + name + ".weight"))
            for name in FFN_PARTS:  # [d_ff, d] for gate and up, [d, d_ff] for down: trained
                setattr(blk, name, nn.Parameter(torch.from_numpy(dequant(gguf, p + name + ".weight")).to(dtype)))
            self.blocks.append(blk)
        inv = cfg.rope_base ** (-2.0 * np.arange(cfg.head_dim // 2) / cfg.head_dim)
        self.register_buffer("inv_freq", torch.tensor(inv, dtype=torch.float64), persistent=False)
        self.threshold = 0.0  # FATReLU's shift (ProSparse's last stage); 0: plain ReLU

    def ffn_parameters(self) -> list[nn.Parameter]:
        return [getattr(b, n) for b in self.blocks for n in FFN_PARTS]

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps).to(x.dtype) * w

    def gate_act(self, g: torch.Tensor) -> torch.Tensor:
        if self.activation == "relu":
            return torch.where(g > self.threshold, g, torch.zeros_like(g)) if self.threshold else torch.relu(g)
        return nn.functional.silu(g)

    def forward(self, tokens: torch.Tensor, acts: list | None = None) -> torch.Tensor:
        """tokens: I64 [B, T]. `acts`, when given, receives each layer's act(gate) [B, T, d_ff]."""
        c = self.cfg
        B, T = tokens.shape
        ang = torch.arange(T, dtype=torch.float64, device=tokens.device)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos().to(self.embed.dtype), ang.sin().to(self.embed.dtype)
        x = self.embed[tokens]                                             # [B, T, d]
        for blk in self.blocks:
            h = self.norm(x, blk.attn_norm)
            q = rope((h @ blk.attn_q.T).unflatten(-1, (c.n_heads, c.head_dim)), cos, sin)
            k = rope((h @ blk.attn_k.T).unflatten(-1, (c.n_kv_heads, c.head_dim)), cos, sin)
            v = (h @ blk.attn_v.T).unflatten(-1, (c.n_kv_heads, c.head_dim))
            o = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=c.n_heads != c.n_kv_heads)                    # [B, heads, T, hd]
            x = x + o.transpose(1, 2).flatten(-2) @ blk.attn_output.T
            h = self.norm(x, blk.ffn_norm)
            a = self.gate_act(h @ blk.ffn_gate.T)                          # [B, T, d_ff]
            if acts is not None:
                acts.append(a)
            x = x + (a * (h @ blk.ffn_up.T)) @ blk.ffn_down.T
        return self.norm(x, self.out_norm)
