"""pytest-benchmark entries for every weight type's matmul at one shape, so types compare in one run:
GEMV (decode, 1 token) and GEMM (prefill, 64 and 256 tokens: AMX tiles take 16) of a 2048 x 2048 weight, per
kernel ISA.

  pytest bench/test_bench_quant_types.py --benchmark-json bench/results/kernels/quant_kernels.json
  python bench/quant_kernels_table.py bench/results/kernels/quant_kernels.json > bench/results/kernels/quant_kernels.md
Each entry is checked once against gguf-py's dequantization before timing."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from checks import deq, q8a, run_and_check
from support.tiny_model import random_k_blocks

ISAS = _core.available_isas().split(",")
THREADS = 2
ROWS, K = 2048, 2048
TYPES = [Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
RNG = np.random.default_rng(0)
_WEIGHTS: dict = {}


def weights(qt):
    """Stored blocks (gguf-py cannot quantize to K-quants: random blocks with sane scales for those)."""
    if qt not in _WEIGHTS:
        w = RNG.standard_normal((ROWS, K)).astype(np.float32) * 0.05
        if qt == Q.F16:
            _WEIGHTS[qt] = w.astype(np.float16)
        elif qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            _WEIGHTS[qt] = random_k_blocks(qt, ROWS, K, RNG, scale=0.002)
        else:
            _WEIGHTS[qt] = quants.quantize(w, qt)
    return _WEIGHTS[qt]


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "scalar"] or ISAS)
@pytest.mark.parametrize("n_tok", [1, 64, 256])
@pytest.mark.parametrize("qtype", [t.name for t in TYPES])
def test_matmul_type(benchmark, isa, n_tok, qtype):
    qt = Q[qtype]
    w = weights(qt)
    x = RNG.standard_normal((n_tok, K)).astype(np.float32)
    eng, y = single_op_engine(lambda b: b.matmul(b.weight("w", int(qt), K, ROWS, w),
                                                 b.weight("x", int(DType.F32), K, n_tok, x), "y"),
                              max_tokens=n_tok, n_threads=THREADS, isa=isa)
    wd = w.astype(np.float32) if qt == Q.F16 else deq(w, qt, ROWS, K)
    run_and_check(eng, n_tok, y.id, (x if qt == Q.F16 else q8a(x)) @ wd.T, f"matmul {qtype}")
    benchmark.extra_info.update(rows=ROWS, k=K, n_tok=n_tok, weight_bytes=int(w.nbytes))
    benchmark(eng.run, n_tok)
