"""The placement program (place/knapsack.py) against brute force, its communication constraint, and the GPU
placement of a tiny model (`pyinfer place`), all without a GPU."""
import json

import numpy as np
import pytest

import pyinfer
from pyinfer.errors import PyinferError
from pyinfer.place.gpu_placement import GpuCosts, fixed_bytes, place, read_placement, save_placement
from pyinfer.place.knapsack import PrefixKnapsack, solve_brute_force, solve_greedy, solve_highs

pytest.importorskip("highspy")


def random_program(rng, layers=3, max_groups=4, split=False, bonus=False) -> PrefixKnapsack:
    groups = [int(rng.integers(1, max_groups + 1)) for _ in range(layers)]
    nbytes = [[float(rng.integers(1, 10)) for _ in range(g)] for g in groups]
    value = [sorted((float(rng.random()) for _ in range(g)), reverse=True) for g in groups]
    total = sum(map(sum, nbytes))
    p = PrefixKnapsack(nbytes, value, float(rng.uniform(0.2, 0.9) * total))
    if bonus:
        p.whole_bonus = [float(rng.random()) for _ in groups]
    if split:
        p.split_saving = value
        p.split_cost = [float(rng.uniform(0, 1.5)) for _ in groups]
    return p


@pytest.mark.parametrize("split,bonus", [(False, False), (True, False), (False, True)])
def test_highs_reaches_the_brute_force_optimum_and_respects_the_budget(split, bonus):
    rng = np.random.default_rng(1 + 2 * split + bonus)
    for _ in range(25):
        p = random_program(rng, split=split, bonus=bonus)
        best, got = solve_brute_force(p), solve_highs(p)
        assert got.solver == "highs" and got.seconds > 0 and "variables" in got.info
        assert got.used <= p.capacity + 1e-9 and p.check(got.kept)
        assert got.value == pytest.approx(best.value, abs=1e-9)
        greedy = solve_greedy(p)
        assert p.check(greedy.kept) and greedy.value <= best.value + 1e-9


def test_the_communication_constraint_keeps_a_split_layer_only_when_it_pays():
    # Layer 0: four groups worth 1.0, 0.1, 0.1, 0.1 s; layer 1: two groups worth 0.5 each. Capacity: 3 groups.
    nbytes = [[1.0] * 4, [1.0] * 2]
    value = [[1.0, 0.1, 0.1, 0.1], [0.5, 0.5]]
    free = PrefixKnapsack(nbytes, value, 3.0)
    assert solve_highs(free).kept == [1, 2]  # layer 0 split: one group on the GPU
    costly = PrefixKnapsack(nbytes, value, 3.0, split_saving=value, split_cost=[1.5, 1.5])
    got = solve_highs(costly)
    # A one-group split of layer 0 saves 1.0 < 1.5: layer 0 goes wholly to the CPU, layer 1 wholly to the GPU.
    assert got.kept == [0, 2] and got.kept == solve_brute_force(costly).kept
    cheap = PrefixKnapsack(nbytes, value, 3.0, split_saving=value, split_cost=[0.5, 0.5])
    assert solve_highs(cheap).kept == [1, 2]  # the split saves more than it costs: unchanged


def test_greedy_follows_prefixes_where_the_program_looks_past_a_cheap_group():
    # Layer 0's second group is worth more than its first (frequencies need not follow the plan's order).
    p = PrefixKnapsack([[1.0, 1.0], [1.0]], [[0.1, 0.9], [0.4]], 2.0)
    assert solve_greedy(p).kept == [1, 1] and solve_highs(p).kept == [2, 0]


COSTS = GpuCosts(cpu_seconds_per_byte=1e-10, sync_seconds=30e-6)


def test_place_on_a_tiny_model(tiny_model_path, tmp_path):
    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    fixed = sum(fixed_bytes(m.gguf, m.config, None, 64).values())
    with pytest.raises(PyinferError, match=r"below the minimum of .* MiB \(attention"):
        place(m.gguf, m.config, None, fixed - 1, 64, COSTS)
    everything = place(m.gguf, m.config, None, 1 << 34, 64, COSTS)
    assert everything.gpu_neurons == everything.n_ff and everything.head_on_gpu
    assert everything.mass_on_gpu == pytest.approx(1.0) and everything.split_layers == []
    some = place(m.gguf, m.config, None, fixed + everything.ffn_bytes // 2, 64, COSTS, group=32)
    assert some.ffn_bytes_on_gpu + (some.head_bytes if some.head_on_gpu else 0) <= everything.ffn_bytes // 2
    assert all(k % 32 == 0 or k == n for k, n in zip(some.gpu_neurons, some.n_ff))
    out = str(tmp_path / "p.json")
    save_placement(some, out)
    assert read_placement(out, m.gguf.fingerprint())["gpu_neurons"] == some.gpu_neurons
    with pytest.raises(PyinferError, match="another model"):
        read_placement(out, "0" * 64)


def test_a_costly_sync_sends_tiny_splits_to_one_side(tiny_model_path):
    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    fixed = sum(fixed_bytes(m.gguf, m.config, None, 64).values())
    budget = fixed + place(m.gguf, m.config, None, 1 << 34, 64, COSTS).ffn_bytes // 3
    cheap = place(m.gguf, m.config, None, budget, 64, GpuCosts(1e-10, 0.0), group=8)
    dear = place(m.gguf, m.config, None, budget, 64, GpuCosts(1e-10, 1.0), group=8)
    assert cheap.split_layers and not dear.split_layers
    assert dear.greedy["split_layers_losing_time"]  # PowerInfer's greedy fill keeps them split regardless


def test_place_command_writes_one_json_object(tiny_model_path, tmp_path, capsys, monkeypatch):
    from pyinfer.cli import main

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    out = tmp_path / "tiny.placement.json"
    rc = main(["place", "-m", tiny_model_path, "-t", "1", "-c", "64", "--vram-budget", "80M", "--group", "16",
               "--tokens", "2", "-o", str(out), "--json"])
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 0 and len(printed) == 1
    got = json.loads(printed[0])
    assert got == json.loads(out.read_text()) and got["format"] == "pyinfer-gpu-placement"
    assert got["costs"]["cpu_seconds_per_byte"] > 0 and got["solver"] in ("highs", "greedy")
    rc = main(["place", "-m", tiny_model_path, "-t", "1", "-c", "64", "--vram-budget", "1K", "-o", str(out)])
    assert rc == 2 and "below the minimum" in capsys.readouterr().err
