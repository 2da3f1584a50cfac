"""`pyinfer generate` and `pyinfer chat`."""
from __future__ import annotations

import sys

from .common import device_args, load_model, model_args, sampling, sampling_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    g = sub.add_parser("generate", help="complete a prompt, streaming to stdout")
    model_args(g)
    sampling_args(g)
    sparsity_args(g)
    device_args(g)
    g.add_argument("prompt", help="prompt text ('-' reads stdin)")

    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    model_args(c)
    sampling_args(c)
    c.add_argument("--system", default=None, help="system message")
    sparsity_args(c)
    device_args(c)

    return {"generate": cmd_generate, "chat": cmd_chat}


def cmd_generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    model = load_model(args)
    for piece in model.stream(prompt, **sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args) -> int:
    model = load_model(args)
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
        for piece in model.chat(messages, stream=True, **sampling(args)):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0
