"""Qwen 2 MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen 2's attention (q/k/v biases, NEOX RoPE) and a Mixture
of Experts whose chosen weights are the softmax probabilities as they are (not renormalized), plus a shared
expert every token runs, scaled by the sigmoid of its own one-row gate (llama.cpp's qwen2moe graph)."""
from __future__ import annotations

from ..config import LlamaConfig
from .base import MOE_TENSORS, SHARED_EXPERT_TENSORS, Architecture


class Qwen2Moe(Architecture):
    name = "qwen2moe"
    rope_neox = True
    tensor_patterns = MOE_TENSORS + SHARED_EXPERT_TENSORS

    def config(self, f) -> LlamaConfig:
        return LlamaConfig(**self.common_hparams(f), **self.moe_hparams(f, norm=False, shared=True))


ARCH = Qwen2Moe()
