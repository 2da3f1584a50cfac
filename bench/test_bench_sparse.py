"""pytest-benchmark entries for the neuron-aware operators against the dense GEMV of the same matrix,
at the real model's FFN shape and at LLaMA-7B's (4096 x 11008, synthetic weights; the shape of the
ReLU-family models, ReluLLaMA / ProSparse / TurboSparse, that run at ~90% sparsity).

  pytest bench/test_bench_sparse.py --benchmark-json bench/results/kernels/sparse_kernels.json
  python bench/sparse_kernels_table.py bench/results/kernels/sparse_kernels.json

Each entry is one engine run of a single node (plus a trivial input copy), so ratios between entries
of one run are what to read."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from pyinfer.runtime.sparse_ffn import q4t_from_blocks
from checks import check_close, deq, q8a, run_and_check

THREADS = 2
SHAPES = {"smollm2": (576, 1536), "qwen0.5b": (896, 4864), "7b": (4096, 11008)}  # (d_model, d_ff)
DENSITIES = [1.0, 0.5, 0.25, 0.1, 0.05]
_cache: dict = {}


def _mats(shape: str):
    if shape not in _cache:
        d, ff = SHAPES[shape]
        rng = np.random.default_rng(0)
        gate = quants.quantize(rng.standard_normal((ff, d)).astype(np.float32) * 0.05, Q.Q4_1)   # [ff, d]
        down = quants.quantize(rng.standard_normal((d, ff)).astype(np.float32) * 0.05, Q.Q4_1)   # [d, ff]
        down_t = quants.quantize(quants.dequantize(down, Q.Q4_1).reshape(d, ff).T.copy(), Q.Q8_0)  # [ff, d]
        _cache[shape] = (gate, down, q4t_from_blocks(down, "Q4_1", d, ff), down_t)
    return _cache[shape]


def _scores(ff: int, density: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    return ((rng.random((1, ff)) < density) * (1.0 + rng.random((1, ff)))).astype(np.float32)


def _run(benchmark, eng, **info):
    benchmark.extra_info.update(info)
    ids = np.zeros(1, np.int32)
    benchmark(eng.run, 1, ids)


def _x(cols):
    return np.random.default_rng(2).standard_normal((1, cols)).astype(np.float32)


def _input(b, cols):
    tok = b.input("tokens")
    b.graph.input_tokens = tok.id
    return b.get_rows(b.weight("x_table", int(DType.F32), cols, 1, _x(cols)), tok, "x")


def _check(eng, out, want, what):
    run_and_check(eng, 1, out.id, want, what, tokens=np.zeros(1, np.int32))


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("op", ["gate_gemv", "down_gemv"])
def test_dense(benchmark, shape, op):
    d, ff = SHAPES[shape]
    gate, down, _, _ = _mats(shape)
    rows, k, w = (ff, d, gate) if op == "gate_gemv" else (d, ff, down)
    eng, y = single_op_engine(lambda b: b.matmul(b.weight("w", int(DType.Q4_1), k, rows, w), _input(b, k), "y"),
                              max_tokens=1, n_threads=THREADS)
    _check(eng, y, q8a(_x(k)) @ deq(w, Q.Q4_1, rows, k).T, op)
    _run(benchmark, eng, shape=shape, op=op, density=1.0, kind="dense")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("density", DENSITIES)
def test_gather_gemv(benchmark, shape, density):
    d, ff = SHAPES[shape]
    gate, _, _, _ = _mats(shape)
    s = _scores(ff, density)

    def build(b):
        active = b.active_set(b.weight("s", int(DType.F32), ff, 1, s), ff, "active", threshold=0.5)
        return b.matmul(b.weight("w", int(DType.Q4_1), d, ff, gate), _input(b, d), "y", active=active)

    eng, y = single_op_engine(build, max_tokens=1, n_threads=THREADS)
    eng.run(1, np.zeros(1, np.int32))
    rows = np.flatnonzero(s[0] > 0.5)  # the gather writes only the listed rows
    check_close(eng.tensor(y.id, 1)[:, rows], (q8a(_x(d)) @ deq(gate, Q.Q4_1, ff, d).T)[:, rows], "gather_gemv")
    _run(benchmark, eng, shape=shape, op="gather_gemv", density=density, kind="sparse")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("fmt", ["q4t", "q8_0"])
def test_down_axpy(benchmark, shape, density, fmt):
    d, ff = SHAPES[shape]
    _, _, (nibbles, scales), down_t = _mats(shape)
    s = _scores(ff, density)

    def build(b):
        a = b.get_rows(b.weight("a", int(DType.F32), ff, 1, s), _input_ids(b), "a")
        active = b.active_set(a, ff, "active", threshold=0.5)
        if fmt == "q8_0":  # the threshold plans' down at low density, and the input-sparse projections' copy
            return b.down_axpy(b.weight("w", int(DType.Q8_0), d, ff, down_t), a, active)
        return b.down_axpy(b.weight("w", int(DType.Q4T), d, ff, nibbles), a, active,
                           scales=b.weight("sc", int(DType.F16), 2 * d, ff // 32, scales))

    eng, y = single_op_engine(build, max_tokens=1, n_threads=THREADS)
    down = deq(down_t, Q.Q8_0, ff, d) if fmt == "q8_0" else deq(_mats(shape)[1], Q.Q4_1, d, ff).T
    _check(eng, y, np.where(s > 0.5, s, 0) @ down, f"down_axpy_{fmt}")
    _run(benchmark, eng, shape=shape, op=f"down_axpy_{fmt}", density=density, kind="sparse")


def _input_ids(b):
    tok = b.input("tokens")
    b.graph.input_tokens = tok.id
    return tok
