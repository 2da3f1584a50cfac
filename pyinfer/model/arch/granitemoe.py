"""Granite MoE (granite-3.x-1b-a400m, 3b-a800m, and the "shared" variants): the llama layer with Granite's four
multipliers (embeddings times embedding_scale, q.k times attention.scale instead of 1/sqrt(head size), each
residual branch times residual_scale, the logits divided by logit_scale), softmax top-k experts renormalized, and
an optional shared expert added ungated (llama.cpp's granite graph, which granitemoe builds on)."""
from __future__ import annotations

from ...errors import ModelFormatError
from ..config import LlamaConfig
from .base import MOE_TENSORS, SHARED_EXPERT_TENSORS, Architecture


class GraniteMoe(Architecture):
    name = "granitemoe"
    tensor_patterns = MOE_TENSORS + SHARED_EXPERT_TENSORS

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)
        moe = self.moe_hparams(f, norm=True, shared=True, shared_gated=False, width_key="feed_forward_length")
        if not moe:
            raise ModelFormatError(f"{f.path.name}: granitemoe needs granitemoe.expert_count and its expert tensors")
        if "blk.0.ffn_gate_inp_shexp.weight" in f.tensors:
            raise ModelFormatError(f"{f.path.name}: Granite's shared expert has no gate (ffn_gate_inp_shexp)")
        logit_scale = float(f.require(p + "logit_scale"))
        if not logit_scale or logit_scale != logit_scale:
            raise ModelFormatError(f"{f.path.name}: {p}logit_scale must be a non-zero number")
        attn_scale = float(f.get(p + "attention.scale", 0.0) or 0.0)
        return LlamaConfig(**hp, **moe, embed_scale=float(f.get(p + "embedding_scale", 0.0) or 0.0),
                           attn_scale=attn_scale or None, residual_scale=float(f.get(p + "residual_scale", 0.0) or 0.0),
                           logit_scale=logit_scale)

    def attention_options(self, m, il: int) -> dict:
        return {"scale": m.cfg.attn_scale}


ARCH = GraniteMoe()
