"""`pyinfer perplexity`: llama.cpp's protocol."""
from __future__ import annotations

import json

from ..errors import PyinferError
from .common import device_args, load_model, model_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    pp = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp protocol)",
                        description="llama.cpp's perplexity protocol: non-overlapping windows of --ctx tokens, each "
                                    "from an empty cache, the second half of each window scored. With --sparsity, "
                                    "every token is computed as sparse decode computes it (not as a dense prefill), "
                                    "so the figure is the sparse model's quality.")
    model_args(pp, ctx_default=512)
    pp.add_argument("-f", "--file", required=True, help="text file to score")
    pp.add_argument("--windows", type=int, default=None, help="score only the first N windows")
    pp.add_argument("--json", action="store_true", help="print the result as JSON")
    sparsity_args(pp)
    device_args(pp)

    return {"perplexity": cmd_perplexity}


def cmd_perplexity(args) -> int:
    from ..tools.perplexity import perplexity

    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise PyinferError(f"cannot read {args.file}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PyinferError(f"{args.file} is not UTF-8 text") from None
    if args.windows is not None and args.windows < 1:
        raise PyinferError("--windows must be at least 1")
    # With sparsity, every token is computed as decode computes it (a window is one prefill, and prefill is
    # dense): otherwise the figure would be the dense model's.
    model = load_model(args, emulate_prefill=args.sparsity != "off")
    r = perplexity(model, text, ctx=args.ctx, windows=args.windows, progress=not args.json)
    if args.json:
        print(json.dumps(r.as_dict()))
    else:
        print(f"perplexity: {r.perplexity:.4f}  ({r.windows} windows of {r.ctx} tokens, "
              f"{r.scored_tokens} scored of {r.total_tokens}; {r.path} path)")
    return 0
