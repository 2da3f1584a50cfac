"""The Mixture-of-Experts families against llama.cpp on files made the way real ones are: a tiny random Hugging Face
checkpoint per architecture (built by `transformers` from a small config, its own initialization: normal weights of
sd `initializer_range` 0.02; SmallThinker, which `transformers` does not know, written as safetensors in its
checkpoints' names), converted to an F32 GGUF by llama.cpp's own `convert_hf_to_gguf.py` (from the llama-cpp-python
0.3.36 sdist, with its `gguf-py`), quantized by llama.cpp's `llama_model_quantize` (Q8_0, Q4_K_M; MXFP4_MOE for
gpt-oss), then run by both engines on the same 48 ids.

The tiny checkpoints carry no tokenizer: the converter's vocabulary step is replaced by a copy of a llama.cpp vocab
file's tokenizer keys (the weights, hyperparameters and tensor layout are the converter's own). Biases, norm weights,
attention sinks and routing selection biases, which `transformers` starts at 0 or 1, get small random values so that
a path which dropped them would show.

  python bench/hf_check.py --vendor DIR     # DIR: vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist
                                            # writes bench/results/robustness/hf_check.{json,md}
  python bench/hf_check.py --vendor DIR --only deepseek_v2 glm4_moe
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import pyinfer  # noqa: E402
from llamacpp_quantized import distance, llamacpp_logits, max_top1, quantized_by_llamacpp  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "robustness"
FTYPES = {"Q8_0": 7, "Q4_K_M": 15}  # llama_ftype
COMMON = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
              rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=256, intermediate_size=512)
# (model_type, what, vocabulary file, config, what it checks)
CASES = [
    ("olmoe", "OLMoE", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=2, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
          intermediate_size=256, norm_topk_prob=False),
     "q/k norms over whole rows, top-2 of 8 not renormalized"),
    ("granitemoe", "Granite MoE", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=256,
          embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0),
     "embedding, attention, residual and logit multipliers, top-2 of 8"),
    ("granitemoeshared", "Granite MoE (shared expert)", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2, intermediate_size=256,
          shared_intermediate_size=512, embedding_multiplier=12.0, attention_multiplier=0.015625,
          residual_multiplier=0.22, logits_scaling=8.0),
     "granitemoe with an ungated shared expert"),
    ("glm4_moe", "GLM-4.5 (glm4moe)", "ggml-vocab-qwen2.gguf",
     dict(COMMON, num_hidden_layers=3, head_dim=64, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
          first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1, n_group=1, topk_group=1,
          routed_scaling_factor=2.5, norm_topk_prob=True, num_nextn_predict_layers=0, **MOE),
     "q/k/v biases, QK-norm, partial RoPE (32 of 64), a leading dense layer, sigmoid routing with a selection "
     "bias, x2.5, a shared expert"),
    ("gpt_oss", "gpt-oss", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=2, head_dim=64, num_local_experts=8, num_experts_per_tok=2,
          intermediate_size=256, sliding_window=5, layer_types=["sliding_attention", "full_attention"],
          rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                            original_max_position_embeddings=1024)),
     "attention sinks, a window of 5 on the first layer, YaRN x4, biased router and experts, clamped SwiGLU"),
    # llama.cpp knows V2-Lite (q without a low rank, no q_lora_rank key) by its layer count, 26 or 27
    ("deepseek_v2", "DeepSeek-V2-Lite (deepseek2)", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=26, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=128,
          qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64, first_k_dense_replace=1, n_routed_experts=8,
          n_shared_experts=2, topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
          routed_scaling_factor=1.0, **MOE,
          rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=1024, beta_fast=32,
                            beta_slow=1, mscale=0.707, mscale_all_dim=0.707)),
     "26 layers: latent attention (q direct, latent 128 + 32 rotary), YaRN x4, a leading dense layer, softmax "
     "top-2 of 8, two shared experts"),
    ("deepseek_v3", "DeepSeek-V3 layout (deepseek2)", "ggml-vocab-llama-bpe.gguf",
     dict(COMMON, num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=128, qk_rope_head_dim=32,
          qk_nope_head_dim=64, v_head_dim=64, first_k_dense_replace=1, n_routed_experts=8, n_shared_experts=1,
          n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, **MOE,
          rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=1024, beta_fast=32,
                            beta_slow=1, mscale=1.0, mscale_all_dim=1.0)),
     "low-rank q with its norm, sigmoid routing with a selection bias in 4 groups of which 2 count, x2.5"),
    ("smallthinker", "SmallThinker", "ggml-vocab-qwen2.gguf",
     dict(COMMON, num_hidden_layers=5, head_dim=64, moe_num_primary_experts=8, moe_num_active_primary_experts=2,
          moe_ffn_hidden_size=256, moe_primary_router_apply_softmax=True, sliding_window_layout=[0, 1, 1, 1, 0],
          sliding_window_size=4096, rope_theta=1.5e6),
     "the router on each layer's input before attention, ReGLU experts, softmax top-2 of 8; windowed layers "
     "(llama.cpp's pattern: every 4th layer global and NoPE, window 4096)"),
    ("smallthinker-sigmoid", "SmallThinker (sigmoid routing)", "ggml-vocab-qwen2.gguf",
     dict(COMMON, num_hidden_layers=3, head_dim=64, moe_num_primary_experts=8, moe_num_active_primary_experts=2,
          moe_ffn_hidden_size=256, moe_primary_router_apply_softmax=False, rope_theta=1.5e6),
     "sigmoid routing, no window: every layer global with RoPE"),
]


def machine() -> dict:
    """What the figures were measured with: the CPU, the converter's transformers and the llama.cpp binding."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else \
        platform.processor()
    return {"cpu": cpu, "transformers": ver("transformers"), "llama_cpp_python": ver("llama_cpp_python")}


def vocab_size(vocab: Path) -> int:
    from gguf import GGUFReader

    return len(GGUFReader(str(vocab)).fields["tokenizer.ggml.tokens"].data)


def perturb(named: dict, rng: np.random.Generator) -> dict:
    """What transformers starts at a constant (biases and selection biases 0, norm weights 1, sinks 0) drawn
    around it, so that a dropped term shows in the logits."""
    out = {}
    for name, w in named.items():
        if name.endswith("norm.weight") or "layernorm" in name:
            w = w + rng.normal(0, 0.1, w.shape).astype(w.dtype)
        elif name.endswith("bias") or name.endswith("sinks") or "e_score_correction" in name:
            w = w + rng.normal(0, 0.1 if "correction" in name else 0.02, w.shape).astype(w.dtype)
        out[name] = w
    return out


def smallthinker_checkpoint(cfg: dict, out: Path, rng: np.random.Generator) -> None:
    """SmallThinker's checkpoint names (transformers has no class for it): attention, a primary router per layer,
    experts' gate / up / down, weights at sd initializer_range."""
    from safetensors.numpy import save_file

    d, hd, nl, ne, dff = (cfg["hidden_size"], cfg["head_dim"], cfg["num_hidden_layers"],
                          cfg["moe_num_primary_experts"], cfg["moe_ffn_hidden_size"])
    nh, nkv, sd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["initializer_range"]
    w = lambda *shape: rng.normal(0, sd, shape).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "lm_head.weight": w(cfg["vocab_size"], d),
         "model.norm.weight": np.ones(d, np.float32)}
    for i in range(nl):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(nh * hd, d), p + "self_attn.k_proj.weight": w(nkv * hd, d),
                  p + "self_attn.v_proj.weight": w(nkv * hd, d), p + "self_attn.o_proj.weight": w(d, nh * hd),
                  p + "input_layernorm.weight": np.ones(d, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(d, np.float32),
                  p + "block_sparse_moe.primary_router.weight": w(ne, d)})
        for e in range(ne):
            q = f"{p}block_sparse_moe.experts.{e}."
            t.update({q + "gate.weight": w(dff, d), q + "up.weight": w(dff, d), q + "down.weight": w(d, dff)})
    save_file(perturb(t, rng), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(dict(cfg, architectures=["SmallThinkerForCausalLM"],
                                                     model_type="smallthinker", torch_dtype="float32")))


def checkpoint(model_type: str, cfg: dict, out: Path, seed: int) -> None:
    """A tiny random checkpoint of `model_type` at `out` (config.json and model.safetensors)."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if model_type.startswith("smallthinker"):  # a case of it: smallthinker-sigmoid
        return smallthinker_checkpoint(cfg, out, rng)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        named = perturb({k: v.detach().numpy() for k, v in model.state_dict().items()}, rng)
        for k, v in model.state_dict().items():
            v.copy_(torch.from_numpy(named[k]))
    model.save_pretrained(str(out), safe_serialization=True)


# The converter, run in its own process with its own gguf-py first on the path; only its vocabulary step is replaced.
CONVERT = r"""
import runpy, sys
vendor, model_dir, outfile, vocab = sys.argv[1:5]
sys.path[:0] = [vendor, vendor + "/gguf-py"]
import gguf, conversion
from conversion.base import TextModel
conversion.load_all_models()

def set_vocab(self):
    reader = gguf.GGUFReader(vocab)
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            kind = field.types[0]
            self.gguf_writer.add_key_value(name, field.contents(), kind,
                                           sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)

def patch(cls):
    if "set_vocab" in vars(cls):
        cls.set_vocab = set_vocab
    for sub in cls.__subclasses__():
        patch(sub)
patch(TextModel)
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", outfile, "--outtype", "f32"]
runpy.run_path(vendor + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert(vendor: Path, model_dir: Path, out: Path, vocab: Path) -> Path:
    r = subprocess.run([sys.executable, "-c", CONVERT, str(vendor), str(model_dir), str(out), str(vocab)],
                       capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {model_dir.name}: {tail[0]}")
    return out


def run_case(model_type: str, name: str, vocab_file: str, cfg: dict, vendor: Path, tmp: Path, n_ids: int) -> list[dict]:
    vocab = vendor / "models" / vocab_file
    cfg = dict(cfg, vocab_size=vocab_size(vocab))
    ckpt = tmp / model_type
    checkpoint(model_type, cfg, ckpt, seed=len(model_type))
    src = convert(vendor, ckpt, tmp / f"{model_type}-f32.gguf", vocab)
    ours = pyinfer.load(str(src), n_threads=2, n_ctx=max(128, n_ids), progress=False, cache_type="f32")
    ids = np.random.default_rng(0).integers(3, ours.config.vocab_size, n_ids).tolist()
    ref = llamacpp_logits(str(src), ids, "f32")
    base = {"model_type": model_type, "arch": name, "gguf_arch": ours.config.arch, "vocab": vocab_file}
    rows = [dict(base, file="F32", quantization_noise=None,
                 pyinfer_vs_llamacpp=distance(ours.eval(ids, all_logits=True).astype(np.float64), ref),
                 llamacpp_decode_vs_batch=distance(llamacpp_logits(str(src), ids, "f32", prompt=1), ref))]
    for ft, code in dict(FTYPES, **({"MXFP4_MOE": 38} if model_type == "gpt_oss" else {})).items():
        out = tmp / f"{model_type}-{ft}.gguf"
        rows.append(dict(base, file=ft, **quantized_by_llamacpp(src, out, ft, code, ids, ref, "f32")))
    for r in rows:
        print(json.dumps(r), file=sys.stderr)
    return rows


def markdown(rows: list[dict], n_ids: int) -> str:
    md = ["# The MoE families from Hugging Face checkpoints, converted by llama.cpp, against llama.cpp 0.3.36", "",
          "Tiny random checkpoints made by `transformers` (SmallThinker: safetensors in its checkpoints' names), sd "
          "0.02 as `transformers` initializes them, d 256, 8 experts of 256, 2 per token; converted to F32 by "
          "llama.cpp's `convert_hf_to_gguf.py`, quantized by `llama_model_quantize`; "
          f"{n_ids} random ids through both engines, both with an f32 KV cache. max = largest |difference| over the "
          "largest |logit|; top-1 = share of positions whose argmax agrees; positions apart = positions whose "
          "logits differ anywhere by more than 0.1% of the largest |logit|. Quantization noise: llama.cpp's own "
          "logits on the quantized file against its F32 file. llama.cpp against itself: the same ids fed one at "
          "a time (its decode path) against its one batch of them, same file and cache: how far llama.cpp's own "
          "float sums, in another order, move these logits; and pyinfer against that one-at-a-time run. The bar: "
          "max <= 1% and top-1 1.000 (the max, top-1 and positions apart columns: against llama.cpp's batch).", ""]
    columns = ["architecture", "GGUF arch", "what it checks", "file", "tensor types", "max", "top-1",
               "positions apart", "quantization noise: max", "top-1", "llama.cpp one at a time vs its batch: max",
               "top-1", "pyinfer vs llama.cpp one at a time: max", "top-1"]
    md += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    what = {c[0]: c[4] for c in CASES}
    for r in rows:
        a = r["pyinfer_vs_llamacpp"]
        cells = [r["arch"], r["gguf_arch"], what[r["model_type"]], r["file"],
                 ", ".join(f"{k} {v}" for k, v in sorted((r.get("tensor_types") or {}).items())) or "F32",
                 max_top1(a), str(a["positions_apart"]), max_top1(r["quantization_noise"]),
                 max_top1(r.get("llamacpp_decode_vs_batch")), max_top1(r.get("pyinfer_vs_llamacpp_decode"))]
        md.append("| " + " | ".join(cells) + " |")
    return "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vendor", type=Path, required=True,
                    help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (convert_hf_to_gguf.py, gguf-py, "
                         "models/ggml-vocab-*.gguf)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--only", nargs="+", metavar="MODEL_TYPE", choices=[c[0] for c in CASES],
                    help=f"run these and replace their rows in the saved table ({', '.join(c[0] for c in CASES)})")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep the checkpoints and GGUF files in DIR (for "
                    "bench/trace_vs_llamacpp.py -m FILE) instead of a temporary folder")
    args = ap.parse_args()
    if not (args.vendor / "convert_hf_to_gguf.py").exists():
        raise SystemExit(f"hf_check: no convert_hf_to_gguf.py in {args.vendor} (give the sdist's vendor/llama.cpp)")
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="pyinfer-hf-"))
    saved = RESULTS / "hf_check.json"
    rows = []
    if args.only and saved.exists():
        rows = [r for r in json.loads(saved.read_text())["rows"] if r["model_type"] not in args.only]
    order = [c[0] for c in CASES]
    for model_type, name, vocab, cfg, _ in CASES:
        if args.only and model_type not in args.only:
            continue
        try:
            rows += run_case(model_type, name, vocab, cfg, args.vendor, tmp, args.tokens)
        except (Exception, SystemExit) as e:  # one architecture's failure is a row, not the end of the run
            print(f"hf_check: {model_type}: {e}", file=sys.stderr)
            rows.append({"model_type": model_type, "arch": name, "gguf_arch": "-", "vocab": vocab, "file": "-",
                         "error": str(e)})
        if not args.keep:
            shutil.rmtree(tmp / model_type, ignore_errors=True)
            for f in tmp.glob(f"{model_type}-*.gguf"):
                f.unlink()
        rows.sort(key=lambda r: (order.index(r["model_type"]), ["-", "F32", *FTYPES, "MXFP4_MOE"].index(r["file"])))
        RESULTS.mkdir(parents=True, exist_ok=True)  # saved after every case: a later failure keeps these rows
        saved.write_text(json.dumps({"tokens": args.tokens, "machine": machine(), "rows": rows}, indent=1))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    text = markdown([r for r in rows if "error" not in r], args.tokens)
    errors = [f"- {r['arch']}: {r['error']}" for r in rows if "error" in r]
    (RESULTS / "hf_check.md").write_text(text + ("\nNot run:\n" + "\n".join(errors) + "\n" if errors else ""))
    print(text)
    print("\n".join(errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
