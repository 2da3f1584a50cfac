"""Reads a GGUF header (metadata and tensor directory), bounding every count and length by the file.

`gguf.GGUFReader` trusts every count in the file (an array that claims 2^32 items in a 4 KB file makes it
loop four billion times) and builds numpy views per string: 16 s for Gemma 3's 262,144-token vocabulary.
This walk bounds each count by the bytes left, so a corrupt header fails in milliseconds with one line that
says where, and decodes the values as it goes (0.1 s for the same file). Tensor data stays with the
caller's memory map; the `gguf` package still names the types and dequantizes."""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError

# GGUF value types: bytes and numpy dtype of the scalars; 8 is a string, 9 an array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_SCALAR_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
                  11: "<i8", 12: "<f8"}
_BOOL = 7
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAP_ARRAYS_OVER = 1 << 20  # bytes: numeric metadata arrays larger than this stay in the file


@dataclass
class TensorInfo:
    name: str
    shape: list[int]      # GGUF order: shape[0] is the row length
    type_id: int          # GGML type id
    offset: int           # from the start of the data section


@dataclass
class GGUFHeader:
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int       # byte offset of the data section (after the header, aligned)
    alignment: int        # general.alignment (32 when absent): tensor offsets are multiples of it


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.size, self.path = buf, 0, len(buf), path

    def fail(self, what: str):
        raise ModelFormatError(f"{self.path.name} is not a valid GGUF file: {what} (at byte {self.pos})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"{what} runs past the end of the file")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = struct.unpack_from("<I", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = struct.unpack_from("<Q", self.buf, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str) -> bytes:
        n = self.u64(what + " length")
        self.need(n, what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s

    def value(self, vtype: int, what: str) -> Any:
        """Decodes one value (strings as str, arrays of strings as lists, numeric arrays as read-only numpy
        arrays). A string, or an array of strings, that is not valid UTF-8 decodes to None: its user (the
        tokenizer, a config key) reports it in one line."""
        start = self.pos
        self.skip_value(vtype, what)  # bounds first
        if vtype in _SCALAR_BYTES:
            v = np.frombuffer(self.buf, _SCALAR_DTYPES[vtype], 1, start)[0].item()
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            try:
                return bytes(self.buf[start + 8:self.pos]).decode("utf-8")
            except UnicodeDecodeError:
                return None
        itype, count = struct.unpack_from("<IQ", self.buf, start)
        body = start + 12
        if itype in _SCALAR_BYTES:
            return self._numeric_array(itype, count, body)
        out, pos = [], body
        raw = self.buf
        try:
            for _ in range(count):
                n = struct.unpack_from("<Q", raw, pos)[0]
                out.append(bytes(raw[pos + 8:pos + 8 + n]).decode("utf-8"))
                pos += 8 + n
        except UnicodeDecodeError:
            return None
        return out

    def _numeric_array(self, itype: int, count: int, offset: int) -> np.ndarray:
        """A read-only numpy array, never a Python list (a list of 12M floats is 400 MB): small ones copied, large
        ones mapped from the file, so an array nothing reads costs no memory."""
        dtype = np.dtype(_SCALAR_DTYPES[itype])
        if count * dtype.itemsize > _MAP_ARRAYS_OVER:
            arr = np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=(count,))
        else:
            arr = np.frombuffer(self.buf, dtype, count, offset).copy()
        if itype == _BOOL:
            arr = arr.astype(bool)
        arr.flags.writeable = False
        return arr

    def skip_value(self, vtype: int, what: str) -> None:
        if vtype in _SCALAR_BYTES:
            self.need(_SCALAR_BYTES[vtype], what)
            self.pos += _SCALAR_BYTES[vtype]
        elif vtype == _STRING:
            n = self.u64(what + " length")
            self.need(n, what)
            self.pos += n
        elif vtype == _ARRAY:
            itype = self.u32(what + " item type")
            count = self.u64(what + " count")
            if itype in _SCALAR_BYTES:
                self.need(count * _SCALAR_BYTES[itype], f"{what} ({count} items)")
                self.pos += count * _SCALAR_BYTES[itype]
            elif itype == _STRING:
                if count * 8 > self.size - self.pos:  # every string takes at least its 8-byte length
                    self.fail(f"{what} claims {count} strings")
                for _ in range(count):
                    self.pos += 8 + self._checked_len(what)
            else:
                self.fail(f"{what} has unsupported item type {itype}")
        else:
            self.fail(f"{what} has unknown value type {vtype}")

    def _checked_len(self, what: str) -> int:
        self.need(8, what)
        n = struct.unpack_from("<Q", self.buf, self.pos)[0]
        if n > self.size - self.pos - 8:
            self.fail(f"a string of {what} runs past the end of the file")
        return n


def _shown(name: str) -> str:
    """A key or tensor name as an error message shows it: quoted, escaped, cut (a corrupt length can make a name
    of megabytes of anything, newlines included)."""
    text = repr(name[:80])
    return text + ("…" if len(name) > 80 else "")


def check_gguf_header(path: Path) -> None:
    """Raises ModelFormatError unless every count, length and tensor shape of the header fits the file."""
    read_gguf_header(path, decode=False)


def read_gguf_header(path: Path, decode: bool = True) -> GGUFHeader:
    """The header's metadata and tensor directory, or a one-line ModelFormatError."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise ModelFormatError(f"{path.name} is empty") from None
    with buf:
        c = _Cursor(memoryview(buf), path)
        try:
            return _walk(c, decode)
        finally:
            c.buf.release()


def _walk(c: _Cursor, decode: bool) -> GGUFHeader:
    c.need(4, "magic")
    c.pos = 4
    version = c.u32("version")
    if version not in (2, 3):
        c.fail(f"version {version} is not supported (2 or 3)")
    n_tensors = c.u64("tensor count")
    n_kv = c.u64("metadata count")
    if n_kv * 12 > c.size - c.pos:  # a key-value pair takes at least 12 bytes
        c.fail(f"header claims {n_kv} metadata entries")
    if n_tensors * 24 > c.size - c.pos:  # a tensor entry takes at least 24 bytes
        c.fail(f"header claims {n_tensors} tensors")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            c.fail(f"metadata key {i} is not UTF-8")
        vtype = c.u32(f"type of {_shown(name)}")
        if decode:
            metadata[name] = c.value(vtype, f"{_shown(name)}")
        else:
            c.skip_value(vtype, f"{_shown(name)}")
    tensors = []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}").decode("utf-8", "replace")
        nd = c.u32(f"dimensions of tensor {_shown(name)}")
        if not 1 <= nd <= _MAX_DIMS:
            c.fail(f"tensor {_shown(name)} has {nd} dimensions (1..{_MAX_DIMS})")
        elements = 1
        shape = []
        for d in range(nd):
            n = c.u64(f"shape of tensor {_shown(name)}")
            elements *= n
            if n < 1 or elements > 1 << 48:
                c.fail(f"tensor {_shown(name)} has shape dimension {d} = {n}")
            shape.append(n)
        type_id = c.u32(f"type of tensor {_shown(name)}")
        offset = c.u64(f"offset of tensor {_shown(name)}")
        tensors.append(TensorInfo(name, shape, type_id, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1 or alignment & (alignment - 1):
        if decode:
            raise ModelFormatError(f"{c.path.name}: general.alignment must be a power of two")
        alignment = 32
    return GGUFHeader(metadata, tensors, -(-c.pos // alignment) * alignment, alignment)
