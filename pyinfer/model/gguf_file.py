"""Reads a GGUF file with the `gguf` package, memory-mapped: weights stay in their stored format. The reader knows
no architecture: model/arch/ `open_model()` opens a file and presents it as its architecture's graph reads it."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import ModelFormatError, UnsupportedModelError
from .config import LlamaConfig
from .gguf_check import GGUFHeader, TensorInfo, read_gguf_header

# GGML type names that our kernels run (GGML ids are the _core.DType values).
SUPPORTED_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10,
                   "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18,
                   "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "BF16": 30, "MXFP4": 39}
GGUF_MAGIC = b"GGUF"
POWERINFER_MAGIC = b"PWRI"  # PowerInfer's converter overwrites the magic; the layout after it is GGUF's
# Element types that gguf's reader gives typed views of; block types are rows of bytes.
_ELEMENT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                   "I32": np.int32, "I64": np.int64}


@dataclass
class GGUFTensor:
    name: str
    type_name: str        # GGML type name, e.g. "Q4_1"
    cols: int             # elements per row (GGUF ne[0])
    rows: int             # product of the other dims
    data: np.ndarray      # memory-mapped bytes (or typed view) of the whole tensor

    @property
    def dtype_id(self) -> int:
        return SUPPORTED_TYPES[self.type_name]


class GGUFModelFile:
    """Metadata and memory-mapped tensors of one GGUF file."""

    def __init__(self, path: str | os.PathLike, mmap: bool = True):
        """`mmap` False: every tensor is read into anonymous memory (llama.cpp's --no-mmap) instead of being
        mapped from the file."""
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"model file not found: {self.path}")
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic not in (GGUF_MAGIC, POWERINFER_MAGIC):
            raise ModelFormatError(f"{self.path} is not a GGUF file (bad magic {magic!r})")
        self.powerinfer = magic == POWERINFER_MAGIC
        header = read_gguf_header(self.path)  # every count and length bounded by the file
        self.metadata: dict[str, Any] = header.metadata
        self.tensors: dict[str, GGUFTensor] = {}
        raw = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._map = getattr(raw, "_mmap", None)  # the mapping itself, for release()
        self._random = False
        self._ranges: dict[str, tuple[int, int, np.ndarray]] = {}  # tensor name -> (file offset, bytes, view)
        # A merged expert tensor an architecture presents from part of a fused one (Gemma 4's ffn_gate_up_exps):
        # name -> (file offset of expert 0's part, bytes from one expert's part to the next), for the expert store.
        self.expert_spans: dict[str, tuple[int, int]] = {}
        # Fused tensors an architecture presented as others, still readable whole by name (tensor()) for a graph
        # that computes on them as stored (Gemma 4's ffn_gate_up_exps in RAM); not among `tensors`.
        self.fused: dict[str, GGUFTensor] = {}
        extents = []
        for t in header.tensors:
            tensor = self._tensor_view(t, raw, header, size)
            if t.name in self.tensors:
                raise ModelFormatError(f"{self.path.name}: tensor {t.name} appears twice")
            self.tensors[t.name] = tensor
            start = header.data_start + t.offset
            extents.append((start, start + tensor.data.nbytes, t.name))
            self._ranges[t.name] = (start, tensor.data.nbytes, tensor.data)  # the view as the file maps it
        extents.sort()
        for (s0, e0, a), (s1, _, b) in zip(extents, extents[1:]):
            if s1 < e0:
                raise ModelFormatError(f"{self.path.name}: tensors {a} and {b} overlap")
        self.file_size = size
        self.read_bytes = 0  # bytes of tensors read into memory rather than mapped (mmap False)
        if not mmap:
            self._read_into_memory()
        self._present_transposed_down()

    def _read_into_memory(self) -> None:
        """Every tensor copied into one anonymous buffer on 2 MiB pages where the kernel grants them (THP in
        `madvise` mode, as most distributions ship it): decode reads every weight once a token, and on 4 KiB pages
        of the mapped file each 4 KiB of a stream is a TLB miss. On a 2-core Zen 4 VM the Qwen2.5-1.5B-shaped
        Q4_K_M file decoded 28.5-29.3 tok/s from here against 26.1-27.5 mapped. Tensors start 64 bytes apart."""
        import mmap as mmap_module

        huge = 2 << 20
        offsets, total = {}, 0
        for name, t in self.tensors.items():
            offsets[name] = total
            total += (t.data.nbytes + 63) // 64 * 64
        if hasattr(mmap_module, "MAP_PRIVATE"):
            # Private: a shared anonymous map is shmem, which THP leaves alone unless shmem_enabled says otherwise.
            buf = mmap_module.mmap(-1, total + huge, flags=mmap_module.MAP_PRIVATE | mmap_module.MAP_ANONYMOUS)
            with contextlib.suppress(AttributeError, OSError):  # advice only: other systems, THP off
                buf.madvise(mmap_module.MADV_HUGEPAGE)
            whole = np.frombuffer(buf, np.uint8)
        else:  # Windows: plain memory
            whole = np.empty(total + huge, np.uint8)
        start = -whole.ctypes.data % huge  # the tensors from the first 2 MiB boundary on
        for name, t in self.tensors.items():
            src = np.asarray(t.data)
            dst = whole[start + offsets[name]:start + offsets[name] + src.nbytes].view(src.dtype).reshape(src.shape)
            dst[...] = src
            t.data = dst
            self.read_bytes += src.nbytes
            if name in self._ranges:  # the copied pages leave this process (the page cache keeps them): the
                self._drop_mapped_pages(*self._ranges[name][:2])  # peak RSS is one model, not two

    def _present_transposed_down(self) -> None:
        """PowerInfer files store each FFN down projection transposed (`ffn_down_t`, [n_ff, d_model]); the
        dense path reads `ffn_down` [d_model, n_ff], so it is presented too: float types transposed as they
        are, block types through F32 (a copy in RAM: the cost of reading these files)."""
        for name in [n for n in self.tensors if n.endswith(".ffn_down_t.weight")]:
            down = name.replace(".ffn_down_t.", ".ffn_down.")
            if down in self.tensors:
                continue
            t = self.tensors[name]
            self.powerinfer = True
            if t.type_name in ("F32", "F16"):
                data = np.ascontiguousarray(np.asarray(t.data).reshape(t.rows, t.cols).T)
                self.tensors[down] = GGUFTensor(down, t.type_name, t.rows, t.cols, data)
            elif t.type_name in SUPPORTED_TYPES:
                from gguf import quants

                w = quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name]).reshape(t.rows, t.cols)
                self.tensors[down] = GGUFTensor(down, "F32", t.rows, t.cols, np.ascontiguousarray(w.T, np.float32))

    def _tensor_view(self, t: TensorInfo, raw: np.ndarray, header: GGUFHeader, size: int) -> GGUFTensor:
        """The tensor's bytes in the file's memory map, typed as gguf's reader types them."""
        try:
            qtype = GGMLQuantizationType(t.type_id)
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFormatError(f"{self.path.name}: tensor {t.name} has unknown type id {t.type_id}") from None
        cols = t.shape[0]
        rows = int(np.prod(t.shape[1:], dtype=np.int64)) if len(t.shape) > 1 else 1
        if cols % block_elems:
            raise ModelFormatError(f"{self.path.name}: tensor {t.name} has {cols} columns, not a multiple of "
                                   f"{qtype.name}'s block of {block_elems}")
        row_bytes = cols // block_elems * block_bytes
        start = header.data_start + t.offset
        end = start + rows * row_bytes
        if end > size:
            raise ModelFormatError(f"{self.path} is truncated: tensor {t.name} ends at byte {end}, file has {size}")
        if t.offset % header.alignment:
            raise ModelFormatError(f"{self.path.name}: tensor {t.name} is not aligned to {header.alignment} bytes")
        data = raw[start:end]
        typed = _ELEMENT_DTYPES.get(qtype.name)
        if typed is not None:
            data = data.view(typed).reshape((rows, cols) if len(t.shape) > 1 else (cols,))
        else:  # blocks: rows of bytes
            data = data.reshape((rows, row_bytes) if len(t.shape) > 1 else (row_bytes,))
        return GGUFTensor(t.name, qtype.name, cols, rows, data)

    @property
    def weight_bytes(self) -> int:
        """Bytes of every tensor the file stores (fused tensors once, however the architecture presents them)."""
        return sum(n for _, n, _ in self._ranges.values())

    def release(self, name: str) -> None:
        """Drops the pages of tensor `name` from this process's mapping and from the page cache, once its bytes
        have been copied where they stay (offload's resident weights, the bundle file): mapped pages left behind
        count against a memory limit until the kernel reclaims them, and reclaiming them under the limit's
        pressure is what got the process killed. A later read of the tensor faults its pages in again."""
        if name not in self._ranges or self._map is None:
            return
        lo, hi = self._drop_mapped_pages(*self._ranges[name][:2])
        if hi <= lo:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except (OSError, AttributeError, ValueError):  # best effort: other systems, a vanished file
            pass

    def _drop_mapped_pages(self, start: int, n: int) -> tuple[int, int]:
        """Unmaps from this process the whole pages inside file bytes [start, start + n) (a later read faults them
        in again); returns that page range."""
        import mmap

        page = mmap.PAGESIZE
        lo, hi = (start + page - 1) // page * page, (start + n) // page * page
        if hi > lo and self._map is not None:
            with contextlib.suppress(OSError, AttributeError, ValueError):  # best effort: other systems
                self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return lo, hi

    def read_copy(self, name: str) -> np.ndarray:
        """Tensor `name`'s bytes in a new array of its own, read with one read() and no readahead, then dropped
        from the page cache. Copying through the mapping instead faults each page in with the disk's read-around
        (8 MiB on the test VM), which drags neighbouring tensors into the page cache: memory a limit counts."""
        t = self.tensors[name]
        got = self._ranges.get(name)
        if got is None or t.data is not got[2] or self._map is None:  # presented or already in memory: a copy
            return np.array(t.data, copy=True)
        start, n, _ = got
        out = np.empty(n, np.uint8)
        try:
            with open(self.path, "rb", buffering=0) as f:
                with contextlib.suppress(OSError, AttributeError):
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # this read only, no read-ahead
                f.seek(start)
                done = 0
                view = memoryview(out)
                while done < n:
                    k = f.readinto(view[done:])
                    if not k:
                        raise ModelFormatError(f"{self.path} is truncated: tensor {name} ends past the file's end")
                    done += k
        except OSError as e:
            raise ModelFormatError(f"cannot read {self.path}: {e.strerror or e}") from None
        self.release(name)
        return out.view(t.data.dtype).reshape(t.data.shape)

    def advise_random(self, on: bool) -> None:
        """Faults on the mapping read only their own pages (MADV_RANDOM) instead of the disk's read-around, or go
        back to the default. Under a memory limit a handful of small reads (norms, fingerprint samples) must not
        pull hundreds of MiB of neighbours into the page cache."""
        import mmap

        if self._map is None:
            return
        self._random = on
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self._map.madvise(mmap.MADV_RANDOM if on else mmap.MADV_NORMAL)

    @contextlib.contextmanager
    def read_ahead(self):
        """The default read-around for a block that reads whole tensors through the mapping (the bundle writer),
        whatever advise_random said."""
        was = self._random
        self.advise_random(False)
        try:
            yield
        finally:
            self.advise_random(was)

    def fingerprint(self) -> str:
        """Identity of this model for sidecar files: the file size, the header (metadata, tensor
        directory) and a sample of the weights, hashed. Fast (reads about a megabyte)."""
        import hashlib

        h = hashlib.sha256(str(self.file_size).encode())
        with open(self.path, "rb") as f:
            with contextlib.suppress(OSError, AttributeError):  # samples only: no read-ahead into the weights
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            h.update(f.read(1 << 20))
            for name in sorted(self.tensors)[:: max(1, len(self.tensors) // 8)]:
                t, got = self.tensors[name], self._ranges.get(name)
                n = min(1 << 14, t.data.nbytes)
                if got is not None and t.data is got[2]:  # read, not faulted through the mapping (read-around)
                    f.seek(got[0])
                    h.update(f.read(n))
                else:
                    h.update(np.asarray(t.data).reshape(-1).view(np.uint8)[:n].tobytes())
        return h.hexdigest()

    def get(self, key: str, default: Any = None) -> Any:
        v = self.metadata.get(key, default)
        return default if v is None else v

    def require(self, key: str) -> Any:
        if key not in self.metadata or self.metadata[key] is None:
            raise ModelFormatError(f"{self.path.name}: required metadata '{key}' is missing")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "?"))

    def tensor(self, name: str) -> GGUFTensor:
        t = self.tensors.get(name) or self.fused.get(name)
        if t is None:
            raise ModelFormatError(f"{self.path.name}: tensor '{name}' is missing")
        if t.type_name not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                f"tensor {name} has type {t.type_name}, which pyinfer does not support "
                f"(supported: {', '.join(SUPPORTED_TYPES)})")
        return t

    def check_config(self, c: LlamaConfig) -> None:
        """Values that the graph would turn into wrong shapes or huge buffers: one line instead."""
        def bad(why: str):
            raise ModelFormatError(f"{self.path.name}: {why}")

        if not 1 <= c.n_layers <= 4096 or sum(1 for n in self.tensors if n.endswith(".attn_norm.weight")) < c.n_layers:
            bad(f"block_count {c.n_layers} does not match the file's layers")
        if not 1 <= c.n_heads <= 1 << 16 or not 1 <= c.head_dim <= 1 << 16:  # the graph's ints are 32-bit
            bad(f"head_count {c.n_heads} and head size {c.head_dim} must be in 1..65536")
        if not (1 <= c.n_kv_heads <= c.n_heads and c.n_heads % c.n_kv_heads == 0):
            bad(f"head_count {c.n_heads} is not a multiple of head_count_kv {c.n_kv_heads}")
        if c.head_dim % 2:
            bad(f"head size {c.head_dim} is odd (RoPE rotates pairs)")
        if c.d_ff < 1:
            bad("feed_forward_length must be positive")
        if not 0 <= c.sliding_window < 1 << 31:  # the attention op's window is a 32-bit int
            bad(f"attention.sliding_window {c.sliding_window} must be in 0..2147483647")
        # The lookup table and the head hold one row per token, as llama.cpp requires: a head of other rows would
        # make logits of another width than the vocabulary (found by fuzzing the tiny architectures).
        for name in ("token_embd.weight",) + (() if c.tied_output else ("output.weight",)):
            t = self.tensor(name)
            if t.cols != c.d_model or t.rows != c.vocab_size or c.vocab_size < 1:
                bad(f"{name} [{t.rows}, {t.cols}] does not match the vocabulary ({c.vocab_size}) "
                    f"and embedding_length ({c.d_model})")
        if not (np.isfinite(c.rope_base) and c.rope_base > 0 and np.isfinite(c.norm_eps) and 0 <= c.norm_eps < 1):
            bad("rope.freq_base or layer_norm_rms_epsilon is out of range")

    def finite_norm(self, name: str) -> GGUFTensor:
        """A norm weight, checked for NaN and Inf (a corrupt norm would turn every logit into NaN)."""
        t = self.tensor(name)
        if t.type_name in ("F32", "F16") and not np.isfinite(np.asarray(t.data)).all():
            raise ModelFormatError(f"{self.path.name}: tensor {name} holds NaN or Inf")
        return t


def short_error(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]
