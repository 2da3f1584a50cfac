"""Writes small random llama-architecture GGUF files for unit tests (never for acceptance)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants
from tokenizers.pre_tokenizers import ByteLevel

TINY = dict(n_layers=2, d_model=64, d_ff=96, n_heads=4, n_kv_heads=2, rope_base=10000.0, eps=1e-5)


def _add_shape(w: GGUFWriter, c: dict, context: int = 256) -> None:
    w.add_block_count(c["n_layers"])
    w.add_context_length(context)
    w.add_embedding_length(c["d_model"])
    w.add_feed_forward_length(c["d_ff"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])


def _add_tiny_vocab(w: GGUFWriter, pad_to: int = 0) -> int:
    """The byte-level BPE vocabulary of tiny_vocab(), padded with unused tokens to `pad_to` entries;
    returns its size."""
    tokens, merges = tiny_vocab()
    tokens = tokens + [f"<unused_{i}>" for i in range(pad_to - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    return len(tokens)


def tiny_vocab() -> tuple[list[str], list[str]]:
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [m.replace(" ", "") for m in merges]
    return tokens, merges


TINY_GEMMA3 = dict(n_layers=7, d_model=128, d_ff=256, n_heads=2, n_kv_heads=1, head_dim=128, rope_base=1e6,
                   eps=1e-6, window=6)
# Gemma 3 270M's mix: Q5_0 projections, Q8_0 v and embeddings, Q4_K attention output, Q6_K down.
GEMMA3_TYPES = {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_K, "ffn_gate": Q.Q5_0,
                "ffn_up": Q.Q5_0, "ffn_down": Q.Q6_K}


# Byte offsets of each block type's fp16 scales (d, and dmin or m): random bits there could be inf or NaN.
FP16_SCALES = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2),
               Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,),
               Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,), Q.IQ3_XXS: (0,), Q.IQ3_S: (0,), Q.MXFP4: ()}
# The low-bit types of MoE quants (llama.cpp's Q2_K .. IQ2_S mixes, gpt-oss's MXFP4).
LOW_BIT_TYPES = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S]


def random_k_blocks(qtype: Q, rows: int, cols: int, rng, scale: float = 0.01, low: float = 0.3,
                    signed: bool = False) -> np.ndarray:
    """Random blocks of any block type (gguf-py cannot quantize to K-quants): every bit random, fp16 scales in a
    sane range (|d| in [low, 1) * scale, either sign with `signed`). U8 [rows, row bytes]."""
    from gguf import GGML_QUANT_SIZES

    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    nb = cols // block_elems
    raw = rng.integers(0, 256, size=(rows, nb, block_bytes), dtype=np.uint8)
    for off in FP16_SCALES[qtype]:
        d = rng.uniform(low, 1.0, size=(rows, nb))
        if signed:
            d = d * rng.choice([-1, 1], size=(rows, nb))
        raw[:, :, off:off + 2] = (d * scale).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if qtype == Q.MXFP4:  # an E8M0 exponent byte, 2^(e - 128) near `scale` (its values are up to 12)
        raw[:, :, 0] = 127 + np.round(np.log2(scale)).astype(int) + rng.integers(-2, 1, size=(rows, nb))
    return raw.reshape(rows, nb * block_bytes)


def random_blocks(qtype: Q, rows: int, cols: int, rng) -> np.ndarray:
    """The kernel tests' blocks: every packed bit random, fp16 scales of either sign (every nibble, high bit, 6-bit
    scale and sign that real files can hold)."""
    return random_k_blocks(qtype, rows, cols, rng, scale=0.02, low=0.2, signed=True)


def add_random(w: GGUFWriter, rng, name: str, shape: tuple, qtype: Q, scale: float) -> None:
    """A tensor of normal(0, scale) values stored as `qtype` (F32, F16, gguf-py's quantizers, or random K-quant
    blocks, which gguf-py cannot quantize to)."""
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    if qtype == Q.F32:
        w.add_tensor(name, a)
    elif qtype == Q.F16:
        w.add_tensor(name, a.astype(np.float16))
    elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # 3-D (merged experts): rows of every expert, then reshaped
        rows = int(np.prod(shape[:-1]))
        blocks = random_k_blocks(qtype, rows, shape[-1], rng)
        w.add_tensor(name, blocks.reshape(*shape[:-1], -1), raw_dtype=qtype)
    else:
        w.add_tensor(name, quants.quantize(a, qtype), raw_dtype=qtype)


def finish(w: GGUFWriter, path: Path, extra=None) -> Path:
    """`extra(writer)` adds a test's own keys or tensors; then the file is written."""
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_gemma3(path: Path, seed: int = 0, config: dict | None = None, types: dict | None = None,
                      extra=None) -> Path:
    """A tiny random Gemma 3 (7 layers: 5 local, 1 global, 1 local) with heads wider than d_model / n_heads,
    a sliding window of 6 and Gemma 3 270M's mix of weight types. Byte-level BPE vocabulary (the
    tokenizer kind is independent of the architecture)."""
    rng = np.random.default_rng(seed)
    c = dict(TINY_GEMMA3, **(config or {}))
    kinds = dict(GEMMA3_TYPES, **(types or {}))
    w = GGUFWriter(str(path), "gemma3")
    _add_shape(w, c)
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_sliding_window(c["window"])
    vocab = _add_tiny_vocab(w)

    def add(name: str, shape: tuple, qtype: Q, scale: float = 0.1):
        add_random(w, rng, name, shape, qtype, scale)

    d, ff, hd = c["d_model"], c["d_ff"], c["head_dim"]
    qw, kvw = c["n_heads"] * hd, c["n_kv_heads"] * hd
    add("token_embd.weight", (vocab, d), Q.Q8_0, 1.0)
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        for norm, n in (("attn_norm", d), ("ffn_norm", d), ("post_attention_norm", d), ("post_ffw_norm", d),
                        ("attn_q_norm", hd), ("attn_k_norm", hd)):
            w.add_tensor(p + norm + ".weight", (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32))
        add(p + "attn_q.weight", (qw, d), kinds["attn_q"])
        add(p + "attn_k.weight", (kvw, d), kinds["attn_k"])
        add(p + "attn_v.weight", (kvw, d), kinds["attn_v"])
        add(p + "attn_output.weight", (d, qw), kinds["attn_output"])
        add(p + "ffn_gate.weight", (ff, d), kinds["ffn_gate"])
        add(p + "ffn_up.weight", (ff, d), kinds["ffn_up"])
        add(p + "ffn_down.weight", (d, ff), kinds["ffn_down"])
    w.add_tensor("output_norm.weight", (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    return finish(w, path, extra)


def write_tiny_llama(path: Path, seed: int = 0, matrix_type: Q = Q.Q4_1, embed_type: Q = Q.Q8_0,
                     override_types: dict[str, np.dtype] | None = None, ffn_activation: str | None = None,
                     config: dict | None = None, powerinfer: dict | None = None, pad_vocab: int = 0,
                     extra=None, chat_template: str | None = None) -> Path:
    """`config` overrides entries of TINY (e.g. n_heads=2 for a head size of 32; context=N for a longer context
    than 256). `powerinfer`
    (dict(rank=R, threshold=T or None)) writes the layout of PowerInfer's converter instead: predictor MLPs
    blk.N.fc1/fc2, ffn_down stored transposed as ffn_down_t, `powerinfer.sparse_threshold`, no activation
    key, and the magic PWRI. `pad_vocab`: vocabulary entries (unused tokens pad it), for a head of a real
    model's size. `extra(writer)`: adds keys or tensors of its own before the file is written. `chat_template`:
    the file's template (a ChatML one without tools by default)."""
    rng = np.random.default_rng(seed)
    c = dict(TINY, **(config or {}))
    w = GGUFWriter(str(path), "llama")
    _add_shape(w, c, c.get("context", 256))
    if ffn_activation:
        w.add_string("pyinfer.ffn_activation", ffn_activation)
    if powerinfer and powerinfer.get("threshold") is not None:
        w.add_float32("powerinfer.sparse_threshold", powerinfer["threshold"])
    vocab_padded = _add_tiny_vocab(w, pad_vocab)  # rows need no padding; columns are multiples of 32
    w.add_chat_template(chat_template or "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def add(name: str, shape: tuple[int, int] | tuple[int], qtype: Q, scale: float = 0.2):
        if override_types and name in override_types:
            w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(override_types[name]))
            return
        add_random(w, rng, name, shape, qtype, scale)

    d, ff, hd = c["d_model"], c["d_ff"], c["d_model"] // c["n_heads"]
    add("token_embd.weight", (vocab_padded, d), embed_type, 1.0)
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", (d,), Q.F32, 0.3)
        add(p + "attn_q.weight", (d, d), matrix_type)
        add(p + "attn_k.weight", (c["n_kv_heads"] * hd, d), matrix_type)
        add(p + "attn_v.weight", (c["n_kv_heads"] * hd, d), matrix_type)
        add(p + "attn_output.weight", (d, d), matrix_type)
        add(p + "ffn_norm.weight", (d,), Q.F32, 0.3)
        add(p + "ffn_gate.weight", (ff, d), matrix_type)
        add(p + "ffn_up.weight", (ff, d), matrix_type)
        if powerinfer:  # the converter's layout: down transposed, then the layer's predictor
            add(p + "ffn_down_t.weight", (ff, d), matrix_type)
            add(p + "fc1.weight", (powerinfer["rank"], d), Q.F16, 0.3)
            add(p + "fc2.weight", (ff, powerinfer["rank"]), Q.F16, 0.3)
        else:
            add(p + "ffn_down.weight", (d, ff), matrix_type)
    add("output_norm.weight", (d,), Q.F32, 0.3)
    finish(w, path, extra)
    if powerinfer:
        with open(path, "r+b") as f:
            f.write(b"PWRI")
    return path


# Tiny shapes per architecture: Qwen 3's heads are wider than d_model / heads (its own key_length).
TINY_ARCH = {
    "llama": dict(TINY, head_dim=16),
    "llama3": dict(TINY, head_dim=16),
    "qwen2": dict(TINY, head_dim=16),
    "qwen3": dict(TINY, head_dim=32),
    "phi3": dict(TINY, head_dim=16, n_kv_heads=4),
    # Mixture of Experts: 8 experts of 64 neurons, 2 per token (Qwen2-MoE: and a shared expert of 96)
    "qwen3moe": dict(TINY, head_dim=32, n_expert=8, n_expert_used=2, d_ff_expert=64),
    "mixtral": dict(TINY, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff=64),  # experts: d_ff wide
    "qwen2moe": dict(TINY, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff_shared=96),
    # OLMoE: q and k normed as whole rows (llama.cpp gives k's norm n_embd values: no grouped KV heads)
    "olmoe": dict(TINY, head_dim=16, n_kv_heads=4, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff=64),
    # Granite MoE with its shared expert (ungated) and granite-3.0-1b-a400m's multipliers
    "granitemoe": dict(TINY, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff=64, d_ff_shared=96,
                       embedding_scale=12.0, residual_scale=0.22, attention_scale=0.015625, logit_scale=6.0),
    # GLM-4.5: one leading dense layer (FFN 96) then two MoE layers, a shared expert of one expert's width, partial RoPE
    # (8 of 16), sigmoid routing with a selection bias, renormalized and scaled, and one multi-token-prediction layer
    "glm4moe": dict(TINY, n_layers=3, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff_shared=64,
                    rope_dims=8, dense_lead=1, expert_scale=2.5, nextn=1),
}
# DeepSeek-V2-Lite's layout: latent attention (q direct, a latent of 32 plus 16 rotary values cached per token; query
# heads of 32 + 16, value heads of 32), one leading dense layer, softmax routing, two shared experts, YaRN x4 with
# DeepSeek's magnitude. config={"q_lora_rank": 24, "v3": True}: V3's low-rank q, sigmoid routing chosen with a
# selection bias in 4 groups of which 2 count, renormalized and scaled.
TINY_ARCH["deepseek2"] = dict(TINY, n_layers=3, n_kv_heads=1, head_dim=48, rope_dims=16, kv_lora_rank=32, v_dim=32,
                              n_expert=8, n_expert_used=2, d_ff_expert=32, d_ff_shared=64, dense_lead=1, yarn=4.0,
                              yarn_orig=32, q_lora_rank=0, v3=False)
# SmallThinker: 5 layers (with the file's sliding window: layers 0 and 4 global and NoPE, 1-3 sliding), ReGLU experts
# routed from each layer's input before attention, softmax (config={"sigmoid": True}: sigmoid), renormalized.
TINY_ARCH["smallthinker"] = dict(TINY, n_layers=5, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, d_ff=64,
                                 swa=True, sigmoid=False)
MOE_KINDS = ("qwen3moe", "mixtral", "qwen2moe", "olmoe", "granitemoe", "glm4moe", "gpt-oss", "deepseek2",
             "smallthinker")
# gpt-oss: sinks, a window of 5 on the even layers, YaRN x4 over an original context of 32, biased router and experts
TINY_ARCH["gpt-oss"] = dict(TINY, head_dim=16, n_expert=8, n_expert_used=2, d_ff_expert=64, window=5, yarn=4.0,
                            yarn_orig=32)


def write_tiny_arch(path: Path, kind: str, seed: int = 0, qtype: Q = Q.F32, config: dict | None = None,
                    vocab_from=None, context: int = 256, extra=None, bad_qkv_rows: int = 0, longrope: bool = True,
                    fused: bool = True, orig_ctx: int | None = None) -> Path:
    """A tiny random model of architecture `kind`: "llama", "llama3" (llama with rope_freqs.weight), "qwen2" (q/k/v
    biases), "qwen3" (QK-norm, head size 32 with d_model 64 and 4 heads) or "phi3" (fused qkv and gate-up,
    LongRoPE factors, attn_factor; `bad_qkv_rows` more qkv rows than the heads need; `longrope` False: a 4k
    model without factors; `fused` False: separate q, k and v; `orig_ctx`: the
    original context, beyond which the long factors apply; default context / 2). `vocab_from`: a GGUF (llama.cpp's vocab files) whose tokenizer keys are
    copied (a real vocabulary, for llama.cpp to run it); else tiny_vocab(). `qtype`: the matrices' type."""
    from gguf import GGUFReader

    rng = np.random.default_rng(seed)
    c = dict(TINY_ARCH[kind], **(config or {}))
    arch = "llama" if kind in ("llama", "llama3", "mixtral") else kind
    w = GGUFWriter(str(path), arch)
    n_trunk = c["n_layers"]
    c["n_layers"] = n_trunk + c.get("nextn", 0)  # block_count counts GLM's multi-token-prediction layers too
    _add_shape(w, c, context)
    hd = c["head_dim"]
    if kind == "deepseek2":  # the cache's one latent head, then the query and value heads (the converter's keys)
        w.add_key_length(c["kv_lora_rank"] + c["rope_dims"])
        w.add_value_length(c["kv_lora_rank"])
        w.add_key_length_mla(hd)
        w.add_value_length_mla(c["v_dim"])
        w.add_kv_lora_rank(c["kv_lora_rank"])
        if c["q_lora_rank"] is not None:  # None: no key, as convert_hf_to_gguf.py writes V2-Lite (q_lora_rank null)
            w.add_q_lora_rank(c["q_lora_rank"])  # 0 (V2-Lite): llama.cpp reads it unless 26 or 27 layers
    else:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(c.get("rope_dims", hd))
    if vocab_from is not None:
        n_vocab = _copy_vocab(w, GGUFReader(str(vocab_from)))
    else:
        n_vocab = _add_tiny_vocab(w)

    def add(name: str, shape: tuple, scale: float = 0.2):
        router = name.endswith("ffn_gate_inp.weight")
        if c.get("fan_in") and len(shape) >= 2 and not router and name not in ("token_embd.weight", "output.weight"):
            scale = 1.0 / np.sqrt(shape[-1])  # as trained weights are: each matrix keeps its input's scale
        add_random(w, rng, name, shape, qtype if len(shape) >= 2 and not router else Q.F32, scale)

    d, ff = c["d_model"], c["d_ff"]
    qw, kvw = c["n_heads"] * hd, c["n_kv_heads"] * hd
    add("token_embd.weight", (n_vocab, d), 1.0)
    if kind in MOE_KINDS:
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
        if kind not in ("mixtral", "olmoe", "granitemoe"):  # experts feed_forward_length wide there; others: own key
            w.add_expert_feed_forward_length(c["d_ff_expert"])
        if kind in ("qwen2moe", "granitemoe"):
            w.add_expert_shared_feed_forward_length(c["d_ff_shared"])
    if kind == "glm4moe":
        w.add_uint32("glm4moe.leading_dense_block_count", c["dense_lead"])
        w.add_uint32("glm4moe.expert_shared_count", c["d_ff_shared"] // c["d_ff_expert"])
        w.add_float32("glm4moe.expert_weights_scale", c["expert_scale"])
        w.add_bool("glm4moe.expert_weights_norm", True)
        w.add_uint32("glm4moe.expert_gating_func", 2)
        w.add_uint32("glm4moe.nextn_predict_layers", c["nextn"])
    if kind == "deepseek2":
        w.add_leading_dense_block_count(c["dense_lead"])
        w.add_expert_shared_count(c["d_ff_shared"] // c["d_ff_expert"])
        w.add_expert_weights_scale(2.5 if c["v3"] else 1.0)
        w.add_expert_weights_norm(c["v3"])
        w.add_uint32("deepseek2.expert_gating_func", 2 if c["v3"] else 1)
        if c["v3"]:
            w.add_expert_group_count(4)
            w.add_expert_group_used_count(2)
        w.add_string("deepseek2.rope.scaling.type", "yarn")
        w.add_float32("deepseek2.rope.scaling.factor", c["yarn"])
        w.add_uint32("deepseek2.rope.scaling.original_context_length", c["yarn_orig"])
        w.add_float32("deepseek2.rope.scaling.yarn_log_multiplier", 0.0707)  # the converter's 0.1 x mscale_all_dim
    if kind == "smallthinker":
        w.add_uint32("smallthinker.expert_gating_func", 2 if c["sigmoid"] else 1)
        if c["swa"]:
            w.add_uint32("smallthinker.attention.sliding_window", 4096)
    if kind == "gpt-oss":
        w.add_uint32("gpt-oss.attention.sliding_window", c["window"])
        w.add_string("gpt-oss.rope.scaling.type", "yarn")
        w.add_float32("gpt-oss.rope.scaling.factor", c["yarn"])
        w.add_uint32("gpt-oss.rope.scaling.original_context_length", c["yarn_orig"])
    if kind == "granitemoe":
        w.add_float32("granitemoe.embedding_scale", c["embedding_scale"])
        w.add_float32("granitemoe.residual_scale", c["residual_scale"])
        w.add_float32("granitemoe.attention.scale", c["attention_scale"])
        w.add_float32("granitemoe.logit_scale", c["logit_scale"])
    if kind == "llama3":  # Llama 3.1's factors: 1 for the fast pairs, up to 8 for the slow ones
        w.add_tensor("rope_freqs.weight", np.geomspace(1.0, 8.0, hd // 2).astype(np.float32))
    if kind == "phi3" and longrope:
        w.add_float32("phi3.rope.scaling.attn_factor", 1.19)
        w.add_uint32("phi3.rope.scaling.original_context_length", orig_ctx or context // 2)
        w.add_tensor("rope_factors_short.weight", np.linspace(1.0, 3.0, hd // 2).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", np.linspace(1.0, 20.0, hd // 2).astype(np.float32))
    for il in range(c["n_layers"]):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
        ffn_norm = "post_attention_norm" if kind in ("glm4moe", "gpt-oss") else "ffn_norm"  # their FFN norm's name
        w.add_tensor(p + ffn_norm + ".weight", (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
        if kind == "phi3" and fused:
            add(p + "attn_qkv.weight", (qw + 2 * kvw + bad_qkv_rows, d))
        elif kind == "deepseek2":
            _add_latent_attention(w, rng, add, p, c)
        else:
            add(p + "attn_q.weight", (qw, d))
            add(p + "attn_k.weight", (kvw, d))
            add(p + "attn_v.weight", (kvw, d))
        if kind in ("qwen2", "qwen2moe", "glm4moe", "gpt-oss"):
            for part, n in (("q", qw), ("k", kvw), ("v", kvw)):
                add(p + f"attn_{part}.bias", (n,), 0.5)
        if kind == "gpt-oss":
            add(p + "attn_output.bias", (d,), 0.5)
            w.add_tensor(p + "attn_sinks.weight", (rng.standard_normal(c["n_heads"]) * 2).astype(np.float32))
        if kind in ("qwen3", "qwen3moe", "glm4moe"):
            for part in ("q", "k"):
                w.add_tensor(p + f"attn_{part}_norm.weight", (1.0 + 0.2 * rng.standard_normal(hd)).astype(np.float32))
        if kind == "olmoe":
            for part, n in (("q", qw), ("k", kvw)):
                w.add_tensor(p + f"attn_{part}_norm.weight", (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32))
        add(p + "attn_output.weight", (d, c["n_heads"] * c["v_dim"] if kind == "deepseek2" else qw))
        if il >= n_trunk:  # GLM's multi-token-prediction layer: its own projection and norms (never run here)
            add(p + "nextn.eh_proj.weight", (d, 2 * d))
            for part in ("enorm", "hnorm", "shared_head_norm"):
                w.add_tensor(p + f"nextn.{part}.weight", np.ones(d, np.float32))
        if kind in MOE_KINDS and il >= c.get("dense_lead", 0):
            _add_experts(w, rng, add, p, kind, c)
        elif kind == "phi3":
            add(p + "ffn_up.weight", (2 * ff, d))  # gate rows, then up rows
            add(p + "ffn_down.weight", (d, ff))
        else:
            add(p + "ffn_gate.weight", (ff, d))
            add(p + "ffn_up.weight", (ff, d))
            add(p + "ffn_down.weight", (d, ff))
    w.add_tensor("output_norm.weight", (1.0 + 0.2 * rng.standard_normal(d)).astype(np.float32))
    if kind not in ("qwen2", "granitemoe"):  # tied heads here (llama.cpp requires qwen2moe's own head)
        add("output.weight", (n_vocab, d), 0.5)
    return finish(w, path, extra)


def _add_latent_attention(w: GGUFWriter, rng, add, p: str, c: dict) -> None:
    """DeepSeek-V2's attention tensors as the converter writes them: q (or q_a, its norm, q_b) with each head's
    rows [nope | rope], kv_a_mqa [latent | rope], the latent's norm, and kv_b split per head into k_b (numpy [heads,
    latent, nope]) and v_b ([heads, v, latent])."""
    d, heads, hd, rot, rank = c["d_model"], c["n_heads"], c["head_dim"], c["rope_dims"], c["kv_lora_rank"]
    if c["q_lora_rank"]:
        add(p + "attn_q_a.weight", (c["q_lora_rank"], d))
        w.add_tensor(p + "attn_q_a_norm.weight", (1.0 + 0.2 * rng.standard_normal(c["q_lora_rank"])).astype(np.float32))
        add(p + "attn_q_b.weight", (heads * hd, c["q_lora_rank"]))
    else:
        add(p + "attn_q.weight", (heads * hd, d))
    add(p + "attn_kv_a_mqa.weight", (rank + rot, d))
    w.add_tensor(p + "attn_kv_a_norm.weight", (1.0 + 0.2 * rng.standard_normal(rank)).astype(np.float32))
    add(p + "attn_k_b.weight", (heads, rank, hd - rot), 0.3)
    add(p + "attn_v_b.weight", (heads, c["v_dim"], rank), 0.3)


def _add_experts(w: GGUFWriter, rng, add, p: str, kind: str, c: dict) -> None:
    """A layer's router (F32, as llama.cpp's quantizer keeps it) and merged experts (numpy shape [n, rows,
    cols]: GGUF's ne [cols, rows, n]); Qwen2-MoE's shared expert and its one-row gate."""
    d, n, ffe = c["d_model"], c["n_expert"], c["d_ff_expert"]
    # SmallThinker's router reads the un-normed layer input: a smaller scale keeps its sigmoid off saturation (where
    # every probability is 1.0 and the choice is a tie)
    add(p + "ffn_gate_inp.weight", (n, d), c.get("router_scale", 0.1 if kind == "smallthinker" else 0.5))
    add(p + "ffn_gate_exps.weight", (n, ffe, d))
    add(p + "ffn_up_exps.weight", (n, ffe, d))
    add(p + "ffn_down_exps.weight", (n, d, ffe))
    if kind == "gpt-oss":  # the router's and every expert's biases
        w.add_tensor(p + "ffn_gate_inp.bias", (rng.standard_normal(n) * 0.5).astype(np.float32))
        for part, rows in (("gate", ffe), ("up", ffe), ("down", d)):
            w.add_tensor(p + f"ffn_{part}_exps.bias", (rng.standard_normal((n, rows)) * 0.2).astype(np.float32))
    if kind == "glm4moe" or (kind == "deepseek2" and c["v3"]):  # the selection bias: enough to change the winners
        w.add_tensor(p + "exp_probs_b.bias", (rng.standard_normal(n) * 0.3).astype(np.float32))
    if kind in ("qwen2moe", "granitemoe", "glm4moe", "deepseek2"):
        if kind == "qwen2moe":  # Granite's and GLM's shared experts have no gate
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(d) * 0.2).astype(np.float32))
        add(p + "ffn_gate_shexp.weight", (c["d_ff_shared"], d))
        add(p + "ffn_up_shexp.weight", (c["d_ff_shared"], d))
        add(p + "ffn_down_shexp.weight", (d, c["d_ff_shared"]))


def _copy_vocab(w: GGUFWriter, r) -> int:
    """Copies the tokenizer.* keys of a GGUF read with GGUFReader; returns the vocabulary size."""
    from gguf import GGUFValueType

    n = 0
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(name, value, vtype, sub_type=field.types[-1])
            if name == "tokenizer.ggml.tokens":
                n = len(value)
        else:
            w.add_key_value(name, value, vtype)
    return n
