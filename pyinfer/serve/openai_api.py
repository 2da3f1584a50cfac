"""OpenAI-compatible HTTP API (FastAPI on uvicorn) over the EngineLoop.

/v1/completions and /v1/chat/completions (streamed as server-sent events, or whole), /v1/models, /health,
/metrics in Prometheus text, and the chat page at / (`webui`). Errors are OpenAI-shaped JSON with the matching status, 404 and 405
included. Every request field is checked here (api_models, then the sampler is built), so a bad value is a 400
naming it and never reaches the engine thread. Past `max_concurrent` requests in flight a new one gets a 429. A
client that hangs up, streaming or not, cancels its request at once, which frees its KV blocks."""
# No `from __future__ import annotations` here: FastAPI reads the handlers' Request annotations at runtime.

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from ..errors import PyinferError
from ..model.tokenizer import IncrementalDecoder
from ..runtime.sampling import Sampler, SamplingParams
from ..runtime.stops import StopMatcher
from .api_models import APIError, ChatRequest, CompletionRequest, parse
from .engine_loop import EngineLoop, EngineStopped, ServeRequest
from .grammar import GrammarError, Grammars
from .logprobs import chat_logprobs, completion_logprobs, prompt_entries
from .http_limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONCURRENT, UNAUTHORIZED, BodyLimit, authorized
from .metrics import make_registry
from .structured import OutputPlan, plan_output, template_input
from .tool_parser import ToolCallParser
from .webui import HEADERS as WEBUI_HEADERS
from .webui import load_files as webui_files


def create_app(model, loop: EngineLoop, model_name: str, api_key: Optional[str] = None,
               max_concurrent: int = DEFAULT_MAX_CONCURRENT, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               webui: bool = True):
    """The app; `webui`: serve the chat page at / (and its files under /webui/)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.exceptions import HTTPException

    class CancellingStream(StreamingResponse):
        """A streamed response that calls `on_end` when it ends, however it ends: Starlette cancels a stream whose
        client left before its first chunk without ever starting the generator, so the generator's own cleanup
        cannot be the only one."""

        def __init__(self, content, on_end, **kwargs):
            super().__init__(content, **kwargs)
            self.on_end = on_end

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.on_end()

    app = FastAPI(title="pyinfer", docs_url=None, redoc_url=None, openapi_url=None)
    tk = model.tokenizer
    grammars = Grammars(tk, model.config.vocab_size, loop.eos_ids)  # structured outputs and tool calls

    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):  # 404 for an unknown path, 405 for a wrong method
        why = {404: f"no such endpoint: {request.url.path}", 405: f"method {request.method} is not allowed here"}
        return JSONResponse(APIError(e.status_code, why.get(e.status_code, str(e.detail))).body(),
                            status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(_, e: Exception):  # never a bare 500 page: an OpenAI-shaped body
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}", "server_error").body(), status_code=500)

    registry = make_registry(loop)
    # Tokenizing runs off the event loop, on one thread: its allocator arena is reused request after request
    # (a pool of threads would each keep the high-water mark of the largest prompt it saw).
    tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyinfer-tokenize")
    loop.on_stop(lambda: tokenize_pool.shutdown(wait=False, cancel_futures=True))
    # No token is longer than this many bytes, so a prompt of B bytes has at least B / longest tokens: a
    # prompt that cannot fit is refused before it is tokenized.
    longest_token = tk.max_token_bytes()
    preparing = 0  # requests between arrival and submit (tokenizing); the engine counts the rest

    def refuse_oversized(n_bytes: int, max_tokens: int) -> None:
        at_least = n_bytes // max(1, longest_token)
        why = loop.check(at_least, max_tokens, at_least=True)
        if why:
            raise APIError(400, why, param="max_tokens", code="context_length_exceeded")

    async def off_loop(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(tokenize_pool, fn, *args)
    def authorize(request: Request) -> None:
        if not authorized(api_key, request.headers.get("authorization", "").encode()):
            raise APIError(401, UNAUTHORIZED, "authentication_error", code="invalid_api_key")

    def refuse_if_unavailable() -> None:
        if not loop.alive:
            raise APIError(503, f"the engine is not running ({loop.failure or 'stopped'})", "server_error",
                           code="engine_stopped")
        if loop.in_flight() + preparing >= max_concurrent:
            raise APIError(429, f"this server is serving its limit of {max_concurrent} requests; retry later "
                                "(--max-concurrent-requests)", "rate_limit_error", code="rate_limit_exceeded")

    async def read_body(request: Request, kind):
        authorize(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, an integer of 4,300+ digits
            raise APIError(400, "request body is not valid JSON") from None
        req = parse(kind, body)
        if req.model not in (None, model_name):
            raise APIError(404, f"model '{req.model}' does not exist (this server has '{model_name}')",
                           param="model", code="model_not_found")
        return req

    def sampler_of(req) -> tuple[Sampler, int]:
        """The request's sampler (its values checked once more by the sampler itself) and max_tokens."""
        params = SamplingParams(1.0 if req.temperature is None else float(req.temperature),
                                40 if req.top_k is None else req.top_k,
                                1.0 if req.top_p is None else float(req.top_p), req.seed,
                                float(req.presence_penalty or 0.0), float(req.frequency_penalty or 0.0))
        try:
            sampler = Sampler(params)
        except PyinferError as e:
            raise APIError(400, str(e)) from None
        return sampler, req.max_tokens or getattr(req, "max_completion_tokens", None) or 16

    async def disconnected(request: Request) -> None:
        """Returns when the client hangs up (its body is read, so the next message is the disconnect)."""
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    async def prepared(request: Request, body, n_bytes: int, tokenize, plan: OutputPlan):
        """(sampler, max_tokens, prompt ids, grammar state or None) once the request passed every check: tokenized
        and its grammar compiled (or found compiled) off the loop."""
        nonlocal preparing
        refuse_if_unavailable()
        sampler, max_tokens = sampler_of(body)
        refuse_oversized(n_bytes, max_tokens)

        def work():
            ids = tokenize()
            try:
                return ids, grammars.constraint(plan.grammar, plan.param) if plan.grammar else None
            except GrammarError as e:
                raise APIError(400, str(e), param=e.param) from None

        preparing += 1
        try:
            ids, constraint = await off_loop(work)
        finally:
            preparing -= 1
        return sampler, max_tokens, ids, constraint

    async def generate(request: Request, body, sampler: Sampler, max_tokens: int, prompt_ids: list[int], chat: bool,
                       prompt_text: str = "", constraint=None, plan: OutputPlan = OutputPlan()):
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

        alternatives = body.logprob_alternatives()  # None: no log-probabilities
        echo = not chat and bool(getattr(body, "echo", False))  # completions: the prompt first, scored with logprobs
        req = ServeRequest(prompt_ids, max_tokens, sampler, emit, body.pyinfer_min_output_tokens,
                           logprobs=alternatives, echo=echo, constraint=constraint)
        try:
            rid = loop.submit(req)
        except EngineStopped as e:
            raise APIError(503, str(e), "server_error", code="engine_stopped") from None
        # With tools the answer is read for calls, whose markers may be special tokens: decoded as text.
        parser = ToolCallParser(plan.tool_format, list(plan.tool_names), plan.auto) if plan.tool_names else None
        decoder, matcher = IncrementalDecoder(tk, skip_special=parser is None), StopMatcher(stops)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())

        scored = {"prompt": [], "pending": [], "all": []}  # log-probability entries: echo's, not yet sent, all

        def on_event(kind, payload):
            """(text, finish reason or None, whether the request is over) for one engine event."""
            if kind == "logprob":
                scored["pending"].append(payload)
                scored["all"].append(payload)
                return "", None, False
            if kind == "prompt_logprobs":
                scored["prompt"] = prompt_entries(prompt_ids, payload, alternatives)
                return "", None, False
            if kind == "token":
                text, stopped = matcher.push(decoder.push(payload))
                if stopped:
                    loop.stop_request(rid)
                    return text, "stop", True
                return text, None, False
            if kind == "done":
                return matcher.flush(), payload, True
            raise APIError(500, str(payload), "server_error")

        offset = {"chars": len(prompt_text) if echo else 0}  # text_offset of the next token sent (completions)

        def sent_logprobs(entries):
            """The logprobs field of a chunk or a response that carries `entries` (None without logprobs)."""
            if alternatives is None:
                return None
            if chat:
                return chat_logprobs(tk, entries)
            out = completion_logprobs(tk, entries, offset["chars"])
            offset["chars"] += sum(len(t) for t in out["tokens"])
            return out

        def finish_reason(finish):
            # a call cut short (max_tokens, a stop string) is not a finished tool call
            return "tool_calls" if finish == "stop" and parser is not None and parser.calls_complete else finish

        def chat_deltas(text: str, over: bool) -> list[dict]:
            """The chat deltas that new text makes: content, or with tools the parser's pieces as OpenAI streams
            them (a call's id and name first, then its arguments in fragments)."""
            if parser is None:
                return [{"content": text}] if text else []
            out = []
            for d in parser.push(text) + (parser.finish() if over else []):
                if d[0] == "content":
                    out.append({"content": d[1]})
                elif d[0] == "call":
                    call = parser.result.calls[d[1]]
                    out.append({"tool_calls": [{"index": d[1], "id": call.id, "type": "function",
                                                "function": {"name": call.name, "arguments": ""}}]})
                else:
                    out.append({"tool_calls": [{"index": d[1], "function": {"arguments": d[2]}}]})
            return out

        def chunk(text, finish, entries=(), delta=None):
            logprobs = sent_logprobs(list(entries)) if entries else None
            if chat:
                if delta is None:
                    delta = {"content": text} if text else {}
                return {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model_name,
                        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish_reason(finish)}]}
            return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

        if body.stream:
            state = {"over": False}

            async def sse():
                try:
                    if chat:
                        first = chunk("", None)
                        first["choices"][0]["delta"] = {"role": "assistant"}
                        yield f"data: {json.dumps(first)}\n\n"
                    elif echo and alternatives is None:  # the prompt first (scored, it waits for its scores)
                        yield f"data: {json.dumps(chunk(prompt_text, None))}\n\n"
                    while not state["over"]:
                        try:
                            kind, payload = await events.get()
                            text, finish, state["over"] = on_event(kind, payload)
                        except APIError as e:
                            state["over"] = True
                            yield f"data: {json.dumps(e.body())}\n\n"
                            break
                        if kind == "prompt_logprobs":
                            offset["chars"] = 0
                            yield f"data: {json.dumps(chunk(prompt_text, None, scored['prompt']))}\n\n"
                        elif chat and parser is not None:
                            deltas = chat_deltas(text, state["over"])
                            if not deltas and (finish or (kind == "token" and scored["pending"])):
                                deltas = [{}]  # the finish reason, or log-probabilities, on a chunk of their own
                            for k, delta in enumerate(deltas):
                                piece = chunk("", finish if k == len(deltas) - 1 else None,
                                              scored["pending"] if k == 0 else (), delta)
                                yield f"data: {json.dumps(piece)}\n\n"
                            scored["pending"].clear()
                        elif text or finish or (kind == "token" and scored["pending"]):
                            yield f"data: {json.dumps(chunk(text, finish, scored['pending']))}\n\n"
                            scored["pending"].clear()
                    yield "data: [DONE]\n\n"
                finally:
                    if not state["over"]:
                        loop.cancel(rid)

            def abandoned() -> None:  # the response ended, however: a client gone before the first chunk too
                if not state["over"]:
                    loop.cancel(rid)

            return CancellingStream(sse(), abandoned, media_type="text/event-stream")

        parts, finish, over, nxt = [], None, False, None
        hangup = asyncio.ensure_future(disconnected(request))
        try:
            while not over:
                nxt = asyncio.ensure_future(events.get())
                await asyncio.wait({nxt, hangup}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():  # the client hung up: stop generating now, nobody reads the answer
                    nxt.cancel()
                    loop.cancel(rid)
                    over = True
                    return Response(status_code=499)
                text, f, over = on_event(*nxt.result())
                parts.append(text)
                finish = f or finish
        finally:
            hangup.cancel()
            if nxt is not None:
                nxt.cancel()
            if not over:
                loop.cancel(rid)
        text = "".join(parts)
        n_out = len(req.emitted)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out, "total_tokens": len(prompt_ids) + n_out}
        if chat:
            message = {"role": "assistant", "content": text}
            if parser is not None:
                chat_deltas(text, True)
                content = "".join(parser.result.content).strip()
                message = {"role": "assistant", "content": content or None}
                if parser.result.calls:
                    message["tool_calls"] = [c.as_dict() for c in parser.result.calls]
            return {"id": ident, "object": "chat.completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "message": message, "logprobs": sent_logprobs(scored["all"]),
                                 "finish_reason": finish_reason(finish)}], "usage": usage}
        if echo:
            offset["chars"] = 0
        return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"index": 0, "text": (prompt_text if echo else "") + text,
                             "logprobs": sent_logprobs(scored["prompt"] + scored["all"]), "finish_reason": finish}],
                "usage": usage}

    async def completions(request: Request):
        body = await read_body(request, CompletionRequest)
        text = body.text()
        plan = plan_output(body, grammars, None)
        sampler, max_tokens, ids, constraint = await prepared(request, body, len(text.encode("utf-8", "replace")),
                                                              lambda: model.tokenize(text), plan)
        return await generate(request, body, sampler, max_tokens, ids, chat=False, prompt_text=text,
                              constraint=constraint, plan=plan)

    async def chat_completions(request: Request):
        body = await read_body(request, ChatRequest)
        plan = plan_output(body, grammars, model.chat_template)
        messages, tools = template_input(plan, [m.as_dict() for m in body.messages])

        def chat_ids() -> list[int]:
            # A tool's name, description or schema is rendered as the template's own text: control-token text
            # there would become control tokens (messages' content is guarded by encode_chat).
            calls = [m["tool_calls"] for m in messages if m.get("tool_calls")]
            if (tools or calls) and tk.has_control_text(json.dumps([tools, calls], ensure_ascii=False)):
                raise APIError(400, "'tools' or a message's 'tool_calls' holds a special token's text",
                               param="tools" if tools else "messages")
            try:
                return model.chat_ids(messages, tools=tools)
            except PyinferError as e:  # the template refused these messages (roles, order) or went past its bounds
                raise APIError(400, str(e), param="messages") from None

        n_bytes = sum(len(m["role"].encode("utf-8", "replace")) + len(m["content"].encode("utf-8", "replace"))
                      for m in messages)
        sampler, max_tokens, ids, constraint = await prepared(request, body, n_bytes, chat_ids, plan)
        return await generate(request, body, sampler, max_tokens, ids, chat=True, constraint=constraint, plan=plan)

    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pyinfer"}]}

    async def health(request: Request):
        if loop.alive:
            return {"status": "ok"}
        return JSONResponse({"status": "engine stopped", "reason": loop.failure or "stopped"}, status_code=503)

    async def metrics(request: Request):
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    page_files = webui_files() if webui else {}

    async def page(request: Request):
        name = request.path_params.get("name", "index.html")
        if name not in page_files:
            raise HTTPException(404)
        content, media_type = page_files[name]
        return Response(content, media_type=media_type, headers=WEBUI_HEADERS)

    # FastAPI keeps every endpoint function it has seen in a module-level cache (4,096 entries): endpoints that
    # closed over the model would keep each app's model alive long after the app (tests and the fuzzer build
    # hundreds). So the routes are thin and find this app's handlers on app.state.
    app.state.pyinfer_handlers = {"completions": completions, "chat": chat_completions, "models": models,
                                  "health": health, "metrics": metrics, "page": page}
    routes = [("GET", "/", "page"), ("GET", "/webui/{name}", "page")] if webui else []
    for method, path, name in routes + [("POST", "/v1/completions", "completions"),
                                        ("POST", "/v1/chat/completions", "chat"), ("GET", "/v1/models", "models"),
                                        ("GET", "/health", "health"), ("GET", "/metrics", "metrics")]:
        app.add_api_route(path, _route(name, Request), methods=[method])
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, api_key=api_key)
    return app


def _route(name: str, request_type):
    """An endpoint that holds nothing but the handler's name (see the end of create_app)."""
    async def endpoint(request: request_type):
        return await request.app.state.pyinfer_handlers[name](request)

    endpoint.__name__ = name
    return endpoint
