"""Qwen 3 MoE (Qwen3-30B-A3B, 235B-A22B): Qwen 3's attention (QK-norm, NEOX RoPE, its own head size) and in
every layer a Mixture of Experts: softmax over the router's logits, the top `expert_used_count` experts,
their weights divided by their sum (llama.cpp's qwen3moe graph)."""
from __future__ import annotations

from ..config import LlamaConfig
from .base import MOE_TENSORS, QK_NORMS, Architecture


class Qwen3Moe(Architecture):
    name = "qwen3moe"
    rope_neox = True
    tensor_patterns = QK_NORMS + MOE_TENSORS

    def config(self, f) -> LlamaConfig:
        return LlamaConfig(**self.common_hparams(f), qk_norm=True, **self.moe_hparams(f, norm=True))

    def attention_options(self, m, il: int) -> dict:
        return {"qk_norm": True}


ARCH = Qwen3Moe()
