"""The low-bit weight types against llama.cpp itself: a tiny random LLaMA written in F32, every matrix quantized to one
type by llama.cpp's own quantizer (`ggml_quantize_chunk` from llama-cpp-python's libggml, an importance matrix of
ones, which IQ2_XXS and IQ2_XS require; `llama_model_quantize` refuses those two without a real one), then run by
both engines on the same ids. The quantization noise is llama.cpp's own logits on the quantized file against its F32
file: pyinfer's distance to llama.cpp is stated beside it.

`--source hf`: the F32 model is instead a tiny random `LlamaForCausalLM` made by `transformers` (its own
initialization, sd 0.02) and converted by llama.cpp's `convert_hf_to_gguf.py` (bench/hf_check.py), the way real files
are made; the tiny LLaMA above has weights of sd 0.2, whose layers multiply small differences.

  python bench/lowbit_check.py           # writes bench/results/vs_llamacpp/lowbit_check.{json,md}
  python bench/lowbit_check.py --source hf --vendor DIR   # DIR: the sdist's vendor/llama.cpp; lowbit_check_hf.*
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "tests"))
import pyinfer  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from llamacpp_quant_fixture import libggml, quantize  # noqa: E402
from llamacpp_quantized import distance, llamacpp_logits, max_top1  # noqa: E402
from support.tiny_model import LOW_BIT_TYPES, write_tiny_llama  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "vs_llamacpp"
SHAPE = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, n_layers=2)
SOURCE_TEXT = {"tiny": "written with gguf-py, weights of sd 0.2",
               "hf": "made by transformers, sd 0.02, converted by llama.cpp's convert_hf_to_gguf.py, vocabulary "
                     "ggml-vocab-llama-spm"}


def hf_llama(vendor: Path, tmp: Path) -> Path:
    """A tiny random LlamaForCausalLM of SHAPE, converted to F32 by llama.cpp (bench/hf_check.py's way)."""
    from hf_check import COMMON, checkpoint, convert, vocab_size

    vocab = vendor / "models" / "ggml-vocab-llama-spm.gguf"
    cfg = dict(COMMON, num_hidden_layers=SHAPE["n_layers"], hidden_size=SHAPE["d_model"],
               intermediate_size=SHAPE["d_ff"], num_attention_heads=SHAPE["n_heads"],
               num_key_value_heads=SHAPE["n_kv_heads"], vocab_size=vocab_size(vocab))
    checkpoint("llama", cfg, tmp / "llama", seed=11)
    return convert(vendor, tmp / "llama", tmp / "f32.gguf", vocab)


def quantized_copy(src: Path, dst: Path, qtype: Q, lib) -> dict:
    """src with every matrix whose rows fit qtype's blocks quantized by llama.cpp; returns {tensor type: count}."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), f.types[0])
    types: dict[str, int] = {}
    for t in r.tensors:
        data = np.asarray(t.data)
        if data.ndim == 2 and data.shape[1] % GGML_QUANT_SIZES[qtype][0] == 0:
            blocks, _ = quantize(lib, data.astype(np.float32), qtype)
            w.add_tensor(t.name, blocks, raw_dtype=qtype)
            types[qtype.name] = types.get(qtype.name, 0) + 1
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return types


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--cache-type", default="f32", choices=["f32", "f16"],
                    help="both engines' KV cache (default f32: llama.cpp's f16 cache also rounds q and the softmax "
                         "to fp16, which activation quantization then amplifies on a tiny random model)")
    ap.add_argument("--source", default="tiny", choices=["tiny", "hf"],
                    help="the F32 model: tiny (written with gguf-py, sd 0.2) or hf (transformers, converted by "
                         "llama.cpp; needs --vendor)")
    ap.add_argument("--vendor", type=Path, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (--source hf)")
    args = ap.parse_args()
    kv = args.cache_type
    lib = libggml()
    tmp = Path(tempfile.mkdtemp(prefix="pyinfer-lowbit-"))
    if args.source == "hf":
        if args.vendor is None or not (args.vendor / "convert_hf_to_gguf.py").exists():
            raise SystemExit("lowbit_check: --source hf needs --vendor (the sdist's vendor/llama.cpp)")
        src = hf_llama(args.vendor, tmp)
    else:
        src = write_tiny_llama(tmp / "f32.gguf", seed=11, matrix_type=Q.F32, embed_type=Q.F32, config=SHAPE)
    stem = "lowbit_check" + ("_hf" if args.source == "hf" else "")
    f32 = pyinfer.load(str(src), n_threads=2, n_ctx=128, progress=False, cache_type=kv)
    ids = np.random.default_rng(0).integers(3, f32.config.vocab_size, args.tokens).tolist()
    ref = llamacpp_logits(str(src), ids, kv)
    rows = [{"type": "F32", "tensor_types": {}, "pyinfer_vs_llamacpp": distance(f32.eval(ids, all_logits=True).astype(np.float64), ref),
             "quantization_noise": None}]
    for qtype in LOW_BIT_TYPES:
        path = tmp / f"{qtype.name}.gguf"
        types = quantized_copy(src, path, qtype, lib)
        theirs = llamacpp_logits(str(path), ids, kv)
        ours = pyinfer.load(str(path), n_threads=2, n_ctx=128, progress=False, cache_type=kv).eval(ids, all_logits=True)
        decode = llamacpp_logits(str(path), ids, kv, prompt=1)  # the ids one at a time: llama.cpp's decode path
        rows.append({"type": qtype.name, "tensor_types": types, "pyinfer_vs_llamacpp": distance(ours.astype(np.float64), theirs),
                     "quantization_noise": distance(theirs, ref), "llamacpp_decode_vs_batch": distance(decode, theirs),
                     "pyinfer_vs_llamacpp_decode": distance(ours.astype(np.float64), decode)})
        print(json.dumps(rows[-1]), file=sys.stderr)
        path.unlink()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"tokens": args.tokens, "shape": SHAPE, "cache_type": kv,
                                                      "source": args.source, "rows": rows}, indent=1))
    md = ["# Low-bit weight types against llama.cpp 0.3.36", "",
          f"A tiny random LLaMA ({SHAPE['n_layers']} layers, d {SHAPE['d_model']}, FFN {SHAPE['d_ff']}; "
          f"{SOURCE_TEXT[args.source]}), every matrix "
          "(embeddings and head too) quantized to the type by llama.cpp's `ggml_quantize_chunk`; "
          f"{args.tokens} random ids through both engines. max = largest |difference| over the largest |logit|; top-1 "
          "= share of positions whose argmax agrees. Quantization noise: llama.cpp on the quantized file against "
          "llama.cpp on the F32 file (how far the type itself moves the logits). Both engines quantize activations as "
          f"llama.cpp does for each type (Q8_0, Q8_1 or Q8_K) and hold an {kv} KV cache. Last pair: llama.cpp "
          "against itself, the same ids one at a time (its decode path) against its one batch of them; then pyinfer "
          "against that one-at-a-time run.", "",
          "| type | pyinfer vs llama.cpp: max | median | top-1 | positions apart (> 0.1%) | quantization noise: max | "
          "top-1 | llama.cpp one at a time vs its batch: max | top-1 | pyinfer vs llama.cpp one at a time: max | "
          "top-1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["pyinfer_vs_llamacpp"]
        md.append(f"| {r['type']} | {a['max_rel']:.4f} | {a['median_rel']:.5f} | {a['argmax_agree']:.3f} | "
                  f"{a.get('positions_apart', '-')} | {max_top1(r['quantization_noise'])} | "
                  f"{max_top1(r.get('llamacpp_decode_vs_batch'))} | {max_top1(r.get('pyinfer_vs_llamacpp_decode'))} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
