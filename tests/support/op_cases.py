"""The op harness's cases (tests/test_backend_ops.py runs them, bench/test_bench_backend_ops.py times them): one
registry keyed by the core's Op enum, each case a small graph and what numpy says it computes."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer import _core
from pyinfer._core import DType, Op, RowMode
from pyinfer.model.config import Activation
from pyinfer.runtime.graph_builder import GraphBuilder

ISAS = _core.available_isas().split(",")
F32 = int(DType.F32)


@dataclass
class Case:
    """What a case's builder returns: the tensors to read, what numpy says they hold, the run's token count and
    inputs, the tolerance, and its own engine arguments where it places nodes itself."""
    outputs: list
    want: list
    n_tokens: int
    run_kw: dict = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-5
    read: Callable[[np.ndarray], object] | None = None  # an engine output -> what `want` states of it
    engine_kw: dict = field(default_factory=dict)


def f32(b, rng, name, rows, cols, scale=1.0):
    data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    return b.weight(name, F32, cols, rows, data), data


def i32(b, name, values):
    v = np.atleast_2d(np.asarray(values, np.int32))
    return b.weight(name, int(DType.I32), v.shape[1], v.shape[0], v)


def fresh(b, x, name):
    """x copied into an activation (ops that write in place must not write a weight)."""
    return b.add(x, b.weight(name + ".zero", F32, x.cols, x.n_rows, np.zeros((x.n_rows, x.cols), np.float32)),
                 name=name)


def silu(x):
    return x / (1 + np.exp(-x))


def q8a(x: np.ndarray) -> np.ndarray:
    """x as the engine's own activation quantization rounds it (per 32 values: d = amax / 127, q = rint(x / d))."""
    b = llamacpp_q8(x, "own")
    return (b[..., 2:] * b[..., :1]).reshape(x.shape)


# ---- the cases, by op ------------------------------------------------------------------------------------------
def get_rows(b, rng):
    vocab, k = 40, 64
    table = rng.standard_normal((vocab, k)).astype(np.float32)
    tq, ids = quants.quantize(table, Q.Q8_0), [3, 0, 39, 3]
    e = b.get_rows(b.weight("t", int(Q.Q8_0), k, vocab, tq), i32(b, "ids", np.array(ids)[:, None]), "e")
    return Case([e], [quants.dequantize(tq, Q.Q8_0).reshape(vocab, k)[ids]], 4)


def rms_norm(b, rng):
    X, x = f32(b, rng, "x", 4, 80)
    G, g = f32(b, rng, "g", 1, 80)
    n = b.rms_norm(X, G, 1e-5, "n")
    return Case([n], [x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g], 4, atol=1e-6)


def quantize(b, rng):
    X, x = f32(b, rng, "x", 3, 96, 3.0)
    q = b.quantize(X)
    # Compare the dequantized blocks: d * q per value (the bytes are 4 d, 4 s, 32 q per block).
    def read(got):
        raw = got.reshape(3, 3, 40)
        d = raw[..., :4].copy().view(np.float32)
        qs = raw[..., 8:].view(np.int8).astype(np.float32)
        return (qs * d).reshape(3, 96)
    return Case([q], [q8a(x)], 3, rtol=1e-6, atol=1e-6, read=read)


def act_scheme_name(weight) -> str:
    """The activation scheme (llamacpp_q8's name) the engine quantizes with for weights of GGML type `weight`."""
    return {0: "own", 1: "q8_0", 2: "q8_1", 3: "q8_k"}[_core.act_scheme(DType(int(weight)))]


def q8a_as(x: np.ndarray, weight) -> np.ndarray:
    """x as the engine quantizes it for weights of type `weight` (q8a() for pyinfer's own copies)."""
    b = llamacpp_q8(x, act_scheme_name(weight))
    return (b[..., 2:] * b[..., :1]).reshape(x.shape)


def offset_correction(x: np.ndarray, wq: np.ndarray, qtype, rows: int, k: int) -> np.ndarray:
    """What Q8_1 activations add to (x as quantized) @ w.T for Q4_1 / Q5_1 weights (zeros for other types): their
    offset m meets the block's s = fp16(d x sum q), not the fp16 d times the sum (llama.cpp's Q8_1)."""
    if act_scheme_name(qtype) != "q8_1":
        return np.zeros((x.shape[0], rows))
    act = llamacpp_q8(x, "q8_1")
    s_minus = (act[..., 1] - act[..., 0] * act[..., 2:].sum(-1)).astype(np.float64)  # [tokens, blocks]
    block = {Q.Q4_1: 20, Q.Q5_1: 24}[Q(int(qtype))]
    m = wq.reshape(rows, k // 32, block)[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return s_minus @ m.T


def _fp16(v):
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def llamacpp_q8(x: np.ndarray, scheme: str) -> np.ndarray:
    """llama.cpp's activation blocks for a weight type, written out from ggml (x86 quantize_row_q8_0 / q8_1,
    quantize_row_q8_K_ref) as Q8A's (d, s, q) per 32, [rows, blocks, 34] floats: the bits the engine must give.
    "own": pyinfer's blocks for its own copies (fp32 d = amax / 127 per 32, s = d x sum)."""
    rows, n = x.shape
    if scheme == "own":  # fp32 scales per 32, d x sum unrounded
        xb = x.reshape(rows, -1, 32).astype(np.float32)
        amax = np.abs(xb).max(-1, keepdims=True)
        q = np.rint(xb * np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0))
        d = (amax / np.float32(127)).astype(np.float32)
        return np.concatenate([d, d * q.sum(-1, keepdims=True), q], -1).astype(np.float32)
    per = 256 if scheme == "q8_k" else 32
    xb = x.reshape(rows, -1, per).astype(np.float32)
    amax = np.abs(xb).max(-1, keepdims=True)
    iscale = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.clip(np.rint(xb * iscale), -127, 127).astype(np.float32).reshape(rows, -1, 32)
    sums = q.sum(-1, keepdims=True)
    if scheme == "q8_k":  # one fp32 scale 1 / (127 / amax) per 256
        d = np.repeat(np.where(iscale > 0, np.float32(1) / np.where(iscale > 0, iscale, 1), 0), 8, axis=1)
        s = d * sums
    else:
        d32 = (amax / np.float32(127)).astype(np.float32)
        d = _fp16(d32)
        s = _fp16(d32 * sums) if scheme == "q8_1" else d * sums
    return np.concatenate([d, s, q], -1).astype(np.float32)


def _read_q8a_blocks(rows: int, n: int):
    def read(got):
        raw = got.reshape(rows, n // 32, 40)
        ds = raw[..., :8].copy().view(np.float32)
        return np.concatenate([ds, raw[..., 8:].view(np.int8).astype(np.float32)], -1)
    return read


def _quantize_as(weight: Q, scheme: str):
    def case(b, rng):
        rows, n = 3, 512
        x = (rng.standard_normal((rows, n)) * 3.0).astype(np.float32)
        x[1, 256:] = 0.0  # an all-zero super-block
        x[2, 5] = 2e3  # one large value: the rest of its block (or super-block) rounds to small q
        q = b.quantize(b.weight("x", F32, n, rows, x), weight=DType(int(weight)))
        return Case([q], [llamacpp_q8(x, scheme)], rows, rtol=0, atol=0, read=_read_q8a_blocks(rows, n))
    case.__name__ = f"quantize_as_{weight.name.lower()}"
    return case


def mat_mul_f32(b, rng):
    W, w = f32(b, rng, "w", 37, 96)
    X, x = f32(b, rng, "x", 5, 96)
    return Case([b.matmul(W, X, "y")], [x @ w.T], 5, rtol=1e-4, atol=1e-4)


def mat_mul_q4_k(b, rng):
    from .tiny_model import random_blocks

    rows, k, n = 24, 512, 3
    wq = random_blocks(Q.Q4_K, rows, k, rng)
    X, x = f32(b, rng, "x", n, k)
    y = b.matmul(b.weight("w", int(Q.Q4_K), k, rows, wq), X, "y")
    want = q8a_as(x, Q.Q4_K) @ quants.dequantize(wq, Q.Q4_K).reshape(rows, k).T
    return Case([y], [want], n, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))


def rope(b, rng):
    from .reference_llama import rope as rope_ref

    n, heads, hd = 5, 3, 16
    X, x = f32(b, rng, "x", n, heads * hd)
    pos = np.array([0, 1, 7, 100, 2047], np.int32)
    y = b.rope(fresh(b, X, "y"), i32(b, "p", pos[:, None]), heads, hd, 10000.0)
    return Case([y], [rope_ref(x, pos, heads, hd, 10000.0)], n)


def rope_partial(b, rng):
    """Partial RoPE (GLM-4.5): each head's first 8 of 16 values rotate as a head of 8, NEOX pairs; the rest pass."""
    from .reference_llama import rope as rope_ref

    n, heads, hd = 5, 3, 16
    X, x = f32(b, rng, "x", n, heads * hd)
    pos = np.array([0, 1, 7, 100, 2047], np.int32)
    y = b.rope(fresh(b, X, "y"), i32(b, "p", pos[:, None]), heads, hd, 10000.0, neox=True, n_rot=8)
    return Case([y], [rope_ref(x, pos, heads, hd, 10000.0, neox=True, n_rot=8)], n)


def rope_yarn(b, rng):
    """YaRN (gpt-oss): x4 with the ramp over pairs 2..6 and the magnitude 1 + 0.1 ln 4."""
    from .reference_llama import rope as rope_ref

    n, heads, hd = 5, 3, 16
    X, x = f32(b, rng, "x", n, heads * hd)
    pos = np.array([0, 1, 7, 100, 2047], np.int32)
    y = b.rope(fresh(b, X, "y"), i32(b, "p", pos[:, None]), heads, hd, 10000.0, neox=True, freq_scale=0.25,
               yarn=(1.0, 2.0, 6.0))
    return Case([y], [rope_ref(x, pos, heads, hd, 10000.0, neox=True, freq_scale=0.25, yarn=(1.0, 2.0, 6.0))], n,
                atol=2e-5)


def kv_store(b, rng):
    n, cols, n_ctx = 3, 64, 8
    cache = b.state("kc", cols, n_ctx)
    K, k = f32(b, rng, "k", n, cols)
    b.kv_store(cache, K, i32(b, "p", np.array([[5], [0], [2]])))
    want = np.zeros((n_ctx, cols), np.float16)
    want[[5, 0, 2]] = k.astype(np.float16)
    return Case([cache], [want.view(np.uint16)], n, rtol=0, atol=0)  # F16 reads back as its bits


def _attention_case(b, rng, window: int = 0, sinks: np.ndarray | None = None):
    from .reference_llama import attention as attention_ref

    n, heads, kv_heads, hd, n_ctx = 6, 6, 2, 32, 16
    P = i32(b, "p", np.arange(n)[:, None])
    kc, vc = b.state("kc", kv_heads * hd, n_ctx), b.state("vc", kv_heads * hd, n_ctx)
    K, k = f32(b, rng, "k", n, kv_heads * hd)
    V, v = f32(b, rng, "v", n, kv_heads * hd)
    Qw, q = f32(b, rng, "q", n, heads * hd)
    b.kv_store(kc, K, P)
    b.kv_store(vc, V, P)
    S = b.weight("sinks", F32, heads, 1, sinks) if sinks is not None else None
    o = b.attention(Qw, kc, vc, P, heads, kv_heads, hd, "o", window=window, sinks=S)
    k16, v16 = (a.astype(np.float16).astype(np.float32) for a in (k, v))  # the cache is fp16
    want = attention_ref(q, k16, v16, heads, kv_heads, hd, window=window, sinks=None if sinks is None else sinks[0])
    return Case([o], [want], n, rtol=1e-4, atol=1e-5)


def attention(b, rng):
    return _attention_case(b, rng)


def attention_sinks(b, rng):
    """gpt-oss's sinks: a logit per head in every row's softmax, one far above the scores (the rescaled branch),
    with a window of 3."""
    return _attention_case(b, rng, window=3, sinks=np.array([[0.5, -1.0, 2.0, 30.0, 0.0, -3.0]], np.float32))


def _latent_attention(b, rng, pos: np.ndarray, n_ctx: int, scale: float, heads: int = 4, latent: int = 32,
                      rot: int = 16):
    """Tokens at `pos` store their [latent | rotary] rows and attend with q and q_rope: (o, k, q, r)."""
    n, hd = len(pos), latent + rot
    P = i32(b, "p", pos[:, None])
    kc = b.state("kc", hd, n_ctx)
    K, k = f32(b, rng, "k", n, hd)
    Q, q = f32(b, rng, "q", n, heads * latent)
    R, r = f32(b, rng, "q_rope", n, heads * rot)
    b.kv_store(kc, K, P)
    o = b.attention(Q, kc, b.view(kc, "vc", cols=latent), P, heads, 1, hd, "o", scale=scale, q_rope=R, v_dim=latent)
    return o, k, q, r


def attention_mla(b, rng):
    """DeepSeek-V2's latent attention: one cache row per token, [latent | rotary], read whole as the key and its
    latent prefix as the value (a view of the same cache); each query head is its q part then its q_rope part."""
    from .reference_llama import attention as attention_ref

    n, heads, latent, rot = 6, 4, 32, 16
    hd = latent + rot
    o, k, q, r = _latent_attention(b, rng, np.arange(n), 16, 0.3)
    k16 = k.astype(np.float16).astype(np.float32)
    q_full = np.concatenate([q.reshape(n, heads, latent), r.reshape(n, heads, rot)], 2).reshape(n, heads * hd)
    want = attention_ref(q_full, k16, k16[:, :latent], heads, 1, hd, scale=0.3)
    return Case([o], [want], n, rtol=1e-4, atol=1e-5)


def attention_mla_decode(b, rng):
    """The latent attention of two tokens deep in a cache (positions 399 and 400: split-K, the partial states
    v_dim wide); the rows never written are zeros, keys like any other."""
    n, heads, latent, rot = 2, 4, 32, 16
    hd = latent + rot
    pos = np.array([399, 400])
    o, k, q, r = _latent_attention(b, rng, pos, 416, 0.2)
    keys = np.zeros((pos[-1] + 1, hd), np.float32)
    keys[pos] = k.astype(np.float16).astype(np.float32)
    want = np.zeros((n, heads, latent), np.float32)
    for t in range(n):
        qt = np.concatenate([q[t].reshape(heads, latent), r[t].reshape(heads, rot)], 1)
        s_ = qt @ keys[:pos[t] + 1].T * 0.2
        p_ = np.exp(s_ - s_.max(-1, keepdims=True))
        want[t] = (p_ / p_.sum(-1, keepdims=True)) @ keys[:pos[t] + 1, :latent]
    return Case([o], [want.reshape(n, heads * latent)], n, rtol=1e-4, atol=1e-5)


def add(b, rng):
    A, a = f32(b, rng, "a", 4, 80)
    C, c = f32(b, rng, "c", 4, 80)
    return Case([b.add(A, C, name="s")], [a + c], 4, rtol=1e-6, atol=0)


def add_scaled(b, rng):
    """a + scale * b (Granite's residual multiplier): the product rounded, then the sum."""
    A, a = f32(b, rng, "a", 4, 80)
    C, c = f32(b, rng, "c", 4, 80)
    return Case([b.add(A, C, name="s", scale=0.22)], [a + np.float32(0.22) * c], 4, rtol=1e-6, atol=0)


def add_post_scaled(b, rng):
    """(a + b) * post (Gemma 4's layer output scale: llama.cpp's add, then its mul): the sum rounded, then scaled."""
    A, a = f32(b, rng, "a", 4, 80)
    C, c = f32(b, rng, "c", 4, 80)
    return Case([b.add(A, C, name="s", post=0.37)], [(a + c) * np.float32(0.37)], 4, rtol=1e-6, atol=0)


def softcap(b, rng):
    """cap * tanh(x / cap) over rows wider than the threads' column shares (Gemma's logits)."""
    X, x = f32(b, rng, "x", 2, 1000, 40.0)
    want = (np.tanh(x * np.float32(1 / 30.0)) * np.float32(30.0)).astype(np.float32)
    return Case([b.softcap(X, 30.0)], [want], 2, rtol=1e-6, atol=1e-6)


def silu_mul(b, rng):
    G, g = f32(b, rng, "g", 3, 203, 4.0)  # a tail after the SIMD loop
    U, u = f32(b, rng, "u", 3, 203)
    return Case([b.gated_mul(G, U, name="m", act=int(Activation.SILU))], [silu(g) * u], 3, atol=1e-5)


def swiglu_oai_mul(b, rng):
    """gpt-oss's clamped SwiGLU: gates and ups past the limit of 7 on both sides."""
    from .reference_llama import swiglu_oai

    G, g = f32(b, rng, "g", 3, 203, 6.0)
    U, u = f32(b, rng, "u", 3, 203, 6.0)
    return Case([b.gated_mul(G, U, name="m", act=int(Activation.SWIGLU_OAI))], [swiglu_oai(g, u)], 3, atol=1e-5)


def select_rows(b, rng):
    E, e = f32(b, rng, "e", 4, 64)
    out_ids = b.input("o", RowMode.OUTPUTS)
    b.graph.input_out_ids = out_ids.id
    sel = b.select_rows(fresh(b, E, "x"), out_ids, "sel")
    pick = np.array([2, 0], np.int32)
    return Case([sel], [e[pick]], 4, {"out_ids": pick}, rtol=0, atol=0)


def bias_relu(b, rng):
    X, x = f32(b, rng, "x", 3, 70)
    B, bias = f32(b, rng, "b", 1, 70)
    return Case([b.bias_relu(fresh(b, X, "y"), B)], [np.maximum(x + bias, 0)], 3, atol=1e-6)


def _lists(lists: np.ndarray) -> list:
    return [row[1:1 + row[0]] for row in lists]


def _active_sets(b, rng, n: int, top_k: int):
    """Each token's list: |scores| > 1, or with top_k its top_k largest |scores| (a fixed density)."""
    n_ff = 64
    S, s = f32(b, rng, "s", n, n_ff)
    act = b.active_set(S, n_ff, "act", threshold=0.0 if top_k else 1.0, top_k=top_k)
    want = np.zeros((n, n_ff + 1), np.int32)
    for t in range(n):
        ids = np.sort(np.argsort(-np.abs(s[t]), kind="stable")[:top_k]) if top_k else np.flatnonzero(np.abs(s[t]) > 1.0)
        want[t, 0], want[t, 1:1 + len(ids)] = len(ids), ids
    return Case([act], [_lists(want)], n, rtol=0, atol=0, read=_lists)


def active_set(b, rng):
    return _active_sets(b, rng, 2, 0)


def active_set_top_k(b, rng):
    return _active_sets(b, rng, 3, 11)


def gated_act(b, rng):
    n_ff, n = 64, 2
    G, g = f32(b, rng, "g", n, n_ff)
    U, u = f32(b, rng, "u", n, n_ff)
    S, s = f32(b, rng, "s", n, n_ff)
    lists = b.active_set(S, n_ff, "act", threshold=0.5)
    gate = fresh(b, G, "gate")
    b.gated_act(gate, U, lists, 0.1, act=int(Activation.SILU))
    a = silu(g) * u
    want = np.where(np.abs(a) > 0.1, a, 0)
    listed = np.abs(s) > 0.5  # only the listed entries are written
    return Case([gate], [want[listed]], n, atol=1e-6, read=lambda got: got[listed])


def down_axpy(b, rng):
    n_ff, d, n = 70, 96, 3
    Wt, wt = f32(b, rng, "w", n_ff, d)
    a = (rng.standard_normal((n, n_ff)) * (rng.random((n, n_ff)) < 0.3)).astype(np.float32)
    A = b.weight("a", F32, n_ff, n, a)
    y = b.down_axpy(Wt, A, b.active_set(A, n_ff, "act", threshold=0.0))
    want = a @ wt
    return Case([y], [want], n, atol=1e-4 * max(1.0, float(np.abs(want).max())))


def scatter_cols(b, rng):
    X, x = f32(b, rng, "x", 2, 8)
    perm = np.array([3, 0, 7, 1, 6, 2, 5, 4], np.int32)
    y = b.scatter_cols(X, i32(b, "p", perm), "y")
    want = np.zeros_like(x)
    want[:, perm] = x
    return Case([y], [want], 2, rtol=0, atol=0)


def active_union(b, rng):
    n_ff, n = 64, 3
    s = (rng.random((n, n_ff)) < 0.1).astype(np.float32) * 2
    lists = b.active_set(b.weight("s", F32, n_ff, n, s), n_ff, "act", threshold=1.0)
    union = b.active_union(lists, n_ff, "u", max_tokens=4)
    ids = np.flatnonzero(s.any(0))
    want = np.zeros((1, n_ff + 1), np.int32)
    want[0, 0], want[0, 1:1 + len(ids)] = len(ids), ids
    return Case([union], [_lists(want)], n, rtol=0, atol=0, read=_lists)


def neuron_fetch(b, rng):
    d, n_ff, n = 64, 96, 3
    gate = rng.standard_normal((n_ff, d)).astype(np.float32)
    bundles = np.concatenate([gate, gate[::-1], gate * 2], axis=1)  # per neuron: gate | up | down rows
    path = os.path.join(tempfile.mkdtemp(prefix="pyinfer-ops-"), "ffn.bundles")
    with open(path, "wb") as f:
        f.write(bundles.tobytes() + bytes(8192))
    layer = {"n_ff": n_ff, "resident": 0, "file_offset": 0, "bundle_bytes": 12 * d, "part_offsets": [0, 4 * d, 8 * d],
             "selective": False}
    store = _core.NeuronStore(path, [layer])
    G = b.paged_weight("g", F32, d, n_ff, store, 0, 0)
    b.neuron_fetch(0)  # the whole cold tail becomes readable
    X, x = f32(b, rng, "x", n, d)
    y = b.matmul(G, X, "y")
    b.neuron_fetch(0, release=True)
    return Case([y], [x @ gate.T], n, rtol=1e-4, atol=1e-4)


def copy(b, rng):
    X, x = f32(b, rng, "x", 3, 40)
    y = b.add(X, X, name="y")                  # on the CPU
    with b.weights_on(1):
        W, w = f32(b, rng, "w", 3, 40)
    z = b.add(y, W, name="z")                  # on backend 1, in memory space 1: y is copied there
    placement = [0, 1]
    return Case([z], [2 * x + w], 3, rtol=1e-6, atol=0,
                engine_kw={"placement": placement, "backend_threads": [1, 1], "backend_memory": [0, 1],
                           "backend_kinds": ["cpu", "cpu"]})


def _route(b, rng, n, n_exp, k):
    L, logits = f32(b, rng, "logits", n, n_exp, 3.0)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ids = np.argsort(-probs, -1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, -1)
    return b.moe_route(L, k), w / w.sum(-1, keepdims=True), ids


def moe_route(b, rng):
    route, w, ids = _route(b, rng, 9, 16, 4)
    return Case([route], [np.concatenate([w, ids], 1).astype(np.float32)], 9, rtol=1e-5, atol=1e-6)


def _experts_reference(weights, x, ids, rows_e):
    return np.stack([np.concatenate([weights[e * rows_e:(e + 1) * rows_e] @ x[t] for e in ids[t]])
                     for t in range(len(x))])


def moe_mat_mul(b, rng):
    n, n_exp, k, rows_e, cols = 3, 6, 2, 16, 64
    route, _, ids = _route(b, rng, n, n_exp, k)
    W, w = f32(b, rng, "experts", n_exp * rows_e, cols)
    X, x = f32(b, rng, "x", n, cols)
    return Case([b.moe_matmul(W, X, route, n_exp, k, "y")], [_experts_reference(w, x, ids, rows_e)], n,
                rtol=1e-4, atol=1e-4)


def moe_mat_mul_bias(b, rng):
    """Each slot's rows plus its expert's bias (gpt-oss)."""
    n, n_exp, k, rows_e, cols = 3, 6, 2, 16, 64
    route, _, ids = _route(b, rng, n, n_exp, k)
    W, w = f32(b, rng, "experts", n_exp * rows_e, cols)
    X, x = f32(b, rng, "x", n, cols)
    B, bias = f32(b, rng, "bias", n_exp, rows_e)
    want = _experts_reference(w, x, ids, rows_e) + bias[ids].reshape(n, k * rows_e)
    return Case([b.moe_matmul(W, X, route, n_exp, k, "y", bias=B)], [want], n, rtol=1e-4, atol=1e-4)


def moe_mat_mul_per_head(b, rng):
    """No route: every token runs every expert, slot s on expert s and x's segment s (MLA's absorbed projections,
    a matmul per head); a Q8_0 weight as the real files' attn_k_b."""
    n, heads, rows_e, cols = 3, 4, 16, 32
    w = rng.standard_normal((heads * rows_e, cols)).astype(np.float32)
    blocks = quants.quantize(w, Q.Q8_0)
    W = b.weight("per_head", int(DType.Q8_0), cols, heads * rows_e, blocks)
    X, x = f32(b, rng, "x", n, heads * cols)
    wd = quants.dequantize(blocks, Q.Q8_0).reshape(heads, rows_e, cols)
    want = np.einsum("hrc,thc->thr", wd, q8a_as(x, Q.Q8_0).reshape(n, heads, cols)).reshape(n, heads * rows_e)
    return Case([b.moe_matmul(W, X, None, heads, heads, "y")], [want], n, rtol=1e-4, atol=1e-4)


def moe_route_grouped(b, rng):
    """DeepSeek-V3's grouped routing: sigmoid probabilities plus a selection bias; 4 groups of 4 experts, each
    scored by its two best selections; only the 2 best groups' experts can be chosen; weights renormalized and
    scaled."""
    n, n_exp, k, n_group, used = 9, 16, 3, 4, 2
    L, logits = f32(b, rng, "logits", n, n_exp, 2.0)
    Bias, bias = f32(b, rng, "bias", 1, n_exp, 0.3)
    route = b.moe_route(L, k, gating=1, bias=Bias, scale=2.5, groups=(n_group, used))
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    sel = probs + bias
    groups = sel.reshape(n, n_group, -1)
    score = np.sort(groups, -1)[..., -2:].sum(-1)
    keep = np.argsort(-score, -1, kind="stable")[:, :used]
    mask = np.full_like(groups, -np.inf)
    np.put_along_axis(mask, keep[..., None], 0.0, 1)
    ids = np.argsort(-(groups + mask).reshape(n, n_exp), -1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, ids, -1)
    w = w / w.sum(-1, keepdims=True) * 2.5
    return Case([route], [np.concatenate([w, ids], 1).astype(np.float32)], n, rtol=1e-5, atol=1e-6)


def moe_combine(b, rng):
    n, n_exp, k, d = 5, 8, 3, 48
    route, w, _ = _route(b, rng, n, n_exp, k)
    E, e = f32(b, rng, "experts", n, k * d)
    S, sh = f32(b, rng, "shared", n, d)
    G, g = f32(b, rng, "gate", n, 1)
    y = b.moe_combine(E, route, k, shared=S, shared_gate=G)
    want = np.einsum("ts,tsd->td", w, e.reshape(n, k, d)) + sh / (1 + np.exp(-g))
    return Case([y], [want], n, atol=1e-5)


def expert_fetch(b, rng):
    n, n_exp, k, rows_e, d = 3, 4, 2, 32, 64
    w = rng.standard_normal((n_exp * rows_e, d)).astype(np.float32)
    path = os.path.join(tempfile.mkdtemp(prefix="pyinfer-ops-"), "experts.bin")
    with open(path, "wb") as f:
        f.write(w.tobytes() * 3)  # gate, up and down parts: the same bytes
    eb = rows_e * d * 4
    store = _core.ExpertStore(path, [{"n_expert": n_exp, "file_offsets": [0, n_exp * eb, 2 * n_exp * eb],
                                      "expert_bytes": [eb] * 3, "resident": []}], 4)
    route, _, ids = _route(b, rng, n, n_exp, k)
    b.expert_fetch(route, 0)
    X, x = f32(b, rng, "x", n, d)
    y = b.moe_matmul(b.expert_weight("w", F32, d, n_exp * rows_e, store, 0, 0), X, route, n_exp, k, "y")
    return Case([y], [_experts_reference(w, x, ids, rows_e)], n, rtol=1e-4, atol=1e-4)


def moe_route_split(b, rng):
    n, n_exp, k = 4, 8, 3
    route, w, ids = _route(b, rng, n, n_exp, k)
    local = [1, 4, 6]
    emap = np.full((1, n_exp), -1, np.int32)
    emap[0, local] = np.arange(len(local))
    part = b.moe_route_split(route, i32(b, "map", emap), len(local), k, "part")
    here = np.isin(ids, local)
    want = np.concatenate([np.where(here, w, 0), np.where(here, emap[0][ids], -1)], 1).astype(np.float32)
    return Case([part], [want], n, rtol=1e-5, atol=1e-6)


def _sequences(b):
    """Two sequences interleaved in one batch (A0 B0 A1 B1 A2 B2 A3), each starting at position 0 in a state row of
    its own (1 and 0; row 2 unused): the row each token reads, and the per-sequence token indices."""
    seq = np.array([0, 1, 0, 1, 0, 1, 0])
    pos = np.array([0, 0, 1, 1, 2, 2, 3])
    P = i32(b, "p", pos[:, None])
    R = i32(b, "r", (1 - seq)[:, None])
    return P, R, [np.flatnonzero(seq == s) for s in (0, 1)]


def ssm_conv(b, rng):
    """Qwen3.5's causal conv1d, two interleaved sequences in rows of their own (a tail of channels past 16)."""
    from .reference_recurrent import ssm_conv as conv_ref

    C, K = 37, 4
    P, R, seqs = _sequences(b)
    X, x = f32(b, rng, "x", 7, C)
    W, w = f32(b, rng, "w", C, K, 0.5)
    y = b.ssm_conv(X, W, b.state("conv", C * (K - 1), 3, DType.F32), P, "y", rows=R)
    want = np.zeros((7, C))
    for idx in seqs:
        want[idx] = conv_ref(x[idx], w)
    return Case([y], [want], 7, rtol=1e-5, atol=1e-6)


def delta_net(b, rng):
    """The gated delta rule: 2 k heads read by 4 v heads (h % 2), two interleaved sequences in rows of their own."""
    from .reference_recurrent import delta_net as delta_ref

    hk, hv, S, eps = 2, 4, 32, 1e-6  # heads of whole warps (the device kernel's)
    P, R, seqs = _sequences(b)
    Q, qkv = f32(b, rng, "qkv", 7, (2 * hk + hv) * S)
    B, beta = f32(b, rng, "beta", 7, hv)
    A, alpha = f32(b, rng, "alpha", 7, hv)
    decay = np.stack([rng.standard_normal(hv), -np.exp(rng.standard_normal(hv))]).astype(np.float32)
    D = b.weight("decay", F32, hv, 2, decay)
    o = b.delta_net(Q, B, A, D, b.state("s", hv * S * S, 3, DType.F32), P, hk, hv, S, eps, "o", rows=R)
    want = np.zeros((7, hv * S))
    for idx in seqs:
        want[idx] = delta_ref(qkv[idx], beta[idx], alpha[idx], decay[0], decay[1], hk, hv, S, eps)
    return Case([o], [want], 7, rtol=1e-4, atol=1e-5)


def delta_net_grouped(b, rng):
    """Qwen3-Next's head mapping: v head h reads k head h // 2 (repeat-interleave), one sequence."""
    from .reference_recurrent import delta_net as delta_ref

    hk, hv, S, eps = 2, 4, 32, 1e-6
    P = i32(b, "p", np.arange(5)[:, None])
    Q, qkv = f32(b, rng, "qkv", 5, (2 * hk + hv) * S)
    B, beta = f32(b, rng, "beta", 5, hv)
    A, alpha = f32(b, rng, "alpha", 5, hv)
    decay = np.stack([rng.standard_normal(hv), -np.exp(rng.standard_normal(hv))]).astype(np.float32)
    o = b.delta_net(Q, B, A, b.weight("decay", F32, hv, 2, decay), b.state("s", hv * S * S, 1, DType.F32), P, hk, hv,
                    S, eps, "o", grouped=True)
    return Case([o], [delta_ref(qkv, beta, alpha, decay[0], decay[1], hk, hv, S, eps, grouped=True)], 5, rtol=1e-4,
                atol=1e-5)


def _prompt_runs(b, lengths):
    """A prompt batch: runs of two sequences in turn, each run in order (A0..A(n-1) B0.. A(n)..), A in state row 1
    and B in row 0; A's later run goes on from the state its first run left. Positions, rows and per-sequence
    token indices."""
    seq, pos, seen = [], [], [0, 0]
    for i, n in enumerate(lengths):
        s = i % 2
        seq += [s] * n
        pos += list(range(seen[s], seen[s] + n))
        seen[s] += n
    seq = np.array(seq)
    P = i32(b, "p", np.array(pos)[:, None])
    R = i32(b, "r", (1 - seq)[:, None])
    return P, R, [np.flatnonzero(seq == s) for s in (0, 1)], len(seq)


def ssm_conv_prompt(b, rng):
    """The conv over prompts: a run longer than its taps (rows read from the run itself), a short run of another
    sequence, then the first sequence again from the state its long run left."""
    from .reference_recurrent import ssm_conv as conv_ref

    C, K = 37, 4
    P, R, seqs, T = _prompt_runs(b, [40, 2, 5])
    X, x = f32(b, rng, "x", T, C)
    W, w = f32(b, rng, "w", C, K, 0.5)
    y = b.ssm_conv(X, W, b.state("conv", C * (K - 1), 2, DType.F32), P, "y", rows=R)
    want = np.zeros((T, C))
    for idx in seqs:
        want[idx] = conv_ref(x[idx], w)
    return Case([y], [want], T, rtol=1e-5, atol=1e-6)


def delta_net_prompt(b, rng):
    """The gated delta rule over prompts, in chunks (kDeltaChunk = 64): 130 tokens of one sequence (two whole
    chunks and two tokens), 70 of another, then 5 more of the first token by token from the state the chunks left."""
    from .reference_recurrent import delta_net as delta_ref

    hk, hv, S, eps = 2, 4, 32, 1e-6
    P, R, seqs, T = _prompt_runs(b, [130, 70, 5])
    Q, qkv = f32(b, rng, "qkv", T, (2 * hk + hv) * S)
    B, beta = f32(b, rng, "beta", T, hv)
    A, alpha = f32(b, rng, "alpha", T, hv)
    decay = np.stack([rng.standard_normal(hv), -np.exp(rng.standard_normal(hv))]).astype(np.float32)
    D = b.weight("decay", F32, hv, 2, decay)
    o = b.delta_net(Q, B, A, D, b.state("s", hv * S * S, 2, DType.F32), P, hk, hv, S, eps, "o", rows=R)
    want = np.zeros((T, hv * S))
    for idx in seqs:
        want[idx] = delta_ref(qkv[idx], beta[idx], alpha[idx], decay[0], decay[1], hk, hv, S, eps)
    return Case([o], [want], T, rtol=1e-4, atol=1e-5)


def sigmoid_mul(b, rng):
    """Qwen3.5's attention output gate: sigmoid(g) * u."""
    G, g = f32(b, rng, "g", 3, 203, 4.0)
    U, u = f32(b, rng, "u", 3, 203)
    return Case([b.gated_mul(G, U, name="m", act=int(Activation.SIGMOID))], [u / (1 + np.exp(-g))], 3, atol=1e-6)


CASES: dict[Op, list[Callable]] = {
    Op.GET_ROWS: [get_rows], Op.RMS_NORM: [rms_norm],
    Op.QUANTIZE: [quantize, _quantize_as(Q.Q8_0, "q8_0"), _quantize_as(Q.Q4_1, "q8_1"), _quantize_as(Q.Q4_K, "q8_k"),
                  _quantize_as(Q.IQ2_XXS, "q8_k")],
    Op.MAT_MUL: [mat_mul_f32, mat_mul_q4_k],
    Op.ROPE: [rope, rope_partial, rope_yarn], Op.KV_STORE: [kv_store], Op.ATTENTION: [attention, attention_sinks, attention_mla, attention_mla_decode], Op.ADD: [add, add_scaled, add_post_scaled], Op.SOFTCAP: [softcap], Op.SILU_MUL: [silu_mul, swiglu_oai_mul, sigmoid_mul],
    Op.SELECT_ROWS: [select_rows], Op.BIAS_RELU: [bias_relu], Op.ACTIVE_SET: [active_set, active_set_top_k],
    Op.GATED_ACT: [gated_act], Op.DOWN_AXPY: [down_axpy], Op.SCATTER_COLS: [scatter_cols],
    Op.ACTIVE_UNION: [active_union], Op.NEURON_FETCH: [neuron_fetch], Op.COPY: [copy], Op.MOE_ROUTE: [moe_route, moe_route_grouped],
    Op.MOE_MAT_MUL: [moe_mat_mul, moe_mat_mul_bias, moe_mat_mul_per_head], Op.MOE_COMBINE: [moe_combine], Op.EXPERT_FETCH: [expert_fetch],
    Op.MOE_ROUTE_SPLIT: [moe_route_split], Op.SSM_CONV: [ssm_conv, ssm_conv_prompt],
    Op.DELTA_NET: [delta_net, delta_net_grouped, delta_net_prompt],
}
# Cases no device runs: the active union is a guard's decision, read on the host; offload's fetches run on the CPU;
# the copy case places its own nodes.
HOST_ONLY = {active_union, neuron_fetch, expert_fetch, copy}
ALL = [pytest.param(op, case, id=f"{op.name.lower()}-{case.__name__}") for op, cases in CASES.items() for case in cases]
# Cases CUDA's `supports` refuses (their nodes stay on the CPU there): MLA's attention and the per-head matmul.
ON_DEVICES = [p for p in ALL if p.values[1] not in HOST_ONLY]
ON_CUDA = ON_DEVICES  # every device op has its CUDA kernel (MLA's, the per-head matmul's, the recurrent ones included)


def run_case(case: Callable, isa: str = "auto", device: str | None = None):
    """(Case, outputs): the case's graph run once; with `device`, every node but the active unions on backend 1
    of that kind ("cpu": the stand-in; "cuda:N")."""
    b = GraphBuilder()
    c = case(b, np.random.default_rng(11))
    for t in c.outputs:
        b.graph.pin(t.id)
    kw = dict(c.engine_kw)
    if device is not None:
        kw = {"placement": [0 if op == Op.ACTIVE_UNION else 1 for op, _ in b.node_ops], "backend_threads": [1, 1],
              "backend_memory": [0, 1], "backend_kinds": ["cpu", device]}
    e = _core.Engine(b.graph, max_tokens=max(16, c.n_tokens), max_outputs=16, n_threads=2, isa=isa, **kw)
    e.run(c.n_tokens, **c.run_kw)
    rows = {RowMode.TOKENS: c.n_tokens, RowMode.OUTPUTS: len(c.run_kw.get("out_ids", []))}
    outs = [np.array(e.tensor(t.id, rows.get(t.rows, t.n_rows))) for t in c.outputs]
    return c, outs, e


def compare(c: Case, got: list, want: list) -> None:
    """Engine outputs `got` (read through the case's `read`) against `want` (already in that form)."""
    for g, w in zip(got, want):
        if c.read is not None:
            g = c.read(g)
        if isinstance(g, list):
            for a, z in zip(g, w):
                np.testing.assert_array_equal(a, z)
            continue
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=c.rtol, atol=c.atol)
