"""One HTTP request run against an ASGI app in this process, as a stream of parts: how a Ray Serve replica runs
the same FastAPI app `pyinfer serve` runs (every check, limit and error of it), for requests a front forwarded.

`call_asgi` yields a `Head` first (status and headers), then the body's chunks as bytes. A consumer that stops
early (closes the generator, or is cancelled because its own client left) makes the app see `http.disconnect`,
so the engine cancels the request and frees its KV, as it does for a client of the plain server."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator


@dataclass(frozen=True)
class Head:
    status: int
    headers: list[tuple[str, str]]   # as the app sent them, hop-by-hop ones included
    replica: str = ""                # who answered (set by the replica)


@dataclass(frozen=True)
class Forwarded:
    """What a front passes on: the request as the client sent it, its body already read."""
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes


async def call_asgi(app, req: Forwarded, replica: str = "") -> AsyncIterator[object]:
    """Yields Head, then bytes chunks of the body, until the app ends its response."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()          # the app watches for a hang-up: it comes when our consumer leaves
        return {"type": "http.disconnect"}

    async def send(message):
        await sent.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode("latin-1", "replace"),
             "query_string": req.query.encode("latin-1", "replace"), "root_path": "",
             "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in req.headers],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}

    async def run():
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(None)   # the app returned (or raised): nothing more will come

    task = asyncio.ensure_future(run())
    try:
        while True:
            message = await sent.get()
            if message is None:
                break
            if message["type"] == "http.response.start":
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())]
                yield Head(message["status"], headers, replica)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
    finally:
        gone.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10.0)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            task.cancel()
        except Exception:  # noqa: BLE001 - the app's own error handlers answered already; nothing to add here
            pass
