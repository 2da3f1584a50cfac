"""Each architecture against llama.cpp itself: a tiny random model per architecture (2 layers, d 256, FFN 512,
F32 weights, written with gguf-py) with a real vocabulary copied from llama.cpp's own vocab files, run by
llama.cpp and pyinfer on the same 48 ids; then each quantized by llama.cpp (`llama_model_quantize`, Q4_K_M
and Q8_0) and run again. The quantization noise is llama.cpp's own logits on the quantized file against its
F32 file: pyinfer's distance to llama.cpp on a quantized file is stated beside it.

  python bench/arch_check.py --vendor DIR   # DIR: vendor/llama.cpp/models of the llama-cpp-python 0.3.36 sdist
                                            # writes bench/results/robustness/arch_check.{json,md}
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
from gguf import GGMLQuantizationType as Q  # noqa: E402
from llamacpp_quantized import distance, llamacpp_logits, max_top1, quantized_by_llamacpp  # noqa: E402
from support.reference_gemma4 import gemma4_logits  # noqa: E402
from support.reference_llama import reference_logits  # noqa: E402
from support.tiny_model import MOE_KINDS  # noqa: E402
from support.tiny_model import write_tiny_arch as tiny_arch  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "robustness"
FTYPES = {"Q4_K_M": 15, "Q8_0": 7}  # llama_ftype
SHAPE = dict(d_model=256, d_ff=512, n_heads=4, n_kv_heads=2, n_layers=2)
# (what, writer kind, vocabulary file, what it checks)
CASES = [
    ("llama (Mistral, SmolLM)", "llama", "ggml-vocab-llama-spm.gguf", "the plain llama layer"),
    ("llama 3.x", "llama3", "ggml-vocab-llama-bpe.gguf", "rope_freqs.weight frequency factors"),
    ("qwen2", "qwen2", "ggml-vocab-qwen2.gguf", "q/k/v biases, NEOX RoPE, tied head"),
    ("qwen3", "qwen3", "ggml-vocab-qwen2.gguf", "QK-norm, head size 128 != d / heads"),
    ("phi3", "phi3", "ggml-vocab-phi-3.gguf", "fused qkv and gate-up, LongRoPE short factors, attn_factor"),
    ("phi3 (long)", "phi3-long", "ggml-vocab-phi-3.gguf", "LongRoPE long factors (context beyond the original)"),
    # Gemma 3 at its own tiny shape (7 layers: 5 local, 1 global, 1 local; d 128, heads of 128), a tiny vocabulary
    ("gemma3", "gemma3", None, "QK-norm, post-norms, sliding window 6, local RoPE base, GELU"),
    ("gemma3 (linear 8)", "gemma3-linear8", None, "rope.scaling linear 8 on the global layer only (Gemma 3 4B-27B)"),
    # Mixture of Experts: 8 experts of 256 neurons, 2 per token (K-quants need 256-wide expert rows)
    ("qwen3moe", "qwen3moe", "ggml-vocab-qwen2.gguf", "qwen3 attention, softmax top-2 of 8 experts, renormalized"),
    ("Mixtral (llama + experts)", "mixtral", "ggml-vocab-llama-spm.gguf", "llama layer, top-2 of 8 experts, renormalized"),
    ("qwen2moe", "qwen2moe", "ggml-vocab-qwen2.gguf", "qwen2 attention, top-2 of 8 not renormalized, sigmoid-gated shared expert"),
    ("olmoe", "olmoe", "ggml-vocab-llama-bpe.gguf", "q/k RMS-normed as whole rows, NEOX RoPE, top-2 of 8 not renormalized"),
    ("granitemoe", "granitemoe", "ggml-vocab-llama-bpe.gguf",
     "embedding, attention, residual and logit multipliers; top-2 of 8 renormalized; ungated shared expert"),
    ("glm4moe", "glm4moe", "ggml-vocab-qwen2.gguf", "q/k/v biases, QK-norm, partial NEOX RoPE (32 of 64), a leading "
     "dense layer, sigmoid routing with a selection bias, x2.5, shared experts, an MTP layer left out"),
    ("gpt-oss", "gpt-oss", "ggml-vocab-llama-bpe.gguf", "attention sinks, a window of 5 on even layers, YaRN x4 "
     "(original context 32), biased router and experts, softmax of the top 2, clamped SwiGLU"),
    ("deepseek2 (V2-Lite)", "deepseek2", "ggml-vocab-llama-bpe.gguf", "latent attention (q direct, latent 128 + 32 "
     "rotary cached, absorbed k_b / v_b), YaRN x4 with DeepSeek's magnitude, a leading dense layer, softmax top-2 "
     "of 8, two shared experts"),
    ("deepseek2 (V3 layout)", "deepseek2-v3", "ggml-vocab-llama-bpe.gguf", "low-rank q with its norm, sigmoid "
     "routing with a selection bias in 4 groups of which 2 count, renormalized, x2.5"),
    ("smallthinker", "smallthinker", "ggml-vocab-qwen2.gguf", "5 layers: the router on each layer's input before "
     "attention, ReGLU experts, softmax top-2 of 8 renormalized; a sliding window: layers 0 and 4 global and NoPE"),
    # Qwen 3.5 (issue 53): 4 layers, 0-2 gated DeltaNet, 3 gated full attention
    ("qwen35", "qwen35", "ggml-vocab-qwen35.gguf", "3 gated DeltaNet layers (conv1d of 4 taps and its state, the "
     "gated delta rule, 2 key heads read by 4 value heads of 32) and a gated full-attention layer (QK-norm, "
     "partial M-RoPE 16 of 64)"),
    ("qwen35moe", "qwen35moe", "ggml-vocab-qwen35.gguf", "qwen35's layers with experts: softmax top-2 of 8 "
     "renormalized and a sigmoid-gated shared expert"),
    ("qwen3next", "qwen3next", "ggml-vocab-qwen35.gguf", "qwen35moe's layers with value head h reading key head "
     "h / 2 (repeat-interleave), beta and alpha fused in ssm_ba, plain NEOX RoPE"),
    # Gemma 4 (issue 53): 6 layers, sliding / global alternating, the last 2 sharing the caches of layers 2 and 3
    ("gemma4", "gemma4", "ggml-vocab-gemma-4.gguf", "sliding heads of 32 (2 KV heads, window 5) and global ones of "
     "64 (1 KV head, a quarter of the pairs rotated), V norm, 2 shared-KV layers with double-wide FFNs, per-layer "
     "embeddings of 16, layer output scales, logits capped at 30"),
    ("gemma4 (k = v)", "gemma4-kv", "ggml-vocab-gemma-4.gguf", "global layers without attn_v (the value is k's "
     "projection), no per-layer embeddings or shared KV (31B's layout)"),
    ("gemma4 MoE", "gemma4moe", "ggml-vocab-gemma-4.gguf", "26B-A4B's layout: each layer's dense FFN beside 8 "
     "experts of 256, 2 per token, each half normed apart; the router on the stream's own norm times a scale; each "
     "expert's output scaled; gate and up fused in ffn_gate_up_exps"),
    ("smallthinker (sigmoid, no window)", "smallthinker-sigmoid", "ggml-vocab-qwen2.gguf", "sigmoid routing, every "
     "layer global with RoPE"),
]
MOE = dict(n_expert=8, n_expert_used=2, d_ff_expert=256, d_ff_shared=512)


INIT_TEXT = {False: "at sd 0.2 (Gemma 3 / 4 and Qwen 3.5: their writers' own)",
             True: "at sd 1/sqrt(inputs), as trained weights keep their scale"}
# Kinds whose own writers (Gemma 3 and 4, Qwen 3.5) set their weights' scale themselves: `--init fan-in` skips them.
OWN_INIT = ("gemma3", "gemma4", "qwen35", "qwen3next")


def write(kind: str, path: Path, vocab: Path | None, fan_in: bool = False) -> Path:
    """llama.cpp rounds its context up to a multiple of 256 before choosing Phi-3's long or short factors,
    so the original context is put well away from the 128 both engines run with: 4096 (short), 64 (long).
    `fan_in`: every projection matrix drawn at 1 / sqrt(its inputs) (write_tiny_arch's fan_in)."""
    def write_tiny_arch(path: Path, arch: str, **kw) -> Path:
        return tiny_arch(path, arch, **dict(kw, config=dict(kw.get("config") or {}, fan_in=fan_in)))

    if kind.startswith("gemma3"):
        from support.tiny_model import write_tiny_gemma3

        f32 = {k: Q.F32 for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
        scaled = (lambda w: (w.add_string("gemma3.rope.scaling.type", "linear"),
                             w.add_float32("gemma3.rope.scaling.factor", 8.0))) if kind.endswith("linear8") else None
        return write_tiny_gemma3(path, seed=3, types=f32, extra=scaled)
    if kind.startswith("gemma4"):
        from support.tiny_gemma4 import write_tiny_gemma4

        shape = dict(d_model=256, d_ff=512, n_heads=4, head_dim=64, head_dim_local=32, kv_heads=1, kv_heads_local=2,
                     per_layer=16, cap=30.0, rotated_pairs=8, scale=0.05)  # ~1/sqrt(d), as trained weights
        if kind == "gemma4-kv":
            shape.update(per_layer=0, shared=0, k_eq_v=True)
        if kind == "gemma4moe":
            shape.update(per_layer=0, shared=0, k_eq_v=True, n_expert=8, n_expert_used=2, d_ff_expert=256, fused=True)
        return write_tiny_gemma4(path, seed=len(kind), vocab_from=vocab, config=shape)
    hd = 128 if kind in ("qwen3", "qwen3moe") else 64
    if kind.startswith("qwen35") or kind == "qwen3next":
        from support.tiny_hybrid import write_tiny_qwen35

        return write_tiny_qwen35(path, seed=len(kind), vocab_from=vocab, moe=kind == "qwen35moe",
                                 arch="qwen3next" if kind == "qwen3next" else "qwen35",
                                 config=dict(SHAPE, n_layers=4, head_dim=hd, rope_dims=16, sections=(3, 3, 2, 0),
                                             ssm_head_dim=32, ssm_k_heads=2, ssm_v_heads=4, **MOE))
    if kind.startswith("deepseek2"):  # query heads 64 + 32, a latent of 128 (+ 32 rotary), value heads 64
        mla = dict(SHAPE, n_layers=3, n_kv_heads=1, head_dim=96, rope_dims=32, kv_lora_rank=128, v_dim=64,
                   **MOE, q_lora_rank=96 if kind.endswith("v3") else 0, v3=kind.endswith("v3"))
        return write_tiny_arch(path, "deepseek2", seed=len(kind), config=mla, vocab_from=vocab)
    if kind.startswith("smallthinker"):  # 5 layers (the window pattern's period and one), experts d_ff wide
        sigmoid = kind.endswith("sigmoid")
        return write_tiny_arch(path, "smallthinker", seed=len(kind), vocab_from=vocab,
                               config=dict(SHAPE, n_layers=5, head_dim=hd, **dict(MOE, d_ff=MOE["d_ff_expert"]),
                                           swa=not sigmoid, sigmoid=sigmoid, router_scale=0.01))
    if kind in MOE_KINDS:
        moe = dict(MOE, d_ff=MOE["d_ff_expert"]) if kind in ("mixtral", "olmoe", "granitemoe") else MOE  # experts d_ff wide
        shape = dict(SHAPE, n_kv_heads=SHAPE["n_heads"]) if kind == "olmoe" else SHAPE  # OLMoE: k_norm is d wide
        if kind == "glm4moe":  # a dense layer, then two MoE layers (and the MTP layer after them)
            shape = dict(SHAPE, n_layers=3, rope_dims=hd // 2)
        return write_tiny_arch(path, kind, seed=len(kind), config=dict(shape, head_dim=hd, **moe), vocab_from=vocab)
    extra = {"orig_ctx": 64 if kind == "phi3-long" else 4096} if kind.startswith("phi3") else {}
    return write_tiny_arch(path, kind.removesuffix("-long"), seed=len(kind), config=dict(SHAPE, head_dim=hd),
                           vocab_from=vocab, **extra)


def run_case(name: str, kind: str, vocab: Path, tmp: Path, n_ids: int, kv: str = "f16",
             fan_in: bool = False) -> list[dict]:
    """`kv`: both engines' KV cache type; `fan_in`: write()'s."""
    src = write(kind, tmp / f"{kind}-f32.gguf", vocab, fan_in)
    f32 = pyinfer.load(str(src), n_threads=2, n_ctx=max(128, n_ids), progress=False, cache_type=kv)
    ids = np.random.default_rng(0).integers(3, f32.config.vocab_size, n_ids).tolist()
    ref = llamacpp_logits(str(src), ids, kv)
    ours = f32.eval(ids, all_logits=True).astype(np.float64)
    margins: list = []
    numpy_ref = (gemma4_logits(f32.gguf, ids, cache_fp16=kv == "f16") if kind.startswith("gemma4") else
                 reference_logits(f32.gguf, ids, n_ctx=max(128, n_ids), margins=margins))
    # Where the engines' top tokens differ: llama.cpp's top-2 gap over its largest |logit|, and whose side
    # the fp32 numpy reference (tests/reference_llama.py) takes.
    ties = [{"position": int(i), "llamacpp_top2_gap": float(-np.diff(np.sort(ref[i])[::-1][:2])[0] / np.abs(ref).max()),
             "numpy_reference_agrees_with": "pyinfer" if numpy_ref[i].argmax() == ours[i].argmax() else
             "llama.cpp" if numpy_ref[i].argmax() == ref[i].argmax() else "neither"}
            for i in np.flatnonzero(ours.argmax(1) != ref.argmax(1))]
    vocab_name = vocab.name if vocab is not None else "tiny byte-level BPE"
    rows = [{"arch": name, "kind": kind, "file": "F32", "vocab": vocab_name,
             "pyinfer_vs_llamacpp": distance(ours, ref), "quantization_noise": None, "top1_differences": ties}]
    if margins:  # MoE: positions whose routing is within 0.001 of another expert (noise may choose either)
        near = np.flatnonzero(np.min(margins, axis=0) < 1e-3)
        clear = np.setdiff1d(np.arange(len(ids)), near)
        rows[0]["routing_near_ties"] = near.tolist()
        rows[0]["pyinfer_vs_llamacpp_clear_routing"] = distance(ours[clear], ref[clear])
    if f32.config.recurrent_layers or f32.config.kv_shared_from or kind.startswith("gemma4"):
        # a recurrent state or borrowed caches: the prompt's half in one run, then one token at a time
        half = n_ids // 2
        m = pyinfer.load(str(src), n_threads=2, n_ctx=max(128, n_ids), progress=False, cache_type=kv)
        steps = [m.forward(ids[:half], 0, np.arange(half))] + [m.forward([t], half + i, np.array([0]))
                                                              for i, t in enumerate(ids[half:])]
        rows.append({"arch": name, "kind": kind, "file": "F32 decode", "vocab": vocab_name, "quantization_noise": None,
                     "pyinfer_vs_llamacpp": distance(np.concatenate(steps).astype(np.float64),
                                                     llamacpp_logits(str(src), ids, kv, prompt=half))})
    for ft, code in dict(FTYPES, **({"MXFP4_MOE": 38} if kind == "gpt-oss" else {})).items():  # gpt-oss ships MXFP4
        rows.append({"arch": name, "kind": kind, "file": ft, "vocab": vocab_name,
                     **quantized_by_llamacpp(src, tmp / f"{kind}-{ft}.gguf", ft, code, ids, ref, kv)})
    for r in rows:
        print(json.dumps(r), file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vendor", type=Path, required=True, help="vendor/llama.cpp/models of the sdist")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--only", nargs="+", metavar="KIND", help="run these cases and replace their rows in the saved "
                    f"table (kinds: {', '.join(c[1] for c in CASES)})")
    ap.add_argument("--cache-type", default="f32", choices=["f32", "f16"],
                    help="both engines' KV cache (default f32: llama.cpp's f16 cache also rounds q and the softmax "
                         "to fp16, noise that activation quantization amplifies on these tiny random models); "
                         "f16 results go to arch_check_f16.{json,md}")
    ap.add_argument("--init", default="plain", choices=["plain", "fan-in"],
                    help="the tiny models' projection matrices: plain (normal with sd 0.2, each layer's gain ~3: "
                         "small differences grow layer to layer) or fan-in (sd 1/sqrt(inputs), the scale trained "
                         "weights keep; Gemma 3 / 4 and Qwen 3.5, whose writers set their own, are skipped); "
                         "fan-in results go to arch_check_fan_in.{json,md}")
    args = ap.parse_args()
    kv, fan_in = args.cache_type, args.init == "fan-in"
    stem = ("arch_check" if kv == "f32" else f"arch_check_{kv}") + ("_fan_in" if fan_in else "")
    tmp = Path(tempfile.mkdtemp(prefix="pyinfer-arch-"))
    rows = []
    if args.only and (RESULTS / f"{stem}.json").exists():
        rows = [r for r in json.loads((RESULTS / f"{stem}.json").read_text())["rows"] if r["kind"] not in args.only]
    for name, kind, vocab, _ in CASES:
        if (args.only and kind not in args.only) or (fan_in and kind.startswith(OWN_INIT)):
            continue
        rows += run_case(name, kind, args.vendor / vocab if vocab else None, tmp, args.tokens, kv, fan_in)
        for f in tmp.glob(f"{kind}-*.gguf"):
            f.unlink()
    order = [c[1] for c in CASES]
    rows.sort(key=lambda r: (order.index(r["kind"]), ["F32", "F32 decode", *FTYPES, "MXFP4_MOE"].index(r["file"])))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"tokens": args.tokens, "shape": SHAPE, "cache_type": kv,
                                                      "init": args.init, "rows": rows},
                                                        indent=1))
    md = ["# Architectures against llama.cpp 0.3.36", "",
          f"Tiny random models ({SHAPE['n_layers']} layers, d {SHAPE['d_model']}, FFN {SHAPE['d_ff']}, "
          f"{SHAPE['n_heads']} heads, {SHAPE['n_kv_heads']} KV heads; projection matrices "
          f"{INIT_TEXT[fan_in]}) with "
          "llama.cpp's own vocabularies; "
          f"{args.tokens} random ids evaluated by both engines. max = largest |difference| over the largest "
          "|logit|; top-1 = share of positions whose argmax agrees; positions apart = positions whose logits differ "
          "anywhere by more than 0.1% of the largest |logit|. Quantization noise: llama.cpp's own logits "
          f"on the quantized file against its F32 file. Both engines hold an {kv} KV cache and quantize "
          "activations as llama.cpp does for each weight type. The f16-cache pair: llama.cpp with its default f16 cache "
          "against itself with the f32 cache, on the same file (what fp16 rounding of K, V, q and the softmax "
          "alone moves on these tiny random models). Where shown, llama.cpp against itself fed the ids one at a "
          "time (its decode path) instead of in one batch, same file and cache, and pyinfer against that run.", "",
          "| architecture | checks | vocabulary | file | max | top-1 | positions apart | quantization noise: max | top-1 "
          "| llama.cpp f16 cache vs its f32 cache: max | top-1 | llama.cpp one at a time vs its batch: max | top-1 "
          "| pyinfer vs llama.cpp one at a time: max | top-1 |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    what = {c[1]: c[3] for c in CASES}
    for r in rows:
        a = r["pyinfer_vs_llamacpp"]
        md.append(f"| {r['arch']} | {what[r['kind']]} | {r['vocab']} | {r['file']} | {max_top1(a)} | "
                  f"{a.get('positions_apart', '-')} | {max_top1(r['quantization_noise'])} | "
                  f"{max_top1(r.get('llamacpp_f16_cache_vs_f32'))} | {max_top1(r.get('llamacpp_decode_vs_batch'))} | "
                  f"{max_top1(r.get('pyinfer_vs_llamacpp_decode'))} |")
    for r in rows:
        if r.get("routing_near_ties") is not None:
            c = r["pyinfer_vs_llamacpp_clear_routing"]
            md.append(f"\n{r['arch']} {r['file']}: {len(r['routing_near_ties'])} of {args.tokens} positions route within "
                      f"0.001 of a tie in the fp32 reference (positions {r['routing_near_ties']}); over the others max "
                      f"{c['max_rel']:.4f}, top-1 {c['argmax_agree']:.3f}.")
        for t in r.get("top1_differences") or []:
            md.append(f"\n{r['arch']} {r['file']}: position {t['position']} differs; llama.cpp's top two logits are "
                      f"{t['llamacpp_top2_gap']:.4%} of the largest |logit| apart, and the fp32 numpy reference "
                      f"agrees with {t['numpy_reference_agrees_with']}.")
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
