"""Qwen 2 and 2.5: the llama layer with biases on q, k and v (read by the shared attention whenever a file
has them) and NEOX RoPE."""
from __future__ import annotations

from .base import Architecture


class Qwen2(Architecture):
    name = "qwen2"
    rope_neox = True


ARCH = Qwen2()
