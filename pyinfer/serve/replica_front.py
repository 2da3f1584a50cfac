"""The front of many replicas: forwards one request, and retries it on another replica when the first refused it
or died before answering (no Ray here: `open_stream` is whatever reaches a replica; tested with stand-ins).

A replica's stream is: its id (str), then the Head, then body chunks (asgi_bridge). The front retries when
- the replica answered 429 (its request limit) or 503 (its engine is not running): the next replica is asked,
  this one is named in `avoid` so the router ranks it last; after the last attempt its refusal is passed on;
- the replica was lost (`is_lost(error)`: its process died) before its Head: nothing reached the client yet, so
  the request is sent again, whole. A non-streamed answer's Head comes with its body, at the end, so a replica
  killed mid-generation costs the client only time.
A replica lost after its Head (a stream already under way) cannot be replayed: a streamed reply gets an
OpenAI-shaped error event and `[DONE]`, so no client waits on a reply that will never come."""
from __future__ import annotations

import json
from typing import AsyncIterator, Callable

from .asgi_bridge import Forwarded, Head

RETRY_STATUSES = (429, 503)
JSON = [("content-type", "application/json")]


def error_body(status: int, message: str, code: str) -> bytes:
    kind = "rate_limit_error" if status == 429 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


async def forward(open_stream: Callable[[Forwarded, frozenset], AsyncIterator[object]], req: Forwarded,
                  attempts: int, is_lost: Callable[[BaseException], bool]) -> tuple[Head, Reply]:
    """(Head, body) of the first replica that answered, after up to `attempts` tries."""
    avoid: set[str] = set()
    why = "no replica answered"
    for attempt in range(attempts):
        stream = open_stream(req, frozenset(avoid)).__aiter__()
        replica = ""
        try:
            replica = await stream.__anext__()
            head = await stream.__anext__()
        except StopAsyncIteration:
            why = f"replica {replica or '?'} ended its answer before it began"
            await _close(stream)
            continue
        except Exception as e:  # noqa: BLE001 - only a lost replica is retried; anything else is a bug to raise
            await _close(stream)
            if not is_lost(e):
                raise
            why = f"replica {replica or '?'} was lost ({type(e).__name__})"
            if replica:
                avoid.add(replica)
            continue
        if head.status in RETRY_STATUSES and attempt + 1 < attempts:
            await _close(stream)
            avoid.add(replica)
            why = f"replica {replica} answered {head.status}"
            continue
        return head, Reply(_body(stream, head, replica, is_lost), stream)
    return Head(503, JSON), Reply(_once(error_body(503, f"no replica could serve this request: {why}", "no_replica")))


class Reply:
    """The body's chunks (async-iterable, once). aclose() closes the replica's stream too, even when the body was
    never iterated (a response cancelled before its first chunk): the replica then sees its client leave."""

    def __init__(self, chunks: AsyncIterator[bytes], stream=None):
        self._chunks, self._stream = chunks, stream

    def __aiter__(self):
        return self._chunks

    async def aclose(self) -> None:
        await _close(self._chunks)
        if self._stream is not None:
            await _close(self._stream)


async def _body(stream, head: Head, replica: str, is_lost) -> AsyncIterator[bytes]:
    streamed = any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in head.headers)
    try:
        async for chunk in stream:
            yield chunk
    except Exception as e:  # noqa: BLE001
        if not is_lost(e):
            raise
        if streamed:  # the client reads events: end its stream with an error it can show, then [DONE]
            body = json.loads(error_body(503, f"replica {replica} was lost mid-reply ({type(e).__name__}); "
                                              "the reply is incomplete", "replica_lost"))
            yield f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    finally:
        await _close(stream)


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _close(stream) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing a stream of a dead replica may raise again: it is gone either way
            pass
