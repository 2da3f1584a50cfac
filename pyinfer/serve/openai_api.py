"""OpenAI-compatible HTTP API (FastAPI on uvicorn) over the EngineLoop.

/v1/completions and /v1/chat/completions (streamed as server-sent events, or whole), /v1/models,
/health, and /metrics in Prometheus text. Errors are OpenAI-shaped JSON with the matching status.
A client that disconnects cancels its request, which frees its KV blocks at once."""
# No `from __future__ import annotations` here: FastAPI reads the handlers' Request annotations at runtime.

import asyncio
import json
import time
import uuid
from typing import Optional

from ..model.tokenizer import IncrementalDecoder
from ..runtime.sampling import SamplingParams
from ..runtime.stops import StopMatcher
from .engine_loop import EngineLoop, ServeRequest


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _int(body: dict, key: str, default: int, lo: int, hi: int) -> int:
    v = body.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise APIError(400, f"'{key}' must be an integer in [{lo}, {hi}]", param=key)
    return v


def _float(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise APIError(400, f"'{key}' must be a number in [{lo}, {hi}]", param=key)
    return float(v)


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or len(s) > 4 or not all(isinstance(x, str) and x for x in s):
        raise APIError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    return s


def create_app(model, loop: EngineLoop, model_name: str, api_key: str | None = None):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

    app = FastAPI(title="pyinfer", docs_url=None, redoc_url=None)
    tk = model.tokenizer

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(json.JSONDecodeError)
    async def _bad_json(_, e):
        return JSONResponse(APIError(400, "request body is not valid JSON").body(), status_code=400)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key", "authentication_error", code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        authorize(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise APIError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        if body.get("model") not in (None, model_name):
            raise APIError(404, f"model '{body.get('model')}' does not exist (this server has '{model_name}')",
                           param="model", code="model_not_found")
        if body.get("n", 1) != 1:
            raise APIError(400, "only n = 1 is supported", param="n")
        return body

    def sampling(body: dict) -> tuple[SamplingParams, int]:
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise APIError(400, "'seed' must be an integer", param="seed")
        params = SamplingParams(_float(body, "temperature", 1.0, 0.0, 2.0), _int(body, "top_k", 40, 0, 1 << 20),
                                _float(body, "top_p", 1.0, 0.0, 1.0), seed)
        return params, _int(body, "max_tokens", 16, 1, 1 << 20)

    async def generate(request: Request, body: dict, prompt_ids: list[int], chat: bool):
        params, max_tokens = sampling(body)
        lower = body.get("pyinfer_min_output_tokens")
        if lower is not None and (isinstance(lower, bool) or not isinstance(lower, int) or lower < 1):
            raise APIError(400, "'pyinfer_min_output_tokens' must be a positive integer",
                           param="pyinfer_min_output_tokens")
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="messages" if chat else "prompt")
        why = loop.check(len(prompt_ids), max_tokens)
        if why:
            raise APIError(400, why, param="max_tokens", code="context_length_exceeded")
        stops = _stops(body)
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

        if body.get("stream"):
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
        body = await read_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise APIError(400, "'prompt' must be a string", param="prompt")
        return await generate(request, body, model.tokenize(prompt), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_body(request)
        msgs = body.get("messages")
        if (not isinstance(msgs, list) or not msgs or
                not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                        for m in msgs)):
            raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", param="messages")
        ids = model.tokenize(model.render_chat(msgs), add_bos=False, special=True)
        if tk.add_bos and tk.bos_id is not None and ids[:1] != [tk.bos_id]:
            ids = [tk.bos_id] + ids
        return await generate(request, body, ids, chat=True)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pyinfer"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok" if loop.thread.is_alive() else "engine stopped"}

    @app.get("/metrics")
    async def metrics():
        m = loop.metrics()
        lines = []
        for key, kind, help_ in (
                ("waiting", "gauge", "requests waiting to be scheduled (queue depth)"),
                ("running", "gauge", "requests in the running batch"),
                ("kv_used_tokens", "gauge", "KV cache tokens reserved"),
                ("kv_budget_tokens", "gauge", "KV cache budget in tokens"),
                ("kv_peak_tokens", "gauge", "highest KV reservation seen"),
                ("tokens_per_second", "gauge", "generated tokens per second over the last 10 s"),
                ("requests_total", "counter", "requests accepted"),
                ("finished_total", "counter", "requests completed"),
                ("cancelled_total", "counter", "requests cancelled (client gone or stop string)"),
                ("evictions_total", "counter", "running requests evicted by the scheduler"),
                ("tokens_generated_total", "counter", "tokens sent to clients"),
                ("steps_total", "counter", "engine steps")):
            name = f"pyinfer_{key}"
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {m[key]}"]
        lines.append(f'pyinfer_scheduler_info{{policy="{loop.policy_name}"}} 1')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    return app
