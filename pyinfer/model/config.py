"""Hyper-parameters of a llama-family model, read from GGUF metadata."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int          # embedding width
    d_ff: int             # FFN hidden width (neurons per layer)
    n_heads: int
    n_kv_heads: int       # < n_heads: grouped-query attention
    head_dim: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    train_ctx: int        # context length the model was trained for
    tied_output: bool     # output head reuses token_embd
    # ReGLU FFN (ReLU instead of SiLU on the gate), as in ReluLLaMA / ProSparse. GGUF has no standard key,
    # so it is read from metadata "pyinfer.ffn_activation" = "relu".
    ffn_relu: bool = False

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim
