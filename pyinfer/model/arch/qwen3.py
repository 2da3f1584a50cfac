"""Qwen 3 (dense): the llama layer with per-head RMS norm of q and k before RoPE, NEOX RoPE, and heads whose
size is its own key (attention.key_length, often wider than d_model / heads)."""
from __future__ import annotations

from ..config import LlamaConfig
from .base import QK_NORMS, Architecture


class Qwen3(Architecture):
    name = "qwen3"
    rope_neox = True
    tensor_patterns = QK_NORMS

    def config(self, f) -> LlamaConfig:
        return LlamaConfig(**self.common_hparams(f), qk_norm=True)

    def attention_options(self, m, il: int) -> dict:
        return {"qk_norm": True}


ARCH = Qwen3()
