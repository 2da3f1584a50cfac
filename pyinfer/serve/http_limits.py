"""What the HTTP server refuses before the API sees a request: bodies over a size (413, read no further),
request heads that never finish (the connection closed), and more connections than it serves (uvicorn's 503).

`uvicorn_config` is the one place `pyinfer serve`, the tests and the benchmarks get their uvicorn settings."""
from __future__ import annotations

import asyncio
import hmac
import json

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_MAX_CONCURRENT = 128   # TGI's default for --max-concurrent-requests
HEADER_TIMEOUT_S = 10.0        # a client has this long to send a request's head (slow-header connections)
KEEP_ALIVE_S = 5.0             # an idle keep-alive connection is closed after this
MAX_HEADER_BYTES = 64 << 10    # h11's cap on an incomplete request head


BODY_TIMEOUT_S = 30.0         # a body still not in whole after this is a 408: slow bodies do not hold connections
UNAUTHORIZED = "invalid or missing API key"


def authorized(api_key: str | None, header: bytes) -> bool:
    """Whether an Authorization header carries the key (always, without one). Constant time: how long the
    comparison takes says nothing about how much of the key matched."""
    return api_key is None or hmac.compare_digest(header, f"Bearer {api_key}".encode())


DRAIN_BYTES = 64 << 20         # an over-limit body up to this size is read and dropped before the 413 ...
DRAIN_SECONDS = 10.0          # ... for at most this long: a client still sending when the server closes gets a
                              # reset instead of the answer (nginx's lingering close, bounded)


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 (OpenAI-shaped) and never buffered past
    the limit; what the client still sends (up to DRAIN_BYTES, for DRAIN_SECONDS) is read and dropped first, so
    it reads the 413 rather than a reset. A Content-Length over DRAIN_BYTES is answered at once. The body is read
    here and replayed to the app; later receive() calls (the hang-up watch) pass through."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: str | None = None):
        self.app, self.max_bytes, self.api_key = app, max_bytes, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        if not authorized(self.api_key, headers.get(b"authorization", b"")):  # before any body is read
            return await self._refuse(send, 401, UNAUTHORIZED, "authentication_error", "invalid_api_key")
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                return await self._refuse(send, 400, "invalid Content-Length header")
            if too_big:
                if int(declared) <= DRAIN_BYTES:
                    await self._drain(receive, 0)
                return await self._refuse(send, 413, self._why())
        try:
            whole = await asyncio.wait_for(self._read(receive), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:
            return await self._refuse(send, 408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s")
        if whole is None:  # the client left
            return
        if isinstance(whole, int):
            return await self._refuse(send, 413, self._why())
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive):
        """The body; None if the client left; its size so far (an int) once over the limit, the rest drained."""
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body = msg.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                if msg.get("more_body", False):
                    await self._drain(receive, size)
                return size
            chunks.append(body)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    async def _drain(receive, size: int) -> None:
        async def rest():
            nonlocal size
            while size <= DRAIN_BYTES:
                msg = await receive()
                size += len(msg.get("body", b""))
                if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
                    return

        try:
            await asyncio.wait_for(rest(), DRAIN_SECONDS)
        except asyncio.TimeoutError:
            pass

    def _why(self) -> str:
        return f"request body is larger than this server's limit of {self.max_bytes} bytes (--max-body-bytes)"

    @staticmethod
    async def _refuse(send, status: int, message: str, type_: str = "invalid_request_error",
                      code: str | None = None) -> None:
        from .api_models import APIError

        body = json.dumps(APIError(status, message, type_, code=code).body()).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _guarded_h11_protocol():
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        """uvicorn's h11 protocol, and a connection whose request head has not come in whole HEADER_TIMEOUT_S after
        it opened (or after its last response) is closed: uvicorn alone keeps slow-header connections forever."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(HEADER_TIMEOUT_S, self._header_timeout)

        def _header_timeout(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._header_timer.cancel()
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._header_timer.cancel()
            super().connection_lost(exc)

    return GuardedH11Protocol


def uvicorn_config(app, host: str, port: int, max_connections: int):
    """uvicorn's Config with the limits set: at most `max_connections` connections or tasks (past them uvicorn
    answers 503), idle keep-alive and slow request heads closed, request heads capped."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=_guarded_h11_protocol(),
                          limit_concurrency=max_connections, timeout_keep_alive=KEEP_ALIVE_S,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, backlog=max(64, max_connections))
