"""The bundle file: every FFN neuron's gate row, up row and down row side by side, so one read fetches
all three (LLM in a flash's row-column bundling), in the sparsity plan's hot-first order, so a layer's
cold neurons are one contiguous tail and the hottest ones a prefix.

Layout: a 64 KiB header (magic, JSON), then per layer its bundles [n_ff, bundle_bytes] padded to 4 KiB
(so tails can be read with O_DIRECT), then, for a Q4T down, its group scales, then the layer's original down
matrix as the model stores it (dense runs, prefill, read it whole in large reads instead of through mmap).
Rows keep exactly the bytes the in-RAM sparse path computes with, so offloaded runs equal in-RAM runs bit
for bit. The file is bound to its model and plan by fingerprint and plan id; anything else found at its
path is rebuilt, never trusted.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import SparsityPlan
from ..tools.atomic_file import atomic_write

MAGIC = b"PYINFBND"
FORMAT_VERSION = 2
HEADER_BYTES = 64 * 1024
ALIGN = 4096


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_id(plan: SparsityPlan, down_type: str) -> str:
    """What the bundles depend on besides the model: the neuron order of every layer and the down form."""
    h = hashlib.sha256(down_type.encode())
    for lp in plan.layers:
        h.update(np.ascontiguousarray(lp.perm, dtype=np.int32).tobytes())
    return h.hexdigest()


@dataclass
class BundleLayout:
    path: Path
    layers: list[dict]   # n_ff, bundle_bytes, part_offsets, file_offset, types, scales_offset/shape, down_rows
    file_bytes: int

    def layer_bytes(self, il: int) -> int:
        return self.layers[il]["n_ff"] * self.layers[il]["bundle_bytes"]


def bundle_path(cache: Path, gguf: GGUFModelFile, pid: str) -> Path:
    return cache / "offload" / f"{gguf.fingerprint()[:20]}-{pid[:12]}.bundles"


def settle(f, upto: int) -> None:
    """Writes what `f` holds up to byte `upto` to the disk and drops it from the page cache (best effort)."""
    try:
        f.flush()
        os.fdatasync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, upto, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError, ValueError):
        pass


def read_header(path: Path, magic: bytes, header_bytes: int, version: int, fingerprint: str) -> dict | None:
    """The JSON header of a sidecar file (magic, u32 length, JSON) of this format version and model whose size
    is the one it states, or None (missing, foreign, stale, truncated; what follows checks its own fields)."""
    try:
        with open(path, "rb") as f:
            head = f.read(header_bytes)
        if len(head) < 12 or head[:8] != magic:
            return None
        n = int.from_bytes(head[8:12], "little")
        meta = json.loads(head[12:12 + n].decode())
        if (not isinstance(meta, dict) or meta.get("version") != version or meta.get("fingerprint") != fingerprint
                or path.stat().st_size != meta.get("file_bytes")):
            return None
        return meta
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def write_header(f, magic: bytes, header_bytes: int, meta: dict) -> None:
    """read_header's header, written over the zeros reserved at the file's start once its layout is known."""
    text = json.dumps(meta).encode()
    if 12 + len(text) > header_bytes:
        raise PyinferError(f"too many layers for the {meta['format']} header")
    f.seek(0)
    f.write(magic + len(text).to_bytes(4, "little") + text)


def read_layout(path: Path, fingerprint: str, pid: str) -> BundleLayout | None:
    """The layout of a valid bundle file for this model and plan, or None (missing, foreign, stale,
    truncated)."""
    meta = read_header(path, MAGIC, HEADER_BYTES, FORMAT_VERSION, fingerprint)
    try:
        if meta is None or meta.get("plan_id") != pid:
            return None
        return BundleLayout(path, meta["layers"], int(meta["file_bytes"]))
    except (ValueError, KeyError, TypeError):
        return None


def write_bundles(path: Path, gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan, down_type: str,
                  progress: bool = True) -> BundleLayout:
    """Writes the file whole (atomic_write): a failure (disk full) leaves nothing behind and raises a one-line
    PyinferError."""
    from ..runtime.sparse_ffn import ffn_arrays

    fp, pid = gguf.fingerprint(), plan_id(plan, down_type)
    layers: list[dict] = []
    offset = HEADER_BYTES

    def write(f) -> None:
        nonlocal offset
        f.write(b"\0" * HEADER_BYTES)
        for il in tqdm(range(cfg.n_layers), desc="pyinfer: writing neuron bundles", unit="layer",
                       disable=not progress, file=sys.stderr, leave=False):
            fa = ffn_arrays(gguf, cfg, plan, il, down_type)
            # Bundle k holds hot-first neuron k whole: a Q4T down keeps the original order, so its row perm[k].
            down = fa.down if fa.down_rows is None else np.asarray(fa.down)[fa.down_rows]
            parts = [np.ascontiguousarray(a).reshape(cfg.d_ff, -1).view(np.uint8) for a in (fa.gate, fa.up, down)]
            widths = [p.shape[1] for p in parts]
            bundles = np.concatenate(parts, axis=1)          # U8 [n_ff, bundle_bytes]
            f.write(memoryview(bundles).cast("B"))  # no second copy of the layer
            pad = align(bundles.nbytes) - bundles.nbytes
            f.write(b"\0" * pad)
            entry = {"n_ff": cfg.d_ff, "bundle_bytes": int(sum(widths)),
                     "part_offsets": [0, widths[0], widths[0] + widths[1]], "file_offset": offset,
                     "types": [int(fa.gate_type), int(fa.up_type), int(fa.down_type)],
                     "down_rows": fa.down_rows is not None}
            offset += bundles.nbytes + pad
            if fa.scales is not None:
                sc = np.ascontiguousarray(fa.scales)
                f.write(sc.tobytes())
                f.write(b"\0" * (align(sc.nbytes) - sc.nbytes))
                entry.update(scales_offset=offset, scales_shape=list(sc.shape))
                offset += align(sc.nbytes)
            src = gguf.tensor(f"blk.{il}.ffn_down.weight")  # [d, n_ff], bytes as stored
            raw = np.asarray(src.data).view(np.uint8).reshape(src.rows, -1)
            f.write(raw.tobytes())
            f.write(b"\0" * (align(raw.nbytes) - raw.nbytes))
            entry.update(dense_offset=offset, dense_rows=int(src.rows), dense_row_bytes=int(raw.shape[1]),
                         dense_type=int(src.dtype_id))
            offset += align(raw.nbytes)
            layers.append(entry)
            # Under a memory limit neither the layer's dirty pages nor its source pages in the model's mapping
            # may pile up: flushed and dropped layer by layer, the writer holds about one layer.
            settle(f, offset)
            for part in ("gate", "up", "down"):
                gguf.release(f"blk.{il}.ffn_{part}.weight")
        write_header(f, MAGIC, HEADER_BYTES, {"format": "pyinfer-bundles", "version": FORMAT_VERSION,
                                              "fingerprint": fp, "plan_id": pid, "down": down_type,
                                              "layers": layers, "file_bytes": offset})

    try:
        with gguf.read_ahead():
            atomic_write(path, write)  # a failure (disk full) leaves nothing behind
    except OSError as e:
        raise PyinferError(f"cannot write the neuron bundle file {path}: {e.strerror or e}") from None
    return BundleLayout(path, layers, offset)


def open_or_write(cache: Path, gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan, down_type: str,
                  progress: bool = True) -> BundleLayout:
    pid = plan_id(plan, down_type)
    path = bundle_path(cache, gguf, pid)
    layout = read_layout(path, gguf.fingerprint(), pid)
    if layout is None:
        if path.exists() and progress:
            print(f"pyinfer: {path.name} does not match this model and plan; rebuilding it", file=sys.stderr)
        layout = write_bundles(path, gguf, cfg, plan, down_type, progress)
    return layout


def read_scales(layout: BundleLayout, il: int) -> np.ndarray | None:
    e = layout.layers[il]
    if "scales_offset" not in e:
        return None
    shape = tuple(e["scales_shape"])
    with open(layout.path, "rb") as f:
        f.seek(e["scales_offset"])
        data = f.read(int(np.prod(shape)) * 2)
    if len(data) != int(np.prod(shape)) * 2:
        raise PyinferError(f"{layout.path} is truncated")
    return np.frombuffer(data, dtype=np.float16).reshape(shape).copy()
