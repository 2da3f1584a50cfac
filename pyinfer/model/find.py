"""GGUF files where people keep them: the Hugging Face hub and its cache (`-m OWNER/REPO[:QUANT]`,
`-m hf://OWNER/REPO/FILE.gguf`, through huggingface_hub: $HF_ENDPOINT, $HF_HUB_OFFLINE, the shared cache and its
progress bars), ollama's store (`-m ollama:NAME[:TAG]`), LM Studio's models folder
(`-m lmstudio:PUBLISHER/REPO[/FILE]`), and pyinfer's own cache: what
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
from .shards import SHARD, shard_names

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


_REPO = re.compile(r"([A-Za-z0-9][\w.-]{0,95})/([A-Za-z0-9][\w.-]{0,95})(?::([\w.-]{1,64}))?")
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
DEFAULT_QUANT = "Q4_K_M"  # what llama.cpp's -hf picks when none is named


def _hub_error(e: Exception, what: str) -> PyinferError:
    name = type(e).__name__
    why = {"RepositoryNotFoundError": "no such repository (or it is private: log in with `hf auth login`)",
           "GatedRepoError": "the repository is gated: accept its terms on the hub and log in",
           "EntryNotFoundError": "no such file in the repository",
           "RemoteEntryNotFoundError": "no such file in the repository",
           "LocalEntryNotFoundError": "not in the local cache, and the hub cannot be reached (offline?)",
           "OfflineModeIsEnabled": "HF_HUB_OFFLINE is set and it is not in the local cache"}.get(name)
    return PyinferError(f"{what}: {why or f'{name}: {str(e).splitlines()[0] if str(e) else name}'}")


def pick_gguf(files: list[str], quant: str | None, repo: str) -> str:
    """The repository's GGUF file for `quant` (a case-insensitive part of its name; none: Q4_K_M, or the only one)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not f.split("/")[-1].startswith("mmproj"))
    if not ggufs:
        raise PyinferError(f"{repo} holds no GGUF file")
    want = (quant or DEFAULT_QUANT).lower()
    match = [f for f in ggufs if want in f.split("/")[-1].lower()]
    if not match and quant is None and len(ggufs) == 1:
        match = ggufs
    if not match:
        raise PyinferError(f"{repo} has no {quant or DEFAULT_QUANT} file; it has {', '.join(ggufs)} "
                           f"(name one as {repo}:QUANT)")
    whole = [f for f in match if not _SHARD.search(f)]
    return whole[0] if whole else match[0]  # shards sort by number: the first (resolve_hub fetches and joins all)


def _cached_files(repo: str) -> list[str]:
    """The GGUF files of `repo` in the local cache's snapshots (offline: no listing from the hub)."""
    snaps = hf_cache() / ("models--" + repo.replace("/", "--")) / "snapshots"
    return sorted({str(p.relative_to(s)) for s in snaps.glob("*") for p in s.rglob("*.gguf")}) if snaps.is_dir() else []


def resolve_hub(repo: str, filename: str | None = None, quant: str | None = None) -> Path:
    """The GGUF of a hub repository in the shared cache, downloaded (with huggingface_hub's progress bar) if it is
    not there yet: `filename`, or the one pick_gguf chooses for `quant`."""
    try:
        import huggingface_hub as hub
    except ImportError:
        raise PyinferError("models from the Hugging Face hub need huggingface_hub: pip install huggingface_hub") \
            from None
    if filename is None:
        try:
            files = hub.HfApi().list_repo_files(repo)
        except Exception as e:  # noqa: BLE001 - offline, or the hub said no: the cache may still have it
            files = _cached_files(repo)
            if not files:
                raise _hub_error(e, f"cannot list {repo} on the hub") from None
        filename = pick_gguf(files, quant, repo)
    names = shard_names(filename) if SHARD.match(filename.rsplit("/", 1)[-1]) else [filename]
    paths = []
    for name in names:
        try:
            paths.append(Path(hub.hf_hub_download(repo, name, cache_dir=str(hf_cache()))))
        except Exception as e:  # noqa: BLE001 - every failure of the download is one line
            raise _hub_error(e, f"cannot fetch {name} from {repo}") from None
    return paths[0]  # a sharded model: all its shards are in the same snapshot folder (pull.resolve_model joins)


def resolve_store(path_or_name: str) -> Path | None:
    """A model named by its store (`ollama:`, `lmstudio:`, `hf://`, or OWNER/REPO[:QUANT]), or None when the name
    is none of these."""
    prefix, sep, rest = path_or_name.partition(":")
    if sep and rest and prefix == "ollama":
        return resolve_ollama(rest)
    if sep and rest and prefix == "lmstudio":
        return resolve_lmstudio(rest)
    hub = path_or_name.startswith("hf://")
    ref = path_or_name[len("hf://"):] if hub else path_or_name
    parts = ref.split("/", 2)
    if hub and len(parts) == 3 and parts[2] and _REPO.fullmatch("/".join(parts[:2])):
        return resolve_hub("/".join(parts[:2]), filename=parts[2])
    m = _REPO.fullmatch(ref)
    if m and (hub or not ref.lower().endswith(".gguf")):
        return resolve_hub(f"{m.group(1)}/{m.group(2)}", quant=m.group(3))
    if hub:
        raise PyinferError(f"not a hub model: {path_or_name!r} (hf://OWNER/REPO/FILE.gguf or hf://OWNER/REPO[:QUANT])")
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
