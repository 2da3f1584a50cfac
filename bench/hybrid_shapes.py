"""Qwen 3.5 (`qwen35`) models of a real size with random weights, in the type mix llama.cpp's quantizer gives that
architecture: speed only, never quality (bench/real_shapes.py does the same for the dense families).

  python bench/hybrid_shapes.py --shape qwen3.5-9b --ftype Q4_K_M --out /work/models/qwen3.5-9b-q4_k_m.gguf

The types come from llama.cpp itself: a narrow F16 copy with the same layers, tensor names and vocabulary (every
row as wide as a multiple of 256, as the real rows are) is quantized by llama-cpp-python's llama_model_quantize, and
each tensor of the full-size file gets the type its narrow twin got (the conv taps, A, dt and the norms stay F32).
The shape: Qwen3.5-9B's layer count and llama.cpp's size test (32 layers, d 4096 is its "9B"); the other widths are
Qwen3-Next's published layout scaled to d 4096 (16 query heads of 256 with 4 KV heads and 64 rotary values, DeltaNet
heads of 128 with 16 key and 32 value heads, a conv of 4 taps, FFN 12288), an assumption stated as such.
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
from support.tiny_hybrid import write_tiny_qwen35  # noqa: E402
from support.tiny_model import _add_shape, _copy_vocab  # noqa: E402

SHAPES = {
    "qwen3.5-9b": dict(d=4096, ff=12288, layers=32, heads=16, kv=4, head_dim=256, rope_dims=64,
                       sections=(11, 11, 10, 0), conv=4, ssm_head=128, k_heads=16, v_heads=32, interval=4,
                       rope_base=1e7, eps=1e-6),
}
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}


def tensors(c: dict, vocab: int):
    """(name, rows, cols or None for a vector) of every tensor, in file order (tests/support/tiny_hybrid.py's)."""
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


def llamacpp_types(c: dict, ftype: str, tmp: Path) -> dict[str, Q]:
    """Each tensor's type in llama.cpp's `ftype` file of this architecture, from a narrow twin it quantizes."""
    import llama_cpp

    narrow = dict(n_layers=c["layers"], d_model=256, d_ff=512, n_heads=1, n_kv_heads=1, head_dim=256,
                  rope_dims=64, sections=c["sections"], interval=c["interval"], conv_kernel=c["conv"],
                  ssm_head_dim=128, ssm_k_heads=1, ssm_v_heads=2)
    src = write_tiny_qwen35(tmp / "narrow_f16.gguf", qtype=Q.F16, config=narrow, vocab_from=vocab_file("qwen35"))
    out = tmp / "narrow_q.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit("llama_model_quantize failed")
    return {t.name: Q(int(t.tensor_type)) for t in GGUFReader(str(out)).tensors}


def write_model(path: Path, shape: str, ftype: str, seed: int = 0) -> Path:
    c = SHAPES[shape]
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        types = llamacpp_types(c, ftype, Path(tmp))
    w = GGUFWriter(str(path), "qwen35")
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
    vocab = _copy_vocab(w, GGUFReader(str(vocab_file("qwen35"))))
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
        if cols is None:  # norms near 1, dt near 0, A negative
            v = -np.exp(0.3 * rng.standard_normal(rows)) if name.endswith("ssm_a") else (
                0.1 * rng.standard_normal(rows) if name.endswith("ssm_dt.bias") else 1.0 + 0.05 * rng.standard_normal(rows))
            w.write_tensor_data(v.astype(np.float32))
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
