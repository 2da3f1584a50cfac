"""A bounds check of a GGUF header before the `gguf` reader sees it.

The reader trusts every count and length in the file: an array that claims 2^32 items in a 4 KB file
makes it loop four billion times over empty slices, and a string longer than the file reads as empty.
This walk bounds each count by the bytes left in the file, so a corrupt header fails in milliseconds with
one line that says where."""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from ..errors import ModelFormatError

# GGUF value types: (name, bytes) of the scalars; 8 is a string, 9 an array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS


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


def check_gguf_header(path: Path) -> None:
    """Raises ModelFormatError unless every count, length and tensor shape of the header fits the file."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file
            raise ModelFormatError(f"{path.name} is empty") from None
    with buf:
        c = _Cursor(memoryview(buf), path)
        try:
            _walk(c)
        finally:
            c.buf.release()


def _walk(c: _Cursor) -> None:
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
    for i in range(n_kv):
        key = c.string(f"metadata key {i}")
        try:
            name = key.decode("utf-8")
        except UnicodeDecodeError:
            c.fail(f"metadata key {i} is not UTF-8")
        c.skip_value(c.u32(f"type of '{name}'"), f"'{name}'")
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}").decode("utf-8", "replace")
        nd = c.u32(f"dimensions of tensor '{name}'")
        if not 1 <= nd <= _MAX_DIMS:
            c.fail(f"tensor '{name}' has {nd} dimensions (1..{_MAX_DIMS})")
        elements = 1
        for d in range(nd):
            n = c.u64(f"shape of tensor '{name}'")
            elements *= n
            if n < 1 or elements > 1 << 48:
                c.fail(f"tensor '{name}' has shape dimension {d} = {n}")
        c.u32(f"type of tensor '{name}'")
        c.u64(f"offset of tensor '{name}'")
