"""The regime expert streaming is for: a Qwen3-30B-A3B-shaped Mixture of Experts (48 layers, d 2048, 32 heads of
128 with 4 KV heads, 128 experts of 768 neurons, 8 per token, Q4_0, random weights, about 17 GB) decoded under
total memory limits far below its size, pyinfer (`mem_limit`: experts stream, the hottest resident) against
llama.cpp (repacking off, so its weights stay in the mmap), both in memory cgroups of the same limit
(bench/offload.py's protocol: caches dropped, alternating rounds, medians and spreads).

No real MoE file fits the package registries, so the router is built to produce a stated routing process:
  - every token belongs to a routing class (its id mod 2048); its embedding is that class's axis, and attention
    and the experts write exact zeros (fp16 scale 0 over random nibbles: the bytes are read, the sums are 0), so
    every layer's router sees the class;
  - each layer's router gives each class 8 experts, drawn from that layer's popularity p_e ~ (rank_e + 1)^-ALPHA
    (a random rank order per layer), except that each of the previous class's experts is kept with probability
    REUSE (what an expert cache can reuse from one decode step to the next);
  - the output head sends class c to class c + 1, so greedy decode walks the classes in order and every step
    is routed by the process above.
Because attention and the experts add exact zeros, every layer's hidden state is its token's class axis: the
next layer's router applied to this layer's state (pyinfer's prefetch) names exactly the experts that layer
will choose. `--prefetch` therefore measures what read-ahead saves when its prediction is right, an upper
bound; how often it is right on a real model is that model's (pre-gated MoE and ProMoE report most of the
experts), and no real MoE file fits the package registries to measure it here.
Random weights: the figures are speeds and bytes, never quality. Needs root, cgroup v1 and llama-cpp-python;
writes ~17 GB under --workdir.

  python bench/moe_synthetic.py --limits 4G 8G 12G --tokens 64 --ctx 256
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

MOE_RESULTS = Path(__file__).parent / "results" / "moe"  # (offload.py's RESULTS is the neuron offload's)

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SHAPES = {  # --family: the model shapes written (random weights, the type mix their files ship in)
    "qwen3moe": {"n_layers": 48, "d_model": 2048, "n_heads": 32, "n_kv_heads": 4, "head_dim": 128, "n_expert": 128,
                 "n_expert_used": 8, "d_ff_expert": 768, "vocab": 151936},
    # gpt-oss-20b: MXFP4 experts, Q8_0 attention, attention sinks, a window of 128 on every other layer, YaRN x32
    "gpt-oss": {"n_layers": 24, "d_model": 2880, "n_heads": 64, "n_kv_heads": 8, "head_dim": 64, "n_expert": 32,
                "n_expert_used": 4, "d_ff_expert": 2880, "vocab": 201088},
    # GLM-4.5-Air's layers, an 8-layer slice of its 46 (the leading dense layer and 7 MoE layers): Q4_K experts (down
    # Q5_0: its rows of 1408 are no multiple of 256), Q8_0 attention, partial RoPE over 64 of 128, sigmoid routing with a selection bias, a shared expert
    "glm4moe": {"n_layers": 8, "d_model": 4096, "n_heads": 96, "n_kv_heads": 8, "head_dim": 128, "n_expert": 128,
                "n_expert_used": 8, "d_ff_expert": 1408, "vocab": 151552, "d_ff_dense": 10944},
    # DeepSeek-V2-Lite: latent attention (16 heads of 128 + 64, a latent of 512 + 64 cached), a leading dense layer,
    # 64 experts of 1408, 6 per token, two shared experts; Q4_K experts (down Q5_0), Q8_0 attention
    "deepseek2": {"n_layers": 27, "d_model": 2048, "n_heads": 16, "n_kv_heads": 1, "head_dim": 192, "n_expert": 64,
                  "n_expert_used": 6, "d_ff_expert": 1408, "vocab": 102400, "d_ff_dense": 10944, "rope_dims": 64,
                  "kv_lora_rank": 512, "v_dim": 128},
    # SmallThinker-21B-A3B: 64 ReGLU experts of 768, 6 per token, routed from each layer's input before attention;
    # three of every four layers sliding over 4096, the fourth global and NoPE; Q4_K experts, Q8_0 attention
    "smallthinker": {"n_layers": 52, "d_model": 2560, "n_heads": 28, "n_kv_heads": 4, "head_dim": 128, "n_expert": 64,
                     "n_expert_used": 6, "d_ff_expert": 768, "vocab": 151936},
}
# Qwen3.5-35B-A3B's class (an assumption where its config is not at hand: Qwen3-Next's layout at 40 layers, d 2048): three
# of every four layers gated DeltaNet (16 key and 32 value heads of 128, a conv of 4), the fourth gated attention (16
# heads of 256, 2 KV heads, 64 rotary values); 256 experts of 512, 8 per token, and a gated shared expert of 512
SHAPES["qwen35moe"] = {"n_layers": 40, "d_model": 2048, "n_heads": 16, "n_kv_heads": 2, "head_dim": 256,
                       "n_expert": 256, "n_expert_used": 8, "d_ff_expert": 512, "vocab": 248320, "d_ff_shared": 512,
                       "ssm_head": 128, "k_heads": 16, "v_heads": 32, "conv": 4, "rope_dims": 64}
# its first 16 layers (12 DeltaNet, 4 attention; 7.5 GiB): small enough for both engines side by side in one process
SHAPES["qwen35moe-slice"] = dict(SHAPES["qwen35moe"], n_layers=16)
# Gemma 4 26B-A4B (transformers' conversion config): 30 layers, five sliding over 1024 (16 heads of 256 over 8 KV
# heads) per global one (heads of 512 over 2 KV heads, no attn_v: the value is k's projection); every layer a dense
# FFN of 2112 beside 128 experts of 704, 8 per token, gate and up fused; Q4_K experts (down Q5_0: its rows of 704 are
# no multiple of 256), Q8_0 attention and dense FFN
SHAPES["gemma4moe"] = {"n_layers": 30, "d_model": 2816, "n_heads": 16, "n_kv_heads": 8, "head_dim": 256,
                       "head_dim_global": 512, "kv_heads_global": 2, "n_expert": 128, "n_expert_used": 8,
                       "d_ff_expert": 704, "vocab": 262144, "d_ff_dense": 2112, "window": 1024,
                       "kv_heads_per_layer": [8 if (il + 1) % 6 else 2 for il in range(30)]}
SHAPE = SHAPES["qwen3moe"]
SHAPE_NAMES = {"gemma4moe": "Gemma 4 26B-A4B", "qwen35moe-slice": "Qwen3.5-35B-A3B (class, 16-layer slice)", "qwen35moe": "Qwen3.5-35B-A3B (class)", "qwen3moe": "Qwen3-30B-A3B", "gpt-oss": "gpt-oss-20b", "glm4moe": "GLM-4.5-Air (8-layer slice)",
               "deepseek2": "DeepSeek-V2-Lite", "smallthinker": "SmallThinker-21B-A3B"}
CLASSES = 2048            # routing classes: token id mod CLASSES (one axis of d_model each)
ALPHA, REUSE = 1.0, 0.3   # popularity skew per layer; chance a token keeps each of the previous token's experts
SCALE = 0.02              # fp16 scale of the random blocks that do compute (q, k, v, expert gate and up)


def q4_blocks(rng, rows: int, cols: int, scale: float) -> np.ndarray:
    """U8 [rows, cols / 32 * 18]: random nibbles under one fp16 scale (0: every value exactly 0)."""
    b = rng.integers(0, 256, size=(rows, cols // 32, 18), dtype=np.uint8)
    b[:, :, :2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return b.reshape(rows, -1)


def axis_rows(rows: int, cols: int, axis_of_row: dict[int, list[int]], value: float) -> np.ndarray:
    """Q4_0 [rows, cols] that is `value` at (r, c) for c in axis_of_row[r] and exactly 0 elsewhere."""
    b = np.zeros((rows, cols // 32, 18), np.uint8)
    b[:, :, 2:] = 0x88                                  # every nibble 8: value d * (8 - 8) = 0
    d = np.frombuffer(np.float16(value / 7).tobytes(), np.uint8)
    for r, axes in axis_of_row.items():
        for c in axes:
            blk, j = divmod(c, 32)
            b[r, blk, :2] = d
            byte = 2 + (j % 16)
            b[r, blk, byte] = (b[r, blk, byte] & 0xF0) | 15 if j < 16 else (b[r, blk, byte] & 0x0F) | 0xF0
    return b.reshape(rows, -1)


def class_embedding(V: int, d: int) -> np.ndarray:
    """Q4_0 [V, d]: token v is its routing class's axis (value 1: the norm scales it to sqrt(d) anyway)."""
    return axis_rows(V, d, {v: [v % CLASSES] for v in range(V)}, 1.0)


def class_head(V: int, d: int) -> np.ndarray:
    """Q4_0 [V, d]: class c's axis votes for token c + 1 (the next class), so greedy decode walks the chain."""
    return axis_rows(V, d, {(cls + 1) % CLASSES: [cls] for cls in range(CLASSES)}, 1.0)


def class_router(experts_of_class: np.ndarray) -> np.ndarray:
    """F32 [n_expert, d]: class c's experts (I32 [CLASSES, k]) get logits 10, 9.9, ... (clear margins), others 0."""
    n, d, k = SHAPE["n_expert"], SHAPE["d_model"], SHAPE["n_expert_used"]
    r = np.zeros((n, d), np.float32)
    for cls in range(CLASSES):
        r[experts_of_class[cls], cls] = (10.0 - 0.1 * np.arange(k)) / float(np.sqrt(d))
    return r


def routing(seed: int = 7) -> np.ndarray:
    """I32 [n_layers, CLASSES, k]: each class's experts per layer, by the stated process along the class chain."""
    rng = np.random.default_rng(seed)
    n, k = SHAPE["n_expert"], SHAPE["n_expert_used"]
    out = np.zeros((SHAPE["n_layers"], CLASSES, k), np.int32)
    for il in range(SHAPE["n_layers"]):
        pop = (np.arange(n) + 1.0) ** -ALPHA
        pop = pop[rng.permutation(n)]
        pop /= pop.sum()
        prev: list[int] = list(rng.choice(n, k, replace=False, p=pop))
        for c in range(CLASSES):
            keep = [e for e in prev if rng.random() < REUSE]
            while len(keep) < k:
                e = int(rng.choice(n, p=pop))
                if e not in keep:
                    keep.append(e)
            out[il, c] = keep
            prev = keep
    return out


def q8_blocks(rng, rows: int, cols: int, scale: float) -> np.ndarray:
    """U8 [rows, cols / 32 * 34]: random int8 under one fp16 scale (0: every value exactly 0)."""
    b = rng.integers(0, 256, size=(rows, cols // 32, 34), dtype=np.uint8)
    b[:, :, :2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return b.reshape(rows, -1)


def mxfp4_blocks(rng, rows: int, cols: int, scale: float) -> np.ndarray:
    """U8 [rows, cols / 32 * 17]: random E2M1 nibbles under an exponent near `scale` (0: every nibble 0, exact
    zeros)."""
    if scale == 0:
        return np.zeros((rows, cols // 32 * 17), np.uint8)
    b = rng.integers(0, 256, size=(rows, cols // 32, 17), dtype=np.uint8)
    b[:, :, 0] = 128 + int(np.round(np.log2(scale)))  # 2^(e - 128) with the doubled value table
    return b.reshape(rows, -1)


def plan_adders(plan: list, rng):
    """(f32, q8): add to `plan` an F32 tensor made by `make`, and a Q8_0 matrix of random blocks under `scale`."""
    from gguf import GGMLQuantizationType as Q

    def f32(name, shape, make):
        plan.append((name, shape, make, Q.F32))

    def q8(name, rows, cols, scale):
        plan.append((name, (rows, cols), lambda: q8_blocks(rng, rows, cols, scale), Q.Q8_0))

    return f32, q8


def write_plan(w, plan: list[tuple]) -> None:
    """The tensors of `plan` ((name, element shape, maker of its bytes, type) each) into the file: their infos first
    (the byte shape of block types: gguf-py turns it into elements), then each made one at a time while writing."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as Q
    from tqdm import tqdm

    for name, shape, _, qt in plan:
        if qt == Q.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            elems, nbytes = GGML_QUANT_SIZES[qt]
            byte_shape = (*shape[:-1], shape[-1] // elems * nbytes)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, make, _ in tqdm(plan, desc="writing", unit="tensor", file=sys.stderr):
        w.write_tensor_data(make())
    w.close()


def moe_header(w, context: int, ff: int, rope_base: float, eps: float, head_keys: bool = True) -> None:
    """The shape keys every family's synthetic writes (SHAPE's; `ff`: feed_forward_length; `head_keys` False: the
    key and value lengths are the family's own)."""
    c = SHAPE
    w.add_block_count(c["n_layers"])
    w.add_context_length(context)
    w.add_embedding_length(c["d_model"])
    w.add_feed_forward_length(ff)
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c.get("kv_heads_per_layer", c["n_kv_heads"]))  # (Gemma 4: a list, its layers' own)
    if head_keys:
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_expert_count(c["n_expert"])
    w.add_expert_used_count(c["n_expert_used"])
    w.add_expert_feed_forward_length(c["d_ff_expert"])


def begin(path: Path, arch: str, seed: int, context: int, ff: int, rope_base: float, eps: float,
          head_keys: bool = True):
    """A family's writer, its shape keys (moe_header), the routing process's tag and the padded tiny vocabulary
    written; returns (writer, the random generator of its blocks, the routing: I32 [n_layers, CLASSES, k])."""
    from gguf import GGUFWriter
    from support.tiny_model import _add_tiny_vocab

    w = GGUFWriter(str(path), arch)
    moe_header(w, context=context, ff=ff, rope_base=rope_base, eps=eps, head_keys=head_keys)
    w.add_string("pyinfer.synthetic", f"moe routing: classes {CLASSES}, alpha {ALPHA}, reuse {REUSE}")
    _add_tiny_vocab(w, pad_to=SHAPE["vocab"])
    return w, np.random.default_rng(seed), routing()


def plan_attention(plan: list, rng, p: str, norms: tuple[str, str], biases: bool = False) -> None:
    """A layer's two norms (ones), q, k and v (Q8_0 random blocks that compute, with zero biases when `biases`) and the
    output projection that writes exact zeros (zero scales): the attention every family's synthetic but Qwen3's has."""
    from gguf import GGMLQuantizationType as Q

    d, qw, kvw = SHAPE["d_model"], SHAPE["n_heads"] * SHAPE["head_dim"], SHAPE["n_kv_heads"] * SHAPE["head_dim"]
    for norm in norms:
        plan.append((p + norm + ".weight", (d,), lambda: np.ones(d, np.float32), Q.F32))
    for name, rows in (("attn_q", qw), ("attn_k", kvw), ("attn_v", kvw)):
        plan.append((p + name + ".weight", (rows, d), lambda rows=rows: q8_blocks(rng, rows, d, SCALE / 8), Q.Q8_0))
        if biases:
            plan.append((p + name + ".bias", (rows,), lambda rows=rows: np.zeros(rows, np.float32), Q.F32))
    plan.append((p + "attn_output.weight", (d, qw), lambda: q8_blocks(rng, d, qw, 0.0), Q.Q8_0))


def write_gpt_oss(path: Path, seed: int = 0) -> None:
    """gpt-oss-20b's shape under the same routing process: attention and experts write exact zeros (zero
    scales, zero biases), the router and head carry the class chain."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, n, ff, V = c["d_model"], c["n_expert"], c["d_ff_expert"], c["vocab"]
    a = "gpt-oss"
    w, rng, route = begin(path, a, seed, context=131072, ff=ff, rope_base=150000.0, eps=1e-5)
    w.add_uint32(a + ".attention.sliding_window", 128)
    w.add_string(a + ".rope.scaling.type", "yarn")
    w.add_float32(a + ".rope.scaling.factor", 32.0)
    w.add_uint32(a + ".rope.scaling.original_context_length", 4096)
    plan: list[tuple] = []  # (name, element shape, maker, type)

    def zeros(name, shape):
        plan.append((name, shape, lambda: np.zeros(shape, np.float32), Q.F32))

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d),
                 Q.Q4_0))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        plan_attention(plan, rng, p, ("attn_norm", "post_attention_norm"), biases=True)
        zeros(p + "attn_output.bias", (d,))
        zeros(p + "attn_sinks.weight", (c["n_heads"],))

        def router(il=il):
            return class_router(route[il])

        plan.append((p + "ffn_gate_inp.weight", (n, d), router, Q.F32))
        zeros(p + "ffn_gate_inp.bias", (n,))
        for part, rows, cols, scale in (("gate", ff, d, SCALE), ("up", ff, d, SCALE), ("down", d, ff, 0.0)):
            plan.append((p + f"ffn_{part}_exps.weight", (n, rows, cols),
                         lambda rows=rows, cols=cols, scale=scale: mxfp4_blocks(rng, n * rows, cols, scale).reshape(
                             n, rows, -1), Q.MXFP4))
            zeros(p + f"ffn_{part}_exps.bias", (n, rows))
    plan.append(("output_norm.weight", (d,), lambda: np.ones(d, np.float32), Q.F32))
    plan.append(("output.weight", (V, d),
                 lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def q4k_blocks(rng, rows: int, cols: int, scale: float) -> np.ndarray:
    """U8 [rows, cols / 256 * 144]: random Q4_K super-blocks under d = scale, dmin = 0 (scale 0: exact zeros)."""
    b = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    b[:, :, :2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    b[:, :, 2:4] = 0
    return b.reshape(rows, -1)


def plan_q4k_experts(plan: list, rng, p: str, router_of_layer, zero_down: bool = True) -> None:
    """A layer's router (F32, from `router_of_layer()`) and its merged Q4_K experts: gate and up random blocks that
    compute, down (unless `zero_down` is False: the family writes its own) exact zeros."""
    from gguf import GGMLQuantizationType as Q

    n, d, ff = SHAPE["n_expert"], SHAPE["d_model"], SHAPE["d_ff_expert"]
    plan.append((p + "ffn_gate_inp.weight", (n, d), router_of_layer, Q.F32))
    for part in ("gate", "up"):
        plan.append((p + f"ffn_{part}_exps.weight", (n, ff, d),
                     lambda: q4k_blocks(rng, n * ff, d, SCALE).reshape(n, ff, -1), Q.Q4_K))
    if zero_down:
        plan.append((p + "ffn_down_exps.weight", (n, d, ff), lambda: q4k_blocks(rng, n * d, ff, 0.0).reshape(n, d, -1),
                     Q.Q4_K))


def write_glm4moe(path: Path, seed: int = 0) -> None:
    """GLM-4.5-Air's layers under the routing process: attention, the dense FFN, the experts and the shared expert
    write exact zeros (zero scales); the router (sigmoid, a zero selection bias) and head carry the class chain."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, hd, n, ff, V = c["d_model"], c["head_dim"], c["n_expert"], c["d_ff_expert"], c["vocab"]
    a = "glm4moe"
    w, rng, route = begin(path, a, seed, context=131072, ff=c["d_ff_dense"], rope_base=1e6, eps=1e-5)
    w.add_rope_dimension_count(hd // 2)
    w.add_uint32(a + ".leading_dense_block_count", 1)
    w.add_uint32(a + ".expert_shared_count", 1)
    w.add_bool(a + ".expert_weights_norm", True)
    w.add_float32(a + ".expert_weights_scale", 1.0)
    w.add_uint32(a + ".expert_gating_func", 2)
    plan: list[tuple] = []

    def f32(name, shape, make):
        plan.append((name, shape, make, Q.F32))

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d),
                 Q.Q4_0))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        plan_attention(plan, rng, p, ("attn_norm", "post_attention_norm"), biases=True)
        if il == 0:  # the leading dense layer
            dff = c["d_ff_dense"]
            for part, rows, cols, scale in (("gate", dff, d, SCALE), ("up", dff, d, SCALE), ("down", d, dff, 0.0)):
                plan.append((p + f"ffn_{part}.weight", (rows, cols),
                             lambda rows=rows, cols=cols, scale=scale: q8_blocks(rng, rows, cols, scale), Q.Q8_0))
            continue

        def router(il=il):
            return class_router(route[il])

        f32(p + "ffn_gate_inp.weight", (n, d), router)
        f32(p + "exp_probs_b.bias", (n,), lambda: np.zeros(n, np.float32))
        for part, rows, cols, scale in (("gate", ff, d, SCALE), ("up", ff, d, SCALE)):
            plan.append((p + f"ffn_{part}_exps.weight", (n, rows, cols),
                         lambda rows=rows, cols=cols, scale=scale: q4k_blocks(rng, n * rows, cols, scale).reshape(
                             n, rows, -1), Q.Q4_K))
        # down's rows of 1408 are no multiple of 256: Q5_0, as llama.cpp's Q4_K_M falls back (zeros: scale 0)
        plan.append((p + "ffn_down_exps.weight", (n, d, ff), lambda: np.zeros((n, d, ff // 32 * 22), np.uint8), Q.Q5_0))
        for part, rows, cols, scale in (("gate", ff, d, SCALE), ("up", ff, d, SCALE), ("down", d, ff, 0.0)):
            plan.append((p + f"ffn_{part}_shexp.weight", (rows, cols),
                         lambda rows=rows, cols=cols, scale=scale: q8_blocks(rng, rows, cols, scale), Q.Q8_0))
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    plan.append(("output.weight", (V, d),
                 lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def write_deepseek2(path: Path, seed: int = 0) -> None:
    """DeepSeek-V2-Lite's shape under the routing process: latent attention whose output projection, the dense FFN,
    the experts and the shared experts write exact zeros (zero scales); the router (softmax) and head carry the class
    chain. YaRN x40 over an original 4096 with DeepSeek's magnitude, as the real file."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, hd, n, ff, V = c["d_model"], c["head_dim"], c["n_expert"], c["d_ff_expert"], c["vocab"]
    heads, rot, rank, vd = c["n_heads"], c["rope_dims"], c["kv_lora_rank"], c["v_dim"]
    a = "deepseek2"
    w, rng, route = begin(path, a, seed, context=163840, ff=c["d_ff_dense"], rope_base=10000.0, eps=1e-6,
                          head_keys=False)
    w.add_key_length(rank + rot)   # the cache's one latent head
    w.add_value_length(rank)
    w.add_key_length_mla(hd)
    w.add_value_length_mla(vd)
    w.add_kv_lora_rank(rank)
    w.add_q_lora_rank(0)  # q direct (llama.cpp reads the key unless the layer count says V2-Lite)
    w.add_rope_dimension_count(rot)
    w.add_uint32(a + ".leading_dense_block_count", 1)
    w.add_uint32(a + ".expert_shared_count", 2)
    w.add_float32(a + ".expert_weights_scale", 1.0)
    w.add_uint32(a + ".expert_gating_func", 1)
    w.add_string(a + ".rope.scaling.type", "yarn")
    w.add_float32(a + ".rope.scaling.factor", 40.0)
    w.add_uint32(a + ".rope.scaling.original_context_length", 4096)
    w.add_float32(a + ".rope.scaling.yarn_log_multiplier", 0.0707)
    plan: list[tuple] = []

    def f32(name, shape, make):
        plan.append((name, shape, make, Q.F32))

    def q8(name, shape, scale):
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        plan.append((name, shape, lambda: q8_blocks(rng, rows, cols, scale).reshape(*shape[:-1], -1), Q.Q8_0))

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d), Q.Q4_0))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        f32(p + "attn_norm.weight", (d,), lambda: np.ones(d, np.float32))
        f32(p + "ffn_norm.weight", (d,), lambda: np.ones(d, np.float32))
        q8(p + "attn_q.weight", (heads * hd, d), SCALE / 8)
        q8(p + "attn_kv_a_mqa.weight", (rank + rot, d), SCALE / 8)
        f32(p + "attn_kv_a_norm.weight", (rank,), lambda: np.ones(rank, np.float32))
        q8(p + "attn_k_b.weight", (heads, rank, hd - rot), SCALE / 8)
        q8(p + "attn_v_b.weight", (heads, vd, rank), SCALE / 8)
        q8(p + "attn_output.weight", (d, heads * vd), 0.0)
        if il == 0:  # the leading dense layer
            dff = c["d_ff_dense"]
            for part, shape, scale in (("gate", (dff, d), SCALE), ("up", (dff, d), SCALE), ("down", (d, dff), 0.0)):
                q8(p + f"ffn_{part}.weight", shape, scale)
            continue

        plan_q4k_experts(plan, rng, p, lambda il=il: class_router(route[il]), zero_down=False)
        # down's rows of 1408 are no multiple of 256: Q5_0, as llama.cpp's Q4_K_M falls back (zeros: scale 0)
        plan.append((p + "ffn_down_exps.weight", (n, d, ff), lambda: np.zeros((n, d, ff // 32 * 22), np.uint8), Q.Q5_0))
        for part, shape, scale in (("gate", (2 * ff, d), SCALE), ("up", (2 * ff, d), SCALE), ("down", (d, 2 * ff), 0.0)):
            q8(p + f"ffn_{part}_shexp.weight", shape, scale)
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    plan.append(("output.weight", (V, d), lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def write_smallthinker(path: Path, seed: int = 0) -> None:
    """SmallThinker-21B-A3B's shape under the routing process: attention and the experts write exact zeros (zero
    scales); the router (softmax, on each layer's un-normed input, which is its class axis) and head carry the class
    chain."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, n, ff, V = c["d_model"], c["n_expert"], c["d_ff_expert"], c["vocab"]
    a = "smallthinker"
    w, rng, route = begin(path, a, seed, context=65536, ff=ff, rope_base=1.5e6, eps=1e-6)
    w.add_uint32(a + ".expert_gating_func", 1)
    w.add_uint32(a + ".attention.sliding_window", 4096)
    plan: list[tuple] = []

    def f32(name, shape, make):
        plan.append((name, shape, make, Q.F32))

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d), Q.Q4_0))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        plan_attention(plan, rng, p, ("attn_norm", "ffn_norm"))

        # the un-normed class axis (1.0) routes: logits sqrt(d) times the normed synthetics'
        plan_q4k_experts(plan, rng, p, lambda il=il: class_router(route[il]) * float(np.sqrt(d)))
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    plan.append(("output.weight", (V, d), lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def write_qwen35moe(path: Path, seed: int = 0) -> None:
    """Qwen3.5-35B-A3B's class under the routing process: the DeltaNet layers (their conv and delta rule computing on
    random Q8_0 projections), the attention layers, the experts and the shared expert all write exact zeros (zero
    scales on ssm_out, attn_output and the downs); the router (softmax, on the normed class axis) and head carry the
    class chain."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, n, ff, V, hd = c["d_model"], c["n_expert"], c["d_ff_expert"], c["vocab"], c["head_dim"]
    S, hk, hv, K = c["ssm_head"], c["k_heads"], c["v_heads"], c["conv"]
    channels = (2 * hk + hv) * S
    a = "qwen35moe"
    w, rng, route = begin(path, a, seed, context=262144, ff=ff, rope_base=1e7, eps=1e-6)
    w.add_expert_shared_feed_forward_length(c["d_ff_shared"])
    w.add_rope_dimension_count(c["rope_dims"])
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_ssm_conv_kernel(K)
    w.add_ssm_state_size(S)
    w.add_ssm_group_count(hk)
    w.add_ssm_time_step_rank(hv)
    w.add_ssm_inner_size(hv * S)
    w.add_full_attention_interval(4)
    plan: list[tuple] = []
    f32, q8 = plan_adders(plan, rng)

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d), Q.Q4_0))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        for norm in ("attn_norm", "post_attention_norm"):
            f32(p + norm + ".weight", (d,), lambda: np.ones(d, np.float32))
        if (il + 1) % 4:
            q8(p + "attn_qkv.weight", channels, d, SCALE / 8)
            q8(p + "attn_gate.weight", hv * S, d, SCALE / 8)
            f32(p + "ssm_conv1d.weight", (channels, K), lambda: rng.standard_normal((channels, K)).astype(np.float32))
            f32(p + "ssm_dt.bias", (hv,), lambda: np.zeros(hv, np.float32))
            f32(p + "ssm_a", (hv,), lambda: -np.ones(hv, np.float32))
            q8(p + "ssm_beta.weight", hv, d, SCALE / 8)
            q8(p + "ssm_alpha.weight", hv, d, SCALE / 8)
            f32(p + "ssm_norm.weight", (S,), lambda: np.ones(S, np.float32))
            q8(p + "ssm_out.weight", d, hv * S, 0.0)
        else:
            q8(p + "attn_q.weight", 2 * c["n_heads"] * hd, d, SCALE / 8)
            q8(p + "attn_k.weight", c["n_kv_heads"] * hd, d, SCALE / 8)
            q8(p + "attn_v.weight", c["n_kv_heads"] * hd, d, SCALE / 8)
            f32(p + "attn_q_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
            f32(p + "attn_k_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
            q8(p + "attn_output.weight", d, c["n_heads"] * hd, 0.0)

        plan_q4k_experts(plan, rng, p, lambda il=il: class_router(route[il]))
        fs = c["d_ff_shared"]
        f32(p + "ffn_gate_inp_shexp.weight", (d,), lambda: np.zeros(d, np.float32))
        for part in ("gate", "up"):
            plan.append((p + f"ffn_{part}_shexp.weight", (fs, d), lambda: q4k_blocks(rng, fs, d, SCALE), Q.Q4_K))
        plan.append((p + "ffn_down_shexp.weight", (d, fs), lambda: q4k_blocks(rng, d, fs, 0.0), Q.Q4_K))
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    plan.append(("output.weight", (V, d), lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def write_gemma4moe(path: Path, seed: int = 0) -> None:
    """Gemma 4 26B-A4B under the routing process: attention, the dense FFN and the experts write exact zeros (zero
    scales; each branch's post-norm keeps a zero a zero); the router (its input the stream RMS-normed over sqrt(d)
    times ffn_gate_inp.scale, here sqrt(d): the normed class axis other families' routers read) and head carry the
    class chain; layer output scales 1."""
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, n, ff, V, L = c["d_model"], c["n_expert"], c["d_ff_expert"], c["vocab"], c["n_layers"]
    local = [(il + 1) % 6 != 0 for il in range(L)]
    a = "gemma4"
    w, rng, route = begin(path, a, seed, context=262144, ff=c["d_ff_dense"], rope_base=1e6, eps=1e-6, head_keys=False)
    hd, hg = c["head_dim"], c["head_dim_global"]
    for key, v in (("key_length", hg), ("value_length", hg), ("key_length_swa", hd), ("value_length_swa", hd)):
        w.add_uint32(f"{a}.attention.{key}", v)
    w.add_rope_dimension_count(hg)
    w.add_rope_dimension_count_swa(hd)
    w.add_rope_freq_base_swa(1e4)
    w.add_sliding_window(c["window"])
    w.add_sliding_window_pattern(local)
    w.add_final_logit_softcapping(30.0)
    w.add_embedding_length_per_layer_input(0)  # (llama.cpp requires the key)
    plan: list[tuple] = []
    f32, q8 = plan_adders(plan, rng)

    plan.append(("token_embd.weight", (V, d), lambda: class_embedding(V, d), Q.Q4_0))
    f32("rope_freqs.weight", (hg // 2,), lambda: np.array([1.0] * (hg // 8) + [1e30] * (hg // 2 - hg // 8), np.float32))
    dff = c["d_ff_dense"]
    for il in range(L):
        p, h = f"blk.{il}.", hd if local[il] else hg
        kv = c["n_kv_heads"] if local[il] else c["kv_heads_global"]
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "pre_ffw_norm_2",
                     "post_ffw_norm_1", "post_ffw_norm_2"):
            f32(p + norm + ".weight", (d,), lambda: np.ones(d, np.float32))
        q8(p + "attn_q.weight", c["n_heads"] * h, d, SCALE / 8)
        q8(p + "attn_k.weight", kv * h, d, SCALE / 8)
        if local[il]:
            q8(p + "attn_v.weight", kv * h, d, SCALE / 8)
        f32(p + "attn_q_norm.weight", (h,), lambda h=h: np.full(h, h ** -0.25, np.float32))
        f32(p + "attn_k_norm.weight", (h,), lambda h=h: np.full(h, h ** -0.25, np.float32))
        q8(p + "attn_output.weight", d, c["n_heads"] * h, 0.0)
        q8(p + "ffn_gate.weight", dff, d, SCALE)
        q8(p + "ffn_up.weight", dff, d, SCALE)
        q8(p + "ffn_down.weight", d, dff, 0.0)
        f32(p + "ffn_gate_inp.weight", (n, d), lambda il=il: class_router(route[il]))
        f32(p + "ffn_gate_inp.scale", (d,), lambda: np.full(d, np.sqrt(d), np.float32))
        plan.append((p + "ffn_gate_up_exps.weight", (n, 2 * ff, d),
                     lambda: q4k_blocks(rng, n * 2 * ff, d, SCALE).reshape(n, 2 * ff, -1), Q.Q4_K))
        plan.append((p + "ffn_down_exps.weight", (n, d, ff), lambda: np.zeros((n, d, ff // 32 * 22), np.uint8), Q.Q5_0))
        f32(p + "ffn_down_exps.scale", (n,), lambda: np.ones(n, np.float32))
        f32(p + "layer_output_scale.weight", (1,), lambda: np.ones(1, np.float32))
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    plan.append(("output.weight", (V, d), lambda: class_head(V, d), Q.Q4_0))
    write_plan(w, plan)


def write_model(path: Path, seed: int = 0) -> None:
    from gguf import GGMLQuantizationType as Q

    c = SHAPE
    d, hd, n, ff, V = c["d_model"], c["head_dim"], c["n_expert"], c["d_ff_expert"], c["vocab"]
    qw, kvw = c["n_heads"] * hd, c["n_kv_heads"] * hd
    a = "qwen3moe"
    w, rng, route = begin(path, a, seed, context=4096, ff=6144, rope_base=1e6, eps=1e-6)

    # name -> (numpy element shape, maker of its bytes); made one at a time while writing
    plan: list[tuple] = []

    def q4(name, shape, make):
        plan.append((name, shape, make, Q.Q4_0))

    def f32(name, shape, make):
        plan.append((name, shape, make, Q.F32))

    q4("token_embd.weight", (V, d), lambda: class_embedding(V, d))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        f32(p + "attn_norm.weight", (d,), lambda: np.ones(d, np.float32))
        for name, rows in (("attn_q", qw), ("attn_k", kvw), ("attn_v", kvw)):
            q4(p + name + ".weight", (rows, d), lambda rows=rows: q4_blocks(rng, rows, d, SCALE))
        f32(p + "attn_q_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
        f32(p + "attn_k_norm.weight", (hd,), lambda: np.ones(hd, np.float32))
        q4(p + "attn_output.weight", (d, qw), lambda: q4_blocks(rng, d, qw, 0.0))
        f32(p + "ffn_norm.weight", (d,), lambda: np.ones(d, np.float32))

        def router(il=il):
            return class_router(route[il])

        f32(p + "ffn_gate_inp.weight", (n, d), router)
        q4(p + "ffn_gate_exps.weight", (n, ff, d), lambda: q4_blocks(rng, n * ff, d, SCALE).reshape(n, ff, -1))
        q4(p + "ffn_up_exps.weight", (n, ff, d), lambda: q4_blocks(rng, n * ff, d, SCALE).reshape(n, ff, -1))
        q4(p + "ffn_down_exps.weight", (n, d, ff), lambda: q4_blocks(rng, n * d, ff, 0.0).reshape(n, d, -1))
    f32("output_norm.weight", (d,), lambda: np.ones(d, np.float32))
    q4("output.weight", (V, d), lambda: class_head(V, d))

    write_plan(w, plan)


VARIANTS = {  # --policies / --prefetch: pyinfer alone, one of its expert options against the other
    "policies": ("expert_policy", ("lru", "lfu"), "moe_policies", "The expert cache's policy (LRU against LFU)"),
    "prefetch": ("expert_prefetch", ("on", "off"), "moe_prefetch",
                 "Reading the next layer's predicted experts ahead (on against off)"),
    "sources": ("expert_source", ("bundle", "gguf"), "moe_bundle",
                "Reading experts from the expert bundle file (one page-aligned read each) against the model "
                "file's merged tensors (three reads each)"),
}


def prepare(model: Path, bundle: bool) -> None:
    """Measures the routing profile and writes the expert bundle file now, outside any limit and timing (the
    first run under a limit would, through a page cache far smaller than the model)."""
    import pyinfer
    from pyinfer.model.pull import cache_dir
    from pyinfer.offload.expert_bundles import open_or_write_expert_bundles
    from pyinfer.sparsity.expert_profile import cached_profile, describe_profile

    m = pyinfer.load(str(model), n_ctx=64, n_threads=2)
    print(f"routing profile: {describe_profile(cached_profile(m.session, True))}", file=sys.stderr)
    if bundle:
        layout = open_or_write_expert_bundles(cache_dir(), m.session.gguf, m.config)
        print(f"expert bundle file {layout.path} ({layout.file_bytes / 2**30:.2f} GiB)", file=sys.stderr)


def compare_variants(model: str, args, which: str) -> int:
    """pyinfer alone at each limit, one expert option's two values: rounds alternate them (order flipped every
    other round), each in a fresh cgroup of the limit with caches dropped."""
    import json
    import statistics

    import offload as ob

    attr, values, tag, title = VARIANTS[which]
    if args.family != "qwen3moe":  # the family's own table beside the Qwen3-30B-A3B one
        tag += "_" + args.family.replace("-", "_")
    rows = []
    for label, limit in ob.parse_limits(args.limits):
        runs: dict[str, list] = {v: [] for v in values}
        for r in range(args.rounds):
            for value in (values if r % 2 == 0 else values[::-1]):
                setattr(args, attr, value)
                out, cg = ob.run_in_cgroup(ob.child_cmd("pyinfer", model, args, limit), limit, value)
                if "error" in out:
                    print(f"{label} round {r + 1} {value}: {out['error']}", file=sys.stderr)
                    continue
                runs[value].append(out)
                e = out.get("experts") or {}
                print(f"{label} round {r + 1} {value}: {out.get('tok_s', 0):.2f} tok/s, hit rate "
                      f"{e.get('hit_rate', 0):.1%}, {out.get('read_bytes_per_token', 0) / 1e6:.1f} MB/token, "
                      f"prediction {e.get('prediction_accuracy') or 0:.1%}", file=sys.stderr)

        def med(v: list, f):
            xs = [f(o) for o in v if f(o) is not None]
            return statistics.median(xs) if xs else None

        n = args.tokens
        med_rows = {value: {"tok_s": med(v, lambda o: o["tok_s"]),
                            "tok_s_low": min((o["tok_s"] for o in v), default=None),
                            "tok_s_high": max((o["tok_s"] for o in v), default=None),
                            "hit_rate": med(v, lambda o: o["experts"]["hit_rate"]),
                            "mb_per_token": med(v, lambda o: o["read_bytes_per_token"] / 1e6),
                            "prediction_accuracy": med(v, lambda o: o["experts"].get("prediction_accuracy")),
                            "prefetch_used_share": med(v, lambda o: o["experts"].get("prefetch_used_share")),
                            "read_wait_s_per_token": med(v, lambda o: (o["experts"]["read_seconds"] +
                                                                       o["experts"].get("prefetch_wait_seconds", 0)) / n)}
                    for value, v in runs.items()}
        rows.append({"label": label, "limit_bytes": limit, "median": med_rows, "runs": runs})
    MOE_RESULTS.mkdir(parents=True, exist_ok=True)
    (MOE_RESULTS / f"{tag}.json").write_text(json.dumps({"meta": {"tokens": args.tokens, "ctx": args.ctx,
                                                        "rounds": args.rounds, "alpha": ALPHA, "reuse": REUSE,
                                                        "threads": args.threads, "compared": attr},
                                               "rows": rows}, indent=1))

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    a, b = values
    lines = [f"# {title} on the synthetic {SHAPE_NAMES[args.family]}-shaped MoE", "",
             f"pyinfer alone under `--mem-limit` (a memory cgroup of the same limit, caches dropped), {args.threads} "
             f"threads, {args.tokens} decode tokens, {args.rounds} rounds alternating; routing alpha {ALPHA}, reuse "
             f"{REUSE}. Medians (lowest-highest). `waiting on reads` is seconds per token the decode blocked on "
             "expert reads (on-demand reads plus read-ahead not finished in time).", "",
             f"| limit | tok/s {a} | tok/s {b} | {a} / {b} | hit rate {a} | {b} | MB read/token {a} | {b} | "
             f"waiting on reads s/token {a} | {b} | read-ahead choice right | read-ahead used |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        x, y = r["median"][a], r["median"][b]
        ratio = x["tok_s"] / y["tok_s"] if x["tok_s"] and y["tok_s"] else None
        pred = x["prediction_accuracy"] if x["prediction_accuracy"] is not None else y["prediction_accuracy"]
        used = x["prefetch_used_share"] if x["prefetch_used_share"] is not None else y["prefetch_used_share"]
        lines.append(f"| {r['label']} | {f(x['tok_s'], '.2f')} ({f(x['tok_s_low'], '.2f')}-{f(x['tok_s_high'], '.2f')}) | "
                     f"{f(y['tok_s'], '.2f')} ({f(y['tok_s_low'], '.2f')}-{f(y['tok_s_high'], '.2f')}) | "
                     f"{f(ratio, '.2f')}x | {f(x['hit_rate'], '.1%')} | {f(y['hit_rate'], '.1%')} | "
                     f"{f(x['mb_per_token'], '.1f')} | {f(y['mb_per_token'], '.1f')} | {f(x['read_wait_s_per_token'], '.3f')} | "
                     f"{f(y['read_wait_s_per_token'], '.3f')} | {f(pred, '.1%')} | {f(used, '.1%')} |")
    (MOE_RESULTS / f"{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    import offload as ob

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/pyinfer-moe")
    ap.add_argument("--family", default="qwen3moe", choices=sorted(SHAPES),
                    help="the shape written: Qwen3-30B-A3B (Q4_0), gpt-oss-20b (MXFP4 experts), an 8-layer slice of "
                         "GLM-4.5-Air (Q4_K experts), DeepSeek-V2-Lite (latent attention, Q4_K experts), "
                         "SmallThinker-21B-A3B (routed before attention, Q4_K experts), Qwen3.5-35B-A3B's class "
                         "(gated DeltaNet layers, Q4_K experts) or Gemma 4 26B-A4B (fused Q4_K experts beside a "
                         "dense FFN)")
    ap.add_argument("--limits", nargs="+", default=["4G", "8G", "12G"], help="total memory limits (both engines)")
    ap.add_argument("--tag", default="moe_synthetic")
    ap.add_argument("--policies", action="store_true",
                    help="pyinfer alone: LRU against LFU at each limit, alternating (bench/results/moe/moe_policies.*)")
    ap.add_argument("--prefetch", action="store_true",
                    help="pyinfer alone: reading the next layer's predicted experts ahead, on against off "
                         "(bench/results/moe/moe_prefetch.*)")
    ap.add_argument("--sources", action="store_true",
                    help="pyinfer alone: experts read from the expert bundle file against from the model file "
                         "(bench/results/moe/moe_bundle.*)")
    ap.add_argument("--expert-source", default="bundle", choices=["bundle", "gguf"],
                    help="where pyinfer reads streamed experts from: the expert bundle file (written once into "
                         "the cache before timing) or the model file")
    ap.add_argument("--expert-policy", default="lru", choices=["lru", "lfu"],
                    help="pyinfer's expert cache policy (least recently or least frequently used out)")
    ap.add_argument("--expert-prefetch", default="on", choices=["on", "off"],
                    help="pyinfer's read-ahead of the next layer's predicted experts")
    ob.add_common_args(ap)
    ap.set_defaults(tokens=64, ctx=256, sparsity="off")
    args = ap.parse_args()
    global SHAPE
    SHAPE = SHAPES[args.family]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    os.environ["PYINFER_CACHE"] = str(work / "cache")  # the routing profile is cached next to the model
    names = {"gpt-oss": "gpt-oss-20b-shape-mxfp4.gguf", "glm4moe": "glm-4.5-air-8-layer-shape-q4_k.gguf",
             "qwen3moe": "qwen3moe-30b-a3b-shape-q4_0.gguf", "deepseek2": "deepseek-v2-lite-shape-q4_k.gguf",
             "smallthinker": "smallthinker-21b-a3b-shape-q4_k.gguf", "qwen35moe": "qwen3.5-35b-a3b-class-q4_k.gguf",
             "qwen35moe-slice": "qwen3.5-35b-a3b-class-16-layer-q4_k.gguf", "gemma4moe": "gemma-4-26b-a4b-shape-q4_k.gguf"}
    model = work / names[args.family]
    if not model.exists():
        print(f"writing {model} ...", file=sys.stderr)
        writer = {"gpt-oss": write_gpt_oss, "glm4moe": write_glm4moe, "qwen3moe": write_model,
                  "deepseek2": write_deepseek2, "smallthinker": write_smallthinker,
                  "qwen35moe": write_qwen35moe, "qwen35moe-slice": write_qwen35moe, "gemma4moe": write_gemma4moe}[args.family]
        writer(model.with_suffix(".tmp"))
        model.with_suffix(".tmp").replace(model)
    prepare(model, bundle=args.sources or args.expert_source == "bundle")
    which = "policies" if args.policies else "prefetch" if args.prefetch else "sources" if args.sources else None
    if which:
        return compare_variants(str(model), args, which)
    rows = ob.compare(str(model), ob.parse_limits(args.limits), args)
    meta = {"model": model.name, "file_bytes": model.stat().st_size, "shape": SHAPE, "classes": CLASSES,
            "alpha": ALPHA, "reuse": REUSE, "expert_policy": args.expert_policy,
            "expert_prefetch": args.expert_prefetch, "expert_source": args.expert_source, "threads": args.threads, "tokens": args.tokens, "ctx": args.ctx,
            "rounds": args.rounds, "llamacpp_repack": args.repack}
    what = {"gpt-oss": "gpt-oss-20b-shaped synthetic MoE ({:.2f} GiB, MXFP4 experts, Q8_0 attention, 4 of 32 experts "
                       "per token)",
            "glm4moe": "GLM-4.5-Air's layers, an 8-layer slice ({:.2f} GiB, Q4_K experts, Q8_0 attention, 8 of 128 "
                       "experts per token and a shared expert)",
            "qwen3moe": "Qwen3-30B-A3B-shaped synthetic MoE ({:.2f} GiB, Q4_0, 8 of 128 experts per token)",
            "deepseek2": "DeepSeek-V2-Lite-shaped synthetic MoE ({:.2f} GiB, latent attention, Q4_K experts, Q8_0 "
                         "attention, 6 of 64 experts per token and two shared experts)",
            "smallthinker": "SmallThinker-21B-A3B-shaped synthetic MoE ({:.2f} GiB, Q4_K ReGLU experts routed before "
                            "attention, Q8_0 attention, 6 of 64 experts per token)",
            "qwen35moe": "Qwen3.5-35B-A3B-class synthetic hybrid MoE ({:.2f} GiB, 30 gated DeltaNet and 10 gated "
                         "attention layers in Q8_0, Q4_K experts, 8 of 256 per token and a gated shared "
                         "expert)",
            "gemma4moe": "Gemma 4 26B-A4B-shaped synthetic MoE ({:.2f} GiB, fused Q4_K experts, 8 of 128 per token, "
                         "beside a Q8_0 dense FFN in every layer; Q8_0 attention)",
            "qwen35moe-slice": "Qwen3.5-35B-A3B-class synthetic hybrid MoE, its first 16 layers ({:.2f} GiB, 12 gated "
                               "DeltaNet and 4 gated attention layers in Q8_0, Q4_K experts, 8 of 256 per token and a "
                               "gated shared expert)"}[args.family]
    print(ob.write_results(args.tag, what.format(model.stat().st_size / 2**30) + ": decode under one memory limit",
                           [f"Routing: per layer, expert popularity ~ (rank + 1)^-{ALPHA}; each of the previous "
                            f"token's experts kept with probability {REUSE}. Both engines in a memory cgroup of the "
                            "same total limit (pyinfer `mem_limit` = it), caches dropped before every run, llama.cpp's "
                            f"repacking {'on' if args.repack else 'off'}; {args.threads} threads, {args.tokens} tokens, "
                            f"context {args.ctx} for both, {args.rounds} rounds; random weights. `FFN in RAM` is "
                            "pyinfer's expert hit rate (resident or cached)."], meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
