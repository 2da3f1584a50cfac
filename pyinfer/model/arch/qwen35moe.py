"""Qwen 3.5 MoE (`qwen35moe`, Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): Qwen 3.5's layers (model/arch/qwen35.py: gated
DeltaNet and gated full attention) with a Mixture of Experts in every layer: softmax top-k renormalized, plus a shared
expert every token runs, times the sigmoid of its own one-row gate (llama.cpp's qwen35moe graph). Expert streaming,
the expert cache and read-ahead run it as any other MoE."""
from __future__ import annotations

from dataclasses import replace

from ..config import LlamaConfig
from .base import MOE_TENSORS, SHARED_EXPERT_TENSORS
from .qwen35 import Qwen35


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    tensor_patterns = Qwen35.tensor_patterns + MOE_TENSORS + SHARED_EXPERT_TENSORS

    def ffn_width(self, f) -> int:
        """feed_forward_length where the file has it (llama.cpp reads it as optional here), else an expert's width."""
        p = self.name + "."
        return int(f.get(p + "feed_forward_length", 0) or f.require(p + "expert_feed_forward_length"))

    def config(self, f) -> LlamaConfig:
        return replace(super().config(f), **self.moe_hparams(f, norm=True, shared=True))


ARCH = Qwen35Moe()
