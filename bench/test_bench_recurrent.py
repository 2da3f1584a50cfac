"""pytest-benchmark entries for Qwen3.5's recurrent ops at the 9B shape (16 key heads read by 32 value heads of
128, conv over 8,192 channels of 4 taps): 256 tokens as one sequence's prompt (the conv over the run's own rows,
the delta rule in chunks of 64) against the same 256 tokens as two interleaved sequences (every run one token: the
state-reading conv and the token loop), the same work in both. Each is checked once against the float64
reference before timing.

  pytest bench/test_bench_recurrent.py --benchmark-json bench/results/kernels/recurrent_prompt.json
  python bench/kernels_table.py bench/results/kernels/recurrent_prompt.json --axis layout --base interleaved \\
      > bench/results/kernels/recurrent_prompt.md"""
import numpy as np
import pytest
from checks import check_close
from support.reference_recurrent import delta_net as delta_ref
from support.reference_recurrent import ssm_conv as conv_ref

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import GraphBuilder

THREADS = 2
TOKENS = 256
K_HEADS, V_HEADS, S, TAPS, EPS = 16, 32, 128, 4, 1e-6
CHANNELS = (2 * K_HEADS + V_HEADS) * S


def _layout(layout: str):
    """Positions, state rows and each sequence's token indices: one prompt, or two sequences token by token."""
    if layout == "prompt":
        return np.arange(TOKENS), np.zeros(TOKENS, int), [np.arange(TOKENS)]
    seq = np.arange(TOKENS) % 2
    return np.arange(TOKENS) // 2, seq, [np.flatnonzero(seq == s) for s in (0, 1)]


def _run(build, layout: str):
    pos, rows, seqs = _layout(layout)
    b = GraphBuilder()
    P = b.weight("p", int(DType.I32), 1, TOKENS, pos.astype(np.int32)[:, None])
    R = b.weight("r", int(DType.I32), 1, TOKENS, rows.astype(np.int32)[:, None])
    out, want = build(b, P, R, seqs)
    b.graph.pin(out.id)
    eng = _core.Engine(b.graph, max_tokens=TOKENS, max_outputs=1, n_threads=THREADS)
    eng.run(TOKENS)
    return eng, np.array(eng.tensor(out.id, TOKENS)), want


def _delta(b, P, R, seqs):
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((TOKENS, CHANNELS)).astype(np.float32)
    beta, alpha = (rng.standard_normal((TOKENS, V_HEADS)).astype(np.float32) for _ in range(2))
    decay = np.stack([rng.standard_normal(V_HEADS), -np.exp(rng.standard_normal(V_HEADS))]).astype(np.float32)
    f32 = int(DType.F32)
    o = b.delta_net(b.weight("qkv", f32, CHANNELS, TOKENS, qkv), b.weight("beta", f32, V_HEADS, TOKENS, beta),
                    b.weight("alpha", f32, V_HEADS, TOKENS, alpha), b.weight("decay", f32, V_HEADS, 2, decay),
                    b.state("s", V_HEADS * S * S, 2, DType.F32), P, K_HEADS, V_HEADS, S, EPS, "o", rows=R)
    want = np.zeros((TOKENS, V_HEADS * S))
    for idx in seqs:
        want[idx] = delta_ref(qkv[idx], beta[idx], alpha[idx], decay[0], decay[1], K_HEADS, V_HEADS, S, EPS)
    return o, want


def _conv(b, P, R, seqs):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((TOKENS, CHANNELS)).astype(np.float32)
    w = (rng.standard_normal((CHANNELS, TAPS)) * 0.5).astype(np.float32)
    f32 = int(DType.F32)
    y = b.ssm_conv(b.weight("x", f32, CHANNELS, TOKENS, x), b.weight("w", f32, TAPS, CHANNELS, w),
                   b.state("conv", CHANNELS * (TAPS - 1), 2, DType.F32), P, "y", rows=R)
    want = np.zeros((TOKENS, CHANNELS))
    for idx in seqs:
        want[idx] = conv_ref(x[idx], w)
    return y, want


@pytest.mark.parametrize("layout", ["prompt", "interleaved"])
@pytest.mark.parametrize("op", ["delta_net", "ssm_conv"])
def test_recurrent(benchmark, op, layout):
    eng, got, want = _run(_delta if op == "delta_net" else _conv, layout)
    check_close(got, want, f"{op} {layout}", rel=1e-4)  # checked once before timing
    benchmark(eng.run, TOKENS)
