"""OpenAI-compatible HTTP API (FastAPI on uvicorn) over the EngineLoop.

/v1/completions and /v1/chat/completions (streamed as server-sent events, or whole), /v1/models,
/health, and /metrics in Prometheus text. Errors are OpenAI-shaped JSON with the matching status.
A client that disconnects cancels its request, which frees its KV blocks at once."""
# No `from __future__ import annotations` here: FastAPI reads the handlers' Request annotations at runtime.

import asyncio
import hmac
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from ..model.tokenizer import IncrementalDecoder
from ..runtime.sampling import SamplingParams
from ..runtime.stops import StopMatcher
from .api_models import APIError, ChatRequest, CompletionRequest, parse
from .engine_loop import EngineLoop, ServeRequest
from .metrics import make_registry


def create_app(model, loop: EngineLoop, model_name: str, api_key: Optional[str] = None):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    app = FastAPI(title="pyinfer", docs_url=None, redoc_url=None)
    tk = model.tokenizer

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def _internal(_, e: Exception):  # never a bare 500 page: an OpenAI-shaped body
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}", "server_error").body(), status_code=500)

    @app.exception_handler(json.JSONDecodeError)
    async def _bad_json(_, e):
        return JSONResponse(APIError(400, "request body is not valid JSON").body(), status_code=400)

    registry = make_registry(loop)
    # Tokenizing runs off the event loop, on one thread: its allocator arena is reused request after request
    # (a pool of threads would each keep the high-water mark of the largest prompt it saw).
    tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyinfer-tokenize")
    # No token is longer than this many bytes, so a prompt of B bytes has at least B / longest tokens: a
    # prompt that cannot fit is refused before it is tokenized.
    longest_token = tk.max_token_bytes()

    def refuse_oversized(text: str, req) -> None:
        at_least = len(text.encode("utf-8", "replace")) // max(1, longest_token)
        _, max_tokens = sampling(req)
        why = loop.check(at_least, max_tokens, at_least=True)
        if why:
            raise APIError(400, why, param="max_tokens", code="context_length_exceeded")

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(tokenize_pool, fn, *args)
    expected_auth = f"Bearer {api_key}".encode() if api_key is not None else None

    def authorize(request: Request) -> None:
        if expected_auth is None:
            return
        # Constant time: how long the comparison takes says nothing about how much of the key matched.
        if not hmac.compare_digest(request.headers.get("authorization", "").encode(), expected_auth):
            raise APIError(401, "invalid or missing API key", "authentication_error", code="invalid_api_key")

    async def read_body(request: Request, kind):
        authorize(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise APIError(400, "request body is not valid JSON") from None
        req = parse(kind, body)
        if req.model not in (None, model_name):
            raise APIError(404, f"model '{req.model}' does not exist (this server has '{model_name}')",
                           param="model", code="model_not_found")
        return req

    def sampling(req) -> tuple[SamplingParams, int]:
        params = SamplingParams(1.0 if req.temperature is None else float(req.temperature),
                                40 if req.top_k is None else req.top_k,
                                1.0 if req.top_p is None else float(req.top_p), req.seed)
        max_tokens = req.max_tokens or getattr(req, "max_completion_tokens", None) or 16
        return params, max_tokens

    async def generate(request: Request, body, prompt_ids: list[int], chat: bool):
        params, max_tokens = sampling(body)
        lower = body.pyinfer_min_output_tokens
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="messages" if chat else "prompt")
        why = loop.check(len(prompt_ids), max_tokens)
        if why:
            raise APIError(400, why, param="max_tokens", code="context_length_exceeded")
        stops = body.stops()
        aio = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        def emit(kind, payload):  # called from the engine thread
            try:
                aio.call_soon_threadsafe(events.put_nowait, (kind, payload))
            except RuntimeError:  # event loop gone (shutdown): nobody is listening
                pass

        req = ServeRequest(prompt_ids, max_tokens, params, emit, lower)
        rid = loop.submit(req)
        decoder, matcher = IncrementalDecoder(tk), StopMatcher(stops)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())

        async def pieces():
            """(text, finish_reason or None); cancels the request if abandoned."""
            done = False
            try:
                while True:
                    kind, payload = await events.get()
                    if kind == "token":
                        text, stopped = matcher.push(decoder.push(payload))
                        if stopped:
                            loop.stop_request(rid)
                            done = True
                            yield text, "stop"
                            return
                        if text:
                            yield text, None
                    elif kind == "done":
                        done = True
                        yield matcher.flush(), payload
                        return
                    else:
                        done = True
                        raise APIError(500, str(payload), "server_error")
            finally:
                if not done:
                    loop.cancel(rid)

        def chunk(text, finish):
            if chat:
                return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_name,
                        "choices": [{"index": 0, "delta": {"content": text} if text else {},
                                     "finish_reason": finish}]}
            return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}

        if body.stream:
            async def sse():
                if chat:
                    first = chunk("", None)
                    first["choices"][0]["delta"] = {"role": "assistant"}
                    yield f"data: {json.dumps(first)}\n\n"
                try:
                    async for text, finish in pieces():
                        yield f"data: {json.dumps(chunk(text, finish))}\n\n"
                except APIError as e:
                    yield f"data: {json.dumps(e.body())}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")

        parts, finish = [], None
        gen = pieces()
        try:
            while True:
                nxt = asyncio.ensure_future(gen.__anext__())
                while not nxt.done():  # a client that hangs up cancels its request
                    await asyncio.wait([nxt], timeout=0.5)
                    if not nxt.done() and await request.is_disconnected():
                        nxt.cancel()
                        loop.cancel(rid)
                        return JSONResponse({}, status_code=499)
                try:
                    text, f = nxt.result()
                except StopAsyncIteration:
                    break
                parts.append(text)
                finish = f or finish
        finally:
            await gen.aclose()
        text = "".join(parts)
        n_out = len(req.emitted)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out, "total_tokens": len(prompt_ids) + n_out}
        if chat:
            return {"id": ident, "object": "chat.completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish}], "usage": usage}
        return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], "usage": usage}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request, CompletionRequest)
        text = body.text()
        refuse_oversized(text, body)
        ids = await off_loop(model.tokenize, text)  # a long prompt must not stall the event loop
        return await generate(request, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(request, ChatRequest)

        def render() -> list[int]:
            from jinja2 import TemplateError

            try:
                text = model.render_chat([m.as_dict() for m in body.messages])
            except TemplateError as e:  # the model's own template refused these messages (roles, order)
                raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from None
            ids = model.tokenize(text, add_bos=False, special=True)
            return [tk.bos_id] + ids if tk.add_bos and tk.bos_id is not None and ids[:1] != [tk.bos_id] else ids

        refuse_oversized("".join(m.as_dict()["content"] for m in body.messages), body)
        return await generate(request, body, await off_loop(render), chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pyinfer"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok" if loop.thread.is_alive() else "engine stopped"}

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
