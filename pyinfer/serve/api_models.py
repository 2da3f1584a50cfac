"""Request bodies of the OpenAI-compatible API as pydantic models, and the OpenAI-shaped error.

Types are strict (a string "16" is not a max_tokens) and every number is bounded, so a bad value is a 400 that
names its field before anything runs. Unknown fields are accepted and ignored, as OpenAI clients send fields
this server has no use for (user, metadata, ...); the known ones it cannot honour (best_of, suffix, logit_bias, the
legacy functions and function_call, tools on the completions API) are refused unless they ask for nothing: a client
that asked for a change to the answer must not get another answer with a 200. Structured outputs
(`response_format`) and tool calls (`tools`, `tool_choice`, `parallel_tool_calls`) are typed here and honoured by
structured.py."""
from __future__ import annotations

import json
from typing import List, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      field_validator, model_validator)

from ..runtime.sampling import MAX_TOP_LOGPROBS, PENALTY_LIMIT, SEED_MAX

MAX_TOKENS_LIMIT = 1 << 20
MAX_MESSAGES = 1024        # a conversation longer than this is a client bug or an attack
MAX_STOP_CHARS = 256
MAX_TOOLS = 128            # OpenAI's own limit on a request's tools
# Other servers' extensions that change the answer: ignoring them would answer something else than was asked, so
# each is a 400 (with what to send instead, where there is something).
REFUSED_EXTENSIONS = {
    "guided_json": "send 'response_format': {'type': 'json_schema', ...}", "json_schema": "send 'response_format'",
    "guided_regex": "", "guided_choice": "send 'response_format' with an enum schema", "guided_grammar": "",
    "structured_outputs": "send 'response_format'", "grammar": "", "guided_decoding_backend": "",
    "min_p": "", "repetition_penalty": "send 'frequency_penalty'", "repeat_penalty": "send 'frequency_penalty'",
    "typical_p": "", "mirostat": "", "ignore_eos": "", "min_tokens": "", "use_beam_search": "", "n_probs": "",
}
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function's name
Number = Union[StrictInt, StrictFloat]


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
                 code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class JsonSchemaFormat(BaseModel):
    name: StrictStr = Field("response", max_length=64)
    description: Optional[StrictStr] = None
    schema_: Optional[dict] = Field(None, alias="schema")
    strict: Optional[StrictBool] = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None


class FunctionDef(BaseModel):
    name: StrictStr = Field(pattern=FUNCTION_NAME)
    description: Optional[StrictStr] = None
    parameters: Optional[dict] = None
    strict: Optional[StrictBool] = None

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, v):  # a call's arguments are a JSON object (OpenAI's rule; the parser reads objects)
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's parameters must be a JSON Schema of type 'object'")
        return v


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: StrictStr = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class CalledFunction(BaseModel):
    name: StrictStr = Field(max_length=64)
    arguments: StrictStr


class ToolCallIn(BaseModel):
    """A call the assistant made earlier in the conversation (sent back by the client with its result)."""
    id: Optional[StrictStr] = Field(None, max_length=64)
    type: Literal["function"] = "function"
    function: CalledFunction


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: Optional[Number] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOKENS_LIMIT)
    seed: Optional[StrictInt] = Field(None, ge=0, le=SEED_MAX)
    presence_penalty: Optional[Number] = Field(None, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT)
    frequency_penalty: Optional[Number] = Field(None, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT)
    stop: Optional[Union[StrictStr, List[StrictStr]]] = None
    stream: Optional[StrictBool] = False
    n: Optional[StrictInt] = Field(None, ge=1, le=1)
    logprobs: Optional[Union[StrictBool, StrictInt]] = None  # completions: how many alternatives; chat: on or off
    response_format: Optional[ResponseFormat] = None
    # Accepted only when they ask for nothing (see refuse_unsupported): each would change the answer, so a server
    # that ignored them would answer something else than was asked.
    logit_bias: Optional[dict] = None
    tools: Optional[list] = None
    tool_choice: Optional[Union[StrictStr, dict]] = None
    functions: Optional[list] = None
    function_call: Optional[Union[StrictStr, dict]] = None
    # Our extension: the client's lower bound on the output length (the l of A_min's interval [l, u]).
    pyinfer_min_output_tokens: Optional[StrictInt] = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_extensions(cls, body):
        for name, instead in REFUSED_EXTENSIONS.items():
            if isinstance(body, dict) and body.get(name) not in (None, False):
                raise APIError(400, f"'{name}' is not supported by this server" + (f"; {instead}" if instead else ""),
                               param=name)
        return body

    def stops(self) -> list[str]:
        s = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(s) > 4 or not all(s) or any(len(x) > MAX_STOP_CHARS for x in s):
            raise APIError(400, f"'stop' must be a string or a list of up to 4 non-empty strings of at most "
                                f"{MAX_STOP_CHARS} characters", param="stop")
        return s

    def refuse_unsupported(self) -> None:
        """A 400 for a field this server would otherwise silently ignore."""
        for name, nothing in self._unsupported():
            if getattr(self, name, None) not in nothing:
                raise APIError(400, f"'{name}' is not supported by this server", param=name)

    def _unsupported(self):
        return (("logit_bias", (None, {})), ("tools", (None, [])), ("tool_choice", (None, "none", "auto")),
                ("functions", (None, [])), ("function_call", (None, "none", "auto")))

    def logprob_alternatives(self) -> int | None:
        """None: no log-probabilities; else each token's and this many alternatives'."""
        raise NotImplementedError


class CompletionRequest(_Sampling):
    prompt: Union[StrictStr, List[StrictStr]]
    echo: Optional[StrictBool] = None
    best_of: Optional[StrictInt] = None
    suffix: Optional[StrictStr] = None

    def _unsupported(self):
        return super()._unsupported() + (("best_of", (None, 1)), ("suffix", (None, "")))

    def logprob_alternatives(self) -> int | None:
        """The legacy API's `logprobs`: an integer, the alternatives per token (0: the chosen token's alone)."""
        if self.logprobs is None:
            return None
        if isinstance(self.logprobs, bool) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"'logprobs' must be an integer in 0..{MAX_TOP_LOGPROBS}", param="logprobs")
        return self.logprobs

    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) == 1:
            return self.prompt[0]
        raise APIError(400, "'prompt' must be a string (batched prompts are not supported)", param="prompt")


class TextPart(BaseModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    role: StrictStr = Field(max_length=32)      # checked against the template's roles when rendered
    content: Optional[Union[StrictStr, List[TextPart]]] = None  # None: an assistant turn that only called tools
    tool_calls: Optional[List[ToolCallIn]] = Field(None, max_length=MAX_TOOLS)
    tool_call_id: Optional[StrictStr] = Field(None, max_length=64)
    name: Optional[StrictStr] = Field(None, max_length=64)

    def as_dict(self) -> dict:
        """The message as chat templates read it (Hugging Face's convention): a call's arguments as an object."""
        if self.content is None and not self.tool_calls:
            raise APIError(400, f"a '{self.role}' message needs 'content'", param="messages")
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        out = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id or f"call_{i}", "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for i, c in enumerate(self.tool_calls)]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _arguments(text: str):
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise APIError(400, "a tool call's 'arguments' must be a JSON object", param="messages")
    return value


class ChatRequest(_Sampling):
    messages: List[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[List[ToolDef]] = Field(None, max_length=MAX_TOOLS)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[StrictBool] = None

    def _unsupported(self):  # chat honours tools and tool_choice (structured.py)
        return tuple(u for u in super()._unsupported() if u[0] not in ("tools", "tool_choice"))

    def logprob_alternatives(self) -> int | None:
        """Chat's `logprobs` (true or false) and `top_logprobs` (alternatives, which need logprobs)."""
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            raise APIError(400, "'logprobs' must be true or false", param="logprobs")
        if not self.logprobs:
            if self.top_logprobs:
                raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
            return None
        return self.top_logprobs or 0


def parse(model: type[BaseModel], body) -> BaseModel:
    """A validated request, or a 400 APIError naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    msgs = body.get("messages")
    if isinstance(msgs, list) and len(msgs) > MAX_MESSAGES:  # before validating each of them
        raise APIError(400, f"'messages': at most {MAX_MESSAGES} messages", param="messages")
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err.get("loc", ())]
        param = loc[0] if loc else None
        where = ".".join(loc) or "body"
        raise APIError(400, f"'{where}': {err.get('msg', 'invalid value')}", param=param) from None
    req.refuse_unsupported()
    req.logprob_alternatives()  # its values checked now, before anything runs
    return req
