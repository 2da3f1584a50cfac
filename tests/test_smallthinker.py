"""SmallThinker (model/arch/smallthinker.py): the router on each layer's input before attention (so a streamed
layer's experts are read while attention runs), ReGLU experts, NoPE global layers beside sliding ones. The MoE
tests (test_moe.py) run it through every expert path; here what is its own."""
import numpy as np
import pytest
from support.reference_llama import reference_logits
from support.tiny_model import write_tiny_arch

import pyinfer
from pyinfer._core import Op
from pyinfer.model.config import Activation


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    return {name: str(write_tiny_arch(d / f"{name}.gguf", "smallthinker", config=cfg))
            for name, cfg in (("window", {}), ("sigmoid", {"sigmoid": True, "swa": False}))}


def test_layers_route_before_attention_and_globals_rotate_nothing(paths):
    m = pyinfer.load(paths["window"], n_ctx=64, progress=False)
    c = m.config
    assert c.activation == Activation.RELU and c.router_before_attention and c.expert_norm
    assert c.nope_layers == (True, False, False, False, True) and c.local_layers == (False, True, True, True, False)
    assert c.sliding_window == 4096  # llama.cpp's size, whatever the file says


@pytest.mark.parametrize("name", ["window", "sigmoid"])
def test_matches_the_reference(paths, name):
    m = pyinfer.load(paths[name], n_ctx=64, n_threads=2, progress=False)
    ids = np.random.default_rng(1).integers(0, m.config.vocab_size, 24).tolist()
    want = reference_logits(m.gguf, ids, cache_fp16=True)
    got = m.eval(ids, all_logits=True)
    assert np.abs(got - want).max() < 0.005 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_the_route_comes_before_attention_in_every_layer(paths):
    """Node order is run order within a segment: each layer's router matmul and route precede its attention."""
    from pyinfer.model.arch import model_config, open_model
    from pyinfer.runtime.model_graph import build_model_graph

    f = open_model(paths["window"])
    b = build_model_graph(f, model_config(f), 64)
    order = [(op, name) for op, name in b.node_ops]
    routes = [i for i, (op, _) in enumerate(order) if op == Op.MOE_ROUTE]
    attns = [i for i, (op, _) in enumerate(order) if op == Op.ATTENTION]
    assert len(routes) == len(attns) == 5 and all(r < a for r, a in zip(routes, attns))


@pytest.mark.parametrize("prefetch", [True, False])
def test_streamed_experts_read_during_attention_give_the_in_ram_answer(paths, monkeypatch, prefetch):
    """Experts from a store of 8 cache slots: with read-ahead on, each layer's exact choice starts reading before
    its attention (every prediction right, none of the next-layer guessing other families do); the logits are the
    in-RAM run's bit for bit either way."""
    from pyinfer.offload import experts as ex

    path = paths["window"]
    ram = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    ids = list(range(3, 23))
    want_prefill = ram.eval(ids, all_logits=True)
    ram2 = pyinfer.load(path, n_ctx=64, n_threads=2, progress=False)
    want_decode = np.stack([ram2.eval(ids[:i + 1]) for i in range(10)])

    def make(session, ram_budget=None, progress=True):
        plan = ex.ExpertPlan(0, ex.slot_bytes(session.gguf, session.config), [[0, 1], [2], [], [], [3]], 8, "lru")
        return ex.ExpertOffload(session.gguf, session.config, plan, prefetch=prefetch)

    monkeypatch.setattr(ex, "make_expert_offload", make)
    m = pyinfer.load(path, n_ctx=64, n_threads=2, mem_limit="4G", progress=False)
    np.testing.assert_array_equal(m.eval(ids, all_logits=True), want_prefill)
    m2 = pyinfer.load(path, n_ctx=64, n_threads=2, mem_limit="4G", progress=False)
    m2.session.experts.store.reset_stats()
    np.testing.assert_array_equal(np.stack([m2.eval(ids[:i + 1]) for i in range(10)]), want_decode)
    st = m2.session.experts.report(tokens=10)
    assert st["fetches"] == 10 * 5 and st["misses"] > 0
    if prefetch:
        assert st["predicted"] > 0 and st["predicted_right"] == st["predicted"]
    else:
        assert st["predicted"] == st["prefetched"] == 0


def test_decode_cuts_relu_experts_at_zero_and_changes_no_number(paths):
    """ReGLU experts: on the CPU, decode reads up only for the neurons whose gate is positive (the cut inside the
    experts at 0, on by default); one token at a time equals the whole prompt at once, which runs every neuron."""
    from pyinfer import _core

    np.testing.assert_array_equal(_core.gate_cut_bounds(3, np.array([0.0, 0.5], np.float32)),
                                  [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])  # g > t, nothing below
    m = pyinfer.load(paths["window"], n_ctx=64, n_threads=2, progress=False)
    assert m.session.expert_cuts is not None and m.session.expert_cuts.exact
    ids = list(range(3, 19))
    whole = m.eval(ids, all_logits=True)
    one = pyinfer.load(paths["window"], n_ctx=64, n_threads=2, progress=False)
    steps = np.stack([one.eval(ids[:i + 1]) for i in range(len(ids))])
    np.testing.assert_allclose(steps, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())
