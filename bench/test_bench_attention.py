"""pytest-benchmark entries for the tiled attention at SmolLM2's shape (9 query heads, 3 KV heads, head size
64), per kernel ISA and cache type: a 512-token prefill chunk at depth (the last chunk of a long prompt) and
one decode step at depth. Each is checked once against numpy before timing.

  pytest bench/test_bench_attention.py --benchmark-json bench/results/kernels/attention_kernels.json
  python bench/kernels_table.py bench/results/kernels/attention_kernels.json > bench/results/kernels/attention_kernels.md"""
import numpy as np
import pytest
from checks import check_close
from test_attention import cache_round, reference

from pyinfer import _core
from pyinfer._core import DType, RunIf
from pyinfer.runtime.graph_builder import GraphBuilder

ISAS = _core.available_isas().split(",")
THREADS = 2
HEADS, KV_HEADS, HD = 9, 3, 64
CACHES = {"f16": DType.F16, "q8_0": DType.Q8_0}


def _engine(depth: int, positions: np.ndarray, cache: str, isa: str):
    """A cache of `depth` rows and an attention node for queries at `positions`. The cache is written by a
    first run of another token count (the stores are guarded to it), so timed runs only attend."""
    rng = np.random.default_rng(depth)
    width, T = KV_HEADS * HD, len(positions)
    k = rng.standard_normal((depth, width)).astype(np.float32)
    v = rng.standard_normal((depth, width)).astype(np.float32)
    q = rng.standard_normal((max(T, 2), HEADS * HD)).astype(np.float32)
    fill_if = RunIf.MULTI_TOKEN if T == 1 else RunIf.SINGLE_TOKEN
    b = GraphBuilder()
    kc, vc = b.state("kc", width, depth, CACHES[cache]), b.state("vc", width, depth, CACHES[cache])
    rows = b.weight("rows", int(DType.I32), 1, depth, np.arange(depth, dtype=np.int32))
    b.kv_store(kc, b.weight("k", int(DType.F32), width, depth, k), rows, run_if=fill_if)
    b.kv_store(vc, b.weight("v", int(DType.F32), width, depth, v), rows, run_if=fill_if)
    pos = b.input("positions")
    b.graph.input_positions = pos.id
    out = b.attention(b.weight("q", int(DType.F32), HEADS * HD, len(q), q), kc, vc, pos, HEADS, KV_HEADS, HD, "o")
    b.graph.pin(out.id)
    eng = _core.Engine(b.graph, max_tokens=max(T, 2), max_outputs=1, n_threads=THREADS, isa=isa)
    fill = 2 if T == 1 else 1
    eng.run(fill, positions=np.arange(depth - fill, depth, dtype=np.int32))
    eng.run(T, positions=positions)
    want = reference(q[:T], cache_round(k, cache), cache_round(v, cache), [np.arange(depth)] * T, positions, HEADS,
                     KV_HEADS, HD, 0)
    check_close(eng.tensor(out.id, T), want, f"attention {cache} depth {depth}", 1e-3)
    return eng, T


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("depth", [2048, 8192])
def test_prefill_chunk_at_depth(benchmark, isa, cache, depth):
    if isa == "scalar" and depth > 2048:
        pytest.skip("scalar at 8192: minutes, and the ratio is the one at 2048")
    positions = np.arange(depth - 512, depth, dtype=np.int32)
    eng, T = _engine(depth, positions, cache, isa)
    benchmark.extra_info.update(tokens=T, depth=depth)
    benchmark.pedantic(eng.run, args=(T,), kwargs={"positions": positions}, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("depth", [512, 2048, 8192])
def test_decode_at_depth(benchmark, isa, cache, depth):
    positions = np.array([depth - 1], np.int32)
    eng, _ = _engine(depth, positions, cache, isa)
    benchmark.extra_info.update(tokens=1, depth=depth)
    benchmark(eng.run, 1, positions=positions)
