"""Dense models of the real shapes and the real type mix of the files people download, with random weights:
speed does not depend on weight values, and these are the sizes where decode is bound by the memory bus
(the project's small real models sit in cache). Never for quality.

  python bench/real_shapes.py --shape qwen2.5-1.5b --ftype Q4_K_M --out /tmp/qwen2.5-1.5b-q4_k_m.gguf
  python bench/real_shapes.py --list

The vocabulary is llama.cpp's own vocab file of that family (from the llama-cpp-python 0.3.36 sdist, as CI
unpacks it: PYINFER_LLAMACPP_MODELS), so both engines tokenize the same prompt. The type of each tensor follows
llama.cpp's quantizer (src/llama-quant.cpp) for the file type: Q4_K_M keeps Q4_K for the matrices, Q6_K for the
output head (the tied embedding included) and for attn_v and ffn_down in the layers `use_more_bits` names;
Q8_0 is Q8_0 throughout. `--check-mix` quantizes a narrow F16 copy of the same layers with llama.cpp and
compares the types tensor by tensor. Tensors are written one at a time, so an 8B file needs no 8 GB of RAM.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from support.tiny_model import _add_shape, _copy_vocab, random_k_blocks  # noqa: E402

# The published configurations (config.json of each model); `vocab` names llama.cpp's vocab file.
SHAPES = {
    "qwen2.5-1.5b": dict(arch="qwen2", d=1536, ff=8960, layers=28, heads=12, kv=2, head_dim=128, vocab="qwen2",
                         tied=True, rope_base=1e6, eps=1e-6, bias=True),
    "llama3.2-3b": dict(arch="llama", d=3072, ff=8192, layers=28, heads=24, kv=8, head_dim=128, vocab="llama-bpe",
                        tied=True, rope_base=5e5, eps=1e-5, bias=False),
    "qwen3-8b": dict(arch="qwen3", d=4096, ff=12288, layers=36, heads=32, kv=8, head_dim=128, vocab="qwen2",
                     tied=False, rope_base=1e6, eps=1e-6, bias=False),
}
FTYPES = ("Q4_K_M", "Q8_0", "F16")


def random_blocks(qtype: Q, rows: int, cols: int, rng, scale: float = 0.002) -> np.ndarray:
    """U8 [rows, row bytes] of `qtype` (any block type, F16 or BF16): every bit random except the fp16 scales,
    drawn in a sane range (values of normal(0, ~scale * 8) size after dequantization)."""
    if qtype in (Q.F16, Q.BF16):
        v = (rng.standard_normal((rows, cols), dtype=np.float32) * scale * 8)
        if qtype == Q.F16:
            return v.astype(np.float16).view(np.uint8)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return random_k_blocks(qtype, rows, cols, rng, scale)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits in *_M files."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name: str, ftype: str, layer: int, n_layers: int, tied: bool) -> Q:
    """The type llama.cpp's quantizer gives a 2-D tensor of a dense model in a file of `ftype`."""
    if ftype in ("Q8_0", "F16"):
        return Q[ftype]
    head = name == "output.weight" or (tied and name == "token_embd.weight")
    if head:
        return Q.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, n_layers):
        return Q.Q6_K
    return Q.Q4_K


def tensors(c: dict, vocab: int):
    """(name, rows, cols, layer) of every matrix, and (name, length) of every vector, in file order."""
    d, ff, hd = c["d"], c["ff"], c["head_dim"]
    qw, kvw = c["heads"] * hd, c["kv"] * hd
    yield "token_embd.weight", vocab, d, -1
    for il in range(c["layers"]):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", d, None, il
        for part, rows in (("q", qw), ("k", kvw), ("v", kvw)):
            yield p + f"attn_{part}.weight", rows, d, il
            if c["bias"]:
                yield p + f"attn_{part}.bias", rows, None, il
        if c["arch"] == "qwen3":
            yield p + "attn_q_norm.weight", hd, None, il
            yield p + "attn_k_norm.weight", hd, None, il
        yield p + "attn_output.weight", d, qw, il
        yield p + "ffn_norm.weight", d, None, il
        yield p + "ffn_gate.weight", ff, d, il
        yield p + "ffn_up.weight", ff, d, il
        yield p + "ffn_down.weight", d, ff, il
    yield "output_norm.weight", d, None, -1
    if not c["tied"]:
        yield "output.weight", vocab, d, -1


def vocab_file(name: str) -> Path:
    root = os.environ.get("PYINFER_LLAMACPP_MODELS")
    if not root:
        raise SystemExit("set PYINFER_LLAMACPP_MODELS to llama.cpp's models/ folder (the llama-cpp-python 0.3.36 sdist's "
                         "vendor/llama.cpp/models, as .ci/run unpacks it)")
    p = Path(root) / f"ggml-vocab-{name}.gguf"
    if not p.exists():
        raise SystemExit(f"{p}: no such vocab file")
    return p


def write_model(path: Path, shape: str, ftype: str, seed: int = 0, config: dict | None = None) -> Path:
    """A random dense model of `shape` (SHAPES, `config` overriding any of its fields) stored as `ftype`."""
    c = dict(SHAPES[shape], **(config or {}))
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), c["arch"])
    _add_shape(w, dict(n_layers=c["layers"], d_model=c["d"], d_ff=c["ff"], n_heads=c["heads"], n_kv_heads=c["kv"],
                       rope_base=c["rope_base"], eps=c["eps"]), context=32768)
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_file_type({"Q4_K_M": 15, "Q8_0": 7, "F16": 1}[ftype])
    vocab = _copy_vocab(w, GGUFReader(str(vocab_file(c["vocab"]))))
    plan = list(tensors(c, vocab))
    types = {}
    for name, rows, cols, layer in plan:
        if cols is None:
            w.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
        else:
            qt = tensor_type(name, ftype, layer, c["layers"], c["tied"])
            types[name] = qt
            nbytes = rows * (cols // GGML_QUANT_SIZES[qt][0]) * GGML_QUANT_SIZES[qt][1]
            w.add_tensor_info(name, (rows, cols * GGML_QUANT_SIZES[qt][1] // GGML_QUANT_SIZES[qt][0]),
                              np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols, _ in plan:
        if cols is None:  # norms near 1 (as trained models have), biases small
            v = (0.1 if name.endswith(".bias") else 1.0) + 0.05 * rng.standard_normal(rows)
            w.write_tensor_data(v.astype(np.float32))
        else:
            w.write_tensor_data(random_blocks(types[name], rows, cols, rng))
    w.close()
    return path


def check_mix(shape: str, tmp: Path) -> list[str]:
    """Differences between tensor_type() and llama.cpp's quantizer on an F16 copy of `shape` with every matrix
    narrowed (same layers, names and vocabulary; d 256, ff 512): [] when the mix is llama.cpp's."""
    import llama_cpp
    from pyinfer.model.arch import open_model

    c = SHAPES[shape]
    narrow = dict(d=256, ff=512, heads=2, kv=1, head_dim=128)
    src = write_model(tmp / "narrow_f16.gguf", shape, "F16", config=narrow)
    out = tmp / "narrow_q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 15
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit("llama_model_quantize failed")
    got = {n: t.type_name for n, t in open_model(out).tensors.items()}
    diffs = []
    for name, rows, cols, layer in tensors(dict(c, **narrow), 0):
        if cols is not None:
            want = tensor_type(name, "Q4_K_M", layer, c["layers"], c["tied"]).name
            if got.get(name) != want:
                diffs.append(f"{name}: llama.cpp {got.get(name)}, ours {want}")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--ftype", choices=FTYPES, default="Q4_K_M")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="the shapes and what each file weighs")
    ap.add_argument("--check-mix", action="store_true", help="compare the Q4_K_M mix with llama.cpp's quantizer")
    args = ap.parse_args()
    if args.list:
        for name, c in SHAPES.items():
            print(f"{name}: {c['arch']}, d {c['d']}, ff {c['ff']}, {c['layers']} layers, {c['heads']}/{c['kv']} heads, "
                  f"{'tied' if c['tied'] else 'own'} head, vocab {c['vocab']}")
        return 0
    if not args.shape:
        ap.error("--shape is required (or --list)")
    if args.check_mix:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            diffs = check_mix(args.shape, Path(tmp))
        print("\n".join(diffs) or f"{args.shape}: the Q4_K_M mix is llama.cpp's, tensor for tensor")
        return 1 if diffs else 0
    out = args.out or Path(f"/tmp/{args.shape}-{args.ftype.lower()}.gguf")
    write_model(out, args.shape, args.ftype, args.seed)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
