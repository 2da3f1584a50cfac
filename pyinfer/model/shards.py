"""GGUF files split into shards (`NAME-00001-of-00003.gguf`, llama.cpp's gguf-split): joined once into one file.

llama.cpp maps every shard and reads each tensor from the one that holds it; pyinfer's reader maps one file, so a
sharded model is joined as `gguf-split --merge` would: the first shard's metadata without the split.* keys, then
every shard's tensors in order, written by gguf-py into pyinfer's cache (the shards stay where they are, in the
Hugging Face cache; the joined copy costs their size once more on disk). The join is written to a temporary name
and renamed when whole, so an interrupted one is never taken for a model."""
from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from ..errors import ModelFormatError

SHARD = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def shard_names(first: str) -> list[str]:
    """All shard file names of a sharded model, from any one of them (the same folder)."""
    folder, _, name = first.rpartition("/")
    m = SHARD.match(name)
    if m is None or not 1 <= int(m["index"]) <= int(m["count"]):
        raise ModelFormatError(f"{first} is not a shard name (NAME-0000K-of-0000N.gguf, 1 <= K <= N)")
    count = int(m["count"])
    prefix = f"{folder}/" if folder else ""
    return [f"{prefix}{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def join_shards(paths: list[Path], dest: Path, progress: bool = True) -> Path:
    """Writes the model of `paths` (its shards, in order) as one GGUF at `dest`; returns dest."""
    import gguf

    readers = [gguf.GGUFReader(str(p)) for p in paths]
    first = readers[0]
    arch = first.fields.get(gguf.Keys.General.ARCHITECTURE)
    if arch is None:
        raise ModelFormatError(f"{paths[0]}: no general.architecture: not the first shard of a model")
    count = first.fields.get("split.count")
    if count is not None and int(count.contents()) != len(paths):
        raise ModelFormatError(f"{paths[0]} says the model has {int(count.contents())} shards; {len(paths)} given")
    # a name of its own: two processes joining the same model never write one file
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_joined(first, readers, arch.contents(), tmp, len(paths), progress)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()  # a join that failed leaves nothing behind
    return dest


def _write_joined(first, readers, arch: str, tmp: Path, n_shards: int, progress: bool) -> None:
    import gguf
    from tqdm import tqdm

    writer = gguf.GGUFWriter(str(tmp), arch, endianess=first.endianess)
    alignment = first.fields.get(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:  # tensors padded as the file says, not to gguf-py's default
        writer.data_alignment = int(alignment.contents())
    for field in first.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF.") \
                or field.name in _SPLIT_KEYS:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    tensors = [t for r in readers for t in r.tensors]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    with tqdm(total=sum(int(t.n_bytes) for t in tensors), unit="B", unit_scale=True, disable=not progress,
              desc=f"joining {n_shards} shards") as bar:
        for t in tensors:
            writer.write_tensor_data(t.data)
            bar.update(int(t.n_bytes))
    writer.close()
