"""`mem_limit`: one total for the whole process. The split is measured (runtime now, KV and buffers from the
engine), a limit below the minimum is refused with the minimum, offload under a limit equals the in-RAM run, the
model's mapped pages are dropped once copied, and a run inside a memory cgroup of exactly its limit completes."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from support.tiny_model import write_tiny_llama

import pyinfer
from pyinfer.errors import PyinferError
from pyinfer.offload.bundles import open_or_write
from pyinfer.offload.memory import cgroup_memory, mapped_bytes, process_memory
from pyinfer.offload.offloaded_ffn import minimum_budget
from pyinfer.sparsity.plan import LayerPlan, Predictor, SparsityPlan

# FFN-heavy for its size: 6 layers of 4096 neurons in Q8_0 (20 MiB of FFN against 1.2 MiB of attention), so a
# limit some MiB above the minimum streams part of it.
SMALL = dict(n_layers=6, d_model=256, d_ff=4096, n_heads=4, n_kv_heads=2)
# Above the minimum: a process's runtime grows a little with every model it has loaded (more in a long test run).


def headroom(minimum: int) -> int:
    return (8 << 20) + minimum // 40
PROMPT = [5, 17, 33, 2, 40, 41, 8, 60]


def predictor_plan(fp: str, seed: int = 3, hot: int = 64, rank: int = 32) -> SparsityPlan:
    """Predictors that call every cold neuron active (zero weights, cut below zero), in a random order: each
    layer reads only its listed neurons, as a predictor plan does, and every one is listed."""
    rng = np.random.default_rng(seed)
    d, ff = SMALL["d_model"], SMALL["d_ff"]
    layers = []
    for _ in range(SMALL["n_layers"]):
        pred = Predictor(quants.quantize(np.zeros((rank, d), np.float32), Q.Q8_0), np.zeros(rank, np.float32),
                         quants.quantize(np.zeros((ff - hot, rank), np.float32), Q.Q8_0),
                         np.full(ff - hot, -1.0, np.float32), {"recall": 1.0})
        layers.append(LayerPlan(rng.permutation(ff).astype(np.int32), 0.0, hot, pred))
    return SparsityPlan("contrib", 0.0, layers, fp)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """(model path, predictor plan file, threshold plan file)."""
    d = tmp_path_factory.mktemp("memlimit")
    path = write_tiny_llama(d / "small.gguf", seed=7, matrix_type=Q.Q8_0, config=SMALL)
    fp = pyinfer.load(path, n_threads=1, n_ctx=32, progress=False).gguf.fingerprint()
    plan_path, threshold_path = d / "small.sparse.npz", d / "small.threshold.npz"
    predictor_plan(fp).save(plan_path)
    rng = np.random.default_rng(4)  # gate/up dense, down over the neurons past a threshold
    SparsityPlan("contrib", 0.3, [LayerPlan(rng.permutation(SMALL["d_ff"]).astype(np.int32), 0.01, 0, None)
                                  for _ in range(SMALL["n_layers"])], fp).save(threshold_path)
    return str(path), str(plan_path), str(threshold_path)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    return tmp_path


def greedy(model, n=8):
    return model.generate(PROMPT, max_tokens=n, temperature=0)


def minimum_of(message: str) -> int:
    m = re.search(r"minimum of ([0-9.]+) MiB", message)
    assert m, message
    return int(float(m.group(1)) * 2**20)


def test_the_split_is_measured_and_adds_up(small_model, cache):
    path, plan, _ = small_model
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit="1G", progress=False)
    p = m.session.memory
    assert p.limit == 1 << 30 and p.offload
    assert p.runtime > 10 << 20                       # an interpreter, numpy and the core at least
    # The engine that runs has the probe's KV cache, plus the sparse graph's per-layer unions (the margin's)
    assert p.kv <= m.running.engine.state_bytes <= p.kv + p.margin
    assert p.runtime + p.kv + p.buffers + p.margin + p.weights == p.limit
    report = m.memory()
    assert report["mem_limit"] == 1 << 30 and report["plan"]["weight_budget"] == p.weights
    assert report["resident_weight_bytes"] > 0 and report["peak_rss"] > 0
    assert m.offload.plan.streamed_bytes == 0          # a roomy limit keeps every neuron


def test_a_limit_below_the_minimum_names_the_minimum_and_its_parts(small_model, cache):
    path, plan, _ = small_model
    for sparsity in (plan, "off"):
        with pytest.raises(PyinferError) as e:
            pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=sparsity, mem_limit="20M", progress=False)
        msg = str(e.value)
        assert "below this model's minimum of" in msg and "runtime" in msg and "KV cache" in msg
        assert "\n" not in msg
        assert minimum_of(msg) > 20 << 20


def test_offload_under_a_limit_equals_the_in_ram_run(small_model, cache):
    path, plan, _ = small_model
    want = greedy(pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, progress=False))
    roomy = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit="1G", progress=False)
    p, o = roomy.session.memory, roomy.offload.plan
    # A limit that leaves what must stay and half the FFN (the margin grows with the limit: 1/64 of it)
    limit = int((p.overhead - p.margin + o.fixed_bytes + o.ffn_bytes // 2 + (8 << 20)) / (1 - 1 / 64)) + (4 << 20)
    del roomy
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit=limit, progress=False)
    assert 0 < m.offload.plan.streamed_bytes
    assert greedy(m) == want


def test_copied_weights_leave_the_models_mapping(small_model, cache):
    path, plan, _ = small_model
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit="1G", progress=False)
    non_ffn = m.offload.plan.non_ffn_bytes
    # The copies of attention, norms and embeddings are made; their source pages are gone from this mapping.
    assert mapped_bytes(path) < non_ffn / 4
    assert process_memory(path).model_file == mapped_bytes(path)


def test_limit_and_budget_together_are_refused_and_a_dense_model_stays_mapped(small_model, cache, capsys):
    path, plan, _ = small_model
    with pytest.raises(PyinferError, match="not both"):
        pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit="1G", ram_budget="64M", progress=False)
    dense = pyinfer.load(path, n_threads=1, n_ctx=64, mem_limit="1G")
    assert dense.offload is None and not dense.session.memory.offload
    assert greedy(dense) == greedy(pyinfer.load(path, n_threads=1, n_ctx=64, progress=False))


def test_cli_bench_json_reports_the_peak_beside_the_limit(small_model, cache, capsys):
    from pyinfer.cli import main

    path, plan, _ = small_model
    assert main(["bench", "-m", path, "--threads", "1", "--prompt-tokens", "8", "--gen-tokens", "4",
                 "--repetitions", "1", "--sparsity", plan, "--mem-limit", "1G", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["memory"]["mem_limit"] == 1 << 30
    mem = out["memory"]
    assert mem["peak_rss"] > 0  # this process's high-water mark (a long test run's, here)
    assert mem["rss_anon"] + mem["rss_file"] < 1 << 30
    assert out["offload"]["ram_budget"] == out["memory"]["plan"]["weight_budget"]


# ---- a memory cgroup of exactly the limit ---------------------------------------------------------------------
CHILD = """
import json, sys
import pyinfer
m = pyinfer.load(sys.argv[1], n_threads=1, n_ctx=64, sparsity=sys.argv[2], mem_limit=int(sys.argv[3]), progress=False)
toks = m.generate({prompt}, max_tokens=8, temperature=0)
print(json.dumps({{"text": toks, "memory": m.memory()}}))
""".format(prompt=PROMPT)


def test_a_run_inside_a_memory_cgroup_of_exactly_its_limit_completes(small_model, cache):
    from pyinfer.tools.cgroup import cgroup_root, run_in_memory_cgroup

    if cgroup_root() is None:
        if os.environ.get("PYINFER_REQUIRE_CGROUP"):
            pytest.fail("PYINFER_REQUIRE_CGROUP is set but no memory cgroup can be made here")
        pytest.skip("needs root and a memory cgroup controller (cgroup v1 memory, or v2 with memory delegated)")
    path, plan, _ = small_model
    want = greedy(pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, progress=False))
    env = dict(os.environ, PYINFER_CACHE=str(cache))
    # The minimum as a fresh process measures it (its own runtime), then a limit just above it: part of the FFN
    # streams.
    # Run outside the source tree: `python -c` puts the working directory first on sys.path, and the tree's
    # `pyinfer` has no compiled core (CI tests the installed package).
    probe = subprocess.run([sys.executable, "-c", CHILD, path, plan, str(20 << 20)], capture_output=True, text=True,
                           env=env, timeout=300, cwd=str(cache))
    assert probe.returncode != 0 and "minimum of" in probe.stderr, probe.stderr[-500:]
    low = minimum_of(probe.stderr.strip().splitlines()[-1])
    limit = (low + headroom(low)) // 4096 * 4096  # the cgroup counts whole pages
    r = run_in_memory_cgroup([sys.executable, "-c", CHILD, path, plan, str(limit)], limit, env=env, timeout=300,
                             cwd=str(cache))
    killed = " (killed by the kernel)" if r.killed else ""
    assert r.returncode == 0, f"exit {r.returncode}{killed} under {limit / 2**20:.1f} MiB: {r.stderr[-500:]}"
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["text"] == want
    mem = got["memory"]
    assert mem["mem_limit"] == limit and mem["plan"]["offload"]
    assert mem["cgroup"]["limit"] == limit
    assert r.peak <= limit
    print(f"cgroup: limit {limit / 2**20:.1f} MiB, peak {r.peak / 2**20:.1f} MiB, hit the limit {r.failcnt} times, "
          f"weights in RAM {mem['resident_weight_bytes'] / 2**20:.1f} MiB")


def test_cgroup_memory_reads_this_process():
    got = cgroup_memory()
    if got is not None:
        assert got["usage"] > 0


def test_plan_takes_a_limit_and_a_plan_file_goes_with_it(small_model, cache, capsys):
    from pyinfer.cli import main
    from pyinfer.serve.server import build_server

    path, plan, _ = small_model
    out = cache / "small.offload.json"
    assert main(["plan", "-m", path, "-t", "1", "--sparsity", plan, "--mem-limit", "1G", "-o", str(out),
                 "--tokens", "2", "--read-seconds", "0.01", "--verify", "0", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["mem_limit"] == 1 << 30 and got["memory"]["weight_budget"] == got["budget"]
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, mem_limit="1G", ram_budget=str(out), progress=False)
    assert m.offload.predicted["io_threads"] == got["io_threads"]
    assert m.offload.plan.budget == m.session.memory.weights  # the limit's budget, the plan's read splits
    assert main(["plan", "-m", path, "--sparsity", plan, "-o", str(out)]) == 2
    assert "needs --mem-limit SIZE" in capsys.readouterr().err
    _app, _loop, session = build_server(path, kv_budget=64, n_threads=1, sparsity=plan, mem_limit="1G")
    assert session.memory.kv > 0 and session.offload.plan.budget == session.memory.weights


def test_a_plan_without_predictors_stays_mapped_under_a_limit(small_model, cache, capsys):
    """Gate and up run dense in such a plan, so a streamed layer would read its whole cold tail every token: no
    byte saved over the mapped model. Under a limit the weights stay mapped and decode runs dense, said once."""
    path, _, threshold = small_model
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=threshold, mem_limit="1G")
    assert m.offload is None and m.sparsity is None
    assert "no predictors" in capsys.readouterr().err
    assert greedy(m) == greedy(pyinfer.load(path, n_threads=1, n_ctx=64, progress=False))
    # An explicit weight budget still streams it (bit for bit the in-RAM sparse run).
    kept = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=threshold, ram_budget="64M", progress=False)
    assert kept.offload is not None


def test_the_solver_gives_way_to_the_greedy_fill_where_its_memory_would_not_fit(small_model, cache):
    """HiGHS takes tens of MiB while it solves (18-48 MiB measured on this model's 774 groups): under a limit that
    leaves less free while planning, the greedy fill chooses, and the plan says why."""
    from pyinfer.model.pull import cache_dir
    from pyinfer.offload.offloaded_ffn import highs_workspace, plan_offload
    from pyinfer.runtime.sparse_ffn import pick_neuron_down

    path, plan, _ = small_model
    m = pyinfer.load(path, n_threads=1, n_ctx=64, sparsity=plan, progress=False)
    layout = open_or_write(cache_dir(), m.gguf, m.config, m.sparsity, pick_neuron_down(m.sparsity, "auto"),
                           progress=False)
    budget = minimum_budget(m.gguf, m.sparsity, layout) + (4 << 20)
    tight = plan_offload(m.gguf, m.sparsity, layout, budget, solver_room=16 << 20)
    assert tight.choice.solver == "greedy" and "memory limit" in tight.summary()["solver_fallback"]
    roomy = plan_offload(m.gguf, m.sparsity, layout, budget, solver_room=highs_workspace(10 ** 4))
    assert roomy.choice.solver == "highs" and roomy.summary()["solver_fallback"] is None
