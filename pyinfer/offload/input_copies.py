"""Input-major copies on disk: what an input-sparse plan reads under a memory limit.

In RAM an input-sparse projection's copy (runtime/input_major.py: row i = input i's column of W) is anonymous
memory made at load, a second copy of every cut weight that no limit can page out. Under `--mem-limit` each copy
is written once to a file beside the other sidecars (`<cache>/input_major/v1/<fingerprint>/<weight>.npy`) and
mapped instead, advised random: a decode step faults in only the pages of the rows its active inputs name, and
the kernel evicts them as it evicts the model's own mapped pages. So the bytes a cut skips in RAM are not read
from disk either, and a copy costs disk space (8.5 bits a weight for quantized weights), not memory.

The files hold exactly the rows the in-RAM path computes with (the same call makes them), so a limited run gives
the tokens an unlimited one gives. A file of the wrong shape, type or order, or one numpy cannot read, is rebuilt,
never trusted; the folder is bound to the model by its fingerprint and to the copies' format by its version
(a change to how runtime/input_major.py rounds a copy must raise FORMAT_VERSION).
"""
from __future__ import annotations

import contextlib
import mmap
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np

from .._core import DType
from ..errors import PyinferError
from ..model.gguf_file import GGUFModelFile
from ..runtime.input_major import copy_layout, transposed_weight
from ..tools.atomic_file import atomic_write
from .bundles import settle

FORMAT_VERSION = 1
STALE_TEMP_SECONDS = 600  # a temporary file this old is a killed writer's (a live one renames within seconds)


class MappedInputCopies:
    """A source of input-major copies (a graph builder's `input_copies`, which runtime/input_major.by_input_weight
    calls) that maps them from files, writing each the first time it is asked for."""

    def __init__(self, cache: Callable[[], Path], gguf: GGUFModelFile, progress: bool = False):
        self._cache, self._gguf = cache, gguf  # resolved on first use: a load with no input plan never asks
        self.progress, self.written = progress, 0
        self._told = False

    @cached_property
    def folder(self) -> Path:
        folder = Path(self._cache()) / "input_major" / f"v{FORMAT_VERSION}" / self._gguf.fingerprint()[:20]
        now = time.time()
        for tmp in folder.glob(".*.tmp"):  # a writer killed mid-copy (a cgroup's OOM killer) leaves its temp file
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > STALE_TEMP_SECONDS:
                    tmp.unlink()
        return folder

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.npy"

    def __call__(self, gguf: GGUFModelFile, name: str) -> tuple[DType, np.ndarray]:
        dt, shape, np_type = copy_layout(gguf.tensor(name))
        path = self.path(name)
        rows = _open(path, shape, np_type)
        if rows is None:
            if self.progress and not self._told:
                print(f"pyinfer: writing the input-sparse plan's input-major copies to {self.folder} (once per "
                      f"model; under a memory limit they are read from there, only the rows decode uses)",
                      file=sys.stderr)
                self._told = True
            _, made = transposed_weight(gguf, name)

            def write(f, made=made):
                np.save(f, made, allow_pickle=False)
                settle(f, f.tell())  # written through: the page cache under a limit keeps none of it

            try:
                atomic_write(path, write)
            except OSError as e:  # a full or read-only disk: one line, naming where (PYINFER_CACHE moves it)
                raise PyinferError(f"could not write the input-sparse plan's copy {path}: {e.strerror or e} (set "
                                   f"PYINFER_CACHE to a folder with room)") from None
            self.written += made.nbytes
            del made
            rows = _open(path, shape, np_type)
            if rows is None:  # written and unreadable: the disk, not the data
                raise PyinferError(f"{path}: an input-major copy just written cannot be read back")
        return dt, rows


def _open(path: Path, shape: tuple[int, int], np_type) -> np.ndarray | None:
    """The file's rows, mapped and advised random, if it holds an array of exactly this shape and type."""
    try:
        rows = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(rows, np.memmap) or rows.shape != shape or rows.dtype != np_type or \
            not rows.flags.c_contiguous:
        return None
    with contextlib.suppress(AttributeError, OSError, ValueError):  # faults read their own pages only
        rows._mmap.madvise(mmap.MADV_RANDOM)
    return rows
