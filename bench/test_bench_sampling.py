"""pytest-benchmark entries for sampling one token from a 151,936-token vocabulary (Qwen2's): top-k by a full
partition (the sampler before issue 54's work, kept here as the baseline) against runtime.sampling.top_k_ids (a
bound from every 64th logit first), and the whole Sampler free, under a grammar's mask that allows 60k tokens
(inside a JSON string) and one that allows 7 (after a key). Each is checked once before timing.

  pytest bench/test_bench_sampling.py --benchmark-json bench/results/serving/sampling.json"""
import numpy as np
import pytest

from pyinfer.runtime.sampling import Sampler, SamplingParams, top_k_ids

VOCAB, K = 151_936, 40


@pytest.fixture(scope="module")
def logits():
    return (np.random.default_rng(0).standard_normal(VOCAB) * 3).astype(np.float32)


def full_partition(logits, k):
    return np.argpartition(logits, -k)[-k:]


@pytest.mark.parametrize("how", ["full_partition", "top_k_ids"])
def test_top_k(benchmark, logits, how):
    fn = full_partition if how == "full_partition" else top_k_ids
    assert set(fn(logits, K).tolist()) == set(full_partition(logits, K).tolist())
    benchmark(fn, logits, K)


@pytest.mark.parametrize("allowed", [None, 60_000, 7])
def test_sampler(benchmark, logits, allowed):
    mask = None
    if allowed is not None:
        mask = np.zeros(VOCAB, bool)
        mask[np.random.default_rng(1).choice(VOCAB, allowed, replace=False)] = True
    sampler = Sampler(SamplingParams(0.8, K, 0.95, seed=1))
    tok = sampler(logits, mask)
    assert mask is None or mask[tok]
    benchmark(sampler, logits, mask)
