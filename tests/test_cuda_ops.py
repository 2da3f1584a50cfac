"""Every op the CUDA backend runs against the CPU backend (ggml's test-backend-ops): one small graph per case,
computed once with every node on the GPU and once on the CPU, compared within the tolerance stated per op.
Skipped without a CUDA build and a GPU (bench/gpu/check.sh runs them on a GPU machine);
PYINFER_TEST_DEVICE=standin runs them against a second CPU backend instead, which checks the harness itself."""
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants
from support.tiny_model import random_blocks

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.model.config import Activation
from pyinfer.place.device import cuda_devices
from pyinfer.runtime.graph_builder import GraphBuilder

DEVICE = os.environ.get("PYINFER_TEST_DEVICE", "cuda:0")
pytestmark = pytest.mark.skipif(DEVICE != "standin" and not (_core.cuda_built() and cuda_devices()),
                                reason="needs a CUDA build and a GPU")
RNG = np.random.default_rng(7)


def both(build, n_tokens: int, max_tokens: int = 16, before: list[dict] | None = None, **run_kw):
    """(CPU outputs, GPU outputs) of the graph `build(b)` returns, every node on the device for the second.
    `before`: keyword arguments of earlier runs of the same engine (outputs then hold that run's values, so a
    kernel that skips writing a 0 is caught; a fresh device buffer starts as zeros)."""
    global RNG
    outs = []
    for device in (False, True):
        RNG = np.random.default_rng(7)  # the same random inputs for both builds
        b = GraphBuilder()
        out = build(b)
        out = out if isinstance(out, tuple) else (out,)
        for t in out:
            b.graph.pin(t.id)
        kw = {}
        if device:  # every node on the device but the active union (a guard's decision, read on the host)
            placement = [0 if op == _core.Op.ACTIVE_UNION else 1 for op, _ in b.node_ops]
            kw = {"placement": placement, "backend_threads": [1, 1], "backend_memory": [0, 1],
                  "backend_kinds": ["cpu", "cpu" if DEVICE == "standin" else DEVICE]}
        e = _core.Engine(b.graph, max_tokens=max_tokens, max_outputs=max_tokens, n_threads=2, **kw)
        for earlier in before or []:
            e.run(n_tokens, **earlier)
        e.run(n_tokens, **run_kw)
        n_out = len(run_kw.get("out_ids", []))
        rows = {_core.RowMode.TOKENS: n_tokens, _core.RowMode.OUTPUTS: n_out}
        outs.append([np.array(e.tensor(t.id, rows.get(t.rows, t.n_rows))) for t in out])
    return outs


def close(a, b, rtol):
    for x, y in zip(a, b):
        np.testing.assert_allclose(y, x, rtol=rtol, atol=rtol * max(1.0, float(np.abs(x).max())))


def f32(b, name, rows, cols, data=None):
    data = RNG.standard_normal((rows, cols)).astype(np.float32) if data is None else data
    return b.weight(name, int(DType.F32), cols, rows, data)


# The low-bit types: the device decodes them with the CPU reference's own piece decoder (kernels/piece_decode.h).
LOW_BIT = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S]
WEIGHTS = [Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, *LOW_BIT]


def weight_bytes(qtype, rows, cols):
    if qtype in (Q.F32, Q.F16):
        return RNG.standard_normal((rows, cols)).astype(np.float32 if qtype == Q.F32 else np.float16)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
        return quants.quantize(RNG.standard_normal((rows, cols)).astype(np.float32), qtype)
    return random_blocks(qtype, rows, cols, RNG)


# Matmul: fp32 accumulation in another order than the CPU's integer dots: 1e-4 of the output's scale.
@pytest.mark.parametrize("qtype", WEIGHTS)
@pytest.mark.parametrize("n_tok", [1, 3, 9])
def test_matmul(qtype, n_tok):
    rows, k = 37, 512
    w = weight_bytes(qtype, rows, k)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)
    close(*both(lambda b: b.matmul(b.weight("w", int(qtype), k, rows, w), f32(b, "x", n_tok, k, x), "y"), n_tok),
          1e-4)


# Prefill's matmuls (32 tokens or more) go through cuBLAS where libcublas loads: weight and activations in
# fp16 (11-bit mantissas), fp32 accumulation: 2e-3 of the output's scale. Without libcublas the backend's
# own kernel runs and meets it too.
# (x is F32 for float weights and its Q8A copy for the others, as b.matmul makes it.)
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_matmul_prefill(qtype):
    rows, k, n_tok = 70, 512, 40
    w = weight_bytes(qtype, rows, k)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)
    close(*both(lambda b: b.matmul(b.weight("w", int(qtype), k, rows, w), f32(b, "x", n_tok, k, x), "y"), n_tok,
                max_tokens=64), 2e-3)


# A weight wider than cuBLAS's fp16 tile (2048 rows of 4096) is converted and multiplied in two tiles.
def test_matmul_prefill_in_tiles():
    rows, k, n_tok = 2500, 4096, 33
    w = weight_bytes(Q.Q4_0, rows, k)
    x = RNG.standard_normal((n_tok, k)).astype(np.float32)
    close(*both(lambda b: b.matmul(b.weight("w", int(Q.Q4_0), k, rows, w), f32(b, "x", n_tok, k, x), "y"), n_tok,
                max_tokens=64), 2e-3)


# Embedding rows: exact dequantization (1e-6).
@pytest.mark.parametrize("qtype", [Q.F16, Q.Q4_0, Q.Q8_0, Q.Q6_K, Q.Q2_K, Q.IQ3_S])
def test_get_rows(qtype):
    rows, cols = 6, 512
    w = weight_bytes(qtype, rows, cols)
    ids = np.array([5, 0, 3], np.int32)
    close(*both(lambda b: b.get_rows(b.weight("t", int(qtype), cols, rows, w),
                                     b.weight("ids", int(DType.I32), 1, 3, ids), "r", scale=2.0), 3), 1e-6)


# Float ops: 1e-5.
def test_rms_norm_whole_rows_and_segments():
    def build(b):
        x = f32(b, "x", 4, 128)
        wt = f32(b, "w", 1, 128)
        return b.rms_norm(x, wt, 1e-6, "a"), b.rms_norm(x, f32(b, "w32", 1, 32), 1e-6, "s", segment=32)
    close(*both(build, 4), 1e-5)


@pytest.mark.parametrize("neox", [False, True])
def test_rope(neox):
    pos = np.array([0, 5, 17, 1000], np.int32)

    def build(b):
        x = f32(b, "x", 4, 4 * 64)
        y = b.add(x, f32(b, "zero", 4, 256, np.zeros((4, 256), np.float32)), name="y")  # rope writes in place
        return b.rope(y, b.weight("p", int(DType.I32), 1, 4, pos), 4, 64, 10000.0, neox=neox)
    close(*both(build, 4), 1e-5)


@pytest.mark.parametrize("act", [0, 1, 2, 3, 4])
def test_gated_mul_add_bias_relu(act):
    def build(b):
        g, u = f32(b, "g", 3, 96), f32(b, "u", 3, 96)
        return (b.gated_mul(g, u, name="act", act=act), b.add(g, u, name="sum"),
                b.bias_relu(b.add(g, u, name="sum2"), f32(b, "bias", 1, 96)), b.add(g, u, name="scaled", scale=0.22))
    close(*both(build, 3), 1e-5)


def test_quantize_select_rows_scatter_cols():
    perm = RNG.permutation(64).astype(np.int32)

    def build(b):
        x = f32(b, "x", 5, 64)
        q = b.quantize(x)
        out_ids = b.input("out_ids", _core.RowMode.OUTPUTS)
        b.graph.input_out_ids = out_ids.id
        sel = b.select_rows(x, out_ids, "sel")
        return q, sel, b.scatter_cols(x, b.weight("perm", int(DType.I32), 64, 1, perm), "sc")
    cpu, gpu = both(build, 5, out_ids=np.array([4, 1], np.int32))
    np.testing.assert_array_equal(gpu[0], cpu[0])  # Q8A blocks: the same rounding (half to even)
    close(cpu[1:], gpu[1:], 0)


# Attention over the fp16 cache: online softmax in another order, 1e-4.
@pytest.mark.parametrize("window", [0, 5])
def test_kv_store_and_attention(window):
    heads, kv_heads, hd, n = 4, 2, 64, 9
    pos = np.arange(n, dtype=np.int32)

    def build(b):
        q, k, v = f32(b, "q", n, heads * hd), f32(b, "k", n, kv_heads * hd), f32(b, "v", n, kv_heads * hd)
        p = b.weight("pos", int(DType.I32), 1, n, pos)
        kc, vc = b.state("kc", kv_heads * hd, 32), b.state("vc", kv_heads * hd, 32)
        b.kv_store(kc, k, p)
        b.kv_store(vc, v, p)
        return b.attention(q, kc, vc, p, heads, kv_heads, hd, "o", window=window)
    close(*both(build, n), 1e-4)


# The whole tiny model on the device, then split with the CPU: greedy tokens equal, logits within 1% of their
# scale on average (the device's float order can flip an activation's Q8A rounding, which then propagates).
def test_whole_model_and_hybrid_split(tiny_model_path):
    import pyinfer

    cpu = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64)
    device = "standin" if DEVICE == "standin" else DEVICE
    ids = cpu.tokenize("Once upon a time there was")
    want = cpu.eval(ids, all_logits=True)
    for budget in ("4G", None):
        if budget is None:  # attention, KV cache and scratch, plus about half the FFN
            from pyinfer.place.gpu_placement import fixed_bytes

            ffn = sum(t.data.nbytes for n, t in cpu.gguf.tensors.items() if ".ffn_" in n)
            budget = sum(fixed_bytes(cpu.gguf, cpu.config, None, 64).values()) + ffn // 2
        m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, device=device, vram_budget=budget)
        got = m.eval(ids, all_logits=True)
        assert np.abs(got - want).mean() <= 0.01 * np.abs(want).mean()
        assert m.generate("Once upon a time", max_tokens=8, temperature=0) == \
            cpu.generate("Once upon a time", max_tokens=8, temperature=0)


@pytest.mark.skipif(DEVICE == "standin", reason="the stand-in is a CPU backend: it runs every op, so refuses none")
def test_the_engine_refuses_a_sparse_op_on_the_gpu():
    # The batch's union of active lists is a guard's decision, read on the host: the device backend refuses it.
    b = GraphBuilder()
    lists = b.active_set(f32(b, "s", 2, 64), 64, "lists", threshold=0.5)
    b.graph.pin(b.active_union(lists, 64, "union", max_tokens=16).id)
    with pytest.raises(_core.GraphError, match="cannot run node .*active_union.*place it on the CPU"):
        _core.Engine(b.graph, max_tokens=16, max_outputs=16, n_threads=2, placement=[1] * len(b.node_ops),
                     backend_threads=[1, 1], backend_memory=[0, 1], backend_kinds=["cpu", DEVICE])


def assert_lists_equal(got, want):
    """Active lists row by row: the count, then the listed neurons. Entries past the count are scratch (the CPU
    appends branch-free, so the last neuron it looked at sits there), not part of the list."""
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    for t, n in enumerate(want[:, 0]):
        np.testing.assert_array_equal(got[t, 1:1 + n], want[t, 1:1 + n], err_msg=f"token {t}")


# Neuron-aware ops: lists exact; gather-GEMV, gated activation and down axpy within 1e-4 of their scale.
@pytest.mark.parametrize("variant", ["columns", "atomics"])
@pytest.mark.parametrize("shared", [False, True])
def test_neuron_aware_ops(variant, shared, monkeypatch):
    monkeypatch.setenv("PYINFER_CUDA_AXPY", variant)
    n_ff, d, n = 96, 64, 3
    w_gate, w_up = (quants.quantize(RNG.standard_normal((n_ff, d)).astype(np.float32), Q.Q8_0) for _ in range(2))
    down = quants.quantize(RNG.standard_normal((n_ff, d)).astype(np.float32), Q.Q8_0)  # neuron-major rows

    def build(b):
        lists = b.active_set(f32(b, "s", n, n_ff), n_ff, "lists", threshold=0.6)
        x = f32(b, "x", n, d)
        # shared: one list for every token, the batch's union (its op runs on the CPU: guards read it there)
        gather = b.active_union(lists, n_ff, "union", max_tokens=16) if shared else lists
        g = b.matmul(b.weight("wg", int(Q.Q8_0), d, n_ff, w_gate), x, "g", active=gather)
        u = b.matmul(b.weight("wu", int(Q.Q8_0), d, n_ff, w_up), x, "u", active=gather)
        b.gated_act(g, u, lists, 0.1)
        y = b.down_axpy(b.weight("down", int(Q.Q8_0), d, n_ff, down), g, lists, "y")
        return lists, g, y
    cpu, gpu = both(build, n)
    assert_lists_equal(gpu[0], cpu[0])
    close(cpu[1:], gpu[1:], 1e-4)


# The down axpy over a Q4T down (the lossless neuron-major form of a Q4_0/Q4_1 down: nibbles, each 32-neuron
# group's scales and offsets per column, rows in the original order reached through row_map): 1e-4 (the CPU sums
# each group in integers from two int8 digits per coefficient, the GPU in float).
@pytest.mark.parametrize("variant", ["columns", "atomics"])
@pytest.mark.parametrize("src_type", ["Q4_0", "Q4_1"])
def test_down_axpy_q4t(variant, src_type, monkeypatch):
    from pyinfer.runtime.sparse_ffn import q4t_from_blocks

    monkeypatch.setenv("PYINFER_CUDA_AXPY", variant)
    n_ff, d, n = 96, 64, 3
    blocks = quants.quantize(RNG.standard_normal((d, n_ff)).astype(np.float32), Q[src_type])  # [d, n_ff]
    nibbles, scales = q4t_from_blocks(blocks, src_type, d, n_ff)
    row_map = RNG.permutation(n_ff).astype(np.int32)

    def build(b):
        lists = b.active_set(f32(b, "s", n, n_ff), n_ff, "lists", threshold=0.6)
        act = f32(b, "act", n, n_ff)
        down = b.weight("down", int(DType.Q4T), d, n_ff, nibbles)
        sc = b.weight("scales", int(DType.F16), 2 * d, n_ff // 32, scales)
        rm = b.weight("row_map", int(DType.I32), n_ff, 1, row_map)
        return b.down_axpy(down, act, lists, "y", scales=sc, row_map=rm)
    close(*both(build, n), 1e-4)


@pytest.mark.parametrize("mode", ["predictor", "silu", "gelu"])
def test_active_set_modes(mode):
    n_ff, hot, n = 300, 20, 4  # more neurons than one block of threads
    cut = RNG.standard_normal((1, n_ff - hot)).astype(np.float32)

    def build(b):
        if mode == "predictor":
            return b.active_set(f32(b, "s", n, n_ff - hot), n_ff, "lists", cut=f32(b, "cut", 1, n_ff - hot, cut),
                                hot=hot)
        act = Activation.SILU if mode == "silu" else Activation.GELU_TANH
        return b.active_set(f32(b, "s", n, n_ff), n_ff, "lists", threshold=0.1, gate_act=act)
    cpu, gpu = both(build, n)
    assert_lists_equal(gpu[0], cpu[0])


# Decode steps replayed as CUDA graphs (captured on a segment's second one-token run) compute what the same
# kernels launched one by one do: the logits of every step equal bit for bit.
def test_decode_steps_replayed_as_graphs_equal_launches(tiny_model_path, monkeypatch):
    import pyinfer

    device = "standin" if DEVICE == "standin" else DEVICE
    steps = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv("PYINFER_CUDA_GRAPHS", graphs)
        m = pyinfer.load(tiny_model_path, n_threads=2, n_ctx=64, device=device, vram_budget="4G")
        ids = m.tokenize("Once upon a time")
        out = [m.eval(ids)]
        for k in range(6):  # one token at a time: the first sizes staging, the second captures, then replays
            ids.append(int(np.argmax(out[-1])))
            out.append(m.forward([ids[-1]], len(ids) - 1, np.array([0]))[0])
        steps[graphs] = np.stack(out)
    np.testing.assert_array_equal(steps["1"], steps["0"])


# ---- Mixture of Experts (kernels/moe.cu; csrc/backends/cpu/moe_ops.cpp is the reference) ------------------
def expert_bytes(qtype, n_exp, rows, cols):
    """n_exp experts of [rows, cols], merged as GGUF stores them (*_exps): [n_exp * rows, ...]."""
    return weight_bytes(qtype, n_exp * rows, cols)


def routed_logits(b, n_tok, n_exp, table=None):
    """F32 [T, n_exp] router logits picked by the run's token ids from a table of 64 rows: each MoE test runs
    twice (twice_routed), so a slot the second route leaves 0 held the first run's numbers."""
    table = RNG.standard_normal((64, n_exp)).astype(np.float32) if table is None else table
    return b.get_rows(f32(b, "logit_table", 64, n_exp, table), token_ids(b), "logits")


def token_ids(b):
    """The run's token ids (I32 [T]), one input tensor however often asked for."""
    if b.graph.input_tokens < 0:
        b.graph.input_tokens = b.input("tokens").id
    from pyinfer.runtime.graph_builder import T

    return T(b.graph.input_tokens, 1, DType.I32, _core.RowMode.TOKENS)


def twice_routed(n_tok):
    """Keyword arguments for both(): a first run of some token ids, then the compared run of others."""
    ids = RNG.permutation(64)
    return {"before": [{"tokens": np.resize(ids, n_tok).astype(np.int32)}],
            "tokens": np.resize(ids[::-1], n_tok).astype(np.int32)}


# The route: ids exact (logits drawn apart from ties), weights within float rounding of exp in double.
@pytest.mark.parametrize("gating,norm,scale", [(0, True, 0.0), (0, False, 0.0), (1, True, 2.5), (1, False, 0.0)])
def test_moe_route(gating, norm, scale):
    n_tok, n_exp, k = 7, 40, 4
    logits = RNG.permutation(n_tok * n_exp).reshape(n_tok, n_exp).astype(np.float32) / 50
    logits[2, 5] = np.nan  # ranks last, as on the CPU

    cpu, gpu = both(lambda b: b.moe_route(f32(b, "logits", n_tok, n_exp, logits), k, norm=bool(norm), gating=gating,
                                          scale=scale), n_tok)
    np.testing.assert_array_equal(gpu[0][:, k:], cpu[0][:, k:])
    np.testing.assert_allclose(gpu[0][:, :k], cpu[0][:, :k], rtol=1e-6)


# The expert matmul: each slot the chosen expert's rows (its own x segment for down), within the dense matmul's
# 1e-4; one token (a warp per expert row and slot) and several (grouped by expert).
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4, Q.IQ2_XXS, Q.Q3_K])
@pytest.mark.parametrize("n_tok", [1, 5])
@pytest.mark.parametrize("per_slot", [False, True])
def test_moe_matmul(qtype, n_tok, per_slot):
    n_exp, k, rows, cols = 6, 3, 40, 512
    w = expert_bytes(qtype, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, k * cols if per_slot else cols)).astype(np.float32)

    def build(b):
        route = b.moe_route(routed_logits(b, n_tok, n_exp), k)
        return b.moe_matmul(b.weight("experts", int(qtype), cols, n_exp * rows, w), f32(b, "x", n_tok, x.shape[1], x),
                            route, n_exp, k, "y")
    close(*both(build, n_tok, **twice_routed(n_tok)), 1e-4)


# Many tokens: more (token, slot) pairs than one pass of the grouped kernel gathers (1,024), and a split route
# whose other side's slots (id -1) must come out 0, in decode and grouped alike.
@pytest.mark.parametrize("n_tok", [1, 7, 300])
def test_moe_matmul_many_pairs_and_a_split_route(n_tok):
    n_exp, k, rows, cols = 6, 4, 40, 256
    w = expert_bytes(Q.Q4_0, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, cols)).astype(np.float32)
    local = np.array([[0, -1, 1, -1, 2, 3]], np.int32)  # experts 1 and 3 are the other side's
    w_local = np.concatenate([w[e * rows:(e + 1) * rows] for e in (0, 2, 4, 5)])

    def build(b):
        route = b.moe_route(routed_logits(b, n_tok, n_exp), k)
        split = b.moe_route_split(route, b.weight("map", int(DType.I32), n_exp, 1, local), 4, k, "split")
        X = f32(b, "x", n_tok, cols, x)
        return (b.moe_matmul(b.weight("experts", int(Q.Q4_0), cols, n_exp * rows, w), X, route, n_exp, k, "y"),
                b.moe_matmul(b.weight("local", int(Q.Q4_0), cols, 4 * rows, w_local), X, split, 4, k, "y_local"))
    cpu, gpu = both(build, n_tok, max_tokens=n_tok, **twice_routed(n_tok))
    assert (cpu[1] == 0).any()
    close(cpu, gpu, 1e-4)


# CATS inside the experts: one token computes only the rows whose gate passes their expert's cut (the others
# exactly 0 on both sides); more tokens compute every row.
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_0, Q.Q4_K])
@pytest.mark.parametrize("n_tok", [1, 3])
def test_moe_matmul_with_gate_cuts(qtype, n_tok):
    n_exp, k, rows, cols = 6, 3, 40, 256
    w = expert_bytes(qtype, n_exp, rows, cols)
    x = RNG.standard_normal((n_tok, cols)).astype(np.float32)
    gate = RNG.standard_normal((64, k * rows)).astype(np.float32)
    bounds = _core.gate_cut_bounds(1, RNG.uniform(0.05, 0.6, n_exp).astype(np.float32))

    def build(b):  # the gate, like the route, picked by the run's tokens: the two runs cut different rows
        route = b.moe_route(routed_logits(b, n_tok, n_exp), k)
        g = b.get_rows(f32(b, "gate_table", 64, k * rows, gate), token_ids(b), "gate")
        return b.moe_matmul(b.weight("experts", int(qtype), cols, n_exp * rows, w), f32(b, "x", n_tok, cols, x), route,
                            n_exp, k, "y", gate=g, cut=f32(b, "cut", n_exp, 3, np.asarray(bounds, np.float32)),
                            gate_fn=1)
    cpu, gpu = both(build, n_tok, **twice_routed(n_tok))
    if n_tok == 1:
        assert 0 < (cpu[0] == 0).sum() < cpu[0].size
        np.testing.assert_array_equal(gpu[0] == 0, cpu[0] == 0)
    close(cpu, gpu, 1e-4)


# The combine (with Qwen2-MoE's shared expert) and a route split between two sides' experts.
@pytest.mark.parametrize("shared", [False, True])
def test_moe_combine_and_route_split(shared):
    n_tok, n_exp, k, d = 5, 8, 3, 300
    logits = RNG.standard_normal((n_tok, n_exp)).astype(np.float32)
    experts = RNG.standard_normal((n_tok, k * d)).astype(np.float32)
    local = np.array([[-1, 0, -1, 1, 2, -1, -1, 3]], np.int32)  # experts 1, 3, 4, 7 here; the rest elsewhere

    def build(b):
        route = b.moe_route(f32(b, "logits", n_tok, n_exp, logits), k)
        split = b.moe_route_split(route, b.weight("map", int(DType.I32), n_exp, 1, local), 4, k, "split")
        sh = f32(b, "shared", n_tok, d) if shared else None
        sg = f32(b, "shared_gate", n_tok, 1) if shared else None
        return split, b.moe_combine(f32(b, "experts", n_tok, k * d, experts), split, k, shared=sh, shared_gate=sg)
    cpu, gpu = both(build, n_tok)
    np.testing.assert_array_equal(gpu[0], cpu[0])
    assert (cpu[0][:, k:] == -1).any() and (cpu[0][:, k:] >= 0).any()
    close(cpu[1:], gpu[1:], 1e-5)


# A tiny qwen3moe and qwen2moe (a shared expert) with every expert on the device, then about half of them (the
# route split between the device and the CPU, both at once): logits within 1% of their scale on average and the
# same greedy tokens, as the dense model above.
@pytest.mark.parametrize("kind", ["qwen3moe", "qwen2moe"])
def test_moe_model_whole_and_split(kind, tmp_path):
    import pyinfer
    from pyinfer.model.arch import open_model
    from pyinfer.place import expert_placement as ep
    from support.tiny_model import write_tiny_arch

    path = str(write_tiny_arch(tmp_path / f"{kind}.gguf", kind, seed=3, qtype=Q.Q8_0))
    cpu = pyinfer.load(path, n_threads=2, n_ctx=64, progress=False)
    ids = list(range(3, 23))
    want = cpu.eval(ids, all_logits=True)
    f = open_model(path)
    minimum = sum(ep.fixed_bytes(f, cpu.config, 64).values())
    half = minimum + sum(ep.expert_bytes(f, cpu.config)) * cpu.config.n_expert // 2
    device = "standin" if DEVICE == "standin" else DEVICE
    for budget in ("4G", half):
        m = pyinfer.load(path, n_threads=2, n_ctx=64, device=device, vram_budget=budget, progress=False)
        if budget == half:
            assert m.session.placement.report["split_layers"]
        got = m.eval(ids, all_logits=True)
        assert np.abs(got - want).mean() <= 0.01 * np.abs(want).mean()
        assert m.generate("Once upon a time", max_tokens=8, temperature=0) == \
            cpu.generate("Once upon a time", max_tokens=8, temperature=0)
