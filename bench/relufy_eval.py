"""A ReLU-fied model against its original (issue 13's figures): WikiText-2 perplexity of both (llama.cpp's
protocol, 512-token windows), the share of zero FFN activations per layer on WikiText-2, and with --decode the
decode speed of the ReLU model with its own predictors against the original's dense decode, side by side
(alternating rounds; the predictors are trained here on calibration text, never on WikiText-2).

    python bench/relufy_eval.py --relu smollm2-relu.gguf --windows 40 [--decode] [--tag relufy_cpu]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "sparsity"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def zero_share(path: str, text: str, windows: int = 2, ctx: int = 512) -> list[float]:
    """Per layer: the share of zero ReLU(gate) activations over `windows` windows of `text`."""
    import torch

    import pyinfer
    from pyinfer.train.torch_llama import Llama

    m = pyinfer.load(path, n_threads=2, n_ctx=ctx, progress=False)
    ids = m.tokenize(text)
    student = Llama(m.gguf, "relu")
    zeros = np.zeros(m.config.n_layers)
    n = 0
    with torch.no_grad():
        for w in range(windows):
            chunk = ids[w * ctx:(w + 1) * ctx]
            if len(chunk) < 2:
                break
            acts: list = []
            student(torch.tensor([chunk]), acts)
            zeros += np.array([float((a == 0).float().mean()) for a in acts])
            n += 1
    return (zeros / max(n, 1)).tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="the original (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--relu", required=True, help="the ReLU-fied GGUF from `pyinfer relufy`")
    ap.add_argument("--windows", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", action="store_true", help="also profile, train predictors and time decode")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="relufy_eval")
    args = ap.parse_args()
    import pyinfer
    from pyinfer.tools.perplexity import perplexity

    text = (DATA / "wikitext-2-raw-test.txt").read_text()
    orig = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, progress=False)
    relu = pyinfer.load(args.relu, n_threads=args.threads, n_ctx=512, progress=False)
    out = {"meta": {"original": Path(orig.path).name, "relu": Path(args.relu).name, "windows": args.windows,
                    "threads": args.threads, "machine": platform.processor() or platform.machine(),
                    "date": time.strftime("%Y-%m-%d")}}
    out["perplexity_original"] = perplexity(orig, text, 512, args.windows, progress=False).perplexity
    out["perplexity_relu"] = perplexity(relu, text, 512, args.windows, progress=False).perplexity
    out["ppl_ratio"] = out["perplexity_relu"] / out["perplexity_original"]
    out["zero_share_per_layer"] = zero_share(args.relu, text)
    out["zero_share_mean"] = float(np.mean(out["zero_share_per_layer"]))
    if args.decode:
        out["decode"] = decode_side_by_side(orig, args, text)
    lines = [f"# ReLU-fied {out['meta']['original']}: {out['meta']['relu']}", "",
             f"WikiText-2 perplexity ({args.windows} x 512): original {out['perplexity_original']:.4f}, ReLU "
             f"{out['perplexity_relu']:.4f} (x{out['ppl_ratio']:.3f})", "",
             f"FFN zero share on WikiText-2 (mean over layers): {out['zero_share_mean']:.1%}", "",
             "| layer | " + " | ".join(str(i) for i in range(len(out["zero_share_per_layer"]))) + " |",
             "|---" * (len(out["zero_share_per_layer"]) + 1) + "|",
             "| zeros | " + " | ".join(f"{z:.0%}" for z in out["zero_share_per_layer"]) + " |"]
    if "decode" in out:
        d = out["decode"]
        lines += ["", f"Decode ({args.threads} threads, median of {args.rounds} alternating rounds): original dense "
                  f"{d['original_tok_s']:.1f} tok/s, ReLU with predictors {d['relu_tok_s']:.1f} tok/s, "
                  f"**{d['ratio']:.3f}x**"]
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=1))
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    return 0


def decode_side_by_side(orig, args, text) -> dict:
    import tempfile

    import pyinfer
    from pyinfer.cli import main as cli
    from pyinfer.offload.planner import timed_decode

    calib = str(DATA / "pride-and-prejudice.txt")
    with tempfile.TemporaryDirectory() as tmp:
        prof, plan = f"{tmp}/relu.profile.npz", f"{tmp}/relu.sparse.npz"
        cli(["profile", "-m", args.relu, "-t", str(args.threads), "-f", calib, "-o", prof])
        cli(["train-predictors", "-m", args.relu, "-t", str(args.threads), "--profile", prof, "-f", calib,
             "-o", plan])
        relu = pyinfer.load(args.relu, n_threads=args.threads, sparsity=plan, progress=False)
        rates = {"original": [], "relu": []}
        for _ in range(args.rounds):
            for name, m in (("original", orig), ("relu", relu)):
                seconds, _ = timed_decode(m, 64, warmup=4)
                rates[name].append(64 / seconds)
    return {"original_tok_s": statistics.median(rates["original"]), "relu_tok_s": statistics.median(rates["relu"]),
            "ratio": statistics.median(r / o for r, o in zip(rates["relu"], rates["original"]))}


if __name__ == "__main__":
    sys.exit(main())
