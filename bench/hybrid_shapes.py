"""Qwen 3.5 (`qwen35`) and Gemma 4 (`gemma4`) models of a real size with random weights, in the type mix llama.cpp's
quantizer gives each architecture: speed only, never quality (bench/real_shapes.py does the same for the dense
families).

  python bench/hybrid_shapes.py --shape qwen3.5-9b --ftype Q4_K_M --out /work/models/qwen3.5-9b-q4_k_m.gguf
  python bench/hybrid_shapes.py --shape gemma4-e4b --ftype Q4_K_M --out /work/models/gemma4-e4b-q4_k_m.gguf

The types come from llama.cpp itself: a narrow F16 copy with the same layers, tensor names and vocabulary (every
row as wide as a multiple of 256, as the real rows are) is quantized by llama-cpp-python's llama_model_quantize, and
each tensor of the full-size file gets the type its narrow twin got (the conv taps, A, dt and the norms stay F32).
The shape: Qwen3.5-9B's layer count and llama.cpp's size test (32 layers, d 4096 is its "9B"); the other widths are
Qwen3-Next's published layout scaled to d 4096 (16 query heads of 256 with 4 KV heads and 64 rotary values, DeltaNet
heads of 128 with 16 key and 32 value heads, a conv of 4 taps, FFN 12288), an assumption stated as such.
Gemma 4 E4B: transformers' conversion script's published config (42 layers, five sliding-window layers of heads of 256
per global one of 512, 8 heads over 2 KV heads, d 2560, FFN 10240, per-layer inputs of 256, the last 18 layers
sharing KV, window 512, vocabulary 262144); its per-layer table and projections get their types from a 2-layer
twin (the full twin's table would be 5.6 GB). E2B: 35 layers of d 1536, four sliding layers per global one, 1 KV head,
the last 20 layers sharing KV with FFNs of 12288 instead of 6144.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from real_shapes import random_blocks, vocab_file  # noqa: E402
from support.tiny_gemma4 import write_tiny_gemma4  # noqa: E402
from support.tiny_hybrid import write_tiny_qwen35  # noqa: E402
from support.tiny_model import _add_shape, _copy_vocab  # noqa: E402

SHAPES = {
    "qwen3.5-9b": dict(arch="qwen35", d=4096, ff=12288, layers=32, heads=16, kv=4, head_dim=256, rope_dims=64,
                       sections=(11, 11, 10, 0), conv=4, ssm_head=128, k_heads=16, v_heads=32, interval=4,
                       rope_base=1e7, eps=1e-6),
    "gemma4-e4b": dict(arch="gemma4", d=2560, ff=10240, layers=42, heads=8, kv=2, head_dim=512, head_local=256,
                       global_every=6, per_layer=256, shared=18, window=512, rope_base=1e6, rope_base_local=1e4,
                       rotated_pairs=64, eps=1e-6, cap=30.0),
    # E2B: 35 layers of d 1536, four sliding layers per global one, 1 KV head, the last 20 layers sharing KV with FFNs
    # twice as wide (use_double_wide_mlp)
    "gemma4-e2b": dict(arch="gemma4", d=1536, ff=6144, layers=35, heads=8, kv=1, head_dim=512, head_local=256,
                       global_every=5, per_layer=256, shared=20, window=512, rope_base=1e6, rope_base_local=1e4,
                       rotated_pairs=64, eps=1e-6, cap=30.0, double_wide=True),
}
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}


def tensors(c: dict, vocab: int):
    """(name, rows, cols or None for a vector) of every tensor, in file order (the tests' tiny writers')."""
    if c["arch"] == "gemma4":
        yield from gemma4_tensors(c, vocab)
        return
    d, ff, hd, S = c["d"], c["ff"], c["head_dim"], c["ssm_head"]
    hk, hv = c["k_heads"], c["v_heads"]
    yield "token_embd.weight", vocab, d
    for il in range(c["layers"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", d, None
        yield p + "post_attention_norm.weight", d, None
        if (il + 1) % c["interval"]:
            yield p + "attn_qkv.weight", (2 * hk + hv) * S, d
            yield p + "attn_gate.weight", hv * S, d
            yield p + "ssm_conv1d.weight", (2 * hk + hv) * S, c["conv"]
            yield p + "ssm_dt.bias", hv, None
            yield p + "ssm_a", hv, None
            yield p + "ssm_beta.weight", hv, d
            yield p + "ssm_alpha.weight", hv, d
            yield p + "ssm_norm.weight", S, None
            yield p + "ssm_out.weight", d, hv * S
        else:
            yield p + "attn_q.weight", 2 * c["heads"] * hd, d
            yield p + "attn_k.weight", c["kv"] * hd, d
            yield p + "attn_v.weight", c["kv"] * hd, d
            yield p + "attn_q_norm.weight", hd, None
            yield p + "attn_k_norm.weight", hd, None
            yield p + "attn_output.weight", d, c["heads"] * hd
        yield p + "ffn_gate.weight", ff, d
        yield p + "ffn_up.weight", ff, d
        yield p + "ffn_down.weight", d, ff
    yield "output_norm.weight", d, None
    yield "output.weight", vocab, d


def gemma4_local(c: dict) -> list[bool]:
    return [(il + 1) % c["global_every"] != 0 for il in range(c["layers"])]


def gemma4_widths(c: dict) -> list[int]:
    """Each layer's FFN width: the shared-KV layers' twice as wide with use_double_wide_mlp (E2B)."""
    shared_from = c["layers"] - c["shared"]
    return [c["ff"] * (2 if c.get("double_wide") and il >= shared_from else 1) for il in range(c["layers"])]


def gemma4_tensors(c: dict, vocab: int):
    """Gemma 4's tensors in tests/support/tiny_gemma4.py's order (the head tied to token_embd, as Gemma's is)."""
    d, n, L = c["d"], c["per_layer"], c["layers"]
    shared_from, widths = L - c["shared"], gemma4_widths(c)
    yield "token_embd.weight", vocab, d
    yield "rope_freqs.weight", c["head_dim"] // 2, None
    yield "per_layer_token_embd.weight", vocab, L * n
    yield "per_layer_model_proj.weight", L * n, d
    yield "per_layer_proj_norm.weight", n, None
    for il, local in enumerate(gemma4_local(c)):
        p, hd = f"blk.{il}.", c["head_local"] if local else c["head_dim"]
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            yield p + norm + ".weight", d, None
        yield p + "attn_q.weight", c["heads"] * hd, d
        yield p + "attn_q_norm.weight", hd, None
        if il < shared_from:
            yield p + "attn_k.weight", c["kv"] * hd, d
            yield p + "attn_v.weight", c["kv"] * hd, d
            yield p + "attn_k_norm.weight", hd, None
        yield p + "attn_output.weight", d, c["heads"] * hd
        yield p + "ffn_gate.weight", widths[il], d
        yield p + "ffn_up.weight", widths[il], d
        yield p + "ffn_down.weight", d, widths[il]
        yield p + "inp_gate.weight", n, d
        yield p + "proj.weight", d, n
        yield p + "post_norm.weight", d, None
        yield p + "layer_output_scale.weight", 1, None
    yield "output_norm.weight", d, None


def quantize_twin(src: Path, out: Path, ftype: str) -> dict[str, Q]:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit("llama_model_quantize failed")
    return {t.name: Q(int(t.tensor_type)) for t in GGUFReader(str(out)).tensors}


def gemma4_types(c: dict, ftype: str, tmp: Path) -> dict[str, Q]:
    """A narrow twin with every layer (no per-layer inputs), then a 2-layer one for the per-layer table and
    projections; each layer's inp_gate and proj take layer 0's type."""
    narrow = dict(n_layers=c["layers"], d_model=256, d_ff=512, n_heads=1, head_dim=512, head_dim_local=256, kv_heads=1,
                  kv_heads_local=1, shared=c["shared"], per_layer=0, window=c["window"])
    vocab = vocab_file("gemma-4")
    src = write_tiny_gemma4(tmp / "narrow_f16.gguf", qtype=Q.F16, config=narrow, vocab_from=vocab,
                            local=gemma4_local(c))
    types = quantize_twin(src, tmp / "narrow_q.gguf", ftype)
    src = write_tiny_gemma4(tmp / "table_f16.gguf", qtype=Q.F16, vocab_from=vocab,
                            config=dict(narrow, n_layers=2, shared=0, per_layer=c["per_layer"]))
    table = quantize_twin(src, tmp / "table_q.gguf", ftype)
    types.update({k: table[k] for k in ("per_layer_token_embd.weight", "per_layer_model_proj.weight")})
    for il in range(c["layers"]):
        types.update({f"blk.{il}.{part}.weight": table[f"blk.0.{part}.weight"] for part in ("inp_gate", "proj")})
    return types


def llamacpp_types(c: dict, ftype: str, tmp: Path) -> dict[str, Q]:
    """Each tensor's type in llama.cpp's `ftype` file of this architecture, from a narrow twin it quantizes."""
    if c["arch"] == "gemma4":
        return gemma4_types(c, ftype, tmp)
    narrow = dict(n_layers=c["layers"], d_model=256, d_ff=512, n_heads=1, n_kv_heads=1, head_dim=256,
                  rope_dims=64, sections=c["sections"], interval=c["interval"], conv_kernel=c["conv"],
                  ssm_head_dim=128, ssm_k_heads=1, ssm_v_heads=2)
    src = write_tiny_qwen35(tmp / "narrow_f16.gguf", qtype=Q.F16, config=narrow, vocab_from=vocab_file("qwen35"))
    return quantize_twin(src, tmp / "narrow_q.gguf", ftype)


def add_keys(w: GGUFWriter, c: dict, ftype: str) -> int:
    """The architecture's keys and the vocabulary; returns the vocabulary's size."""
    if c["arch"] == "gemma4":
        L = c["layers"]
        widths = gemma4_widths(c)
        _add_shape(w, dict(n_layers=L, d_model=c["d"], d_ff=widths if len(set(widths)) > 1 else c["ff"],
                           n_heads=c["heads"], n_kv_heads=c["kv"], rope_base=c["rope_base"], eps=c["eps"]),
                   context=131072)
        w.add_rope_freq_base_swa(c["rope_base_local"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_key_length_swa(c["head_local"])
        w.add_value_length_swa(c["head_local"])
        w.add_rope_dimension_count(c["head_dim"])
        w.add_rope_dimension_count_swa(c["head_local"])
        w.add_sliding_window(c["window"])
        w.add_sliding_window_pattern(gemma4_local(c))
        w.add_shared_kv_layers(c["shared"])
        w.add_embedding_length_per_layer_input(c["per_layer"])
        w.add_final_logit_softcapping(c["cap"])
        w.add_file_type(FTYPES[ftype])
        return _copy_vocab(w, GGUFReader(str(vocab_file("gemma-4"))))
    _add_shape(w, dict(n_layers=c["layers"], d_model=c["d"], d_ff=c["ff"], n_heads=c["heads"], n_kv_heads=c["kv"],
                       rope_base=c["rope_base"], eps=c["eps"]), context=262144)
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["rope_dims"])
    w.add_rope_dimension_sections(list(c["sections"]))
    w.add_ssm_conv_kernel(c["conv"])
    w.add_ssm_state_size(c["ssm_head"])
    w.add_ssm_group_count(c["k_heads"])
    w.add_ssm_time_step_rank(c["v_heads"])
    w.add_ssm_inner_size(c["v_heads"] * c["ssm_head"])
    w.add_full_attention_interval(c["interval"])
    w.add_file_type(FTYPES[ftype])
    return _copy_vocab(w, GGUFReader(str(vocab_file("qwen35"))))


def vector(name: str, rows: int, c: dict, rng) -> np.ndarray:
    """A vector's values: norms near 1, dt near 0, A negative, Gemma 4's RoPE factors and output scales, and its q
    and k norms near head size^(-1/4): its attention is unscaled, and trained norms keep q.k from turning the softmax
    one-hot (a random model's would, and then any rounding picks another key)."""
    if name == "rope_freqs.weight":
        return np.array([1.0] * c["rotated_pairs"] + [1e30] * (rows - c["rotated_pairs"]), np.float32)
    if c["arch"] == "gemma4" and name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):
        return (rows ** -0.25 * (1.0 + 0.05 * rng.standard_normal(rows))).astype(np.float32)
    if name.endswith("ssm_a"):
        return (-np.exp(0.3 * rng.standard_normal(rows))).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return (0.1 * rng.standard_normal(rows)).astype(np.float32)
    return (1.0 + 0.05 * rng.standard_normal(rows)).astype(np.float32)


def write_model(path: Path, shape: str, ftype: str, seed: int = 0) -> Path:
    c = SHAPES[shape]
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        types = llamacpp_types(c, ftype, Path(tmp))
    w = GGUFWriter(str(path), c["arch"])
    vocab = add_keys(w, c, ftype)
    plan = list(tensors(c, vocab))
    for name, rows, cols in plan:
        qt = types[name] if cols is not None else Q.F32
        if qt == Q.F32:
            shape = (rows,) if cols is None else (rows, cols)
            w.add_tensor_info(name, shape, np.dtype(np.float32), rows * (cols or 1) * 4)
        else:
            block, size = GGML_QUANT_SIZES[qt]
            w.add_tensor_info(name, (rows, cols * size // block), np.dtype(np.uint8), rows * cols // block * size,
                              raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols in plan:
        qt = types[name] if cols is not None else Q.F32
        if cols is None:
            w.write_tensor_data(vector(name, rows, c, rng))
        elif qt == Q.F32:
            w.write_tensor_data((0.3 * rng.standard_normal((rows, cols))).astype(np.float32))
        else:
            w.write_tensor_data(random_blocks(qt, rows, cols, rng))
    w.close()
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-9b")
    ap.add_argument("--ftype", choices=sorted(FTYPES), default="Q4_K_M")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = args.out or Path(f"/tmp/{args.shape}-{args.ftype.lower()}.gguf")
    write_model(out, args.shape, args.ftype, args.seed)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
