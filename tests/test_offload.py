"""Offload under a RAM budget: exactness against the in-RAM run of the same plan, the neuron store, the
resident-set program, and bad input (budgets, stale or broken bundle files, I/O errors, a full disk)."""
import errno
import itertools
import os

import numpy as np
import pytest
from support.plans import TOKENS, all_active_plan, decode_logits, varying_predictor_plan  # noqa: F401
from support.tiny_model import TINY

import pyinfer
from pyinfer import _core
from pyinfer.errors import PyinferError
from pyinfer.offload import bundles as bundles_mod
from pyinfer.offload.bundles import open_or_write, plan_id
from pyinfer.offload.offloaded_ffn import minimum_budget, parse_size
from pyinfer.offload.resident import greedy_resident, solve_resident
from pyinfer.runtime.sparse_ffn import ffn_arrays, pick_neuron_down

FF, L = TINY["d_ff"], TINY["n_layers"]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    return tmp_path


def threshold_plan(fp, seed=1):
    """Threshold only (gate and up dense, down over the active rows) with a random neuron order."""
    plan = all_active_plan(fp, seed=seed, threshold=0.02)
    for lp in plan.layers:
        lp.predictor, lp.hot = None, 0
    return plan


def budgets(model, plan, down="auto", window_share=0.0):
    from pyinfer.model.pull import cache_dir

    layout = open_or_write(cache_dir(), model.gguf, model.config, plan, pick_neuron_down(plan, down), progress=False)
    low = minimum_budget(model.gguf, plan, layout, window_share=window_share)
    ffn = sum(e["n_ff"] * e["bundle_bytes"] for e in layout.layers)
    return [low, low + ffn // 3, low + ffn]


def greedy_tokens(model, n=12):
    return model.generate(TOKENS[:4], max_tokens=n, temperature=0)


@pytest.mark.parametrize("kind,down", [("threshold", "q4t"), ("threshold", "q8_0"), ("predictor", "q4t"),
                                       ("predictor", "q8_0")])
def test_offloaded_runs_equal_in_ram_bit_for_bit(tiny_model_path, cache, kind, down):
    ram = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    fp = ram.gguf.fingerprint()
    plan = threshold_plan(fp) if kind == "threshold" else all_active_plan(fp, seed=2)
    ram = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down)
    want_decode, want_prefill, want_tokens = (decode_logits(ram, TOKENS), ram.eval(TOKENS, all_logits=True),
                                              greedy_tokens(ram))
    for budget in budgets(ram, plan, down):
        off = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down,
                           ram_budget=budget, progress=False)
        assert np.array_equal(decode_logits(off, TOKENS), want_decode)
        off.offload.store.reset_stats()
        assert np.array_equal(off.eval(TOKENS, all_logits=True), want_prefill)
        assert off.offload.stats()["dense_bytes_read"] > 0  # prefill read down from the bundle file
        assert greedy_tokens(off) == want_tokens
        st = off.offload.stats()
        streamed = off.offload.plan.streamed_bytes
        assert (st["bytes_read"] > 0) == (streamed > 0)


@pytest.mark.parametrize("down", ["q4t", "q8_0"])
def test_selective_reads_fetch_each_listed_row(tiny_model_path, cache, down):
    """Predictor layers read only the union's cold rows, on demand: the tokens still equal the in-RAM run's,
    and fewer neurons are read than whole tails hold."""
    ram = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(ram.gguf.fingerprint())
    ram = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down)
    want = decode_logits(ram, TOKENS)
    low = budgets(ram, plan, down)[0]
    off = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down, ram_budget=low,
                       progress=False)
    off.offload.store.reset_stats()
    assert np.array_equal(decode_logits(off, TOKENS), want)
    st = off.offload.stats()
    assert st["listed_neurons"] > 0 and st["listed_reads"] > 0
    cold = sum(e["n_ff"] - k for e, k in zip(off.offload.layout.layers, off.offload.plan.resident))
    assert st["listed_neurons"] < len(TOKENS) * cold  # (bytes: the tiny model's tails are a few pages anyway)
    assert greedy_tokens(off) == greedy_tokens(ram)
    # A neuron cache in part of a larger budget: still the same logits, and later tokens find rows in it.
    cached = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down,
                          ram_budget=budgets(ram, plan, down)[1], neuron_cache=0.5, progress=False)
    assert cached.offload.plan.cache_bytes > 0
    assert np.array_equal(decode_logits(cached, TOKENS), want)
    assert cached.offload.stats()["cache_hits"] > 0
    # A read-ahead window: the same logits again, and listed rows found in it.
    ahead = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down=down,
                         ram_budget=budgets(ram, plan, down, 0.25)[1], neuron_window=0.25, progress=False)
    assert sum(ahead.offload.plan.window) > 0
    assert np.array_equal(decode_logits(ahead, TOKENS), want)
    assert ahead.offload.stats()["window_hits"] > 0


def test_store_serves_each_row_in_any_fetch_order(tiny_model_path, cache):
    model = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = all_active_plan(model.gguf.fingerprint(), seed=4)
    layout = open_or_write(cache, model.gguf, model.config, plan, "q4t", progress=False)
    arrays = [ffn_arrays(model.gguf, model.config, plan, il, "q4t") for il in range(L)]
    picks = {0: np.array([0, 5, 31, 32, 33, 70, FF - 1]), 1: np.array([1, 40, 41, 42, 90])}
    for ring, resident, selective in itertools.product((1, 2, 3), ([0, 0], [32, 64], [FF, 40]), (False, True)):
        layers = [{"n_ff": e["n_ff"], "resident": resident[il], "file_offset": e["file_offset"],
                   "bundle_bytes": e["bundle_bytes"], "part_offsets": e["part_offsets"], "selective": selective,
                   "down_rows": plan.layers[il].perm.tolist()} for il, e in enumerate(layout.layers)]
        store = _core.NeuronStore(str(layout.path), layers, ring_slots=ring)
        for step, il in enumerate((1, 0, 0, 1, 1, 0)):
            listed = selective and step % 2 == 0
            store.fetch(il, picks[il] if listed else None)
            fa = arrays[il]
            for k in (picks[il] if listed else (0, 31, 32, FF - 1)):
                assert store.row(il, 0, k, fa.gate.shape[1]) == fa.gate[k].tobytes()
                assert store.row(il, 1, k, fa.up.shape[1]) == fa.up[k].tobytes()
                # Q4T down keeps the original neuron order: hot-first neuron k is row perm[k]
                assert store.row(il, 2, plan.layers[il].perm[k], fa.down.shape[1]) == \
                    fa.down[plan.layers[il].perm[k]].tobytes()
        cold = sum(1 for il in range(L) if resident[il] < FF)
        assert (store.stats()["bytes_read"] > 0) == (cold > 0)


def test_neuron_cache_keeps_recent_cold_rows_and_evicts_the_least_recent(tiny_model_path, cache):
    model = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = all_active_plan(model.gguf.fingerprint(), seed=4)
    layout = open_or_write(cache, model.gguf, model.config, plan, "q8_0", progress=False)
    arrays = [ffn_arrays(model.gguf, model.config, plan, il, "q8_0") for il in range(L)]
    layers = [{"n_ff": e["n_ff"], "resident": 8, "file_offset": e["file_offset"], "bundle_bytes": e["bundle_bytes"],
               "part_offsets": e["part_offsets"], "selective": True} for e in layout.layers]
    slot = max(e["bundle_bytes"] for e in layout.layers)
    store = _core.NeuronStore(str(layout.path), layers, cache_bytes=3 * slot)
    assert store.stats()["cache_bytes"] == 3 * slot

    def fetch(il, ids):
        before = store.stats()
        store.fetch(il, np.array(ids, np.int32))
        fa = arrays[il]
        for k in ids:  # wherever a row comes from (resident, cache, this read), its bytes are the file's
            assert store.row(il, 0, k, fa.gate.shape[1]) == fa.gate[k].tobytes()
            assert store.row(il, 1, k, fa.up.shape[1]) == fa.up[k].tobytes()
            assert store.row(il, 2, k, fa.down.shape[1]) == fa.down[k].tobytes()
        after = store.stats()
        return {k: after[k] - before[k] for k in ("cache_hits", "cache_evictions", "listed_neurons", "listed_hits")}

    assert fetch(0, [2, 20, 21, 22]) == {"cache_hits": 0, "cache_evictions": 0, "listed_neurons": 3, "listed_hits": 1}
    # LRU order now 22, 21, 20: 21 is a hit (and most recent), 23 is read and evicts 20.
    assert fetch(0, [21, 23]) == {"cache_hits": 1, "cache_evictions": 1, "listed_neurons": 1, "listed_hits": 0}
    assert fetch(0, [20]) == {"cache_hits": 0, "cache_evictions": 1, "listed_neurons": 1, "listed_hits": 0}  # 22 out
    assert fetch(0, [20, 21, 23])["cache_hits"] == 3
    # Another layer shares the cache; a union larger than the cache reads every row and keeps what fits.
    assert fetch(1, list(range(30, 40)))["listed_neurons"] == 10
    assert fetch(1, list(range(30, 40)))["cache_hits"] == 3
    assert fetch(0, [20, 21, 23])["cache_hits"] == 0


@pytest.mark.parametrize("io_uring", [True, False])
def test_listed_reads_through_each_io_engine_and_their_errors(tiny_model_path, cache, io_uring):
    """Selective reads go through io_uring where the kernel allows it, else pread threads: the same rows either
    way, and a file cut short under the open store is an exception until it is whole again."""
    model = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = all_active_plan(model.gguf.fingerprint(), seed=4)
    layout = open_or_write(cache, model.gguf, model.config, plan, "q8_0", progress=False)
    arrays = [ffn_arrays(model.gguf, model.config, plan, il, "q8_0") for il in range(L)]
    layers = [{"n_ff": e["n_ff"], "resident": 4, "file_offset": e["file_offset"], "bundle_bytes": e["bundle_bytes"],
               "part_offsets": e["part_offsets"], "selective": True, "dense_offset": e["dense_offset"],
               "dense_rows": e["dense_rows"], "dense_row_bytes": e["dense_row_bytes"]} for e in layout.layers]
    store = _core.NeuronStore(str(layout.path), layers, io_threads=3, io_uring=io_uring)
    engine = store.stats()["io_engine"]
    assert engine == "pread" if not io_uring else engine in ("io_uring", "pread")

    def fetch_and_check(il, ids):
        store.fetch(il, None if ids is None else np.array(ids, np.int32))
        for k in (range(FF) if ids is None else ids):
            assert store.row(il, 0, k, arrays[il].gate.shape[1]) == arrays[il].gate[k].tobytes()
            assert store.row(il, 2, k, arrays[il].down.shape[1]) == arrays[il].down[k].tobytes()

    for il, ids in ((0, [5, 6, 7, 40, 90, FF - 1]), (1, None), (1, list(range(4, FF, 3)))):
        fetch_and_check(il, ids)
    for il in range(L):  # a dense run's original down: the model's bytes, read whole
        store.fetch_dense(il)
        down = np.asarray(model.gguf.tensor(f"blk.{il}.ffn_down.weight").data).view(np.uint8).reshape(TINY["d_model"], -1)
        for r in (0, 7, TINY["d_model"] - 1):
            assert store.row(il, 3, r, down.shape[1]) == down[r].tobytes()
    assert store.stats()["dense_bytes_read"] >= L * down.nbytes
    good = layout.path.read_bytes()
    os.truncate(layout.path, HEAD + 4096)
    for ids in ([FF - 2, FF - 1], None):
        with pytest.raises(RuntimeError, match="shorter than its layout"):
            store.fetch(1, None if ids is None else np.array(ids, np.int32))
    layout.path.write_bytes(good)
    fetch_and_check(1, [FF - 2, FF - 1])
    store.reset_stats()
    assert store.stats()["io_engine"] == engine


@pytest.mark.parametrize("io_uring,max_range", [(True, 256 << 10), (False, 256 << 10), (True, 64 << 10)])
def test_listed_reads_cut_inside_a_bundle_stay_within_the_tail(tmp_path, io_uring, max_range):
    """Bundles that straddle pages, a union dense enough that the merged reads reach their 256 KiB cap many
    times: a cut inside a bundle's page must not read that page twice (the demand buffer holds one tail), and
    every row must still come back whole."""
    n_ff, bundle = 3000, 1000  # a 2.9 MB tail; 1000-byte bundles cross page boundaries
    raw = np.random.default_rng(3).integers(0, 256, n_ff * bundle + 8192, dtype=np.uint8)
    path = tmp_path / "raw.bundles"
    path.write_bytes(raw.tobytes())
    layer = {"n_ff": n_ff, "resident": 0, "file_offset": 0, "bundle_bytes": bundle, "part_offsets": [0, 300, 600],
             "selective": True}
    store = _core.NeuronStore(str(path), [layer], io_threads=2, io_uring=io_uring, max_range=max_range)
    for ids in (np.arange(0, n_ff, 2), np.arange(1, n_ff), np.arange(5, n_ff, 7)):
        store.fetch(0, ids.astype(np.int32))
        for k in ids[::37]:
            assert store.row(0, 0, int(k), 300) == raw[k * bundle:k * bundle + 300].tobytes()
            assert store.row(0, 2, int(k), 400) == raw[k * bundle + 600:(k + 1) * bundle].tobytes()
        assert store.stats()["bytes_read"] > 0


@pytest.mark.parametrize("cache_bytes", [0, 64 * 1000])
def test_selective_read_ahead_window_serves_the_likeliest_cold_rows(tmp_path, cache_bytes):
    """A selective layer's first `window` cold bundles are read ahead by the reader thread (in layer order, as
    streamed tails are); listed neurons inside it are served from there, the rest are read on demand."""
    n_ff, bundle, layers = 3000, 1000, 3
    raw = np.random.default_rng(4).integers(0, 256, layers * 3_002_368, dtype=np.uint8)
    path = tmp_path / "raw.bundles"
    path.write_bytes(raw.tobytes())
    spec = [{"n_ff": n_ff, "resident": 10, "file_offset": il * 3_002_368, "bundle_bytes": bundle,
             "part_offsets": [0, 300, 600], "selective": True, "window": 500} for il in range(layers)]
    store = _core.NeuronStore(str(path), spec, ring_slots=2, cache_bytes=cache_bytes)

    def fetch(il, ids):
        before = store.stats()
        store.fetch(il, np.array(ids, np.int32))
        for k in ids:
            at = il * 3_002_368 + k * bundle
            assert store.row(il, 1, k, 300) == raw[at + 300:at + 600].tobytes()
        store.release(il)
        after = store.stats()
        return tuple(after[k] - before[k] for k in ("window_hits", "listed_neurons", "cache_hits"))

    for il in (0, 1, 2, 0, 2, 1, 1):  # in layer order, and out of it (the read-ahead restarts)
        window, read, cached = fetch(il, [5, 20, 509, 510, 1000, 2999])
        assert window == 2 and read + cached == 3  # 5 resident; 20, 509 read ahead; the rest read or cached


def test_store_refuses_bad_layouts(tmp_path):
    path = tmp_path / "b.bundles"
    path.write_bytes(b"\0" * 8192)
    good = {"n_ff": 4, "resident": 0, "file_offset": 4096, "bundle_bytes": 64, "part_offsets": [0, 16, 32]}
    for bad in ({"resident": 5}, {"file_offset": 100}, {"part_offsets": [0, 16, 64]}, {"down_rows": [0, 0, 1, 2]},
                {"bundle_bytes": 0}):
        with pytest.raises(ValueError):
            _core.NeuronStore(str(path), [dict(good, **bad)])
    with pytest.raises(RuntimeError, match="cannot open"):
        _core.NeuronStore(str(tmp_path / "missing"), [good])
    with pytest.raises(RuntimeError, match="shorter"):  # the resident prefix lies past the end
        _core.NeuronStore(str(path), [dict(good, resident=4, file_offset=8192)])


# ---- the resident-set program ----------------------------------------------------------------------
def brute_force(n_ff, bundle, capacity, group, values, bonus):
    sizes = [[group] * (n // group) + ([n % group] if n % group else []) for n in n_ff]
    best = (-1.0, None)
    for kept in itertools.product(*[range(len(s) + 1) for s in sizes]):
        cost = sum(sum(s[:k]) * b for s, k, b in zip(sizes, kept, bundle))
        if cost > capacity:
            continue
        v = 0.0
        for l, k in enumerate(kept):
            v += float(values[l][:sum(sizes[l][:k])].sum()) + (bonus if k == len(sizes[l]) else 0.0)
        best = max(best, (v, kept), key=lambda e: e[0])
    return best[0]


@pytest.mark.parametrize("seed", range(6))
def test_program_is_optimal_and_within_budget(seed):
    rng = np.random.default_rng(seed)
    n_ff = [int(x) for x in rng.integers(40, 130, size=3)]
    bundle = [int(x) for x in rng.integers(10, 60, size=3)]
    values = [np.sort(rng.random(n))[::-1] * b for n, b in zip(n_ff, bundle)]  # hot-first
    capacity = int(rng.integers(0, sum(n * b for n, b in zip(n_ff, bundle))))
    bonus = float(rng.choice([0.0, 500.0]))
    c = solve_resident(n_ff, bundle, capacity, group=32, value_per_neuron=values, layer_bonus=bonus)
    assert c.solver == "highs" and c.bytes <= capacity
    assert c.value == pytest.approx(brute_force(n_ff, bundle, capacity, 32, values, bonus), rel=1e-6)
    g = greedy_resident(n_ff, bundle, capacity, group=32, value_per_neuron=values)
    assert g.bytes <= capacity and g.value <= c.value + 1e-6


def test_keeping_a_layer_whole_changes_the_answer():
    """Two layers of 64 neurons x 10 bytes, room for 64 neurons: without the request bonus the program may
    split (equal value), with it it keeps one layer whole; the greedy fill never sees the bonus."""
    c = solve_resident([64, 64], [10, 10], 640, group=32, layer_bonus=100.0)
    assert sorted(c.counts) == [0, 64]
    assert c.value == pytest.approx(640 + 100)


def test_program_falls_back_to_greedy_without_highs(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_highs(name, *a, **k):
        if name == "highspy":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_highs)
    c = solve_resident([64, 64], [10, 10], 700)
    assert c.solver == "greedy" and "highspy" in c.info["fallback"] and c.bytes <= 700


# ---- bad input --------------------------------------------------------------------------------------
def test_sizes():
    assert parse_size("80M") == 80 << 20 and parse_size("1.5G") == 3 << 29 and parse_size("2GB") == 2 * 10 ** 9
    assert parse_size(4096) == 4096
    for bad in ("", "12 parsecs", "-3M", "0"):
        with pytest.raises(PyinferError):
            parse_size(bad)


def test_budget_below_the_minimum_names_it(tiny_model_path, cache):
    ram = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = threshold_plan(ram.gguf.fingerprint())
    low = budgets(ram, plan)[0]
    with pytest.raises(PyinferError, match=r"below the minimum of [0-9.]+ MiB"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=plan, ram_budget=low - 1, progress=False)
    with pytest.raises(PyinferError, match="needs a sparsity plan"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, ram_budget="1G")


def test_a_stale_or_foreign_bundle_file_is_rebuilt(tiny_model_path, cache):
    ram = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = threshold_plan(ram.gguf.fingerprint())
    low = budgets(ram, plan)[0]
    path = bundles_mod.bundle_path(cache, ram.gguf, plan_id(plan, pick_neuron_down(plan, "auto")))
    good = path.read_bytes()
    want = decode_logits(pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=plan), TOKENS)
    for damage in (lambda b: b[:len(b) // 2],                                             # truncated
                   lambda b: b.replace(ram.gguf.fingerprint()[:16].encode(), b"0" * 16),  # another model's
                   lambda b: b"junk" + b[4:]):                                            # not a bundle file
        path.write_bytes(damage(good))
        off = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=plan, ram_budget=low, progress=False)
        assert path.read_bytes() == good
        assert np.array_equal(decode_logits(off, TOKENS), want)


HEAD = bundles_mod.HEADER_BYTES


def test_an_io_error_is_an_exception_not_a_crash(tiny_model_path, cache):
    ram = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = threshold_plan(ram.gguf.fingerprint())
    low = budgets(ram, plan)[0]
    off = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, ram_budget=low, progress=False)
    path = off.offload.layout.path
    want = decode_logits(off, TOKENS)
    good = path.read_bytes()
    os.truncate(path, HEAD + 4096)  # the cold tails are gone from under the open store
    with pytest.raises(RuntimeError, match="shorter than its layout"):
        for _ in range(3):  # the tails already read ahead are still served; the next reads fail
            off.eval(TOKENS[:3])
    with pytest.raises(RuntimeError):  # reported again, not once and then garbage
        off.eval(TOKENS[:3])
    path.write_bytes(good)  # the same file back: the same model works again
    assert np.array_equal(decode_logits(off, TOKENS), want)


def test_a_full_disk_leaves_no_half_file(tiny_model_path, cache, monkeypatch):
    ram = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    plan = threshold_plan(ram.gguf.fingerprint())
    calls = {"n": 0}
    import pyinfer.runtime.sparse_ffn as sf

    orig = sf.ffn_arrays

    def full_disk(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return orig(*a, **k)

    monkeypatch.setattr(sf, "ffn_arrays", full_disk)
    with pytest.raises(PyinferError, match="No space left"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=plan, ram_budget="1G", progress=False)
    assert not list((cache / "offload").glob("*"))


# ---- the planner -------------------------------------------------------------------------------------------
FAKE_READS = {"direct": True, "table": {4096: {1: 100.0, 4: 300.0}, 1 << 20: {1: 1000.0, 4: 1200.0}}}


def test_cache_replay_counts_lru_hits_after_the_first_token():
    from pyinfer.offload.trace_replay import replay

    def counts(resident, selective, slots):  # (cold neurons read, cache hits) summed over the 2 counted tokens
        r = replay(trace, None, resident, selective, slots)
        return round(r.cold_reads * 2), round(r.cache_hits * 2)

    trace = [[np.array([0, 1, 5, 6])], [np.array([0, 1, 5, 7])], [np.array([5, 6, 7])]]
    assert counts([2], [True], slots=2) == (3, 2)
    assert counts([2], [True], slots=0) == (5, 0)
    assert counts([2], [False], slots=2) == (0, 0)  # streamed layers have no cache


def test_replayed_reads_merge_pages_as_the_store_does():
    from pyinfer.offload.trace_replay import merged_ranges

    assert merged_ranges([0, 1000, 2000], 1000) == (4096, 1)
    assert merged_ranges([0, 100_000], 1000) == (8192, 2)  # a gap over 8 KiB: two requests
    assert merged_ranges([0, 9000], 1000, gap=8192) == (12288, 1)  # one page between: read, not requested
    assert merged_ranges([0, 9000], 1000, gap=0) == (8192, 2)
    # 300 contiguous bundles pass the 256 KiB cap inside a page: cut there, no page read twice
    assert merged_ranges([k * 1000 for k in range(300)], 1000) == (303104, 2)


def test_bandwidth_interpolates_between_measured_chunks():
    from pyinfer.offload.planner import bandwidth, best_depth

    assert bandwidth(FAKE_READS, 4096, 1) == pytest.approx(100e6)
    assert bandwidth(FAKE_READS, 1 << 20, 4) == pytest.approx(1200e6)
    mid = bandwidth(FAKE_READS, 65536, 1)  # half-way in log size: the geometric mean
    assert mid == pytest.approx(np.sqrt(100 * 1000) * 1e6)
    assert bandwidth(FAKE_READS, 100, 1) == pytest.approx(100e6)  # clamped to the measured range
    assert best_depth(FAKE_READS, 4096) == 4


def test_prediction_grows_with_the_budget(tiny_model_path, cache):
    from pyinfer.offload.offloaded_ffn import plan_offload
    from pyinfer.offload.planner import predict

    ram = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    for plan in (threshold_plan(ram.gguf.fingerprint()), varying_predictor_plan(ram.gguf.fingerprint())):
        from pyinfer.model.pull import cache_dir

        layout = open_or_write(cache_dir(), ram.gguf, ram.config, plan, pick_neuron_down(plan, "auto"),
                               progress=False)
        low = minimum_budget(ram.gguf, plan, layout)
        ffn = sum(e["n_ff"] * e["bundle_bytes"] for e in layout.layers)
        speeds = [predict(plan_offload(ram.gguf, plan, layout, low + f * ffn), plan, layout, 1e-3, FAKE_READS).tok_s
                  for f in (0.0, 0.5, 1.0)]
        assert speeds == sorted(speeds) and speeds[-1] == pytest.approx(1e3)  # all resident: compute only


def test_plan_command_writes_a_plan_that_load_and_bench_use(tiny_model_path, cache, capsys):
    import json

    from pyinfer.cli import main

    out = cache / "tiny.offload.json"
    rc = main(["plan", "-m", tiny_model_path, "-t", "1", "--ram-budget", "1M", "-o", str(out), "--tokens", "2",
               "--read-seconds", "0.01", "--json"])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["format"] == "pyinfer-offload-plan" and plan["predicted_tok_s"] > 0 and len(plan["sweep"]) == 5
    assert json.loads(out.read_text())["budget"] == 1 << 20
    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity="auto", ram_budget=str(out), progress=False)
    assert m.offload.plan.budget == 1 << 20 and m.offload.predicted["io_threads"] == plan["io_threads"]
    rc = main(["bench", "-m", tiny_model_path, "-t", "1", "-p", "8", "-g", "4", "-r", "1", "--sparsity", "auto",
               "--ram-budget", str(out), "--json"])
    bench = json.loads(capsys.readouterr().out)
    assert rc == 0 and bench["offload"]["predicted_tok_s"] == pytest.approx(plan["predicted_tok_s"])
    pytest.importorskip("fastapi")
    from pyinfer.serve.server import build_server  # `serve --ram-budget PLAN.json`: the same session as load()

    _app, _loop, session = build_server(tiny_model_path, kv_budget=64, n_threads=1, sparsity="auto",
                                        ram_budget=str(out))
    assert session.offload.plan.budget == 1 << 20 and session.offload.predicted["io_threads"] == plan["io_threads"]
    other = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    (cache / "bad.json").write_text("{}")
    with pytest.raises(PyinferError, match="not a pyinfer offload plan"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity="auto", ram_budget=str(cache / "bad.json"))
    plan["fingerprint"] = "0" * 64
    (cache / "other.json").write_text(json.dumps(plan))
    with pytest.raises(PyinferError, match="another model"):
        pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity="auto", ram_budget=str(cache / "other.json"))
    del other


def test_plan_command_picks_the_neuron_cache_share_from_a_decode_trace(tiny_model_path, cache, capsys):
    import json

    from pyinfer.cli import main

    ram = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    sparsity = varying_predictor_plan(ram.gguf.fingerprint()).save(cache / "pred.sparsity.npz")
    budget = budgets(pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=str(sparsity)),
                     varying_predictor_plan(ram.gguf.fingerprint()))[1]
    out = cache / "pred.offload.json"
    rc = main(["plan", "-m", tiny_model_path, "-t", "1", "--sparsity", str(sparsity), "--ram-budget", str(budget),
               "-o", str(out), "--tokens", "4", "--read-seconds", "0.01", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["cache_share"] for r in plan["read_sweep"]][:4] == [0.0, 0.1, 0.25, 0.5]
    assert plan["cache_share"] in (0.0, 0.1, 0.25, 0.5) and plan["window_share"] in (0.0, 0.1, 0.25, 0.5, 1.0)
    assert {r["max_range"] for r in plan["read_sweep"]} == {64 << 10, 256 << 10, 1 << 20}
    assert {r["merge_gap"] for r in plan["read_sweep"]} == {0, 8 << 10, 32 << 10}
    assert all(r["cold_reads_per_token"] >= 0 and 0 <= r["cache_hit_rate"] <= 1 and 0 <= r["window_hit_rate"] <= 1
               for r in plan["read_sweep"])
    verified = [r for r in plan["read_sweep"] if "measured_tok_s" in r]  # --verify 3 (the default)
    assert len(verified) == 3 and plan["measured_tok_s"] == max(r["measured_tok_s"] for r in verified)
    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64, sparsity=str(sparsity), ram_budget=str(out),
                     progress=False)
    assert (m.offload.plan.cache_bytes > 0) == (plan["cache_share"] > 0)
    assert (sum(m.offload.plan.window) > 0) == (plan["window_share"] > 0)
    assert m.offload.merge_gap == plan["merge_gap"]
    assert m.offload.max_range == plan["max_range"] and not (cache / "pred.offload.json.verify.json").exists()
