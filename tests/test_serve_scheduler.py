"""Schedulers with no model and no GPU: integers in, plain data out."""
import numpy as np
import pytest

from pyinfer.serve.block_manager import BlockManager
from pyinfer.serve.simulate import intervals, lmsys_like_lengths, simulate


def example1(policy):
    n = 5
    return simulate(policy, [1] * n, [1] * n, [1] * n, [4] * n, kv_budget=10)


def test_paper_example_1():
    # arXiv 2508.14544, Example 1: n=5, s=1, o in [1,4], true o=1, M=10.
    assert example1("hsf").total_latency_steps == 5
    assert example1("amax").total_latency_steps == 9
    assert example1("amin").total_latency_steps == 5


def test_block_manager_counts_and_frees():
    bm = BlockManager(num_blocks=4, block_size=16)
    assert bm.grow(1, 17) and bm.used_blocks == 2
    assert bm.grow(2, 32) and bm.free_blocks == 0
    assert not bm.grow(3, 1) and bm.table(3) == []
    assert bm.free(1) == 2 and bm.free_blocks == 2


@pytest.mark.parametrize("policy", ["amin", "amax", "hsf", "fcfs"])
def test_every_request_finishes_within_budget(policy):
    s, o = lmsys_like_lengths(200, seed=1)
    lo, up = intervals(o, "c", 0.5)
    up = np.maximum(up, o)
    r = simulate(policy, s, o, lo, up, kv_budget=2000)
    assert r.n == 200 and r.peak_kv_tokens <= 2000


def test_amin_beats_amax_with_uninformative_intervals():
    s, o = lmsys_like_lengths(300, seed=2)
    lo, up = intervals(o, "a")
    amin = simulate("amin", s, o, lo, up, kv_budget=3000)
    amax = simulate("amax", s, o, lo, up, kv_budget=3000)
    hsf = simulate("hsf", s, o, lo, up, kv_budget=3000)
    assert amin.avg_latency_steps < amax.avg_latency_steps
    assert hsf.avg_latency_steps <= amin.avg_latency_steps * 1.001


def test_workload_fit_matches_lmsys_statistics():
    s, o = lmsys_like_lengths(20000, seed=0)
    assert s.min() >= 1 and s.max() <= 468 and o.min() >= 1 and o.max() <= 883
    assert abs(np.median(s) - 11) <= 1 and abs(np.median(o) - 43) <= 2
    assert abs(s.mean() - 41) < 3 and abs(o.mean() - 85) < 4
