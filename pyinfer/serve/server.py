"""`pyinfer serve`: wires model, batch engine, scheduler loop and the HTTP API together."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import PyinferError
from .policies import POLICIES

DEFAULT_POLICY = "hedge"
BLOCK_SIZE = 16


def build_server(model_path: str | None, kv_budget: int, policy: str = DEFAULT_POLICY, n_threads: int | None = None,
                 api_key: str | None = None, max_seq_len: int | None = None, sparsity="off", target=None,
                 cache_type: str = "f16", ram_budget=None, device: str = "cpu", vram_budget=None):
    """Returns (app, loop, model); call loop.start() before serving. `ram_budget`, `device`, `vram_budget`: as
    load()'s."""
    from ..api import load
    from ..sparsity.resolve import resolve_sparsity
    from .batch_engine import BatchEngine
    from .engine_loop import EngineLoop
    from .openai_api import create_app

    if policy not in POLICIES or policy == "hsf":
        raise PyinferError(f"--scheduler must be one of {', '.join(p for p in POLICIES if p != 'hsf')} "
                           "(hsf needs true lengths: simulation only)")
    if kv_budget < BLOCK_SIZE * 2:
        raise PyinferError(f"--kv-budget must be at least {BLOCK_SIZE * 2} tokens")
    # The Model serves tokenizer and chat template; the batch engine is the one that runs, so only it gets
    # the sparse copies of the weights.
    model = load(model_path, n_threads=n_threads, n_ctx=16)
    plan = resolve_sparsity(sparsity, model.gguf, model.config, model.tokenizer.encode, target, model.n_threads)
    cap = min(model.config.train_ctx, max_seq_len or model.config.train_ctx, kv_budget)
    offload = None
    if ram_budget is not None:
        from ..model.pull import cache_dir
        from ..offload import OffloadedFfn, parse_size

        if plan is None:
            raise PyinferError("--ram-budget streams FFN neurons and needs --sparsity (auto or a file)")
        offload = OffloadedFfn(model.gguf, model.config, plan, "auto", parse_size(ram_budget), cache_dir())
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
    return create_app(model, loop, str(name), api_key), loop, model


def serve(args) -> int:
    import uvicorn

    app, loop, model = build_server(args.model, args.kv_budget, args.scheduler, args.threads, args.api_key,
                                    sparsity=args.sparsity, target=args.target, cache_type=args.cache_type,
                                    ram_budget=args.ram_budget, device=args.device, vram_budget=args.vram_budget)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"pyinfer: warning: serving on {args.host} without --api-key", file=sys.stderr)
    loop.start()
    print(f"pyinfer: serving {model.path} on http://{args.host}:{args.port}/v1 "
          f"(scheduler {args.scheduler}, KV budget {loop.kv_budget} tokens)", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        loop.stop()
    return 0
