"""The architectures pyinfer runs, one file each: every module here with an `ARCH` (an Architecture) is
registered by its GGUF name. A new architecture is one file here, plus its test. `open_model()` is where a file
meets its architecture: the GGUF reader below knows none."""
from __future__ import annotations

import importlib
import os
import pkgutil

from ...errors import ModelFormatError, PyinferError, UnsupportedModelError
from ..config import LlamaConfig
from ..gguf_file import GGUFModelFile, short_error
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


def open_model(path: str | os.PathLike, mmap: bool = True) -> GGUFModelFile:
    """A GGUF file read (GGUFModelFile), its fused tensors presented as the separate ones the graph reads where its
    architecture is one pyinfer runs (others open as they are: the tokenizer and `check` read them too)."""
    f = GGUFModelFile(path, mmap=mmap)
    arch = ARCHITECTURES.get(f.architecture)
    if arch is not None:
        try:
            arch.present(f)
        except (TypeError, ValueError, OverflowError) as e:  # metadata of the wrong type: one line
            if isinstance(e, PyinferError):
                raise
            raise ModelFormatError(f"{f.path.name}: malformed model metadata ({short_error(e)})") from None
    return f


def model_config(f: GGUFModelFile) -> LlamaConfig:
    """The hyper-parameters, read by the file's architecture, after checking that every tensor is one its graph
    reads and that no value would make a wrong shape or a huge buffer."""
    arch = architecture(f.architecture)
    try:
        arch.check_tensors(f)
        cfg = arch.config(f)
    except PyinferError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise ModelFormatError(f"{f.path.name}: malformed model metadata ({short_error(e)})") from None
    f.check_config(cfg)
    return cfg
