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


def test_block_manager_holds_state_blocks_apart_from_the_kv_table():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.hold_state(1, 2) and bm.grow(1, 5) and bm.used_blocks == 4
    assert bm.table(1) == [2, 3]  # the KV table holds only its own blocks
    assert bm.hold_state(1, 2) and bm.used_blocks == 4  # once per request
    assert not bm.hold_state(2, 3) and bm.used_blocks == 4  # no room: no change
    assert bm.free(1) == 4 and bm.free_blocks == 6


def test_a_hybrid_request_is_charged_its_state():
    """Budget 10 tokens, every request 1 prompt + 1 output token and a state worth 3: two run at once (2 x (2 + 3)),
    not five; one whose tokens and state can never fit is refused in one line."""
    from pyinfer.serve.policies import FCFS
    from pyinfer.serve.request import Request
    from pyinfer.serve.scheduler import Scheduler

    sched = Scheduler(FCFS(), kv_budget=10, state_blocks=3)
    for i in range(5):
        sched.add_request(Request(i, 1, 1, 1, true_len=1))
    with pytest.raises(ValueError, match="3 state blocks"):
        sched.add_request(Request(9, 4, 1, 4, true_len=4))
    most = 0
    while sched.has_unfinished():
        out = sched.schedule()
        most = max(most, len(out.running))
        assert out.used_blocks == out.kv_tokens + 3 * len(out.running) <= 10
        sched.update_from_output(out.running)
    assert most == 2 and sched.finished_count == 5 and sched.blocks.used_blocks == 0
    assert simulate("fcfs", [1] * 5, [1] * 5, [1] * 5, [1] * 5, kv_budget=10, state_tokens=3).steps == 3


@pytest.mark.parametrize("policy", ["amin", "amin-progress", "amax", "hsf", "fcfs", "hedge"])
def test_hybrid_requests_finish_within_budget(policy):
    """With a state per request, every policy (future-aware ones included) keeps tokens and states under the budget
    and frees the states of finished and evicted requests."""
    s, o = lmsys_like_lengths(120, seed=5)
    lo, up = intervals(o, "c", 0.5)
    up = np.maximum(up, o)
    r = simulate(policy, s, o, lo, up, kv_budget=2500, state_tokens=64)
    assert r.n == 120 and r.peak_kv_tokens <= 2500


@pytest.mark.parametrize("policy", ["amin", "amin-progress", "amax", "hsf", "fcfs", "hedge"])
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


def test_workload_fit_recovers_a_known_sigma():
    """The fitter on a target whose answer is known: a clipped lognormal drawn with sigma 1.3 (other draws
    than the fitter's own) gives back sigma 1.3."""
    from pyinfer.serve.simulate import _fit_sigma

    for sigma, median, lo, hi in ((1.3, 20.0, 1, 500), (0.6, 43.0, 1, 883)):
        z = np.random.default_rng(99).standard_normal(400_000)
        clipped_mean = float(np.clip(np.rint(median * np.exp(sigma * z)), lo, hi).mean())
        assert abs(_fit_sigma(lo, hi, clipped_mean, median, seed=1) - sigma) < 0.02


def test_workload_on_other_seeds_keeps_the_lmsys_statistics():
    for seed in (3, 4):
        s, o = lmsys_like_lengths(20000, seed=seed)
        assert s.min() >= 1 and s.max() <= 468 and o.min() >= 1 and o.max() <= 883
        assert abs(np.median(s) - 11) <= 1 and abs(np.median(o) - 43) <= 2
        assert abs(s.mean() - 41) < 3 and abs(o.mean() - 85) < 4


def test_paper_example_1_hedge():
    # nothing has finished when the first decisions are made: hedge plans 1 * (4/1)^0.25 -> 1 token, as
    # A_min would, so all five start at once
    assert example1("hedge").total_latency_steps == 5


def test_hedge_beats_amin_when_intervals_say_nothing():
    s, o = lmsys_like_lengths(600, seed=3)
    lo, up = intervals(o, "a")
    hedge = simulate("hedge", s, o, lo, up, 4096)
    amin = simulate("amin", s, o, lo, up, 4096)
    assert hedge.avg_latency_steps < 0.8 * amin.avg_latency_steps


def test_hedge_admits_by_area_and_evicts_the_largest_holder_without_information():
    from pyinfer.serve.policies import make_policy
    from pyinfer.serve.request import Request

    hedge = make_policy("hedge")
    for i in range(30):  # finished requests, all [1, 1000]: no information in the intervals
        done = Request(100 + i, prompt_len=5, lower=1, upper=1000)
        done.generated = 10 + i
        hedge.on_finish(done)
    assert not hedge.informative
    short, long_prompt = Request(0, 5, 1, 1000), Request(1, 300, 1, 1000)
    assert hedge.planned_len(short) == hedge.planned_len(long_prompt)  # same interval, same plan
    assert hedge.admission_key(short) < hedge.admission_key(long_prompt)  # less memory x time first
    small, big = Request(2, 5, 1, 1000), Request(3, 50, 1, 1000)
    small.generated, big.generated = 30, 20
    assert min([small, big], key=hedge.victim_key) is big  # 70 KV tokens held vs 35
    # a request that outlived most finished lengths is planned above its progress
    assert hedge.planned_len(small) > 31


def test_hedge_remembers_a_bounded_history():
    from pyinfer.serve.policies import make_policy
    from pyinfer.serve.request import Request

    hedge = make_policy("hedge", history=16)
    for i in range(100):
        done = Request(i, prompt_len=5, lower=1, upper=1000)
        done.generated = 1 + i % 50
        hedge.on_finish(done)
        hedge.planned_len(Request(1000 + i, 5, 1 + i, 1000))  # a new interval each time
    assert len(hedge._lengths) < 32 and len(hedge._neighbours) <= 16


def test_hedge_uses_informative_intervals():
    s, o = lmsys_like_lengths(600, seed=4)
    lo, up = intervals(o, "c", 0.95)
    hedge = simulate("hedge", s, o, lo, up, 4096)
    amin = simulate("amin", s, o, lo, up, 4096)
    amax = simulate("amax", s, o, lo, up, 4096)
    assert hedge.avg_latency_steps < min(amin.avg_latency_steps, amax.avg_latency_steps)


def test_amin_eviction_order_and_pseudo_lower_update():
    from pyinfer.serve.policies import make_policy
    from pyinfer.serve.request import Request
    from pyinfer.serve.scheduler import Scheduler

    # two requests, [1, 10] each, true length 10; M = 12 holds both at first, then overflows
    sched = Scheduler(make_policy("amin", seed=0), kv_budget=12)
    for i in range(2):
        sched.add_request(Request(i, prompt_len=1, lower=1, upper=10, true_len=10))
    evicted = []
    for _ in range(12):
        out = sched.schedule()
        assert out.kv_tokens <= 12
        evicted += out.evicted
        sched.update_from_output([])
        if out.evicted:
            break
    assert len(evicted) == 1
    victim = sched.request(evicted[0])
    # equal õ: a seeded random pick; the victim's õ becomes what it had generated, its progress is lost
    assert victim.pseudo_lower == victim.wasted_tokens > 1 and victim.generated == 0 and victim.evictions == 1


def test_kv_budget_too_small_for_one_request_is_refused():
    from pyinfer.serve.policies import make_policy
    from pyinfer.serve.request import Request
    from pyinfer.serve.scheduler import Scheduler

    sched = Scheduler(make_policy("amin"), kv_budget=10)
    with pytest.raises(ValueError, match="can never fit"):
        sched.add_request(Request(0, prompt_len=5, lower=1, upper=20))


def test_hedge_plans_with_upper_bounds_when_they_are_the_lengths():
    s, o = lmsys_like_lengths(400, seed=5)
    lo, up = np.ones_like(o), o.copy()           # a client whose max_tokens is the real length
    hedge = simulate("hedge", s, o, lo, up, 4096)
    amax = simulate("amax", s, o, lo, up, 4096)
    # the first finishes are needed to notice; until then it plans optimistically
    assert hedge.avg_latency_steps <= 1.1 * amax.avg_latency_steps


def test_a_server_scheduler_forgets_finished_requests():
    """A long-running server must not grow: finished requests leave the id map, and `finished` is bounded."""
    from pyinfer.serve.policies import make_policy
    from pyinfer.serve.request import Request
    from pyinfer.serve.scheduler import Scheduler

    sched = Scheduler(make_policy("hedge", 0), 256, block_size=16, keep_finished=8)
    for i in range(2000):
        sched.add_request(Request(i, 4, 1, 3))
        while sched.has_unfinished():
            out = sched.schedule()
            sched.update_from_output(out.running)
    assert sched.finished_count == 2000 and len(sched.finished) == 8 and not sched._by_id
