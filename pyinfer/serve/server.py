"""`pyinfer serve`: wires model, batch engine, scheduler loop and the HTTP API together."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import PyinferError
from .http_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT
from .policies import POLICIES

DEFAULT_POLICY = "hedge"
BLOCK_SIZE = 16


def build_server(model_path: str | None, kv_budget: int, policy: str = DEFAULT_POLICY, n_threads: int | None = None,
                 api_key: str | None = None, max_seq_len: int | None = None, sparsity="off", target=None,
                 cache_type: str = "f16", ram_budget=None, device: str = "cpu", vram_budget=None,
                 neuron_cache: float | None = None, neuron_window: float | None = None,
                 max_concurrent: int = DEFAULT_MAX_CONCURRENT, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 webui: bool = True):
    """Returns (app, loop, model); call loop.start() before serving. `ram_budget` (a size or a plan file),
    `neuron_cache`, `neuron_window`, `device`, `vram_budget`: as load()'s. `webui`: the chat page at /."""
    from ..api import load
    from ..offload.setup import make_offload
    from ..sparsity.resolve import resolve_sparsity
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
    # The Model serves tokenizer and chat template; the batch engine is the one that runs, so only it gets
    # the sparse copies of the weights.
    model = load(model_path, n_threads=n_threads, n_ctx=16)
    plan = resolve_sparsity(sparsity, model.gguf, model.config, model.tokenizer.encode, target, model.n_threads)
    cap = min(model.config.train_ctx, max_seq_len or model.config.train_ctx, kv_budget)
    offload = make_offload(model.gguf, model.config, plan, "auto", ram_budget, neuron_cache, neuron_window)
    placement = None
    if device != "cpu" or vram_budget is not None:
        from ..place.device import check_cuda, parse_device, resolve_placement

        kind, index = parse_device(device)
        if kind == "cpu":
            raise PyinferError("--vram-budget needs --device cuda (or standin)")
        if offload is not None:
            raise PyinferError("--device and --ram-budget together are not supported yet")
        if kind == "cuda":
            check_cuda(index)
        placement = resolve_placement(kind, index, vram_budget, model.gguf, model.config, plan,
                                      (kv_budget // BLOCK_SIZE) * BLOCK_SIZE, cache_type)
    batch = BatchEngine(model.gguf, model.config, kv_budget // BLOCK_SIZE, BLOCK_SIZE, cap, model.n_threads,
                        sparsity=plan, cache_type=cache_type, offload=offload, device=device, placement=placement)
    batch.engine.reserve_memory()  # the KV budget is resident from the start: memory use is flat while serving
    loop = EngineLoop(batch, policy, (kv_budget // BLOCK_SIZE) * BLOCK_SIZE, set(model.tokenizer.end_of_generation))
    name = Path(model.path).stem  # e.g. SmolLM2-135M-Instruct.Q4_1
    return create_app(model, loop, str(name), api_key, max_concurrent, max_body_bytes, webui), loop, model


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


def server_options(args, api_key: str | None) -> dict:
    """build_server's keyword arguments from `pyinfer serve`'s (one place for the plain and the Ray server)."""
    return dict(model_path=args.model, kv_budget=args.kv_budget, policy=args.scheduler, n_threads=args.threads,
                api_key=api_key, sparsity=args.sparsity, target=args.target, cache_type=args.cache_type,
                ram_budget=args.ram_budget, device=args.device, vram_budget=args.vram_budget,
                neuron_cache=args.neuron_cache, neuron_window=args.neuron_window,
                max_concurrent=args.max_concurrent_requests, max_body_bytes=args.max_body_bytes,
                webui=not args.no_webui)


def serve(args) -> int:
    import uvicorn

    from .http_limits import uvicorn_config

    api_key = api_key_of(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"pyinfer: warning: serving on {args.host} without an API key", file=sys.stderr)
    options = server_options(args, api_key)
    if args.replicas is not None:
        from ..model.pull import resolve_model
        from .ray_serve import serve_replicas

        # Replicas load the model themselves: they get a path (the same one on every machine of a cluster).
        options["model_path"] = str(resolve_model(args.model).resolve())
        return serve_replicas(args, options)
    app, loop, model = build_server(**options)
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
