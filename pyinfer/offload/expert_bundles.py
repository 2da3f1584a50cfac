"""The expert bundle file: each expert's gate, up and down matrices side by side, every part starting on a
4 KiB page, so bringing an expert into RAM is one page-aligned read (O_DIRECT) of exactly its bytes rather
than three reads of the page ranges around its rows in the GGUF's merged tensors (PowerInfer-2's expert
bundles, LLM in a flash's row-column bundling at expert grain).

Layout: a 64 KiB header (magic, JSON), then per layer its n_expert bundles [n_expert, stride] where a bundle is
gate | up | down, each in the stored quantization and padded to a page. The bytes are the GGUF's own, so a run
from the bundle equals the run from the model file bit for bit. The file is bound to its model by
fingerprint; anything else found at its path is rebuilt, never trusted. The expert store (csrc/offload/
expert_store.h) reads it through `expert_strides`: expert e of part p starts at
file_offset + part_offsets[p] + e * stride.
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..tools.atomic_file import atomic_write
from .bundles import align, read_header, settle, write_header

MAGIC = b"PYINFEXP"
FORMAT_VERSION = 1
HEADER_BYTES = 64 * 1024
PARTS = ("gate", "up", "down")


@dataclass
class ExpertBundleLayout:
    path: Path
    layers: list[dict]   # per layer: file_offset, stride, part_offsets [3], expert_bytes [3]
    file_bytes: int

    def store_layers(self) -> list[dict]:
        """The expert store's view of each layer (its ExpertLayer fields)."""
        return [{"file_offsets": [e["file_offset"] + o for o in e["part_offsets"]],
                 "expert_bytes": list(e["expert_bytes"]), "expert_strides": [e["stride"]] * len(PARTS)}
                for e in self.layers]


def expert_bundle_path(cache: Path, gguf: GGUFModelFile) -> Path:
    return cache / "offload" / f"{gguf.fingerprint()[:20]}.experts"


def bundle_bytes(gguf: GGUFModelFile, cfg: LlamaConfig) -> int:
    """The size the bundle file of this model will have."""
    total = HEADER_BYTES
    for il in cfg.moe_layers:
        sizes = [gguf.tensors[f"blk.{il}.ffn_{p}_exps.weight"].data.nbytes // cfg.n_expert for p in PARTS]
        total += cfg.n_expert * sum(map(align, sizes))
    return total


def read_expert_layout(path: Path, gguf: GGUFModelFile, cfg: LlamaConfig) -> ExpertBundleLayout | None:
    """The layout of a valid bundle file for this model, or None (missing, foreign, stale, truncated)."""
    meta = read_header(path, MAGIC, HEADER_BYTES, FORMAT_VERSION, gguf.fingerprint())
    try:
        if meta is None or len(meta["layers"]) != len(cfg.moe_layers):
            return None
        for il, e in zip(cfg.moe_layers, meta["layers"]):  # the sizes the graph's tensors expect
            want = [gguf.tensors[f"blk.{il}.ffn_{p}_exps.weight"].data.nbytes // cfg.n_expert for p in PARTS]
            if list(e["expert_bytes"]) != want or e["n_expert"] != cfg.n_expert:
                return None
        return ExpertBundleLayout(path, meta["layers"], int(meta["file_bytes"]))
    except (ValueError, KeyError, TypeError):
        return None


def write_expert_bundles(path: Path, gguf: GGUFModelFile, cfg: LlamaConfig,
                         progress: bool = True) -> ExpertBundleLayout:
    """Writes the file whole (atomic_write), a layer at a time: a failure (disk full) leaves nothing behind and
    raises a one-line PyinferError."""
    need = bundle_bytes(gguf, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    if free < need:
        raise PyinferError(f"the expert bundle file needs {need / 2**30:.1f} GiB and {path.parent} has "
                           f"{free / 2**30:.1f} GiB free")
    layers: list[dict] = []
    offset = HEADER_BYTES

    def write(f) -> None:
        nonlocal offset
        f.write(b"\0" * HEADER_BYTES)
        with tqdm(total=need, desc="pyinfer: writing expert bundles", unit="B", unit_scale=True,
                  disable=not progress, file=sys.stderr, leave=False) as bar:
            for il in cfg.moe_layers:
                names = [f"blk.{il}.ffn_{p}_exps.weight" for p in PARTS]
                # U8 [n_expert, bytes of one expert] of each part, as the file maps them
                parts = [np.asarray(gguf.tensors[n].data).view(np.uint8).reshape(cfg.n_expert, -1) for n in names]
                sizes = [p.shape[1] for p in parts]
                padded = [align(s) for s in sizes]
                stride = sum(padded)
                pads = [b"\0" * (a - s) for a, s in zip(padded, sizes)]
                for e in range(cfg.n_expert):
                    for part, pad in zip(parts, pads):
                        f.write(memoryview(np.ascontiguousarray(part[e])))
                        f.write(pad)
                layers.append({"n_expert": cfg.n_expert, "file_offset": offset, "stride": stride,
                               "part_offsets": [0, padded[0], padded[0] + padded[1]], "expert_bytes": sizes})
                offset += cfg.n_expert * stride
                # Under a memory limit neither the layer's dirty pages nor its source pages may pile up.
                settle(f, offset)
                for n in names:
                    gguf.release(n)
                bar.update(cfg.n_expert * stride)
        write_header(f, MAGIC, HEADER_BYTES, {"format": "pyinfer-expert-bundles", "version": FORMAT_VERSION,
                                              "fingerprint": gguf.fingerprint(), "layers": layers,
                                              "file_bytes": offset})

    try:
        with gguf.read_ahead():
            atomic_write(path, write)
    except OSError as e:
        raise PyinferError(f"cannot write the expert bundle file {path}: {e.strerror or e}") from None
    return ExpertBundleLayout(path, layers, offset)


def open_or_write_expert_bundles(cache: Path, gguf: GGUFModelFile, cfg: LlamaConfig,
                                 progress: bool = True) -> ExpertBundleLayout:
    path = expert_bundle_path(cache, gguf)
    layout = read_expert_layout(path, gguf, cfg)
    if layout is None:
        if path.exists() and progress:
            print(f"pyinfer: {path.name} does not match this model; rebuilding it", file=sys.stderr)
        layout = write_expert_bundles(path, gguf, cfg, progress)
    return layout
