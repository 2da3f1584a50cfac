"""Gemma 3: the llama layer with embeddings times sqrt(d_model), per-head RMS norm of q and k, NEOX RoPE,
five sliding-window layers (RoPE base 10000) per global one, norms after attention and after the FFN, and a
GELU(tanh)-gated FFN (model/config.py: ARCH_ACTIVATION)."""
from __future__ import annotations

import numpy as np

from ..config import LlamaConfig
from .base import QK_NORMS, Architecture

# Layout facts that llama.cpp fixes in code rather than metadata.
GLOBAL_EVERY = 6
LOCAL_ROPE_BASE = 10000.0


class Gemma3(Architecture):
    name = "gemma3"
    rope_neox = True
    tensor_patterns = QK_NORMS + (r"blk\.N\.post_(attention|ffw)_norm\.weight",)

    def config(self, f) -> LlamaConfig:
        hp = self.common_hparams(f)
        return LlamaConfig(**hp, embed_scale=float(np.sqrt(hp["d_model"])), qk_norm=True, post_norms=True,
                           sliding_window=int(f.get(self.name + ".attention.sliding_window", 0)),
                           global_every=GLOBAL_EVERY, rope_base_local=LOCAL_ROPE_BASE,
                           attn_scale=hp["head_dim"] ** -0.5)

    def build_layer(self, m, il: int, x):
        p, cfg = f"blk.{il}.", m.cfg
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        o = m.attention(h, il, qk_norm=True, window=cfg.window(il), rope_base=cfg.layer_rope_base(il),
                        scale=cfg.attn_scale)
        o = m.norm(o, p + "post_attention_norm.weight", "attn_out_normed", out=o)
        x = m.residual(x, o)
        h = m.norm(x, p + "ffn_norm.weight", "ffn_in")
        f = m.ffn(h, il)
        f = m.norm(f, p + "post_ffw_norm.weight", "ffn_out_normed", out=f)
        return m.residual(x, f)


ARCH = Gemma3()
