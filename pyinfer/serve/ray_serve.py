"""`pyinfer serve --replicas N`: N engine replicas on Ray Serve behind one OpenAI-compatible endpoint.

    client ──HTTP──▶ Ray Serve proxy ──▶ OpenAIFront ──handle(stream)──▶ KvRequestRouter ──▶ EngineReplica × N
                                           │  /metrics, /health                               │ every 0.5 s
                                           └───────────── MetricsBoard (an actor) ◀──────────┘

- EngineReplica: one process with its own engine, threads and KV budget, running the very app `pyinfer serve`
  runs (asgi_bridge), so every check, limit and error is the plain server's. Ray restarts one that dies or whose
  engine stopped (check_health).
- KvRequestRouter: Ray Serve's custom request router, sending each request to the replica with the most free KV
  budget (kv_router, from each replica's record_routing_stats) among those whose queue is not full.
- OpenAIFront: forwards each request and retries it elsewhere on a 429, a 503 or a lost replica (replica_front);
  aggregates /metrics and /health from the MetricsBoard every replica reports to.

Ray is optional (`pip install 'pyinfer[ray]'`); nothing else in pyinfer imports this module."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import signal
import sys
import threading
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray's usage report would reach for the network

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.serve.config import RequestRouterConfig  # noqa: E402
from ray.serve.request_router import RequestRouter  # noqa: E402

from ..errors import PyinferError  # noqa: E402

from .asgi_bridge import Forwarded, call_asgi  # noqa: E402
from .http_limits import BODY_TIMEOUT_S, UNAUTHORIZED, authorized  # noqa: E402
from .kv_router import STATS_PERIOD_S, KvLedger, request_cost  # noqa: E402
from .replica_front import JSON, error_body, forward  # noqa: E402

NAMESPACE = "pyinfer"
APP_NAME = "pyinfer"
STALE_S = 3.0           # a replica silent for this long is gone from /metrics and /health
HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
log = logging.getLogger("pyinfer.serve")


class KvRequestRouter(RequestRouter):
    """Ranks replicas by free KV budget (best first, one per rank, so Ray tries them in that order and skips
    those whose queue is full); a replica the front names in `avoid` is ranked last. Not FIFO: Ray's FIFO mixin
    hands the replica chosen for one request to the oldest waiting one, whose `avoid` may name that replica."""

    def initialize_state(self, **kwargs):
        self.ledger = KvLedger()

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for rid, r in by_id.items():
            self.ledger.observe(rid, r.routing_stats)
        self.ledger.forget(set(by_id))  # Ray passes every running replica: the others are gone
        avoid = frozenset()
        if pending_request is not None:
            avoid = frozenset(pending_request.kwargs.get("avoid", ()))
            # Should every replica be full, Ray waits (with backoff) before it asks again, rather than spin.
            pending_request.routing_context.should_backoff = True
        return [[by_id[rid]] for rid in self.ledger.rank(list(by_id), avoid)]

    def on_request_routed(self, pending_request, replica_id, result):
        self.ledger.sent(replica_id.unique_id, pending_request.kwargs.get("cost", 0))


@ray.remote(num_cpus=0)
class MetricsBoard:
    """The replicas' latest metrics, as each last reported them, and the counters of replicas gone (so the
    summed counters never go back when a replica dies or is replaced)."""

    def __init__(self):
        from .metrics import COUNTER_KEYS

        self.snapshots: dict[str, tuple[float, dict]] = {}
        self.departed = dict.fromkeys(COUNTER_KEYS, 0)

    def report(self, replica: str, metrics: dict) -> None:
        self.snapshots[replica] = (time.time(), metrics)

    def leave(self, replica: str) -> None:
        _, last = self.snapshots.pop(replica, (0.0, {}))
        for key in self.departed:
            self.departed[key] += last.get(key, 0)

    def read(self, max_age_s: float = STALE_S) -> tuple[dict[str, dict], dict[str, float]]:
        """({replica: its metrics}, counters of the replicas gone)."""
        now = time.time()
        for replica in [r for r, (t, _) in self.snapshots.items() if now - t > max_age_s]:
            self.leave(replica)
        return {r: m for r, (_, m) in self.snapshots.items()}, dict(self.departed)


def metrics_board(app_name: str):
    """The app's board, made by whoever asks first (front or replica), kept until the app is deleted."""
    return MetricsBoard.options(name=f"{app_name}-metrics", namespace=NAMESPACE, lifetime="detached",
                                get_if_exists=True).remote()


class EngineReplica:
    def __init__(self, server_options: dict, app_name: str):
        from .server import build_server

        self.app, self.loop, self.model = build_server(**server_options)
        self.loop.start()
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.reports = 0
        self.inside: dict[int, int] = {}  # cost (the router's estimate) of each request now in handle()
        self.board = metrics_board(app_name)
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="pyinfer-metrics-report", daemon=True).start()

    def _report(self) -> None:
        while not self._stop.wait(STATS_PERIOD_S):
            try:
                self.board.report.remote(self.replica, dict(self.loop.metrics(), pid=os.getpid()))
            except Exception:  # noqa: BLE001 - the board is being replaced or Ray is shutting down: try again later
                pass

    async def handle(self, req: Forwarded, avoid=(), cost: int = 0):
        """The replica's id, then the Head and body chunks of the app's answer (`avoid`, `cost`: for the
        router, which reads them from the call)."""
        key = id(req)
        self.inside[key] = cost
        parts = call_asgi(self.app, req, self.replica)
        try:
            yield self.replica
            async for part in parts:
                yield part
        finally:
            self.inside.pop(key, None)
            await parts.aclose()  # now, not at garbage collection: the app sees its client leave at once

    def record_routing_stats(self) -> dict:
        """What the router ranks by. Requests that arrived but are not in the engine yet (being tokenized) count
        at the router's own estimate: a report must not make a replica that just took a burst look empty."""
        self.reports += 1
        m = self.loop.metrics()
        costs = list(self.inside.values())
        unseen = max(0, len(costs) - self.loop.in_flight())
        committed = m["kv_committed_tokens"] + (unseen * sum(costs) // len(costs) if costs else 0)
        return {"report": self.reports, "kv_budget_tokens": m["kv_budget_tokens"], "kv_committed_tokens": committed,
                "alive": self.loop.alive}

    def check_health(self) -> None:
        if not self.loop.alive:  # Ray replaces a replica whose engine thread ended
            raise RuntimeError(f"the engine is not running ({self.loop.failure or 'stopped'})")

    def __del__(self):
        self._stop.set()
        try:
            self.board.leave.remote(self.replica)
        except Exception:  # noqa: BLE001
            pass
        self.loop.stop()


def _is_lost(error: BaseException) -> bool:
    """The replica's process died or cannot be reached (an error the replica's own code raised is not this)."""
    return isinstance(error, ray.exceptions.RayActorError)


class _BodyTooLarge(Exception):
    pass


class OpenAIFront:
    def __init__(self, engine, app_name: str, max_body_bytes: int, attempts: int, api_key: str | None = None):
        self.engine, self.max_body_bytes, self.attempts, self.api_key = engine, max_body_bytes, attempts, api_key
        self.board = metrics_board(app_name)

    async def _board(self):
        """The board's snapshot, or none if it does not answer within 5 s (being restarted)."""
        import asyncio

        try:
            return await asyncio.wait_for(self.board.read.remote(), 5.0)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            return {}, {}

    async def _read_body(self, request) -> bytes:
        """The body, read no further than the limit and for no longer than the plain server allows."""
        import asyncio

        body = bytearray()

        async def read():
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > self.max_body_bytes:
                    raise _BodyTooLarge

        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
        return bytes(body)

    def _opener(self, cost: int):
        engine = self.engine.options(stream=True)

        async def open_stream(req: Forwarded, avoid: frozenset):
            gen = engine.handle.remote(req, avoid=sorted(avoid), cost=cost)
            try:
                async for part in gen:
                    yield part
            finally:
                gen.cancel()  # the client left or the front moved on: the replica sees its client hang up

        return open_stream

    async def __call__(self, request):
        import asyncio

        from prometheus_client import CONTENT_TYPE_LATEST
        from starlette.responses import Response

        from .metrics import replicas_text

        def refuse(status: int, message: str, kind: str, code: str):
            body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
            return Response(json.dumps(body), status_code=status, media_type="application/json")

        path = request.url.path
        if request.method == "GET" and path == "/metrics":
            return Response(replicas_text(*await self._board()), media_type=CONTENT_TYPE_LATEST)
        if request.method == "GET" and path == "/health":
            snapshots, _ = await self._board()
            if snapshots:
                return Response(json.dumps({"status": "ok", "replicas": len(snapshots)}), media_type="application/json")
            return Response('{"status":"no replica is serving"}', status_code=503, media_type="application/json")
        if request.method not in ("GET", "HEAD", "OPTIONS"):  # as the plain server: the key, then the size
            if not authorized(self.api_key, request.headers.get("authorization", "").encode()):
                return refuse(401, UNAUTHORIZED, "authentication_error", "invalid_api_key")
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                return refuse(413, f"request body over {self.max_body_bytes} bytes", "invalid_request_error",
                              "body_too_large")
        try:
            body = await self._read_body(request)
        except _BodyTooLarge:
            return refuse(413, f"request body over {self.max_body_bytes} bytes", "invalid_request_error",
                          "body_too_large")
        except asyncio.TimeoutError:
            return refuse(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
                          "invalid_request_error", "request_timeout")
        req = Forwarded(request.method, path, request.url.query, list(request.headers.items()), body)
        head, reply = await forward(self._opener(_cost_of(body)), req, self.attempts, _is_lost)
        headers = {k: v for k, v in head.headers if k.lower() not in HOP_BY_HOP} or dict(JSON)
        if head.replica:
            headers["x-pyinfer-replica"] = head.replica  # which replica answered (load tests, debugging)
        return _closing_response(reply, head.status, headers)


def _closing_response(reply, status: int, headers: dict):
    """A streamed response that closes the replica's stream however it ends: Starlette cancels a response whose
    client left before its first chunk without ever iterating it."""
    from starlette.responses import StreamingResponse

    class ClosingStream(StreamingResponse):
        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                await reply.aclose()

    return ClosingStream(reply, status_code=status, headers=headers)


def _cost_of(body: bytes) -> int:
    try:
        max_tokens = json.loads(body).get("max_tokens") if body else None
    except (ValueError, AttributeError, RecursionError):
        max_tokens = None
    return request_cost(len(body), max_tokens if isinstance(max_tokens, int) else None)


def build_app(server_options: dict, replicas: int, threads: int, max_concurrent: int, max_body_bytes: int,
              app_name: str = APP_NAME):
    """The Serve application: the front and `replicas` engine replicas of `threads` threads each. With a CUDA
    device each replica asks Ray for a GPU of its own (Ray sets its CUDA_VISIBLE_DEVICES, so it sees it as
    device 0): one replica per GPU."""
    actor_options = {"num_cpus": threads}
    if str(server_options["options"].device).startswith("cuda"):
        actor_options["num_gpus"] = 1
        server_options = dict(server_options, options=server_options["options"].but(device="cuda"))
    engine = serve.deployment(
        EngineReplica, name="EngineReplica", num_replicas=replicas,
        ray_actor_options=actor_options,
        max_ongoing_requests=max_concurrent,  # past it Ray queues at the router: never a 429 from a full replica
        health_check_period_s=2.0, health_check_timeout_s=30.0, graceful_shutdown_timeout_s=5.0,
        request_router_config=RequestRouterConfig(request_router_class=KvRequestRouter,
                                                  request_routing_stats_period_s=STATS_PERIOD_S,
                                                  request_routing_stats_timeout_s=5.0),
    ).bind(server_options, app_name)
    front = serve.deployment(OpenAIFront, name="OpenAIFront", num_replicas=1, ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=replicas * max_concurrent + 64)
    return front.bind(engine, app_name, max_body_bytes, replicas + 1, server_options.get("api_key"))


@contextlib.contextmanager
def _neutral_cwd():
    """Ray puts the driver's working directory on every worker's sys.path: started from a source checkout, the
    workers would import its pyinfer/ (without the built _core) instead of the installed one."""
    here = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        yield
    finally:
        os.chdir(here)


def connect(address: str | None = None) -> int:
    """Connects to Ray (a new local instance without `address`); returns the CPUs the cluster has."""
    with _neutral_cwd():
        ray.init(address=address, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, ignore_reinit_error=True)
    return int(ray.cluster_resources().get("CPU", 0))


def start(server_options: dict, replicas: int, threads: int, host: str, port: int, max_concurrent: int,
          max_body_bytes: int, address: str | None = None, app_name: str = APP_NAME) -> None:
    """Connects to Ray, starts Serve's proxy on host:port and deploys the app; returns once every replica is up.
    Refuses (PyinferError) replicas that could never all be placed, rather than wait for them forever."""
    cpus = connect(address)
    if replicas * threads > cpus:
        raise PyinferError(f"{replicas} replicas of {threads} thread(s) need {replicas * threads} CPUs; the Ray "
                           f"cluster has {cpus}: use fewer --replicas or --threads (or add machines)")
    serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
    options = dict(server_options, options=server_options["options"].but(n_threads=threads))
    serve.run(build_app(options, replicas, threads, max_concurrent, max_body_bytes, app_name), name=app_name,
              route_prefix="/", blocking=False)


def stop(app_name: str = APP_NAME, shutdown: bool = True) -> None:
    """Deletes the app and its board; `shutdown`: Serve and the local Ray too (not on a shared cluster)."""
    try:
        serve.delete(app_name)
        ray.kill(ray.get_actor(f"{app_name}-metrics", namespace=NAMESPACE))
    except Exception:  # noqa: BLE001 - already gone
        pass
    if shutdown:
        serve.shutdown()
        ray.shutdown()


def serve_replicas(args, server_options: dict) -> int:
    """The `pyinfer serve --replicas N` command: blocks until Ctrl-C."""
    t0 = time.monotonic()
    # Without --threads each replica gets an equal part of the cluster's CPUs (not all of them each, which is
    # what an engine takes alone).
    threads = server_options["options"].n_threads or max(1, connect(args.ray_address) // args.replicas)
    try:
        start(server_options, args.replicas, threads, args.host, args.port, args.max_concurrent_requests,
              args.max_body_bytes, args.ray_address)
    except BaseException:
        stop(shutdown=args.ray_address is None)
        raise
    print(f"pyinfer: serving {server_options['model_path']} on http://{args.host}:{args.port}/v1 with "
          f"{args.replicas} replica(s) of {threads} thread(s) on Ray Serve (KV budget {args.kv_budget} tokens "
          f"each; up in {time.monotonic() - t0:.1f} s); Ctrl-C stops", file=sys.stderr)
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # a service manager's stop cleans up as Ctrl-C does
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        stop(shutdown=args.ray_address is None)
    return 0
