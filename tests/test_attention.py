"""The tiled attention against numpy: lengths across every key-tile boundary, GQA, paged block tables,
sliding windows, the q8_0 cache and split-K decode, for every kernel ISA this CPU can run."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import GraphBuilder

ISAS = _core.available_isas().split(",")
TILE = 64  # kAttnKeyTile


def cache_round(x: np.ndarray, cache: str) -> np.ndarray:
    """What the cache gives back for x: fp16, llama.cpp's Q8_0 blocks, or x itself (f32)."""
    if cache == "q8_0":
        return quants.dequantize(quants.quantize(x, Q.Q8_0), Q.Q8_0).reshape(x.shape)
    if cache == "f32":
        return x.astype(np.float32)
    return x.astype(np.float16).astype(np.float32)


def reference(q, keys, values, seq_rows, positions, heads, kv_heads, hd, window):
    """q: [T, heads*hd]; keys/values: cache rows [n_ctx, kv_heads*hd]; seq_rows[t]: cache row of each key
    position of token t's sequence."""
    group = heads // kv_heads
    out = np.zeros_like(q)
    for t, p in enumerate(positions):
        lo = max(0, p - window + 1) if window else 0
        rows = seq_rows[t][lo:p + 1]
        for h in range(heads):
            g = h // group
            k = keys[rows, g * hd:(g + 1) * hd].astype(np.float64)
            v = values[rows, g * hd:(g + 1) * hd].astype(np.float64)
            s = k @ q[t, h * hd:(h + 1) * hd].astype(np.float64) / np.sqrt(hd)
            w = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (w / w.sum()) @ v
    return out


def run_attention(q, keys, values, positions, heads, kv_heads, hd, *, isa, threads=2, window=0, cache="f16",
                  table=None, block=0):
    """Stores `keys`/`values` as the cache rows 0..n_ctx-1 and runs one attention node over it."""
    n_ctx, width = keys.shape
    T = q.shape[0]
    dt = {"q8_0": DType.Q8_0, "f32": DType.F32}.get(cache, DType.F16)
    b = GraphBuilder()
    rows = np.arange(n_ctx, dtype=np.int32)
    kc, vc = b.state("kc", width, n_ctx, dt), b.state("vc", width, n_ctx, dt)
    all_rows = b.weight("rows", int(DType.I32), 1, n_ctx, rows)
    b.kv_store(kc, b.weight("k", int(DType.F32), width, n_ctx, keys), all_rows)
    b.kv_store(vc, b.weight("v", int(DType.F32), width, n_ctx, values), all_rows)
    pos = b.input("positions")
    b.graph.input_positions = pos.id
    kv_table = None
    if table is not None:
        kv_table = b.input("kv_table", cols=table.shape[1])
        b.graph.input_kv_table = kv_table.id
    qw = b.weight("q", int(DType.F32), heads * hd, T, q)
    out = b.attention(qw, kc, vc, pos, heads, kv_heads, hd, "o", kv_table, block, window=window)
    b.graph.pin(out.id)
    eng = _core.Engine(b.graph, max_tokens=T, max_outputs=1, n_threads=threads, isa=isa)
    kw = {"kv_table": table} if table is not None else {}
    eng.run(T, positions=np.asarray(positions, np.int32), **kw)
    return eng.tensor(out.id, T)


def check(q, keys, values, positions, heads, kv_heads, hd, seq_rows=None, window=0, cache="f16", **kw):
    got = run_attention(q, keys, values, positions, heads, kv_heads, hd, window=window, cache=cache, **kw)
    if seq_rows is None:
        seq_rows = [np.arange(keys.shape[0])] * len(positions)
    want = reference(q, cache_round(keys, cache), cache_round(values, cache), seq_rows, positions, heads, kv_heads,
                     hd, window)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def data(rng, T, n_ctx, heads, kv_heads, hd):
    return (rng.standard_normal((T, heads * hd)).astype(np.float32) * 2,  # peaked softmax, not uniform
            rng.standard_normal((n_ctx, kv_heads * hd)).astype(np.float32),
            rng.standard_normal((n_ctx, kv_heads * hd)).astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 5, TILE - 1, TILE, TILE + 1, 2 * TILE + 3, 300])
@pytest.mark.parametrize("heads,kv_heads,hd", [(6, 2, 64), (4, 4, 32), (4, 1, 256), (3, 3, 24)])
def test_prefill_every_tile_boundary(isa, n, heads, kv_heads, hd):
    rng = np.random.default_rng(n * 7 + hd)
    q, k, v = data(rng, n, n, heads, kv_heads, hd)
    check(q, k, v, np.arange(n), heads, kv_heads, hd, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("depth", [1, TILE, 2 * TILE + 1, 700])
def test_decode_at_depth_splits_the_keys(isa, threads, depth):
    """One query over a long cache: with several threads its keys are split into chunks and merged."""
    rng = np.random.default_rng(depth + threads)
    heads, kv_heads, hd = 6, 2, 64
    q, k, v = data(rng, 1, depth, heads, kv_heads, hd)
    check(q, k, v, [depth - 1], heads, kv_heads, hd, isa=isa, threads=threads)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [1, 7, TILE, 100])
@pytest.mark.parametrize("tokens", ["prefill", "decode"])
def test_sliding_window(isa, window, tokens):
    rng = np.random.default_rng(window)
    heads, kv_heads, hd, n = 4, 1, 32, 260
    positions = np.arange(n) if tokens == "prefill" else [n - 1]
    q, k, v = data(rng, len(positions), n, heads, kv_heads, hd)
    check(q, k, v, positions, heads, kv_heads, hd, window=window, isa=isa, threads=3)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("positions", [np.arange(200), [0], [199], np.arange(150, 200)])
@pytest.mark.parametrize("window", [0, 50])
def test_q8_0_cache(isa, positions, window):
    rng = np.random.default_rng(len(positions))
    heads, kv_heads, hd = 6, 2, 64
    q, k, v = data(rng, len(positions), 200, heads, kv_heads, hd)
    check(q, k, v, positions, heads, kv_heads, hd, cache="q8_0", window=window, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("positions", [np.arange(200), [199], np.arange(150, 200)])
def test_f32_cache(isa, positions):
    """llama.cpp's -ctk f32 -ctv f32: keys and values read back as stored (prefill tiles and decode)."""
    rng = np.random.default_rng(len(positions) + 7)
    heads, kv_heads, hd = 6, 2, 64
    q, k, v = data(rng, len(positions), 200, heads, kv_heads, hd)
    check(q, k, v, positions, heads, kv_heads, hd, cache="f32", window=30, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cache", ["f16", "q8_0", "f32"])
def test_paged_batch_of_sequences(isa, cache):
    """Three sequences in one batch, their blocks scattered over the cache: a prefill chunk, a decode
    step, and a second chunk at depth, each through its own block table."""
    rng = np.random.default_rng(5)
    heads, kv_heads, hd, block, n_blocks = 6, 3, 32, 16, 40
    n_ctx = block * n_blocks
    perm = rng.permutation(n_blocks).astype(np.int32)
    tables = [perm[0:12], perm[12:20], perm[20:40]]
    width = 20
    table_rows, positions, seq_rows = [], [], []
    for seq, toks in [(0, np.arange(0, 90)), (1, [120]), (2, np.arange(250, 300))]:
        blocks = np.zeros(width, np.int32)
        blocks[:len(tables[seq])] = tables[seq]
        phys = (blocks[:, None] * block + np.arange(block)).reshape(-1)
        for p in toks:
            table_rows.append(blocks)
            positions.append(int(p))
            seq_rows.append(phys)
    q, k, v = data(rng, len(positions), n_ctx, heads, kv_heads, hd)
    check(q, k, v, positions, heads, kv_heads, hd, seq_rows=seq_rows, cache=cache, isa=isa,
          table=np.stack(table_rows), block=block)


def _bad_attention(hd: int, window: int, cache: DType):
    b = GraphBuilder()
    kc, vc = b.state("kc", 2 * hd, 8, cache), b.state("vc", 2 * hd, 8, cache)
    pos = b.input("positions")
    b.graph.input_positions = pos.id
    q = b.weight("q", int(DType.F32), 2 * hd, 1, np.zeros((1, 2 * hd), np.float32))
    b.attention(q, kc, vc, pos, 2, 2, hd, "o", window=window)
    _core.Engine(b.graph, max_tokens=1, max_outputs=1, n_threads=1)


def test_bad_attention_parameters_are_refused():
    _bad_attention(64, 0, DType.Q8_0)  # fine
    with pytest.raises(ValueError, match="multiple of 32"):
        _bad_attention(48, 0, DType.Q8_0)
    with pytest.raises(ValueError, match="sliding window"):
        _bad_attention(64, -1, DType.F16)
    _bad_attention(64, 0, DType.F32)  # fine: an fp32 cache
    with pytest.raises(ValueError, match="K cache"):
        _bad_attention(64, 0, DType.BF16)


def test_a_failed_split_step_leaves_the_next_run_correct():
    """A fault on one pool thread in a split-K attention step stops it part-way (some chunks never report);
    the engine's next run must still merge every chunk of every pair."""
    rng = np.random.default_rng(9)
    heads, kv_heads, hd, depth = 6, 2, 64, 700
    q, k, v = data(rng, 1, depth, heads, kv_heads, hd)
    b = GraphBuilder()
    kc, vc = b.state("kc", kv_heads * hd, depth), b.state("vc", kv_heads * hd, depth)
    rows = b.weight("rows", int(DType.I32), 1, depth, np.arange(depth, dtype=np.int32))
    b.kv_store(kc, b.weight("k", int(DType.F32), kv_heads * hd, depth, k), rows)
    b.kv_store(vc, b.weight("v", int(DType.F32), kv_heads * hd, depth, v), rows)
    pos = b.input("positions")
    b.graph.input_positions = pos.id
    out = b.attention(b.weight("q", int(DType.F32), heads * hd, 1, q), kc, vc, pos, heads, kv_heads, hd, "o")
    b.graph.pin(out.id)
    eng = _core.Engine(b.graph, max_tokens=1, max_outputs=1, n_threads=2)
    p = np.array([depth - 1], np.int32)
    want = reference(q, cache_round(k, "f16"), cache_round(v, "f16"), [np.arange(depth)], p, heads, kv_heads, hd, 0)
    attention_node = 2
    for thread in (0, 1):
        eng._inject_fault(attention_node, thread)
        with pytest.raises(RuntimeError, match="injected fault"):
            eng.run(1, positions=p)
        eng._inject_fault(-1, -1)
        for _ in range(3):
            eng.run(1, positions=p)
            np.testing.assert_allclose(eng.tensor(out.id, 1), want, rtol=2e-4, atol=2e-5)


@pytest.mark.filterwarnings("ignore:overflow")
@pytest.mark.parametrize("isa", ISAS)
def test_a_key_a_row_cannot_see_never_reaches_it(isa):
    """An inf value (f16 overflow) at the last position poisons only the token that sees it, not the earlier
    tokens computed in the same block and key tile (groups of 3 heads: kernel row pairs straddle tokens)."""
    rng = np.random.default_rng(11)
    heads, kv_heads, hd, n = 3, 1, 32, 40
    q, k, v = data(rng, n, n, heads, kv_heads, hd)
    v[-1] = 1e6  # beyond fp16: inf in the cache
    got = run_attention(q, k, v, np.arange(n), heads, kv_heads, hd, isa=isa)
    want = reference(q[:-1], cache_round(k, "f16"), cache_round(v, "f16"), [np.arange(n)] * (n - 1),
                     np.arange(n - 1), heads, kv_heads, hd, 0)
    assert np.isfinite(got[:-1]).all()
    np.testing.assert_allclose(got[:-1], want, rtol=2e-4, atol=2e-5)


@pytest.mark.filterwarnings("ignore:overflow")
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [5, 9])
def test_a_key_that_left_the_window_never_reaches_it(isa, window):
    """The window's lower edge: an inf value at position 0 reaches only the tokens whose window still holds
    it. The kernels' register tiles hold rows of two or three tokens, so the rows of one tile disagree about
    key 0; the ones that no longer see it must stay finite and exact."""
    rng = np.random.default_rng(window)
    heads, kv_heads, hd, n = 3, 1, 32, 40
    q, k, v = data(rng, n, n, heads, kv_heads, hd)
    v[0] = 1e6  # beyond fp16: inf in the cache
    got = run_attention(q, k, v, np.arange(n), heads, kv_heads, hd, isa=isa, window=window)
    late = np.arange(window, n)  # tokens whose window starts after position 0
    want = reference(q[late], cache_round(k, "f16"), cache_round(v, "f16"), [np.arange(n)] * len(late), late,
                     heads, kv_heads, hd, window)
    assert np.isfinite(got[late]).all()
    np.testing.assert_allclose(got[late], want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,kv_heads,hd", [(9, 3, 64), (4, 1, 256), (4, 2, 24), (4, 4, 48)])
@pytest.mark.parametrize("window", [0, 6, 40])
def test_a_token_gets_the_same_numbers_in_a_batch_of_any_size(isa, heads, kv_heads, hd, window):
    """Bit for bit: a prompt's tokens attended all at once (prefill's matrix-product tile), in chunks, or one at a
    time (decode's key-lane tile) give the same output, so greedy text never depends on how a server batched
    it. Below split-K decode's depth (256 keys), whose merge of key chunks rounds on its own."""
    rng = np.random.default_rng(hd + window)
    n = 150
    q, k, v = data(rng, n, n, heads, kv_heads, hd)
    whole = run_attention(q, k, v, np.arange(n), heads, kv_heads, hd, isa=isa, window=window)
    one = np.stack([run_attention(q[t:t + 1], k, v, [t], heads, kv_heads, hd, isa=isa, window=window)[0]
                    for t in range(0, n, 7)])
    np.testing.assert_array_equal(one, whole[::7])
    for a, b in [(0, 5), (5, 50), (50, 121), (121, n)]:
        part = run_attention(q[a:b], k, v, np.arange(a, b), heads, kv_heads, hd, isa=isa, window=window)
        np.testing.assert_array_equal(part, whole[a:b])
