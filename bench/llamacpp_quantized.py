"""Files quantized by llama.cpp itself: a tiny random LLaMA-architecture model written in F32, quantized with
`llama_cpp.llama_model_quantize` to Q4_K_M, Q5_K_M and Q6_K, then evaluated by pyinfer and by llama.cpp on the
same tokens. The quantization noise is what llama.cpp's own logits move between the F32 file and the
quantized one; pyinfer's distance to llama.cpp on the quantized file is stated against it. pyinfer quantizes
activations in blocks of 32 for every weight type, llama.cpp in blocks of 256 (Q8_K) for K-quants: the F32 row
(no quantization anywhere) shows the engines' floor.

  python bench/llamacpp_quantized.py        # writes bench/results/vs_llamacpp/llamacpp_quantized.{json,md}
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "tests"))
import pyinfer  # noqa: E402
from compare_llamacpp import LlamaCpp  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from pyinfer.model.arch import open_model  # noqa: E402
from support.tiny_model import write_tiny_llama  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "vs_llamacpp"
FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}  # llama_ftype


# KV cache types both engines can hold, as llama.cpp's ggml_type for type_k / type_v.
LLAMACPP_CACHE = {"f16": 1, "f32": 0}


def llamacpp_logits(path: str, ids: list[int], cache_type: str = "f16", prompt: int = 0) -> np.ndarray:
    """llama.cpp's logits at every position; `cache_type` f32 keeps its attention unrounded (its f16 cache rounds
    q and the softmax to fp16 as well: llama.cpp against itself moves 5-7% on a tiny quantized LLaMA). `prompt` > 0:
    the first `prompt` ids in one batch, then every other one alone (decode steps)."""
    t = LLAMACPP_CACHE[cache_type]
    ll = LlamaCpp(path, 2, max(128, len(ids)), logits_all=True, type_k=t, type_v=t)
    ll.llm.reset()
    if prompt:
        ll.llm.eval(ids[:prompt])
        for tok in ids[prompt:]:
            ll.llm.eval([tok])
    else:
        ll.llm.eval(ids)
    return np.asarray(ll.llm.scores[:len(ids)], dtype=np.float64)


def distance(a: np.ndarray, b: np.ndarray) -> dict:
    """Max and median |a - b| over the logit scale, correlation, argmax agreement, and how many positions (rows)
    differ by more than 0.1% of the scale anywhere (a rounding flip moves a position or a few, not all)."""
    scale = float(np.abs(b).max())
    d = np.abs(a - b)
    return {"max_rel": float(d.max() / scale), "median_rel": float(np.median(d) / scale),
            "corr": float(np.corrcoef(a.ravel(), b.ravel())[0, 1]), "argmax_agree": float((a.argmax(1) == b.argmax(1)).mean()),
            "positions_apart": int((d.max(-1) > 1e-3 * scale).sum())}


def max_top1(d: dict | None) -> str:
    """Two table cells of a distance(): max and top-1, or dashes where there is none."""
    return f"{d['max_rel']:.4f} | {d['argmax_agree']:.3f}" if d else "- | -"


def quantized_by_llamacpp(src: Path, out: Path, ftype: str, code: int, ids: list[int],
                          f32_llamacpp: np.ndarray, cache_type: str = "f16") -> dict:
    """`src` quantized by `llama_model_quantize` to `ftype` (llama_ftype `code`) at `out`, both engines run on
    `ids`: the file's tensor types, pyinfer's distance to llama.cpp on it, the quantization noise (llama.cpp's
    own logits on it against `f32_llamacpp`, its logits on the F32 source), llama.cpp's distance to itself fed the
    ids one at a time instead of in one batch (and pyinfer's distance to that), and, with an f32 cache, its distance to itself with its default f16
    cache on the same file (how far rounding alone moves these logits)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = code
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize {ftype} of {Path(src).name} failed ({rc})")
    types = Counter(t.type_name for t in open_model(out).tensors.values())
    ours = pyinfer.load(str(out), n_threads=2, n_ctx=max(128, len(ids)), progress=False, cache_type=cache_type).eval(ids, all_logits=True)
    theirs = llamacpp_logits(str(out), ids, cache_type)
    kv_noise = distance(llamacpp_logits(str(out), ids, "f16"), theirs) if cache_type == "f32" else None
    # llama.cpp against itself: the ids one at a time (its decode kernels) against its one batch of them
    decode = llamacpp_logits(str(out), ids, cache_type, prompt=1)
    return {"tensor_types": dict(types), "pyinfer_vs_llamacpp": distance(ours.astype(np.float64), theirs),
            "quantization_noise": distance(theirs, f32_llamacpp), "llamacpp_f16_cache_vs_f32": kv_noise,
            "llamacpp_decode_vs_batch": distance(decode, theirs),
            "pyinfer_vs_llamacpp_decode": distance(ours.astype(np.float64), decode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cache-type", default="f32", choices=["f32", "f16"],
                    help="both engines' KV cache (default f32: attention unrounded on both sides)")
    args = ap.parse_args()
    kv = args.cache_type
    tmp = Path(tempfile.mkdtemp(prefix="pyinfer-quant-"))
    src = write_tiny_llama(tmp / "tiny-f32.gguf", seed=11, matrix_type=Q.F32, embed_type=Q.F32,
                           config=dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, n_layers=2))
    ref_model = pyinfer.load(str(src), n_threads=2, n_ctx=128, cache_type=kv)
    ids = np.random.default_rng(0).integers(3, ref_model.config.vocab_size, args.tokens).tolist()
    f32_llamacpp = llamacpp_logits(str(src), ids, kv)
    # The float file: no weight or activation quantization on either side, so the engines' floor.
    rows = [{"ftype": "F32 (source)", "tensor_types": dict(Counter(t.type_name for t in ref_model.gguf.tensors.values())),
             "pyinfer_vs_llamacpp": distance(ref_model.eval(ids, all_logits=True).astype(np.float64), f32_llamacpp),
             "quantization_noise": distance(f32_llamacpp, f32_llamacpp)}]
    for name, ftype in FTYPES.items():
        rows.append({"ftype": name, **quantized_by_llamacpp(src, tmp / f"tiny-{name}.gguf", name, ftype, ids,
                                                           f32_llamacpp, kv)})
        print(name, json.dumps(rows[-1]), file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "llamacpp_quantized.json").write_text(json.dumps({"tokens": args.tokens, "cache_type": kv, "rows": rows},
                                                                indent=1))
    md = ["# Files quantized by llama.cpp: pyinfer against llama.cpp", "",
          f"A tiny random LLaMA (2 layers, d 256, FFN 512, F32) quantized by `llama_model_quantize`; {args.tokens} "
          "tokens evaluated by both engines. Distances are |difference| over the largest |logit|. The "
          "quantization noise is llama.cpp's own logits on the quantized file against the F32 file. Both engines "
          f"hold an {kv} KV cache and quantize activations as llama.cpp does for each weight type. Last pairs: "
          "llama.cpp fed the tokens one at a time against its own batch, and pyinfer against that run.", "",
          "| file | tensor types | pyinfer vs llama.cpp: max | median | corr | argmax | quantization noise: max | "
          "median | corr | llama.cpp one at a time vs its batch: max | top-1 | pyinfer vs llama.cpp one at a time: "
          "max | top-1 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, q = r["pyinfer_vs_llamacpp"], r["quantization_noise"]
        types = ", ".join(f"{k} {v}" for k, v in sorted(r["tensor_types"].items()))
        md.append(f"| {r['ftype']} | {types} | {a['max_rel']:.4f} | {a['median_rel']:.5f} | {a['corr']:.6f} | "
                  f"{a['argmax_agree']:.3f} | {q['max_rel']:.4f} | {q['median_rel']:.5f} | {q['corr']:.6f} | "
                  f"{max_top1(r.get('llamacpp_decode_vs_batch'))} | {max_top1(r.get('pyinfer_vs_llamacpp_decode'))} |")
    (RESULTS / "llamacpp_quantized.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
