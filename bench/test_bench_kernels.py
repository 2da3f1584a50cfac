"""pytest-benchmark entries for every op, at the real model's layer shapes, per kernel ISA.

  pytest bench/test_bench_kernels.py --benchmark-json bench/results/kernels/kernels.json
Compare ISAs within one run (ratios), never against numbers from another machine."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType
from pyinfer.runtime.graph_builder import single_op_engine
from checks import deq, q8a, run_and_check, silu

ISAS = _core.available_isas().split(",")
THREADS = 2
RNG = np.random.default_rng(0)
D, FF, VOCAB = 576, 1536, 49152  # SmolLM2-135M


def _weights(rows, k, qtype):
    return quants.quantize(RNG.standard_normal((rows, k)).astype(np.float32) * 0.05, qtype)


def _acts(n, k):
    return RNG.standard_normal((n, k)).astype(np.float32)


MATMULS = {  # name: (rows, k, weight type)
    "ffn_up_q4_1": (FF, D, Q.Q4_1),
    "ffn_down_q4_1": (D, FF, Q.Q4_1),
    "attn_q_q4_1": (D, D, Q.Q4_1),
    "output_head_q8_0": (VOCAB, D, Q.Q8_0),
    "moe_router_f32": (128, 2048, Q.F32),  # Qwen3-30B-A3B's ffn_gate_inp (F32 in every MoE GGUF)
    "ffn_up_f16": (FF, D, Q.F16),
    "ffn_up_bf16": (FF, D, Q.BF16),
}
FLOAT = (Q.F32, Q.F16, Q.BF16)


def _stored(rows, k, qtype):
    """(the weight as stored, its F32 value) for a quantized or float type."""
    w = RNG.standard_normal((rows, k)).astype(np.float32) * 0.05
    if qtype == Q.F32:
        return w, w
    if qtype == Q.F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    if qtype == Q.BF16:
        bf = (w.view(np.uint32) >> 16).astype(np.uint16)
        return bf, (bf.astype(np.uint32) << 16).view(np.float32)
    q = quants.quantize(w, qtype)
    return q, deq(q, qtype, rows, k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n_tok", [1, 64])
@pytest.mark.parametrize("shape", list(MATMULS))
def test_matmul(benchmark, isa, n_tok, shape):
    rows, k, qt = MATMULS[shape]
    if shape == "output_head_q8_0" and n_tok > 1:
        pytest.skip("the output head only sees the rows that need logits")
    (w, wf), x = _stored(rows, k, qt), _acts(n_tok, k)
    eng, y = single_op_engine(lambda b: b.matmul(b.weight("w", int(qt), k, rows, w),
                                                 b.weight("x", int(DType.F32), k, n_tok, x), "y"),
                              max_tokens=n_tok, n_threads=THREADS, isa=isa)
    seen = x if qt in FLOAT else q8a(x)  # float weights multiply the activations as they are
    run_and_check(eng, n_tok, y.id, seen @ wf.T, f"matmul {shape}")
    benchmark.extra_info.update(rows=rows, k=k, n_tok=n_tok, weight_bytes=int(w.nbytes))
    benchmark(eng.run, n_tok)


# Qwen3-30B-A3B's gate experts, Q4_0: 8 chosen in each of 40 layers (264 MiB a run, 8x a 32 MiB L3, so the weights
# come from memory as in a real decode, even when a cut reads a fraction of them)
MOE = {"experts": 16, "k": 8, "rows": 768, "cols": 2048, "layers": 40}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("cut", [0.0, 0.5, 0.7, 0.9])
def test_moe_matmul_decode(benchmark, isa, cut):
    """One decode token through 8 experts of 768 x 2048 in each of 40 layers (MOE): how the threads split the
    chosen rows. `cut`:
    the share of each expert's rows a gate cut skips (CATS inside the experts: up read for the rest only)."""
    n_exp, k, rows, cols, n_layers = MOE["experts"], MOE["k"], MOE["rows"], MOE["cols"], MOE["layers"]
    one = _weights(rows, cols, Q.Q4_0)  # every expert the same bytes (tiled copies), not 192 MiB of random draws
    x = _acts(1, cols)
    gate = _acts(1, k * rows)
    act = np.abs(silu(gate[0]))
    thr = np.quantile(act, cut) if cut else 0.0
    want = np.tile(q8a(x) @ deq(one, Q.Q4_0, rows, cols).T, (1, k))
    if cut:
        want = np.where(act > thr, want, 0)

    def build(b):
        X = b.weight("x", int(DType.F32), cols, 1, x)
        G = b.weight("gate", int(DType.F32), k * rows, 1, gate)
        bounds = _core.gate_cut_bounds(1, np.full(n_exp, thr, np.float32))
        outs = []
        for layer in range(n_layers):
            logits = np.zeros((1, n_exp), np.float32)
            logits[0, RNG.choice(n_exp, k, replace=False)] = 4.0
            route = b.moe_route(b.weight(f"logits{layer}", int(DType.F32), n_exp, 1, logits), k, f"route{layer}")
            w = b.weight(f"experts{layer}", int(Q.Q4_0), cols, n_exp * rows, np.tile(one, (n_exp, 1)))
            cut_w = b.weight(f"cut{layer}", int(DType.F32), 3, n_exp, bounds) if cut else None
            outs.append(b.moe_matmul(w, X, route, n_exp, k, f"y{layer}", gate=G if cut else None, cut=cut_w,
                                     gate_fn=1 if cut else 0))
        return tuple(outs)

    eng, ys = single_op_engine(build, max_tokens=1, n_threads=THREADS, isa=isa)
    for y in ys:
        run_and_check(eng, 1, y.id, want, "moe matmul decode")
    benchmark.extra_info.update(rows=k * rows, k=cols, layers=n_layers, cut=cut,
                                weight_bytes=int(n_layers * k * one.nbytes * (1 - cut)))
    benchmark(eng.run, 1)


@pytest.mark.parametrize("isa", ISAS)
def test_quantize_rmsnorm_silu(benchmark, isa):
    n_tok = 64
    x, u, g = _acts(n_tok, FF), _acts(n_tok, FF), np.ones(FF, np.float32)

    def build(b):
        X = b.weight("x", int(DType.F32), FF, n_tok, x)
        U = b.weight("u", int(DType.F32), FF, n_tok, u)
        n = b.rms_norm(X, b.weight("g", int(DType.F32), FF, 1, g), 1e-5, "n")
        m = b.gated_mul(n, U, name="m")
        return b.quantize(m), m

    eng, (_, m) = single_op_engine(build, max_tokens=n_tok, n_threads=THREADS, isa=isa)
    norm = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    run_and_check(eng, n_tok, m.id, silu(norm) * u, "rms_norm + silu_mul")
    benchmark(eng.run, n_tok)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n_ctx", [128, 512])
def test_attention_decode(benchmark, isa, n_ctx):
    heads, kv_heads, hd = 9, 3, 64
    pos = np.array([n_ctx - 1], np.int32)
    q, k = _acts(1, heads * hd), _acts(1, kv_heads * hd)

    def build(b):
        P = b.weight("p", int(DType.I32), 1, 1, pos)
        kc, vc = b.state("kc", kv_heads * hd, n_ctx), b.state("vc", kv_heads * hd, n_ctx)
        K = b.weight("k", int(DType.F32), kv_heads * hd, 1, k)
        b.kv_store(kc, K, P)
        b.kv_store(vc, K, P)
        Q_ = b.rope(b.add(b.weight("q", int(DType.F32), heads * hd, 1, q), b.weight("z", int(DType.F32), heads * hd, 1,
                                                                                      np.zeros_like(q))), P, heads, hd, 1e5)
        return b.attention(Q_, kc, vc, P, heads, kv_heads, hd, "o")

    eng, o = single_op_engine(build, max_tokens=1, n_threads=THREADS, isa=isa)
    from support.reference_llama import rope

    qr = rope(q, pos, heads, 64, 1e5).reshape(heads, hd)
    kv = k.astype(np.float16).astype(np.float32).reshape(kv_heads, hd)  # the cache is fp16; other rows are zero
    s_last = (qr * np.repeat(kv, heads // kv_heads, 0)).sum(-1) * hd ** -0.5
    p_last = np.exp(s_last) / (np.exp(s_last) + (n_ctx - 1))            # zero keys score 0
    run_and_check(eng, 1, o.id, (p_last[:, None] * np.repeat(kv, heads // kv_heads, 0)).reshape(1, -1), "attention")
    benchmark(eng.run, 1)
