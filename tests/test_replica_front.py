"""The pieces of `serve --replicas` that need no Ray: the router's ranking by free KV, the front's retries on a
refusal or a lost replica, and a request run through the ASGI bridge (with the hang-up it must pass on)."""
import asyncio
import json
import random

import pytest

from pyinfer.serve.asgi_bridge import Forwarded, Head, call_asgi
from pyinfer.serve.kv_router import KvLedger, request_cost
from pyinfer.serve.replica_front import forward

REQ = Forwarded("POST", "/v1/completions", "", [("content-type", "application/json")], b"{}")
SSE = [("content-type", "text/event-stream")]


class Lost(Exception):
    """Stands in for ray.exceptions.ActorDiedError."""


def is_lost(e):
    return isinstance(e, Lost)


def run(coro):
    return asyncio.run(coro)


async def body_of(chunks) -> bytes:
    return b"".join([c async for c in chunks])


def answer(open_stream, attempts=3):
    """(Head, whole body) in one event loop (a second asyncio.run would find the stream already closed)."""
    async def main():
        head, chunks = await forward(open_stream, REQ, attempts, is_lost)
        return head, await body_of(chunks)
    return run(main())


def replicas(*plans):
    """open_stream over stand-in replicas: each plan is (id, status, chunks) with Lost() for a death; the
    replicas are asked in order, and every call's `avoid` is recorded."""
    calls = []

    def open_stream(req, avoid):
        rid, status, chunks = plans[len(calls)]
        calls.append(avoid)

        async def gen():
            yield rid
            if status is Lost:
                raise Lost()
            yield Head(status, SSE if status == 200 else [("content-type", "application/json")], rid)
            for c in chunks:
                if isinstance(c, Lost):
                    raise c
                yield c
        return gen()

    return open_stream, calls


def test_a_refusal_goes_to_the_next_replica_with_the_first_avoided():
    open_stream, calls = replicas(("a", 429, [b'{"error":1}']), ("b", 200, [b"data: x\n\n", b"data: [DONE]\n\n"]))
    head, body = answer(open_stream)
    assert head.status == 200 and head.replica == "b"
    assert body == b"data: x\n\ndata: [DONE]\n\n"
    assert calls == [frozenset(), frozenset({"a"})]


def test_when_every_replica_refuses_the_last_refusal_is_passed_on():
    open_stream, calls = replicas(("a", 429, [b"1"]), ("b", 503, [b"2"]), ("a", 429, [b"3"]))
    head, body = answer(open_stream)
    assert head.status == 429 and body == b"3"
    assert calls[-1] == frozenset({"a", "b"})


def test_a_replica_lost_before_answering_is_retried_and_one_lost_every_time_is_a_503():
    open_stream, calls = replicas(("a", Lost, []), ("b", 200, [b"ok"]))
    head, body = answer(open_stream)
    assert head.status == 200 and body == b"ok" and calls[1] == frozenset({"a"})

    open_stream, _ = replicas(("a", Lost, []), ("b", Lost, []))
    head, body = answer(open_stream, 2)
    body = json.loads(body)
    assert head.status == 503 and body["error"]["code"] == "no_replica" and "lost" in body["error"]["message"]


def test_a_stream_whose_replica_dies_ends_with_an_error_event_and_done():
    open_stream, _ = replicas(("a", 200, [b"data: {}\n\n", Lost()]))
    head, body = answer(open_stream)
    assert head.status == 200
    text = body.decode()
    assert text.startswith("data: {}\n\n") and text.endswith("data: [DONE]\n\n")
    event = json.loads(text.split("data: ")[2])
    assert event["error"]["code"] == "replica_lost"


def test_an_error_that_is_not_a_lost_replica_is_raised():
    def open_stream(req, avoid):
        async def gen():
            raise ValueError("a bug")
            yield
        return gen()

    with pytest.raises(ValueError):
        run(forward(open_stream, REQ, 3, is_lost))


def test_the_ledger_ranks_by_free_kv_and_spreads_a_burst():
    ledger = KvLedger()
    ledger.observe("a", {"report": 1, "kv_budget_tokens": 1024, "kv_committed_tokens": 100})
    ledger.observe("b", {"report": 1, "kv_budget_tokens": 1024, "kv_committed_tokens": 300})
    assert ledger.rank(["a", "b"]) == ["a", "b"]
    assert ledger.rank(["a", "b"], avoid=frozenset({"a"})) == ["b", "a"]
    ledger.sent("a", 250)  # sent since a's last report: a now has less free than b
    assert ledger.rank(["a", "b"]) == ["b", "a"]
    ledger.observe("a", {"report": 1, "kv_budget_tokens": 1024, "kv_committed_tokens": 100})  # same report: kept
    assert ledger.rank(["a", "b"]) == ["b", "a"]
    ledger.observe("a", {"report": 2, "kv_budget_tokens": 1024, "kv_committed_tokens": 120})  # a new one: reset
    assert ledger.rank(["a", "b"]) == ["a", "b"]
    # A replica with no report yet takes work first; a dead one goes last; forget drops the departed.
    ledger.observe("c", {"report": 1, "kv_budget_tokens": 4096, "kv_committed_tokens": 0, "alive": False})
    assert ledger.rank(["a", "b", "c", "new"], rng=random.Random(0)) == ["new", "a", "b", "c"]
    ledger.forget({"a"})
    assert set(ledger.loads) == {"a"}
    # A burst of equal requests alternates between two equal replicas rather than piling on one.
    ledger = KvLedger()
    for r in "ab":
        ledger.observe(r, {"report": 1, "kv_budget_tokens": 2048, "kv_committed_tokens": 0})
    picks = []
    for _ in range(8):
        best = ledger.rank(["a", "b"])[0]
        ledger.sent(best, request_cost(40, 64))
        picks.append(best)
    assert picks.count("a") == picks.count("b") == 4


async def echo_app(scope, receive, send):
    """An ASGI app that streams until its client hangs up, and says whether it saw the hang-up."""
    msg = await receive()
    assert msg["type"] == "http.request" and msg["body"] == b"{}"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["path"].encode(), "more_body": True})
    watch = asyncio.ensure_future(receive())
    while not watch.done():
        await send({"type": "http.response.body", "body": b".", "more_body": True})
        await asyncio.sleep(0.01)
    echo_app.saw = watch.result()["type"]


def test_the_bridge_passes_a_consumer_that_left_on_as_a_hang_up():
    async def main():
        echo_app.saw = None
        parts = []
        gen = call_asgi(echo_app, REQ, "r1")
        async for part in gen:
            parts.append(part)
            if len(parts) == 4:
                break
        await gen.aclose()
        return parts

    parts = run(main())
    assert parts[0] == Head(200, [("content-type", "text/plain")], "r1")
    assert parts[1] == b"/v1/completions" and parts[2] == b"."
    assert echo_app.saw == "http.disconnect"


def test_the_bridge_runs_the_real_app_whole(tiny_model_path):
    pytest.importorskip("fastapi")
    from pyinfer.serve.server import build_server

    app, loop, _ = build_server(tiny_model_path, kv_budget=256, n_threads=1, api_key="k")
    loop.start()
    try:
        async def ask(headers, body):
            req = Forwarded("POST", "/v1/completions", "", headers, json.dumps(body).encode())
            parts = [p async for p in call_asgi(app, req)]
            return parts[0], json.loads(b"".join(parts[1:]))

        head, body = run(ask([("authorization", "Bearer k"), ("content-type", "application/json")],
                             {"prompt": "hello", "max_tokens": 3, "temperature": 0}))
        assert head.status == 200 and body["usage"]["completion_tokens"] >= 1
        head, body = run(ask([], {"prompt": "hello"}))
        assert head.status == 401 and body["error"]["code"] == "invalid_api_key"
    finally:
        loop.stop()
