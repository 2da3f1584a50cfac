"""Continuous batching: sequences run together over a paged KV cache give the logits they give alone."""
import numpy as np

import pyinfer
from pyinfer.serve.batch_engine import BatchEngine, SeqWork


def test_batched_sequences_match_single_sequence_runs(tiny_model_path):
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=128)
    be = BatchEngine(m.gguf, m.config, num_blocks=12, block_size=4, max_seq_len=40, n_threads=2, max_batch_tokens=8)
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
    be = BatchEngine(m.gguf, m.config, num_blocks=4, block_size=4, max_seq_len=16, n_threads=1, max_batch_tokens=8)
    with pytest.raises(ValueError, match="KV slot|KV block"):
        be.step([SeqWork(0, [1, 2], 0, [9])])   # block 9 does not exist
    with pytest.raises(ValueError, match="no KV block"):
        be.step([SeqWork(0, [1] * 6, 0, [0])])  # 6 tokens need 2 blocks


def test_sparse_batches_match_single_sequence_sparse_decode(tiny_model_path):
    """With sparse_batches, every token of a batch gets the sparse FFN that single-token decode gets."""
    from test_sparsity import all_active_plan

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = all_active_plan(m.gguf.fingerprint(), threshold=0.05)
    for lp in plan.layers:
        lp.predictor, lp.hot = None, 0
    single = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan)
    be = BatchEngine(single.gguf, single.config, num_blocks=8, block_size=4, max_seq_len=16, n_threads=2,
                     sparsity=plan, sparse_batches=True)
    a, b = [5, 9, 13], [60, 61]
    be.step([SeqWork(0, a, 0, [0]), SeqWork(1, b, 0, [3])])
    got = be.step([SeqWork(0, [17], 3, [0]), SeqWork(1, [18], 2, [3])])
    for seq, ids in ((0, a + [17]), (1, b + [18])):
        single._cached = []
        ref = [single._forward([t], i, np.array([0]))[0] for i, t in enumerate(ids)][-1]
        np.testing.assert_allclose(got[seq], ref, rtol=1e-4, atol=1e-4)
