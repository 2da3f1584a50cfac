"""What a request asks of its answer's form, as one plan: the grammar that holds the answer (response_format, or
tools with tool_choice), the messages and tools the chat template renders, and how the answer is read back.

A request's fields were typed by api_models; here their meaning is checked (a named tool_choice must name a tool,
a JSON schema must be there), every failure a 400 naming its field. Compiling the grammar (grammar.py) is the
front end's next step, off the event loop."""
from __future__ import annotations

import json
from dataclasses import dataclass

from .api_models import APIError, NamedToolChoice
from .grammar import GrammarError, Grammars
from .tool_formats import ToolFormat, generic_system_text, tool_format, tools_grammar


@dataclass
class OutputPlan:
    grammar: str | None = None             # llguidance's grammar text (None: the answer is free)
    param: str | None = None               # the request field it came from
    tools: list[dict] | None = None        # the request's tools, as the template reads them
    tool_format: ToolFormat | None = None  # how the model writes calls
    tool_names: tuple[str, ...] = ()       # set: the answer is read for tool calls (tool_choice is not "none")
    auto: bool = False                     # tool_choice "auto": text, or calls in the format or its other forms
    parallel: bool = True


def plan_output(body, grammars: Grammars, template: str | None) -> OutputPlan:
    tools = [t.model_dump(exclude_none=True) for t in getattr(body, "tools", None) or []]
    choice = getattr(body, "tool_choice", None) or ("auto" if tools else "none")
    plan = OutputPlan(tools=tools or None, parallel=getattr(body, "parallel_tool_calls", None) is not False)
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "'tools': two tools have the same name", param="tools")
    if choice != "none" and not tools:
        raise APIError(400, "'tool_choice' needs 'tools'", param="tool_choice")
    if tools:
        plan.tool_format = tool_format(template)
    fmt = body.response_format
    if fmt is not None and fmt.type != "text":
        if tools and choice != "none":
            raise APIError(400, "'response_format' cannot be combined with tool calls (tool_choice 'none' can)",
                           param="response_format")
        plan.grammar, plan.param = _schema_grammar(fmt), "response_format"
    elif tools and choice != "none":
        if isinstance(choice, NamedToolChoice):
            if choice.function.name not in names:
                raise APIError(400, f"'tool_choice': no tool is named '{choice.function.name}'", param="tool_choice")
            tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        plan.tool_names = tuple(t["function"]["name"] for t in tools)
        plan.auto = choice == "auto"
        plan.grammar = grammars.from_lark(tools_grammar(plan.tool_format, tools, "auto" if choice == "auto"
                                                        else "required", plan.parallel, grammars.literal))
        plan.param = "tools"
    return plan


def _schema_grammar(fmt) -> str:
    if fmt.type == "json_object":
        schema = {"type": "object"}
    elif fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise APIError(400, "'response_format': type 'json_schema' needs 'json_schema': {'name': ..., 'schema': "
                            "{...}}", param="response_format")
    else:
        schema = fmt.json_schema.schema_
    try:
        return Grammars.from_json_schema(schema)
    except (ValueError, GrammarError) as e:
        raise APIError(400, f"'response_format.json_schema.schema': {e}", param="response_format") from None


def template_input(plan: OutputPlan, messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for the chat template. A template that renders tools gets them as they are; one that
    does not gets the generic format's system message, and earlier calls and results as plain text."""
    if not plan.tools:
        return messages, None
    if plan.tool_format.in_template:
        return messages, plan.tools
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"Result of tool call {m.get('tool_call_id', '')}: {m['content']}"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    system = generic_system_text(plan.tools, plan.parallel)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out, None
