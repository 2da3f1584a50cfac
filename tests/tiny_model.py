"""Writes small random llama-architecture GGUF files for unit tests (never for acceptance)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, quants
from tokenizers.pre_tokenizers import ByteLevel

TINY = dict(n_layers=2, d_model=64, d_ff=96, n_heads=4, n_kv_heads=2, rope_base=10000.0, eps=1e-5)


def tiny_vocab() -> tuple[list[str], list[str]]:
    alphabet = sorted(ByteLevel.alphabet())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [m.replace(" ", "") for m in merges]
    return tokens, merges


def write_tiny_llama(path: Path, seed: int = 0, matrix_type: Q = Q.Q4_1, embed_type: Q = Q.Q8_0,
                     override_types: dict[str, np.dtype] | None = None, ffn_activation: str | None = None,
                     config: dict | None = None) -> Path:
    """`config` overrides entries of TINY (e.g. n_heads=2 for a head size of 32)."""
    rng = np.random.default_rng(seed)
    c = dict(TINY, **(config or {}))
    tokens, merges = tiny_vocab()
    vocab = len(tokens)
    vocab_padded = vocab  # rows need no padding; columns are multiples of 32
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(c["n_layers"])
    w.add_context_length(256)
    w.add_embedding_length(c["d_model"])
    w.add_feed_forward_length(c["d_ff"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    if ffn_activation:
        w.add_string("pyinfer.ffn_activation", ffn_activation)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def add(name: str, shape: tuple[int, int] | tuple[int], qtype: Q, scale: float = 0.2):
        if override_types and name in override_types:
            w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(override_types[name]))
            return
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, a)
        elif qtype == Q.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quants.quantize(a, qtype), raw_dtype=qtype)

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
        add(p + "ffn_down.weight", (d, ff), matrix_type)
    add("output_norm.weight", (d,), Q.F32, 0.3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
