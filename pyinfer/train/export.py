"""The ReLU-fied model as GGUF: every tensor the recipe did not change keeps its exact bytes and type, the FFN is
re-quantized to its source type (Q8_0 where gguf-py cannot quantize to it, said so), and the activation is
recorded (`pyinfer.ffn_activation = relu`), so pyinfer and its profiler treat the file as a ReLU-family model.
`ffn_only` writes just the FFN tensors; `merge` puts them back into the original file."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quants

from ..errors import PyinferError

ACTIVATION_KEY = "pyinfer.ffn_activation"
FFN_ONLY_KEY = "pyinfer.relufy.ffn_only"
_FFN = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.weight$")
_SKIP = ("GGUF.", "general.architecture")


def quantize(a: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType, bool]:
    """(bytes, type, fell back): `a` F32 [rows, cols] in `qtype`, or Q8_0 where gguf-py has no quantizer."""
    if qtype == GGMLQuantizationType.F32:
        return a.astype(np.float32), qtype, False
    if qtype == GGMLQuantizationType.F16:
        return a.astype(np.float16), qtype, False
    try:
        return quants.quantize(a.astype(np.float32), qtype), qtype, False
    except (NotImplementedError, ValueError, KeyError):
        return quants.quantize(a.astype(np.float32), GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0, True


def _copy_fields(r: GGUFReader, w: GGUFWriter, skip=()) -> None:
    for key, f in r.fields.items():
        if key.startswith(_SKIP) or key in skip:
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, f.types[-1] if vtype == GGUFValueType.ARRAY else None)


def _finish(w: GGUFWriter, out: Path, tmp: Path) -> None:
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise PyinferError(f"cannot write {out}: {e.strerror or e}") from None


def export(source: str, ffn: dict[str, np.ndarray], out: str | Path, ffn_only: bool = False) -> list[str]:
    """Writes `out` from the `source` GGUF with the FFN tensors replaced by `ffn` (name -> F32 [rows, cols]).
    Returns notes (types that fell back)."""
    out = Path(out)
    r = GGUFReader(source)
    arch = str(r.fields["general.architecture"].contents())
    tmp = out.with_name(out.name + ".tmp")
    w = GGUFWriter(str(tmp), arch)
    _copy_fields(r, w, skip=(ACTIVATION_KEY,))
    w.add_string(ACTIVATION_KEY, "relu")
    if ffn_only:
        w.add_bool(FFN_ONLY_KEY, True)
    notes = []
    for t in r.tensors:
        if _FFN.match(t.name):
            data, qtype, fell_back = quantize(ffn[t.name], GGMLQuantizationType(t.tensor_type))
            if fell_back:
                notes.append(f"{t.name}: {GGMLQuantizationType(t.tensor_type).name} -> Q8_0 (no quantizer)")
            w.add_tensor(t.name, data, raw_dtype=qtype)
        elif not ffn_only:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    _finish(w, out, tmp)
    return notes


def merge(source: str, ffn_file: str, out: str | Path) -> None:
    """The original `source` with the FFN tensors (and activation) of an `--ffn-only` file."""
    out = Path(out)
    r, f = GGUFReader(source), GGUFReader(ffn_file)
    if FFN_ONLY_KEY not in f.fields:
        raise PyinferError(f"{ffn_file} is not an FFN-only file from `pyinfer relufy --ffn-only`")
    ffn = {t.name: t for t in f.tensors}
    missing = [t.name for t in r.tensors if _FFN.match(t.name) and t.name not in ffn]
    if missing:
        raise PyinferError(f"{ffn_file} lacks {missing[0]} (and {len(missing) - 1} more): made from another model?")
    tmp = out.with_name(out.name + ".tmp")
    w = GGUFWriter(str(tmp), str(r.fields["general.architecture"].contents()))
    _copy_fields(r, w, skip=(ACTIVATION_KEY,))
    w.add_string(ACTIVATION_KEY, "relu")
    for t in r.tensors:
        src = ffn.get(t.name, t)
        if tuple(src.shape) != tuple(t.shape):
            raise PyinferError(f"{t.name} has shape {list(src.shape)} in {ffn_file}, {list(t.shape)} in {source}")
        w.add_tensor(t.name, np.asarray(src.data), raw_dtype=src.tensor_type)
    _finish(w, out, tmp)
