"""Blocks of every low-bit weight type made by llama.cpp's own quantizer, for the test suite (which has no
llama.cpp): `ggml_quantize_chunk` from llama-cpp-python's libggml on a seeded normal matrix (an importance matrix of
ones, which IQ2_XXS and IQ2_XS require), with llama.cpp's own dequantization (`ggml_get_type_traits(t)->to_float`)
beside them. tests/test_quant_types.py checks pyinfer's decoding and matmuls against both.

  python bench/llamacpp_quant_fixture.py     # writes tests/data/llamacpp_low_bit.npz
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support.tiny_model import LOW_BIT_TYPES  # noqa: E402

OUT = Path(__file__).parents[1] / "tests" / "data" / "llamacpp_low_bit.npz"
ROWS, COLS = 2, 512


class TypeTraits(ctypes.Structure):  # ggml.h's struct ggml_type_traits
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)),
                ("from_float_ref", ctypes.c_void_p)]


def libggml() -> ctypes.CDLL:
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


def quantize(lib, x: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray]:
    """(llama.cpp's blocks of x as qtype, llama.cpp's dequantization of them)."""
    rows, cols = x.shape
    be, bb = GGML_QUANT_SIZES[qtype]
    blocks = np.zeros((rows, cols // be * bb), np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    ones = np.ones(cols, np.float32)
    n = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, blocks.ctypes.data, 0, rows, cols, ones.ctypes.data)
    if n != blocks.nbytes:
        raise SystemExit(f"ggml_quantize_chunk {qtype.name}: {n} bytes, expected {blocks.nbytes}")
    back = np.zeros((rows, cols), np.float32)
    lib.ggml_get_type_traits(int(qtype)).contents.to_float(blocks.ctypes.data, back.ctypes.data, rows * cols)
    return blocks, back


def main() -> None:
    lib = libggml()
    rng = np.random.default_rng(51)
    out = {}
    for qtype in LOW_BIT_TYPES:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        out[f"{qtype.name}.blocks"], out[f"{qtype.name}.dequantized"] = quantize(lib, x, qtype)
        err = np.abs(out[f"{qtype.name}.dequantized"] - x).max() / np.abs(x).max()
        print(f"{qtype.name:8s} {out[f'{qtype.name}.blocks'].nbytes:5d} bytes, largest error {err:.3f} of max |x|")
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
