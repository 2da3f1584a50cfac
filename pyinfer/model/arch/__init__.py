"""The architectures pyinfer runs, one file each: every module here with an `ARCH` (an Architecture) is
registered by its GGUF name. A new architecture is one file here, plus its test."""
from __future__ import annotations

import importlib
import pkgutil

from ...errors import UnsupportedModelError
from .base import Architecture


def _discover() -> dict[str, Architecture]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        arch = getattr(module, "ARCH", None)
        if isinstance(arch, Architecture):
            found[arch.name] = arch
    return found


ARCHITECTURES: dict[str, Architecture] = _discover()


def architecture(name: str) -> Architecture:
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise UnsupportedModelError(f"architecture '{name}' is not supported (supported: {', '.join(ARCHITECTURES)})")
    return arch
