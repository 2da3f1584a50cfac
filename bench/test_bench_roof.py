"""The decode GEMV of every weight type at the row lengths of real models, against the machine's read bandwidth
measured in the same run: where decode of a 1.5B-8B model goes, the weights come from DRAM, so a GEMV is as
fast as the bytes it streams. Each weight is repeated (the same row length, more rows) to 256 MB, so nothing of it
is still in the caches when a pass comes back to it.

Prefill's GEMM (256 tokens, 2 threads) of the integer-dot types at the same shapes is timed beside them, as GMAC/s.

  pytest bench/test_bench_roof.py --benchmark-json bench/results/roof/roof_kernels.json
  python bench/roof_table.py bench/results/roof/roof_kernels.json > bench/results/roof/roof_kernels.md
Each entry is checked once against gguf-py's dequantization (its first and last 64 rows) before timing."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from checks import check_close, deq, q8a
from real_shapes import SHAPES, random_blocks

ISA = _core.available_isas().split(",")[0]
WORKING_SET = 256 << 20
ROOF_BYTES = 1 << 30
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16]
# (rows, row length) of the FFN's two shapes per model: gate/up read d-long rows, down reads ff-long ones.
MATRICES = {f"{name}.{part}": (rows, k) for name, c in SHAPES.items()
            for part, rows, k in (("gate", c["ff"], c["d"]), ("down", c["d"], c["ff"]))}
_ROOF: dict = {}


def read_roof(threads: int) -> float:
    """GB/s of a plain read over 1 GiB with `threads` of the engine's pool (once per run and thread count)."""
    if threads not in _ROOF:  # a build from before the probe existed (an A/B's old side) records none
        probe = getattr(_core, "read_bandwidth", None)
        _ROOF[threads] = probe(ROOF_BYTES, threads, 5) if probe else None
    return _ROOF[threads]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("matrix", list(MATRICES))
@pytest.mark.parametrize("qtype", [t.name for t in TYPES])
def test_gemv_roof(benchmark, qtype, matrix, threads):
    qt = Q[qtype]
    rows, k = MATRICES[matrix]
    rng = np.random.default_rng(0)
    one = random_blocks(qt, rows, k, rng)
    copies = max(1, -(-WORKING_SET // one.nbytes))
    w = np.concatenate([one] * copies)
    n = rows * copies
    x = rng.standard_normal((1, k)).astype(np.float32)
    eng, y = single_op_engine(lambda b: b.matmul(b.weight("w", int(qt), k, n, w),
                                                 b.weight("x", int(DType.F32), k, 1, x), "y"),
                              max_tokens=1, n_threads=threads, isa=ISA)
    eng.run(1)
    got = eng.tensor(y.id, 1)[0]
    xin = x if qt in (Q.F16, Q.BF16) else q8a(x)
    for sl in (slice(0, 64), slice(n - 64, n)):
        check_close(got[sl], (xin @ deq(w[sl], qt, 64, k).T)[0], f"GEMV {qtype} {matrix}")
    roof = read_roof(threads)
    benchmark.extra_info.update(rows=n, k=k, weight_bytes=int(w.nbytes), threads=threads, isa=ISA,
                                read_gbps=roof)
    benchmark.pedantic(eng.run, args=(1,), rounds=15, warmup_rounds=2)


# The low-bit types of MoE quants (Q2_K .. IQ2_S, gpt-oss's MXFP4) at an 8B model's two FFN shapes:
#   pytest bench/test_bench_roof.py -k low_bit --benchmark-json bench/results/roof/roof_low_bit.json
LOW_BIT = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("matrix", ["qwen3-8b.gate", "qwen3-8b.down"])
@pytest.mark.parametrize("qtype", [t.name for t in LOW_BIT])
def test_gemv_roof_low_bit(benchmark, qtype, matrix, threads):
    test_gemv_roof(benchmark, qtype, matrix, threads)


PREFILL_TOKENS = 256


@pytest.mark.parametrize("matrix", list(MATRICES))
@pytest.mark.parametrize("qtype", [t.name for t in TYPES if t not in (Q.F16, Q.BF16)])
def test_gemm_prefill(benchmark, qtype, matrix):
    qt = Q[qtype]
    rows, k = MATRICES[matrix]
    rng = np.random.default_rng(0)
    w = random_blocks(qt, rows, k, rng)
    x = rng.standard_normal((PREFILL_TOKENS, k)).astype(np.float32)
    eng, y = single_op_engine(lambda b: b.matmul(b.weight("w", int(qt), k, rows, w),
                                                 b.weight("x", int(DType.F32), k, PREFILL_TOKENS, x), "y"),
                              max_tokens=PREFILL_TOKENS, n_threads=2, isa=ISA)
    eng.run(PREFILL_TOKENS)
    got = eng.tensor(y.id, PREFILL_TOKENS)
    for t in (slice(0, 3), slice(PREFILL_TOKENS - 3, PREFILL_TOKENS)):
        for sl in (slice(0, 64), slice(rows - 64, rows)):
            check_close(got[t, sl], q8a(x[t]) @ deq(w[sl], qt, 64, k).T, f"GEMM {qtype} {matrix}")
    benchmark.extra_info.update(rows=rows, k=k, tokens=PREFILL_TOKENS, macs=rows * k * PREFILL_TOKENS, threads=2,
                                isa=ISA)
    benchmark.pedantic(eng.run, args=(PREFILL_TOKENS,), rounds=9, warmup_rounds=1)
