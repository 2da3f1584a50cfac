"""pytest-benchmark entries for the batched sparse FFN (one run of B decoding tokens) against the dense
FFN of the same batch, to find the break-even that `SparseRuns` uses to fall back to dense.

  pytest bench/test_bench_batch_union.py --benchmark-json bench/results/kernels/batch_union.json
  python bench/batch_union_table.py bench/results/kernels/batch_union.json

Two layer kinds, each at the real model's FFN shape and at LLaMA-7B's (synthetic Q4_1 weights):
  - "predicted" (ReLU-family models): gate/up rows of the batch's union of active neurons for every
    token, each token's gated activation, each token's down rows (Q8_0 under 20% density, else Q4T);
    against gate and up GEMMs, the activation, and the down GEMM.
  - "threshold" (SwiGLU at calibrated thresholds): gate/up are dense either way, so only down differs:
    the per-token down rows (Q4T) against the un-permuting copy and the down GEMM.
Active neurons: token t fires neuron j with probability p_j, a power law (p_j ~ 1/(j+10)) scaled to
the mean density, independently per token, so the union grows with B as it does in real batches;
the measured mean and union densities are stored with each entry."""
import numpy as np
import pytest

from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from pyinfer.runtime.sparse_ffn import Q4T_MIN_DENSITY
from checks import deq, q8a, run_and_check, silu
from gguf import GGMLQuantizationType as Q
from test_bench_sparse import SHAPES, _mats  # the same synthetic matrices (same seeds)

THREADS = 2
BATCHES = [1, 2, 4, 8, 16]
DENSITIES = [0.05, 0.1, 0.2, 0.4, 0.6]


def firing(ff: int, density: float, n_tok: int) -> np.ndarray:
    """F32 [n_tok, ff]: > 0.5 where a token fires a neuron (power-law probabilities, mean `density`)."""
    p = 1.0 / (np.arange(ff) + 10.0)
    lo, hi = 0.0, 1e6
    for _ in range(60):  # scale so the capped probabilities average to `density`
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.minimum(p * mid, 1.0).mean() < density else (lo, mid)
    p = np.minimum(p * lo, 1.0)
    rng = np.random.default_rng(3)
    fires = rng.random((n_tok, ff)) < p
    return (fires * (1.0 + rng.random((n_tok, ff)))).astype(np.float32)


def _x(n, d):
    return np.random.default_rng(2).standard_normal((n, d)).astype(np.float32)


def _reference(shape, kind, scores, fires=None):
    """F32 [T, d]: the FFN output; with `fires`, each token's down over its own firing neurons only."""
    d, ff = SHAPES[shape]
    gate, down, _, _ = _mats(shape)
    act = scores
    if kind == "predicted":
        g = q8a(_x(len(scores), d)) @ deq(gate, Q.Q4_1, ff, d).T  # up uses the same synthetic matrix
        act = silu(g) * g
    if fires is not None:
        act = np.where(fires, act, 0)
    return act @ deq(down, Q.Q4_1, d, ff).T


def _check(eng, out, n_tok, want, what):
    run_and_check(eng, n_tok, out.id, want, what, rel=4e-2, tokens=np.arange(n_tok, dtype=np.int32))


def _inputs(b, d, ff, scores):
    """x F32 [T, d] and the scores F32 [T, ff] of tokens 0..T-1 (token ids select rows)."""
    tok = b.input("tokens")
    b.graph.input_tokens = tok.id
    n = scores.shape[0]
    x = _x(n, d)
    return (b.get_rows(b.weight("x_table", int(DType.F32), d, n, x), tok, "x"),
            b.get_rows(b.weight("s_table", int(DType.F32), ff, n, scores), tok, "s"))


def _run(benchmark, eng, **info):
    benchmark.extra_info.update(info)
    ids = np.arange(info["n_tok"], dtype=np.int32)
    benchmark(eng.run, info["n_tok"], ids)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["predicted", "threshold"])
@pytest.mark.parametrize("n_tok", BATCHES)
def test_dense_ffn(benchmark, shape, kind, n_tok):
    d, ff = SHAPES[shape]
    gate, down, _, _ = _mats(shape)
    scores = firing(ff, 0.5, n_tok)

    def build(b):
        x, s = _inputs(b, d, ff, scores)
        if kind == "predicted":
            g = b.matmul(b.weight("g", int(DType.Q4_1), d, ff, gate), x, "gate")
            u = b.matmul(b.weight("u", int(DType.Q4_1), d, ff, gate), x, "up")
            b.gated_mul(g, u, out=g)
        else:  # gate/up are the same on both paths: only the un-permuting copy and the down GEMM
            g = b.scatter_cols(s, b.weight("perm", int(DType.I32), ff, 1, np.arange(ff, dtype=np.int32)), "act")
        return b.matmul(b.weight("down", int(DType.Q4_1), ff, d, down), g, "y")

    eng, y = single_op_engine(build, max_tokens=16, n_threads=THREADS)
    _check(eng, y, n_tok, _reference(shape, kind, scores), f"dense ffn {kind}")
    _run(benchmark, eng, shape=shape, kind=kind, n_tok=n_tok, path="dense", density=1.0, union=1.0)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("kind", ["predicted", "threshold"])
@pytest.mark.parametrize("n_tok", BATCHES)
@pytest.mark.parametrize("density", DENSITIES)
def test_union_ffn(benchmark, shape, kind, n_tok, density):
    d, ff = SHAPES[shape]
    gate, _, (nibbles, scales), down_q8 = _mats(shape)
    scores = firing(ff, density, n_tok)
    fires = scores > 0.5
    q8 = kind == "predicted" and density < Q4T_MIN_DENSITY

    def build(b):
        x, s = _inputs(b, d, ff, scores)
        lists = b.active_set(s, ff, "active", threshold=0.5)
        union = b.active_union(lists, ff, "union", 16)
        act = s
        if kind == "predicted":
            act = b.matmul(b.weight("g", int(DType.Q4_1), d, ff, gate), x, "gate", active=union)
            u = b.matmul(b.weight("u", int(DType.Q4_1), d, ff, gate), x, "up", active=union)
            b.gated_act(act, u, lists, 0.0)
        if q8:
            return b.down_axpy(b.weight("w", int(DType.Q8_0), d, ff, down_q8), act, lists, union=union)
        return b.down_axpy(b.weight("w", int(DType.Q4T), d, ff, nibbles), act, lists, union=union,
                           scales=b.weight("sc", int(DType.F16), 2 * d, ff // 32, scales))

    eng, y = single_op_engine(build, max_tokens=16, n_threads=THREADS)
    _check(eng, y, n_tok, _reference(shape, kind, scores, fires), f"union ffn {kind}")
    _run(benchmark, eng, shape=shape, kind=kind, n_tok=n_tok, path="union", density=float(fires.mean()),
         union=float(fires.any(axis=0).mean()), target_density=density, down="q8_0" if q8 else "q4t")
