"""Concurrency and failure: several threads on one engine or model, errors on pool and driver threads,
and two CPU backend instances running parts of one graph at the same time."""
import os
import threading

import numpy as np
import pytest

import pyinfer
from pyinfer import _core
from pyinfer.runtime.graph_builder import GraphBuilder
from pyinfer.runtime.model_graph import build_model_graph

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Water boils at"]


def run_threads(fn, n: int, timeout: float = 120.0) -> list:
    """Runs fn(i) on n daemon threads; fails (instead of hanging the suite) if any is still running."""
    out, errors = [None] * n, []

    def body(i):
        try:
            out[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "threads still running: deadlock or livelock"
    if errors:
        raise errors[0]
    return out


def test_four_threads_generate_what_they_would_alone(real_model):
    want = [real_model.generate(p, max_tokens=12, temperature=0) for p in PROMPTS]
    start = threading.Barrier(len(PROMPTS))

    def gen(i):
        start.wait()
        return real_model.generate(PROMPTS[i], max_tokens=12, temperature=0)

    assert run_threads(gen, len(PROMPTS)) == want


def test_four_threads_on_one_engine(tiny_model_path):
    """The C++ engine alone: concurrent runs are serialized (before: both callers drove the pool as thread 0)."""
    from pyinfer.runtime.sparse_ffn import SparseRuns
    from pyinfer.options import LoadOptions
    from pyinfer.session import Session

    eng = Session(tiny_model_path, 64, LoadOptions(n_threads=2)).build(64, 64, SparseRuns(max_tokens=1)).engine
    ids = np.array([1, 5, 9, 13], np.int32)
    pos = np.arange(4, dtype=np.int32)
    eng.run(4, ids, pos, np.array([3], np.int32))
    want = np.array(eng.logits())

    def hammer(i):
        for _ in range(200):
            eng.run(4, ids, pos, np.array([3], np.int32))

    run_threads(hammer, 4)
    eng.run(4, ids, pos, np.array([3], np.int32))
    np.testing.assert_array_equal(eng.logits(), want)


def test_interleaved_streams_in_one_thread(tiny_model_path):
    """Two streams of one model consumed alternately by one thread: each re-reads its own sequence."""
    m = pyinfer.load(tiny_model_path, n_threads=1, n_ctx=64)
    want_a = list(m._token_stream(m.tokenize("the cat"), 8, pyinfer.api.Sampler(pyinfer.api.SamplingParams(0))))
    want_b = list(m._token_stream(m.tokenize("a dog"), 8, pyinfer.api.Sampler(pyinfer.api.SamplingParams(0))))
    a = m._token_stream(m.tokenize("the cat"), 8, pyinfer.api.Sampler(pyinfer.api.SamplingParams(0)))
    b = m._token_stream(m.tokenize("a dog"), 8, pyinfer.api.Sampler(pyinfer.api.SamplingParams(0)))
    got_a, got_b = [], []
    for x, y in zip(a, b):
        got_a.append(x)
        got_b.append(y)
    assert len(got_a) == len(want_a) and len(got_b) == len(want_b)
    # Re-prefilled steps run the batched kernels: same tokens for this float model's greedy path.
    assert got_a == want_a and got_b == want_b


def tiny_engine(path, **kw):
    m = pyinfer.load(path, n_threads=1, n_ctx=64)
    b = build_model_graph(m.gguf, m.config, 64)
    return m, b


def run_prompt(engine, n=6):
    ids = np.arange(1, n + 1, dtype=np.int32)
    engine.run(n, ids, np.arange(n, dtype=np.int32), np.arange(n, dtype=np.int32))
    return np.array(engine.logits())


def test_more_threads_than_cores(tiny_model_path):
    """More pool threads than this process may run on: the waits then yield the core (before, -t 4 on 2
    cores decoded at 0.4 tok/s, each spinning waiter holding the core its straggler needed). Same bits as
    one thread per core; each of many short steps finishes (the run_threads guard fails a livelock)."""
    _, b = tiny_engine(tiny_model_path)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    want = run_prompt(_core.Engine(b.graph, max_tokens=8, max_outputs=8, n_threads=min(cores, 2)))
    eng = _core.Engine(b.graph, max_tokens=8, max_outputs=8, n_threads=cores + 3)
    got = run_threads(lambda _: [run_prompt(eng) for _ in range(50)], 1)[0]
    for logits in got:
        np.testing.assert_array_equal(logits, want)


@pytest.mark.parametrize("thread", [0, 1])
def test_error_on_a_pool_thread_comes_back(tiny_model_path, thread):
    _, b = tiny_engine(tiny_model_path)
    eng = _core.Engine(b.graph, max_tokens=8, max_outputs=8, n_threads=2)
    want = run_prompt(eng)
    eng._inject_fault(5, thread)
    with pytest.raises(RuntimeError, match="injected fault in node 5"):
        run_prompt(eng)
    eng._inject_fault(-1, -1)
    np.testing.assert_array_equal(run_prompt(eng), want)  # the pool is still in step


def ffn_on_second_backend(b: GraphBuilder, residual: bool = True) -> None:
    """Every node from the FFN norm to the residual add of each layer runs on backend 1 (without `residual`,
    the add stays on backend 0: the residual stream is written in place, in one memory space only)."""
    on_b1 = False
    for k, (op, dst) in enumerate(b.node_ops):
        if op == _core.Op.RMS_NORM and dst == "ffn_in":
            on_b1 = True
        if on_b1 and op == _core.Op.ADD:
            on_b1 = False
            if not residual:
                continue
            b.place(k, 1)
        if on_b1:
            b.place(k, 1)


@pytest.mark.parametrize("threads", [[1, 1], [2, 1]])
def test_two_backends_equal_one(tiny_model_path, threads):
    _, b1 = tiny_engine(tiny_model_path)
    want = run_prompt(_core.Engine(b1.graph, max_tokens=8, max_outputs=8, n_threads=sum(threads)))
    _, b2 = tiny_engine(tiny_model_path)
    ffn_on_second_backend(b2)
    eng = _core.Engine(b2.graph, max_tokens=8, max_outputs=8, backend_threads=threads, placement=b2.placement)
    assert eng.n_segments > 2
    for _ in range(3):
        np.testing.assert_array_equal(run_prompt(eng), want)


def test_error_on_the_second_backend_comes_back(tiny_model_path):
    _, b = tiny_engine(tiny_model_path)
    ffn_on_second_backend(b)
    ffn_node = next(k for k, (op, dst) in enumerate(b.node_ops) if dst == "ffn_in")
    eng = _core.Engine(b.graph, max_tokens=8, max_outputs=8, backend_threads=[1, 2], placement=b.placement)
    want = run_prompt(eng)
    eng._inject_fault(ffn_node + 1, 1, backend=1)
    with pytest.raises(RuntimeError, match="injected fault"):
        run_prompt(eng)   # backend 0 waits on a segment that never finishes: it must stop waiting
    eng._inject_fault(-1, -1, backend=1)
    np.testing.assert_array_equal(run_prompt(eng), want)


def test_two_backends_overlap_independent_chains():
    """Two chains with no dependency between them, one per backend, then a merge: both drivers run at once
    (the TSan build checks this run for races)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32) * 0.1
    x = rng.standard_normal((4, 64)).astype(np.float32)

    def build(two: bool):
        b = GraphBuilder()
        W = b.weight("w", int(_core.DType.F32), 64, 64, w)
        X = b.weight("x", int(_core.DType.F32), 64, 4, x)
        a, c = X, X
        for i in range(6):
            a = b.matmul(W, a, f"a{i}")
            if two:
                b.place(b.graph.n_nodes - 1, 1)
            c = b.matmul(W, c, f"c{i}")
        out = b.add(a, c, name="out")
        b.graph.pin(out.id)
        return b, out

    b1, out1 = build(False)
    e1 = _core.Engine(b1.graph, max_tokens=4, max_outputs=4, n_threads=1)
    e1.run(4)
    b2, out2 = build(True)
    e2 = _core.Engine(b2.graph, max_tokens=4, max_outputs=4, backend_threads=[1, 1], placement=b2.placement)
    for _ in range(20):
        e2.run(4)
        np.testing.assert_array_equal(e2.tensor(out2.id, 4), e1.tensor(out1.id, 4))


def ffn_halves_graph(two: bool, layers: int = 3, d: int = 64, ff: int = 96, seed: int = 0):
    """Every layer's FFN in two halves, `hot` neurons [0, ff/2) and `cold` ones [ff/2, ff), whose partial outputs
    are added: the halves are views of one up [ff, d] (rows) and one down [d, ff] (columns). With `two`, the
    hot half runs on backend 1 (PowerInfer's hybrid split, with a CPU backend standing in for the GPU)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = rng.standard_normal((4, d)).astype(np.float32)
    h = b.weight("x", int(_core.DType.F32), d, 4, x)
    hot_nodes, cold_nodes = [], []
    half = ff // 2
    for il in range(layers):
        up = rng.standard_normal((ff, d)).astype(np.float32) * 0.1
        down = rng.standard_normal((d, ff)).astype(np.float32) * 0.1
        UP = b.weight(f"blk.{il}.up", int(_core.DType.F32), d, ff, up)
        DOWN = b.weight(f"blk.{il}.down", int(_core.DType.F32), ff, d, down)
        halves = {}
        for name, start in (("hot", 0), ("cold", half)):
            up_v = b.view(UP, f"blk.{il}.up.{name}", rows=half, row_offset=start)
            down_v = b.view(DOWN, f"blk.{il}.down.{name}", cols=half, col_offset=start)
            act = b.matmul(up_v, h, f"{name}{il}")
            halves[name] = b.matmul(down_v, act, f"{name}_out{il}")
            (hot_nodes if name == "hot" else cold_nodes).extend([b.graph.n_nodes - 2, b.graph.n_nodes - 1])
        h = b.add(halves["hot"], halves["cold"], name=f"h{il}")
    if two:
        for k in hot_nodes:
            b.place(k, 1)
    b.graph.pin(h.id)
    return b, h, hot_nodes, cold_nodes


def test_cold_half_runs_beside_the_hot_half():
    """The executor cuts a backend's segment only where it needs the other backend: the cold half of each
    layer waits for nothing the hot half computes, only the merge does. Results equal one backend's exactly,
    and every segment's span is recorded."""
    b1, out1, _, _ = ffn_halves_graph(False)
    e1 = _core.Engine(b1.graph, max_tokens=4, max_outputs=4, n_threads=1)
    e1.run(4)
    b2, out2, hot, cold = ffn_halves_graph(True)
    e2 = _core.Engine(b2.graph, max_tokens=4, max_outputs=4, backend_threads=[1, 1], placement=b2.placement)
    segs = e2.segments()
    seg_of = {n: i for i, s in enumerate(segs) for n in s["nodes"]}
    for k in range(0, len(cold), 2):  # per layer: its cold segment does not wait for its hot segment
        hot_seg, cold_seg = seg_of[hot[k]], seg_of[cold[k]]
        assert segs[hot_seg]["backend"] == 1 and segs[cold_seg]["backend"] == 0
        assert hot_seg not in segs[cold_seg]["deps"]
    e2.set_timeline(True)
    for _ in range(10):
        e2.run(4)
        np.testing.assert_array_equal(e2.tensor(out2.id, 4), e1.tensor(out1.id, 4))
    spans = e2.timeline()
    assert len(spans) == len(segs) and all(0 <= t0 <= t1 for _, _, t0, t1 in spans)
