"""`pyinfer serve`: one process, or `--replicas N` on Ray Serve."""
from __future__ import annotations

import argparse

from ..errors import PyinferError
from ..serve.http_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT
from .common import device_args, model_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    sv = sub.add_parser("serve", help="OpenAI-compatible server with continuous batching under a KV budget",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Serves /v1/completions, /v1/chat/completions (streaming or not), /v1/models, "
                                    "/health, /metrics\nand a chat page at /. Requests are batched continuously; "
                                    "the scheduler admits and evicts\nunder the KV budget (arXiv 2508.14544's A_min "
                                    "and ours).",
                        epilog="examples:\n"
                               "  pyinfer serve                                  # then open http://127.0.0.1:8000/\n"
                               "  PYINFER_API_KEY=secret pyinfer serve --host 0.0.0.0 --kv-budget 32768\n"
                               "  pyinfer serve --replicas 2 --threads 4         # 2 engines on a local Ray Serve\n"
                               "  pyinfer serve --replicas 8 --ray-address auto  # on a cluster (`ray start` on each "
                               "machine)")
    model_args(sv)
    sv.add_argument("--kv-budget", type=int, default=16384, help="KV cache size in tokens (default 16384)")
    sv.add_argument("--scheduler", default="hedge", choices=["hedge", "amin", "amax", "fcfs"],
                    help="hedge (default: plans each request at the median length of finished requests with "
                         "similar intervals, admits by memory-time area), amin (arXiv 2508.14544), amax or fcfs")
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--api-key", default=None,
                    help="require 'Authorization: Bearer KEY' (visible in `ps`: prefer $PYINFER_API_KEY or "
                         "--api-key-file)")
    sv.add_argument("--api-key-file", default=None, metavar="PATH", help="read the API key from this file")
    sv.add_argument("--max-concurrent-requests", type=int, default=DEFAULT_MAX_CONCURRENT, metavar="N",
                    help=f"requests in flight at once; past them a request gets 429 (default {DEFAULT_MAX_CONCURRENT})")
    sv.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
                    help=f"largest request body; a larger one gets 413 (default {DEFAULT_MAX_BODY_BYTES >> 20} MiB)")
    sv.add_argument("--no-webui", action="store_true", help="do not serve the chat page at / (API only)")
    sv.add_argument("--replicas", type=int, default=None, metavar="N",
                    help="run N engine replicas (each its own process, --threads threads and --kv-budget) on Ray "
                         "Serve behind this one endpoint; requests go to the replica with the most free KV "
                         "(needs pip install 'pyinfer[ray]')")
    sv.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="with --replicas: join this Ray cluster (e.g. auto, or HEAD_IP:6379 after `ray start "
                         "--head` there) instead of starting a local one")
    sparsity_args(sv)
    device_args(sv)

    return {"serve": cmd_serve}


def cmd_serve(args) -> int:
    from ..serve.server import serve

    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise PyinferError("serving needs FastAPI, uvicorn and prometheus_client: pip install 'pyinfer[serve]'") from None
    if not 0 < args.port < 65536:
        raise PyinferError("--port must be in 1..65535")
    if args.ray_address is not None and args.replicas is None:
        raise PyinferError("--ray-address goes with --replicas N")
    if args.replicas is not None:
        if args.replicas < 1:
            raise PyinferError("--replicas must be at least 1")
        try:
            import ray.serve  # noqa: F401
        except ImportError:
            raise PyinferError("--replicas runs on Ray Serve, which is not installed: pip install 'pyinfer[ray]'") \
                from None
        from ..model.pull import resolve_model
        from ..serve.ray_serve import serve_replicas
        from ..serve.server import served_api_key, server_options

        options = server_options(args, served_api_key(args))
        # Replicas load the model themselves: they get a path (the same one on every machine of a cluster).
        options["model_path"] = str(resolve_model(args.model).resolve())
        return serve_replicas(args, options)
    return serve(args)
