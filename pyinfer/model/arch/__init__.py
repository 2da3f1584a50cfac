"""The architectures pyinfer runs, one file each. A new architecture is one file here (plus its test)."""
from __future__ import annotations

from ...errors import UnsupportedModelError
from . import gemma3, llama, phi3, qwen2, qwen3
from .base import Architecture

ARCHITECTURES: dict[str, Architecture] = {m.ARCH.name: m.ARCH for m in (llama, gemma3, qwen2, qwen3, phi3)}


def architecture(name: str) -> Architecture:
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UnsupportedModelError(f"architecture '{name}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    return arch
