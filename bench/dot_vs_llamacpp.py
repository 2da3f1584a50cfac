"""Each quantized weight type's matmul against llama.cpp's own dot product, one row at a time: the weights quantized
by llama.cpp (`ggml_quantize_chunk`, bench/llamacpp_quant_fixture.py), the activation quantized by llama.cpp's own
`from_float` for the type's `vec_dot_type` and dotted by its `vec_dot` (libggml-cpu's type traits, the kernels
llama.cpp decodes with on this CPU), against pyinfer's matmul of the same weights on the same float activation, on
every kernel table this CPU runs. Equal integer sums leave only the order of the float sums: differences of an ulp
or two, which is what the logits comparisons (bench/arch_check.py, bench/lowbit_check.py) see amplified where a
value sits at an 8-bit rounding edge.

  python bench/dot_vs_llamacpp.py      # writes bench/results/vs_llamacpp/dot_vs_llamacpp.{json,md}
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gguf import GGML_QUANT_SIZES  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from llamacpp_quant_fixture import libggml, quantize  # noqa: E402

from pyinfer import _core  # noqa: E402
from pyinfer._core import DType  # noqa: E402
from pyinfer.runtime.graph_builder import single_op_engine  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "vs_llamacpp"
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS,
         Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S]


class CpuTraits(ctypes.Structure):  # ggml-cpu.h's struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def libggml_cpu() -> ctypes.CDLL:
    import llama_cpp

    lib = next((Path(llama_cpp.__file__).parent / "lib").glob("libggml-cpu.so*"), None)
    if lib is None:
        raise SystemExit("dot_vs_llamacpp: llama-cpp-python has no libggml-cpu (pip install '.[bench]')")
    cpu = ctypes.CDLL(str(lib))
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(CpuTraits)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init()  # the fp16 table its dot products read the block scales through
    return cpu


def llamacpp_rows(cpu, blocks: np.ndarray, x: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """llama.cpp's vec_dot of every row of `blocks` with `x` quantized as llama.cpp quantizes it for `qtype`."""
    traits = cpu.ggml_get_type_traits_cpu(int(qtype)).contents
    act = Q(traits.vec_dot_type)
    per_block, block_bytes = GGML_QUANT_SIZES[act]
    xq = np.zeros(x.size // per_block * block_bytes, np.uint8)
    FROM_FLOAT(cpu.ggml_get_type_traits_cpu(int(act)).contents.from_float)(x.ctypes.data, xq.ctypes.data, x.size)
    dot, out = VEC_DOT(traits.vec_dot), ctypes.c_float()
    rows = []
    for row in blocks:
        dot(x.size, ctypes.byref(out), 0, row.ctypes.data, 0, xq.ctypes.data, 0, 1)
        rows.append(out.value)
    return np.array(rows, np.float32), act


def pyinfer_rows(blocks: np.ndarray, x: np.ndarray, qtype: Q, isa: str) -> np.ndarray:
    rows, k = blocks.shape[0], x.size

    def build(b):
        return b.matmul(b.weight("w", int(qtype), k, rows, blocks), b.weight("x", int(DType.F32), k, 1, x[None]), "y")

    eng, y = single_op_engine(build, max_tokens=1, n_threads=2, isa=isa)
    eng.run(1)
    return eng.tensor(y.id, 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--k", type=int, default=1024, help="the row length (a multiple of 256)")
    args = ap.parse_args()
    lib, cpu = libggml(), libggml_cpu()
    isas = _core.available_isas().split(",")
    rows = []
    for qtype in TYPES:
        rng = np.random.default_rng(int(qtype))
        w = rng.normal(0, 0.05, (args.rows, args.k)).astype(np.float32)
        blocks = np.ascontiguousarray(quantize(lib, w, qtype)[0]).reshape(args.rows, -1)
        x = rng.standard_normal(args.k).astype(np.float32)
        theirs, act = llamacpp_rows(cpu, blocks, x, qtype)
        row = {"type": qtype.name, "activation": act.name, "isas": {}}
        outputs = {}
        for isa in isas:
            ours = outputs[isa] = pyinfer_rows(blocks, x, qtype, isa)
            row["isas"][isa] = {"max_rel": float(np.abs(ours - theirs).max() / np.abs(theirs).max()),
                                "bit_equal": float((ours == theirs).mean())}
        # pyinfer's tables against each other, bit for bit
        row["tables_bit_equal"] = all(np.array_equal(outputs[isas[0]], o) for o in outputs.values())
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dot_vs_llamacpp.json").write_text(json.dumps({"rows_per_type": args.rows, "k": args.k,
                                                              "rows": rows}, indent=1))
    md = ["# Each type's matmul against llama.cpp's own dot product", "",
          f"{args.rows} rows of {args.k} weights (normal, sd 0.05) quantized by llama.cpp, one activation row "
          "(normal) quantized by llama.cpp for the type's `vec_dot_type` and dotted by its `vec_dot` (libggml-cpu "
          "of llama-cpp-python 0.3.36, built for this CPU); pyinfer's matmul of the same weights on the same float "
          "row, per kernel table. max = largest |difference| over the largest |output|; bit-equal = share of "
          "outputs equal to the last bit; tables agree = pyinfer's tables give the same bits as each other. "
          f"Tables: the ones this CPU runs ({', '.join(isas)}).", "",
          "| type | activation | " + " | ".join(f"{i}: max | bit-equal" for i in isas) + " | tables agree |",
          "|---|---|" + "---|---|" * len(isas) + "---|"]
    for r in rows:
        md.append(f"| {r['type']} | {r['activation']} | " + " | ".join(
            f"{r['isas'][i]['max_rel']:.1e} | {r['isas'][i]['bit_equal']:.2f}" for i in isas) +
            f" | {'yes' if r['tables_bit_equal'] else 'no'} |")
    text = "\n".join(md) + "\n"
    (RESULTS / "dot_vs_llamacpp.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
