"""The hybrid CPU/GPU split (runtime/hybrid_ffn.py, place/device.py) on a machine without a GPU: a second CPU
backend with memory of its own stands in for the device, runs attention, its FFN blocks and the head, and the
engine copies tensors across as it would for a GPU."""
import itertools

import numpy as np
import pytest
from support.tiny_model import write_tiny_llama

import pyinfer
from pyinfer import _core
from pyinfer.errors import PyinferError
from pyinfer.runtime.model_graph import build_model_graph
from pyinfer.runtime.placement import Placement


@pytest.fixture(scope="module")
def model4(tmp_path_factory) -> str:
    cfg = {"n_layers": 4, "d_model": 64, "d_ff": 128, "n_heads": 4, "n_kv_heads": 2}
    return str(write_tiny_llama(tmp_path_factory.mktemp("hybrid") / "tiny4.gguf", config=cfg))


def logits(m, gpu_blocks, two_backends: bool, head=False) -> np.ndarray:
    ids = list(range(1, 20))
    pl = {"gpu_blocks": gpu_blocks, "block": 32, "head_on_gpu": head}
    b = build_model_graph(m.gguf, m.config, 64, placement=Placement.of(pl))
    kw = {"placement": b.placement, "backend_threads": [2, 1], "backend_memory": [0, 1]} if two_backends else {}
    e = _core.Engine(b.graph, max_tokens=64, max_outputs=64, n_threads=2, **kw)
    n = len(ids)
    e.run(n, np.array(ids, np.int32), np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32))
    assert not two_backends or e.n_copies > 0
    return np.array(e.logits())[:n].copy()


def test_the_device_runs_exactly_what_one_backend_runs(model4):
    # Every split of a 4-block layer, layer by layer: the stand-in computes with the CPU's kernels, so the two
    # backends must agree bit for bit (a scratch slot reused across memory spaces once broke this).
    m = pyinfer.load(model4, n_threads=2, n_ctx=64)
    for counts in itertools.chain(itertools.product((0, 2, 4), repeat=2), [(1, 3), (3, 1)]):
        blocks = [list(range(c)) for c in counts] * 2
        np.testing.assert_array_equal(logits(m, blocks, True), logits(m, blocks, False), err_msg=str(counts))
    np.testing.assert_array_equal(logits(m, [[0, 2]] * 4, True, head=True), logits(m, [[0, 2]] * 4, False))


def test_a_split_layer_sums_to_the_dense_ffn(model4):
    # One FFN on a fixed input: the two sides' partial sums add up to the dense output (up to the order of the
    # float additions; over a whole model that order can flip Q8A roundings, so logits are not compared).
    from pyinfer.runtime.graph_builder import GraphBuilder
    from pyinfer.runtime.hybrid_ffn import hybrid_ffn
    from pyinfer.runtime.sparse_ffn import dense_ffn

    m = pyinfer.load(model4, n_threads=2, n_ctx=64)
    cfg, gguf = m.config, m.gguf
    x = np.random.default_rng(0).standard_normal((3, cfg.d_model)).astype(np.float32)

    def run(blocks):
        b = GraphBuilder()
        h = b.activation("h", cfg.d_model)
        b.add(*[b.weight("x", int(_core.DType.F32), cfg.d_model, 3, x)] * 2, out=h)

        def w(name):
            t = gguf.tensor(name)
            return b.weight(name, t.dtype_id, t.cols, t.rows, t.data)
        out = dense_ffn(b, w, h, 1, cfg) if blocks is None else hybrid_ffn(b, gguf, h, 1, cfg, blocks, 32, 0)
        b.graph.pin(out.id)
        e = _core.Engine(b.graph, max_tokens=3, max_outputs=1, n_threads=2)
        e.run(3)
        return np.array(e.tensor(out.id, 3))

    dense = run(None)
    for blocks in ([1], [0, 3], [0, 1, 2], [0, 1, 2, 3], []):
        np.testing.assert_allclose(run(blocks), dense, rtol=1e-5, atol=1e-5 * np.abs(dense).max(), err_msg=str(blocks))


def test_load_on_the_standin_device(model4):
    cpu = pyinfer.load(model4, n_threads=2, n_ctx=64)
    from pyinfer.place.gpu_placement import fixed_bytes

    minimum = sum(fixed_bytes(cpu.gguf, cpu.config, None, 64).values())
    m = pyinfer.load(model4, n_threads=2, n_ctx=64, device="standin", vram_budget=minimum + 24 * 1024)
    assert 0 < sum(m.placement.report["gpu_neurons"]) < 4 * 128
    assert m.n_copies > 0 and m.running.n_segments > 1
    assert m.generate("Once upon a time", max_tokens=8, temperature=0) == \
        cpu.generate("Once upon a time", max_tokens=8, temperature=0)


@pytest.mark.parametrize("kwargs,message", [
    ({"device": "cpu", "vram_budget": "1G"}, "needs a device"),
    ({"device": "standin"}, "needs a vram_budget"),
    ({"device": "tpu"}, "device must be cpu, cuda, cuda:N or standin"),
    ({"device": "standin", "vram_budget": "1K"}, "below the minimum"),
    ({"device": "standin", "vram_budget": "1G", "sparsity": "auto", "ram_budget": "1G"}, "RAM budget together"),
])
def test_device_errors_are_one_line(model4, kwargs, message):
    with pytest.raises(PyinferError, match=message) as e:
        pyinfer.load(model4, n_threads=1, n_ctx=64, **kwargs)
    assert "\n" not in str(e.value)


def test_cuda_without_a_gpu_says_why_and_the_cpu_still_runs(model4):
    from pyinfer.place.device import cuda_devices

    if _core.cuda_built() and cuda_devices():
        pytest.skip("a GPU is present")
    with pytest.raises(PyinferError, match="without CUDA|no CUDA device"):
        pyinfer.load(model4, n_threads=1, n_ctx=64, device="cuda")
    assert pyinfer.load(model4, n_threads=1, n_ctx=64).generate("Hi", max_tokens=2, temperature=0) is not None


def test_generate_command_takes_the_device_flags(model4, capsys):
    from pyinfer.cli import main

    rc = main(["generate", "-m", model4, "-t", "1", "-c", "64", "--device", "standin", "--vram-budget", "200M",
               "-n", "4", "--temp", "0", "Once upon"])
    assert rc == 0 and capsys.readouterr().out.strip()


def test_sparse_cpu_side_with_an_all_active_plan_equals_dense(tmp_path):
    # Every neuron predicted active: the CPU side's restricted sparse FFN plus the device's dense blocks must
    # give the dense model's decode logits (a float model: no Q8A rounding to flip).
    from gguf import GGMLQuantizationType as Q
    from support.plans import TOKENS, all_active_plan, decode_logits

    path = str(write_tiny_llama(tmp_path / "f32.gguf", seed=3, matrix_type=Q.F32, embed_type=Q.F32))
    dense = pyinfer.load(path, n_threads=2, n_ctx=64)
    want = decode_logits(dense, TOKENS)
    plan = all_active_plan(dense.gguf.fingerprint())
    from pyinfer.place.gpu_placement import fixed_bytes

    minimum = sum(fixed_bytes(dense.gguf, dense.config, plan, 64).values())
    m = pyinfer.load(path, n_threads=2, n_ctx=64, sparsity=plan, device="standin", vram_budget=minimum + 40_000)
    assert any(0 < k < n for k, n in zip(m.placement.report["gpu_neurons"], m.placement.report["n_ff"]))  # split layers
    np.testing.assert_allclose(decode_logits(m, TOKENS), want, rtol=1e-4, atol=1e-4)


def test_restricted_plan_keeps_order_hot_prefix_and_predictor_rows():
    from support.plans import all_active_plan

    from pyinfer.runtime.hybrid_ffn import restrict_plan

    plan = all_active_plan("x", hot=16)
    lp = plan.layers[0]
    neurons = np.arange(32, 96)  # blocks 1 and 2 of 96 neurons
    sub = restrict_plan(plan, 0, neurons, 96).layers[0]
    kept = [k for k in range(96) if lp.perm[k] >= 32]
    assert list(sub.perm) == [int(lp.perm[k]) - 32 for k in kept]
    assert sub.hot == sum(k < 16 for k in kept)
    assert sub.predictor.w2_q8.shape[0] == len(neurons) - sub.hot == len(sub.predictor.cut)
    assert plan.layers[0] is lp and restrict_plan(plan, 0, neurons, 96).layers[1] is plan.layers[1]


def test_server_runs_the_hybrid_split(model4):
    pytest.importorskip("fastapi")
    from pyinfer.serve.server import build_server

    _app, loop, _model = build_server(model4, 256, n_threads=1, device="standin", vram_budget="200M")
    assert loop is not None
    with pytest.raises(PyinferError, match="needs a device"):
        build_server(model4, 256, n_threads=1, vram_budget="200M")


def test_sparse_decode_on_both_sides_is_the_same_on_one_backend(tiny_model_path):
    # Random predictors (each token's list a different half of the cold neurons): the CPU side's restricted
    # plan and the device side's own predictor rows must pick the same neurons whether the device is a second
    # backend or not, so the decode logits agree bit for bit.
    from support.plans import varying_predictor_plan
    from support.plans import TOKENS

    from pyinfer.runtime.sparse_ffn import SparseRuns

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(m.gguf.fingerprint())
    pl = {"gpu_blocks": [[0], [1, 2]], "block": 32, "head_on_gpu": False}

    def decode(two_backends: bool) -> np.ndarray:
        b = build_model_graph(m.gguf, m.config, 64, plan, SparseRuns(max_tokens=1), placement=Placement.of(pl))
        kw = {"placement": b.placement, "backend_threads": [2, 1], "backend_memory": [0, 1]} if two_backends else {}
        e = _core.Engine(b.graph, max_tokens=16, max_outputs=16, n_threads=2, **kw)
        out = []
        for i, t in enumerate(TOKENS):
            e.run(1, np.array([t], np.int32), np.array([i], np.int32), np.array([0], np.int32))
            out.append(np.array(e.logits())[0].copy())
        return np.stack(out)

    np.testing.assert_array_equal(decode(True), decode(False))


def test_a_placement_file_is_checked_against_the_load(model4, tmp_path, monkeypatch):
    from pyinfer.cli import main

    monkeypatch.setenv("PYINFER_CACHE", str(tmp_path))
    out = str(tmp_path / "p.json")
    assert main(["place", "-m", model4, "-t", "1", "-c", "64", "--sparsity", "off", "--vram-budget", "200M",
                 "--tokens", "2", "-o", out]) == 0
    m = pyinfer.load(model4, n_threads=1, n_ctx=64, device="standin", vram_budget=out)
    assert m.placement.report["gpu_blocks"] and m.generate("Hi", max_tokens=2, temperature=0) is not None
    with pytest.raises(PyinferError, match="placed for n_ctx 64"):
        pyinfer.load(model4, n_threads=1, n_ctx=32, device="standin", vram_budget=out)


def test_a_q8_0_kv_cache_lowers_the_minimum(model4):
    from pyinfer.place.gpu_placement import fixed_bytes

    m = pyinfer.load(model4, n_threads=1, n_ctx=64)
    f16, q8 = (fixed_bytes(m.gguf, m.config, None, 4096, t)["kv_cache"] for t in ("f16", "q8_0"))
    assert q8 * 32 == f16 * 17


def test_bench_json_says_where_the_model_ran(model4, capsys):
    import json

    from pyinfer.cli import main

    rc = main(["bench", "-m", model4, "-t", "1", "--device", "standin", "--vram-budget", "200M", "--prompt-tokens", "8",
               "--gen-tokens", "4", "--repetitions", "1", "--json"])
    d = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and d["device"]["device"] == "standin" and d["device"]["copies_per_run"] > 0
    assert 0 < d["device"]["ffn_share_on_gpu"] <= 1


def _halves_wait_for_each_other(engine) -> list[int]:
    """Layers where one half of a split FFN waits for the other (the executor's plan, no timing). A layer's
    FFN nodes run from its "ffn_in" to the next "attn_in" (the last one's to "x_out"); a backend's half is
    its segments holding matmuls of that range, and none may depend on the other backend's half."""
    names, ops, segs = engine.node_names(), engine.node_ops(), engine.segments()
    ffn_in = [i for i, n in enumerate(names) if n == "ffn_in"]
    ends = [i for i, n in enumerate(names) if n == "attn_in"][1:] + [names.index("x_out")]
    serial = []
    for il, (lo, hi) in enumerate(zip(ffn_in, ends)):
        half = {0: set(), 1: set()}
        for k, s in enumerate(segs):
            if any(lo <= i < hi and ops[i] == _core.Op.MAT_MUL for i in s["nodes"]):
                half[s["backend"]].add(k)
        if any(half[1 - be] & set(segs[k]["deps"]) for be in (0, 1) for k in half[be]):
            serial.append(il)
    return serial


@pytest.mark.parametrize("sparse,weights", [(False, "Q4_1"), (True, "Q4_1"), (True, "F16")])
def test_the_two_halves_of_a_split_layer_run_at_the_same_time(tiny_model_path, tmp_path, sparse, weights):
    # Neither half of a split layer waits for the other, only for the layer's input (the device's half once
    # waited for the CPU's: it read h's Q8A copy from the CPU's segment).
    from support.plans import varying_predictor_plan

    from pyinfer.runtime.sparse_ffn import SparseRuns

    # (F16 weights: no Q8A copy for the matmuls, but a predictor's w1 is Q8_0: the device makes that copy too)
    if weights == "F16":
        from gguf import GGMLQuantizationType as Q
        tiny_model_path = str(write_tiny_llama(tmp_path / "f16.gguf", matrix_type=Q.F16, embed_type=Q.F16))
    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(m.gguf.fingerprint()) if sparse else None
    pl = {"gpu_blocks": [[0], [1, 2]], "block": 32, "head_on_gpu": False}
    b = build_model_graph(m.gguf, m.config, 64, plan, SparseRuns(max_tokens=1), placement=Placement.of(pl))
    e = _core.Engine(b.graph, max_tokens=16, max_outputs=16, n_threads=2, placement=b.placement,
                     backend_threads=[2, 1], backend_memory=[0, 1])
    assert _halves_wait_for_each_other(e) == []


def test_the_device_side_of_a_batch_step_is_sparse_per_token(tiny_model_path):
    # A run of up to runs.max_tokens tokens (a batch's decode step) is sparse on the device too, each token
    # with its own list: four tokens in one run give what four one-token runs give (float order aside), and
    # differ from the same run taken dense (random predictors drop about half the cold neurons).
    from support.plans import varying_predictor_plan
    from support.plans import TOKENS

    from pyinfer.runtime.sparse_ffn import SparseRuns

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(m.gguf.fingerprint())
    pl = {"gpu_blocks": [[0, 1], [0, 1, 2]], "block": 32, "head_on_gpu": True}
    ids = np.array(TOKENS[:4], np.int32)

    def logits(runs: SparseRuns, one_by_one: bool) -> np.ndarray:
        b = build_model_graph(m.gguf, m.config, 64, plan, runs, placement=Placement.of(pl))
        e = _core.Engine(b.graph, max_tokens=16, max_outputs=16, n_threads=2, placement=b.placement,
                         backend_threads=[2, 1], backend_memory=[0, 1])
        if not one_by_one:
            e.run(4, ids, np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int32))
            return np.array(e.logits())[:4].copy()
        out = []
        for i in range(4):
            e.run(1, ids[i:i + 1], np.array([i], np.int32), np.array([0], np.int32))
            out.append(np.array(e.logits())[0].copy())
        return np.stack(out)

    every = SparseRuns.every_token(16)
    single, batch = logits(every, True), logits(every, False)
    dense_batch = logits(SparseRuns(max_tokens=1), False)  # four tokens: dense on both sides
    scale = np.abs(single).max()
    assert np.abs(batch - single).max() <= 1e-3 * scale
    assert np.abs(dense_batch - single).max() > 1e-2 * scale


def test_a_q4_model_on_the_device_alone_decodes_as_the_cpu_with_q4t_downs(tiny_model_path):
    # The device's sparse side holds a Q4_1 model's downs as Q4T, the lossless form the CPU's auto choice
    # also takes: with every neuron on the device, decode equals the CPU's bit for bit.
    from support.plans import varying_predictor_plan
    from support.plans import TOKENS

    m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    plan = varying_predictor_plan(m.gguf.fingerprint())

    def decode(model) -> np.ndarray:
        out = []
        for i, t in enumerate(TOKENS):
            out.append(model.forward([t], i, np.array([0]))[0])
        return np.stack(out)

    cpu = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, neuron_down="q4t")
    dev = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, sparsity=plan, device="standin", vram_budget="1G")
    assert sum(dev.placement.report["gpu_neurons"]) == sum(dev.placement.report["n_ff"])
    np.testing.assert_array_equal(decode(dev), decode(cpu))


def test_default_threads_leave_a_core_for_the_device(monkeypatch):
    """The CPU pool spins between nodes; with a device, one core stays for its executor thread."""
    from pyinfer.runtime import threads

    monkeypatch.setattr(threads, "physical_cores", lambda: 16)
    assert threads.default_threads("cpu") == 16
    assert threads.default_threads("cuda") == 15 and threads.default_threads("standin") == 15
    monkeypatch.setattr(threads, "physical_cores", lambda: 1)
    assert threads.default_threads("cuda:0") == 1
