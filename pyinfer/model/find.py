"""GGUF files where people keep them: ollama's store (`-m ollama:NAME[:TAG]`), LM Studio's models folder
(`-m lmstudio:PUBLISHER/REPO[/FILE]`), files already in the Hugging Face cache, and pyinfer's own cache: what
`pyinfer list` shows (cli/list.py reads each file's header; nothing is loaded or downloaded).

ollama keeps a manifest per model and tag (manifests/registry.ollama.ai/library/NAME/TAG, or .../USER/NAME/TAG) that
names its layers by sha256; the layer of media type application/vnd.ollama.image.model is the GGUF, stored as
blobs/sha256-HEX. Its root is $OLLAMA_MODELS, else ~/.ollama/models. LM Studio keeps
~/.lmstudio/models/PUBLISHER/REPO/FILE.gguf ($LMSTUDIO_MODELS overrides; older versions used
~/.cache/lm-studio/models). The Hugging Face cache is $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ..errors import PyinferError

OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def lmstudio_roots() -> list[Path]:
    if os.environ.get("LMSTUDIO_MODELS"):
        return [Path(os.environ["LMSTUDIO_MODELS"])]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home) / "hub"


def resolve_ollama(ref: str) -> Path:
    """`NAME[:TAG]` or `USER/NAME[:TAG]` (tag: latest) -> the GGUF blob its manifest names, or a one-line error."""
    name, _, tag = ref.partition(":")
    tag = tag or "latest"
    parts = name.split("/")
    if not (1 <= len(parts) <= 2 and all(_NAME.fullmatch(p) for p in parts + [tag])):
        raise PyinferError(f"not an ollama model name: {ref!r} (NAME, NAME:TAG or USER/NAME:TAG)")
    root = ollama_root()
    manifest = root / "manifests" / OLLAMA_REGISTRY / (parts[0] if len(parts) == 2 else "library") / parts[-1] / tag
    if not manifest.is_file():
        raise PyinferError(f"ollama model {name}:{tag} not found in {root} (`ollama pull {name}:{tag}` fetches it)")
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_MEDIA)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, StopIteration):
        raise PyinferError(f"ollama manifest {manifest} names no model layer") from None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise PyinferError(f"ollama manifest {manifest}: bad digest {digest!r}")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise PyinferError(f"ollama model {name}:{tag}: its blob {blob.name} is missing from {root / 'blobs'}")
    return blob


def resolve_lmstudio(ref: str) -> Path:
    """`PUBLISHER/REPO` (its one GGUF, or the first by name of several) or `PUBLISHER/REPO/FILE.gguf`."""
    parts = ref.strip("/").split("/")
    if not (2 <= len(parts) <= 3) or any(p in ("", ".", "..") for p in parts):
        raise PyinferError(f"not an LM Studio model: {ref!r} (PUBLISHER/REPO or PUBLISHER/REPO/FILE.gguf)")
    for root in lmstudio_roots():
        here = root.joinpath(*parts)
        if here.is_file():
            return here
        if here.is_dir():
            files = sorted(p for p in here.glob("*.gguf") if not p.name.startswith("mmproj"))
            if files:
                return files[0]
    raise PyinferError(f"LM Studio model {ref} not found in {', '.join(map(str, lmstudio_roots()))}")


def resolve_store(path_or_name: str) -> Path | None:
    """A model named by its store (`ollama:`, `lmstudio:`), or None when the name has no store prefix."""
    prefix, sep, rest = path_or_name.partition(":")
    if not sep or not rest:
        return None
    if prefix == "ollama":
        return resolve_ollama(rest)
    if prefix == "lmstudio":
        return resolve_lmstudio(rest)
    return None


def ollama_models() -> list[tuple[str, Path]]:
    root = ollama_root() / "manifests" / OLLAMA_REGISTRY
    out = []
    for manifest in sorted(root.glob("*/*/*")) if root.is_dir() else []:
        user, name, tag = manifest.parts[-3:]
        ref = f"{name}:{tag}" if user == "library" else f"{user}/{name}:{tag}"
        try:
            out.append((f"ollama:{ref}", resolve_ollama(ref)))
        except PyinferError:
            continue
    return out
