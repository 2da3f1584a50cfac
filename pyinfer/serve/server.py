"""`pyinfer serve`: wires model, batch engine, scheduler loop and the HTTP API together."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import PyinferError
from ..options import LoadOptions
from .http_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT
from .policies import POLICIES

DEFAULT_POLICY = "hedge"
BLOCK_SIZE = 16


def build_server(model_path: str | None, kv_budget: int, policy: str = DEFAULT_POLICY, api_key: str | None = None,
                 max_seq_len: int | None = None, max_concurrent: int = DEFAULT_MAX_CONCURRENT,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, webui: bool = True,
                 options: LoadOptions | None = None, **load_options):
    """Returns (app, loop, session); call loop.start() before serving. The model loads with `options` and/or
    LoadOptions' fields as keywords, as load()'s. `webui`: the chat page at /."""
    from ..model.pull import resolve_model
    from ..session import Session
    from .batch_engine import BatchEngine
    from .engine_loop import EngineLoop
    from .openai_api import create_app

    if policy not in POLICIES or policy == "hsf":
        raise PyinferError(f"--scheduler must be one of {', '.join(p for p in POLICIES if p != 'hsf')} "
                           "(hsf needs true lengths: simulation only)")
    if kv_budget < BLOCK_SIZE * 2:
        raise PyinferError(f"--kv-budget must be at least {BLOCK_SIZE * 2} tokens")
    if max_concurrent < 1:
        raise PyinferError("--max-concurrent-requests must be at least 1")
    if max_body_bytes < 1024:
        raise PyinferError("--max-body-bytes must be at least 1024")
    # One session sets up the model's parts, as the Python API's load() does: the server's engine is its batch
    # engine (many sequences over a paged KV cache); the session also serves the tokenizer and chat template.
    session = Session(resolve_model(model_path), (kv_budget // BLOCK_SIZE) * BLOCK_SIZE,
                      LoadOptions.of(options, **load_options))
    cap = min(session.config.train_ctx, max_seq_len or session.config.train_ctx, kv_budget)
    batch = BatchEngine.of_session(session, kv_budget // BLOCK_SIZE, BLOCK_SIZE, cap, session.max_batch)
    batch.running.reserve_memory()  # the KV budget is resident from the start: memory use is flat while serving
    loop = EngineLoop(batch, policy, (kv_budget // BLOCK_SIZE) * BLOCK_SIZE, set(session.tokenizer.end_of_generation))
    name = Path(session.path).stem  # e.g. SmolLM2-135M-Instruct.Q4_1
    return create_app(session, loop, str(name), api_key, max_concurrent, max_body_bytes, webui), loop, session


def api_key_of(args) -> str | None:
    """--api-key-file, then $PYINFER_API_KEY, then --api-key (which `ps` shows to every user of the machine)."""
    if getattr(args, "api_key_file", None):
        try:
            with open(args.api_key_file) as f:
                key = f.read().strip()
        except OSError as e:
            raise PyinferError(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}") from None
        if not key:
            raise PyinferError(f"--api-key-file {args.api_key_file} is empty")
        return key
    if os.environ.get("PYINFER_API_KEY"):
        return os.environ["PYINFER_API_KEY"]
    if args.api_key:
        print("pyinfer: warning: --api-key is visible to every user in `ps`; prefer PYINFER_API_KEY or "
              "--api-key-file", file=sys.stderr)
    return args.api_key


def served_api_key(args) -> str | None:
    """The key `pyinfer serve` checks (api_key_of), with a warning where the server listens beyond this machine
    without one."""
    api_key = api_key_of(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"pyinfer: warning: serving on {args.host} without an API key", file=sys.stderr)
    return api_key


def server_options(args, api_key: str | None) -> dict:
    """build_server's keyword arguments from `pyinfer serve`'s (one place for the plain and the Ray server)."""
    return dict(model_path=args.model, kv_budget=args.kv_budget, policy=args.scheduler, api_key=api_key,
                max_concurrent=args.max_concurrent_requests, max_body_bytes=args.max_body_bytes,
                webui=not args.no_webui, options=LoadOptions.from_args(args))


def serve(args) -> int:
    """`pyinfer serve` on one process (`--replicas N` is ray_serve.py's, which the command line calls instead)."""
    import uvicorn

    from .http_limits import uvicorn_config

    app, loop, model = build_server(**server_options(args, served_api_key(args)))
    loop.start()
    page = "" if args.no_webui else f"chat page http://{args.host}:{args.port}/, "
    print(f"pyinfer: serving {model.path} on http://{args.host}:{args.port}/v1 ({page}"
          f"scheduler {args.scheduler}, KV budget {loop.kv_budget} tokens, at most {args.max_concurrent_requests} "
          "requests at once)", file=sys.stderr)
    # Connections: every request in flight, plus as many again for health checks, metrics and refusals.
    server = uvicorn.Server(uvicorn_config(app, args.host, args.port, 2 * args.max_concurrent_requests + 32))
    try:
        server.run()
    finally:
        loop.stop()
    return 0
