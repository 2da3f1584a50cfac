"""Continuous batching: sequences run together over a paged KV cache give the logits they give alone."""
import numpy as np
import pytest

import pyinfer
from pyinfer.runtime.sparse_ffn import SparseRuns
from pyinfer.serve.batch_engine import BatchEngine, SeqWork
from pyinfer.sparsity.plan import SparsityPlan


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_batched_sequences_match_single_sequence_runs(tiny_model_path, tmp_path, cache):
    path = tiny_model_path
    if cache == "q8_0":  # needs heads of 32 values
        from support.tiny_model import write_tiny_llama
        path = str(write_tiny_llama(tmp_path / "hd32.gguf", config={"n_heads": 2, "n_kv_heads": 1}))
    m = pyinfer.load(path, n_threads=2, n_ctx=128, cache_type=cache)
    be = BatchEngine(m.session.parts(n_threads=2, cache_type=cache), num_blocks=12, block_size=4, max_seq_len=40,
                     max_batch_tokens=8)
    a, b = [5, 9, 13, 40, 41, 7, 8], [60, 61, 3]
    # blocks deliberately scattered and interleaved between the two sequences
    ta, tb = [7, 2, 9], [4, 11]
    got = be.step([SeqWork(0, a, 0, ta), SeqWork(1, b, 0, tb)])       # both prompts (cut into 2 runs of 8)
    np.testing.assert_allclose(got[0], m.eval(a), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], m.eval(b), rtol=1e-5, atol=1e-5)
    # one decode step each, in one run
    got = be.step([SeqWork(0, [17], len(a), ta), SeqWork(1, [18], len(b), tb)])
    np.testing.assert_allclose(got[0], m.eval(a + [17]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], m.eval(b + [18]), rtol=1e-5, atol=1e-5)


def test_bad_block_table_is_refused(tiny_model_path):
    import pytest

    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    be = BatchEngine(m.session.parts(n_threads=1), num_blocks=4, block_size=4, max_seq_len=16, max_batch_tokens=8)
    with pytest.raises(pyinfer.PyinferError, match="KV block 9 out of range"):
        be.step([SeqWork(0, [1, 2], 0, [9])])   # block 9 does not exist
    with pytest.raises(pyinfer.PyinferError, match="not covered by its 1 KV blocks"):
        be.step([SeqWork(0, [1] * 6, 0, [0])])  # 6 tokens need 2 blocks
    with pytest.raises(pyinfer.PyinferError, match="listed twice"):
        be.step([SeqWork(0, [1] * 6, 0, [1, 1])])  # one block twice: the second half overwrites the first
    with pytest.raises(pyinfer.PyinferError, match="listed twice"):
        be.step([SeqWork(0, [1], 0, [2]), SeqWork(1, [1], 0, [2])])  # two sequences in one block
    # The engine itself checks the same, for callers that drive it directly.
    table = np.array([[1, 1, 0, 0]], np.int32)
    with pytest.raises(ValueError, match="repeats block 1"):
        be.engine.run(1, np.array([1], np.int32), np.array([5], np.int32), np.array([0], np.int32),
                      np.array([5], np.int32), table)
    with pytest.raises(ValueError, match="position 16 out of range"):  # past the table: past the scratch
        be.engine.run(1, np.array([1], np.int32), np.array([16], np.int32), np.array([0], np.int32),
                      np.array([0], np.int32), np.array([[0, 1, 2, 3]], np.int32))
    with pytest.raises(ValueError, match="KV slot of batch row 0"):
        be.engine.run(1, np.array([1], np.int32), np.array([5], np.int32), np.array([0], np.int32),
                      np.array([3], np.int32), np.array([[0, 1, 2, 3]], np.int32))
    with pytest.raises(ValueError, match="appears twice"):  # two tokens, one KV row: two threads, one row
        be.engine.run(2, np.array([1, 2], np.int32), np.array([0, 0], np.int32), np.array([1], np.int32),
                      np.array([0, 0], np.int32), np.array([[0, 1, 2, 3], [0, 1, 2, 3]], np.int32))


def varied_plan(fingerprint: str, mode: str) -> SparsityPlan:
    """A plan whose active lists differ from token to token: random predictors (cut-off 0) in
    "predictor" mode; thresholds otherwise."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants
    from support.plans import D, FF, all_active_plan

    from pyinfer.sparsity.plan import Predictor

    plan = all_active_plan(fingerprint, mode="gate" if mode == "gate" else "contrib", threshold=0.05)
    rng = np.random.default_rng(2)
    for lp in plan.layers:
        if mode == "predictor":
            r = lp.predictor.rank
            lp.predictor = Predictor(quants.quantize(rng.standard_normal((r, D)).astype(np.float32), Q.Q8_0),
                                     np.zeros(r, np.float32),
                                     quants.quantize(rng.standard_normal((FF - lp.hot, r)).astype(np.float32), Q.Q8_0),
                                     np.zeros(FF - lp.hot, np.float32), {"recall": 1.0})
        else:
            lp.predictor, lp.hot = None, 0
            if mode == "gate":
                lp.threshold = 0.1
    return plan


@pytest.mark.parametrize("mode", ["threshold", "gate", "predictor"])
def test_union_batches_match_single_sequence_sparse_decode(tiny_model_path, mode):
    """A decode step of several sequences computes the union of their active neurons once, and each
    sequence still gets exactly the FFN that single-token sparse decode gives it."""
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varied_plan(m.gguf.fingerprint(), mode)
    single = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, emulate_prefill=True)
    be = BatchEngine(single.session.parts(n_threads=2, sparsity=plan), num_blocks=8, block_size=4, max_seq_len=16,
                     runs=SparseRuns.every_token(16))  # the prompts too
    prompts = [[5, 9, 13], [60, 61], [7, 7, 8, 9]]
    tables = [[0], [3], [5, 6]]
    be.step([SeqWork(i, p, 0, t) for i, (p, t) in enumerate(zip(prompts, tables))])
    nxt = [17, 18, 19]
    got = be.step([SeqWork(i, [nxt[i]], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))])
    for i, p in enumerate(prompts):
        single._cached = []
        ref = [single.forward([t], k, np.array([0]))[0] for k, t in enumerate(p + [nxt[i]])][-1]
        np.testing.assert_allclose(got[i], ref, rtol=1e-4, atol=1e-4)


def test_dense_union_falls_back_to_the_dense_ffn(tiny_model_path):
    """Break-evens below zero send every run dense: the logits are the dense model's."""
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varied_plan(m.gguf.fingerprint(), "threshold")
    be = BatchEngine(m.session.parts(n_threads=2, sparsity=plan), num_blocks=8, block_size=4, max_seq_len=16,
                     runs=SparseRuns.never())
    a, b = [5, 9, 13], [60, 61]
    be.step([SeqWork(0, a, 0, [0]), SeqWork(1, b, 0, [3])])
    got = be.step([SeqWork(0, [17], 3, [0]), SeqWork(1, [18], 2, [3])])
    np.testing.assert_allclose(got[0], m.eval(a + [17]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], m.eval(b + [18]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["threshold", "predictor"])
def test_offloaded_batch_engine_equals_in_ram(tiny_model_path, tmp_path, monkeypatch, mode):
    """The server's engine under a RAM budget: every step of a batch of sequences (prompts dense, decode
    steps over the union) gives the logits the in-RAM batch engine gives, bit for bit."""
    from pyinfer.offload import OffloadedFfn
    from pyinfer.offload.bundles import open_or_write
    from pyinfer.offload.offloaded_ffn import minimum_budget
    from pyinfer.runtime.sparse_ffn import pick_neuron_down

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varied_plan(m.gguf.fingerprint(), mode)
    layout = open_or_write(tmp_path, m.gguf, m.config, plan, pick_neuron_down(plan, "auto"), progress=False)
    off = OffloadedFfn(m.gguf, m.config, plan, "auto", minimum_budget(m.gguf, plan, layout), tmp_path, progress=False)
    engines = [BatchEngine(m.session.parts(n_threads=2, sparsity=plan, offload=o), num_blocks=8, block_size=4,
                           max_seq_len=16) for o in (None, off)]
    prompts, tables = [[5, 9, 13], [60, 61], [7, 7, 8, 9]], [[0, 1], [3, 4], [5, 6]]
    outs = [[be.step([SeqWork(i, p, 0, t) for i, (p, t) in enumerate(zip(prompts, tables))])] for be in engines]
    for step in range(3):
        for be, out in zip(engines, outs):
            out.append(be.step([SeqWork(i, [20 + i + step], len(p) + step, t)
                                for i, (p, t) in enumerate(zip(prompts, tables))]))
    for a, b in zip(*outs):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)
    assert off.stats()["bytes_read"] > 0
