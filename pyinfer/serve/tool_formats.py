"""How each model family writes a tool call, and the grammar that holds it to that form.

A chat template that renders `tools` (Qwen 2.5/3 and Hermes, Llama 3.1-3.3, Mistral Nemo, Ministral/Devstral)
also shows the model how to answer: the format is read from the template's own text. A template that knows no tools
(Phi-3.5, Gemma, SmolLM2) gets the tool list in a system message and answers with one JSON object, as llama.cpp's
"generic" format does.

Every call is written as opener + arguments + closer: the opener holds the function's name, the arguments are the
JSON of its `parameters` schema (llguidance's %json, so they always validate), and the closer is fixed. The same
pieces drive the parser (tool_parser.py), so what the grammar allows is exactly what the parser reads.

tool_choice: "required" and a named function constrain the whole answer to calls; "auto" lets the model write text
until it writes the format's trigger (a lazy lexeme: the trigger may appear anywhere), then holds it to calls;
"none" renders the tools and constrains nothing."""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from .grammar import JSON_STYLE


_WS = r"[ \t\n]*"  # a loose form's whitespace (Python's re and llguidance's regexes read it alike)
_WS_TRIGGER = r"[ \t\n]{0,8}"  # within its trigger: bounded, so the parser knows how much text to hold back
_LOOSE_BEFORE_ARGS = _WS + '"arguments"' + _WS + ":" + _WS  # a loose call from the comma after its name


@dataclass(frozen=True)
class ToolFormat:
    name: str
    in_template: bool       # the template renders the tool list itself
    prefix: str             # before the first call (the trigger, where there is one)
    before_name: str        # each call: before_name, the function's name, before_args, arguments, closer
    before_args: str
    closer: str
    separator: str          # between two calls
    suffix: str             # after the last call
    json_name: bool = True  # the name as a JSON string (quoted) or bare
    parallel: bool = True   # more than one call per answer
    id_chars: int = 0       # Mistral's templates want ids of exactly 9 letters and digits (0: call_<24 hex>)
    also: tuple = ()        # other forms its models write when free to ("auto"): read, and held to, too
    loose: bool = False     # a bare JSON object, any whitespace around its punctuation, maybe in a ```json fence

    @property
    def trigger(self) -> str:
        """The fixed text that starts the calls (exact forms; with no prefix, a call's text before its name)."""
        return self.prefix or self.before_name

    def named(self, name: str) -> str:
        """A call's text up to the end of its name (exact forms)."""
        return self.before_name + (json.dumps(name) if self.json_name else name)

    def opener(self, name: str) -> str:
        """A call's text up to its arguments (exact forms)."""
        return self.named(name) + self.before_args

    def loose_named(self, name: str) -> str:
        """A loose call's regular expression up to the comma after its name: past where <tool_call>\n{"name":
        "NAME" ends, so when a model writes the tags the exact form's lazy trigger matches first."""
        return (r'\{' + _WS_TRIGGER + r'"name"' + _WS_TRIGGER + ":" + _WS_TRIGGER + re.escape(json.dumps(name))
                + _WS_TRIGGER + ",")

    def loose_opener(self, name: str) -> str:
        return self.loose_named(name) + _LOOSE_BEFORE_ARGS

    def call_id(self) -> str:
        if self.id_chars:
            alphabet = string.ascii_letters + string.digits
            return "".join(secrets.choice(alphabet) for _ in range(self.id_chars))
        return "call_" + secrets.token_hex(12)

    # ---- what the parser matches (Python regular expressions, at the parser's position) -----------------------
    def trigger_re(self, names: list[str]) -> str:
        """Where the calls start: the prefix, or a call's text up to one of the tools' names (a JSON object that
        names no tool is text)."""
        if self.loose:
            return "|".join(self.loose_named(n) for n in names)
        if self.prefix:
            return re.escape(self.prefix)
        return "|".join(re.escape(self.named(n)) for n in names)

    def opener_re(self, name: str) -> str:
        if self.loose:  # up to the arguments' "{", not past it
            return self.loose_opener(name) + r"(?=\{)"
        return re.escape(self.opener(name))

    def closer_re(self) -> str:
        return _WS + r"\}" if self.loose else re.escape(self.closer)

    def next_re(self) -> str:
        """From the end of a call to the start of the next one's opener."""
        return _WS + r"(?=\{)" if self.loose else re.escape(self.separator)

    def end_re(self) -> str | None:
        return _WS + "```" if self.loose else re.escape(self.suffix) if self.suffix else None


# Qwen2.5-Coder, free to choose ("auto"), mostly writes its call as a bare, pretty-printed JSON object in a
# ```json fence instead of in <tool_call> tags (llama.cpp's Hermes handler accepts that too).
HERMES_BARE = ToolFormat("hermes_bare", True, "", '{"name": ', ', "arguments": ', "}", "\n", "", loose=True)
HERMES = ToolFormat("hermes", True, "", '<tool_call>\n{"name": ', ', "arguments": ', "}\n</tool_call>", "\n", "",
                    also=(HERMES_BARE,))
LLAMA3 = ToolFormat("llama3", True, "", '{"name": ', ', "parameters": ', "}", "", "", parallel=False)
MISTRAL = ToolFormat("mistral", True, "[TOOL_CALLS][", '{"name": ', ', "arguments": ', "}", ", ", "]", id_chars=9)
MISTRAL_ARGS = ToolFormat("mistral_args", True, "", "[TOOL_CALLS]", "[ARGS]", "", "", "", json_name=False,
                          id_chars=9)
GENERIC = ToolFormat("generic", False, '{"tool_calls": [', '{"name": ', ', "arguments": ', "}", ", ", "]}")
FORMATS = (HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, GENERIC)


def tool_format(template: str | None) -> ToolFormat:
    """The format a chat template teaches its model (GENERIC where it renders no tools)."""
    t = template or ""
    if "tools" not in t:
        return GENERIC
    if "<tool_call>" in t:
        return HERMES
    if "[ARGS]" in t:
        return MISTRAL_ARGS
    if "[TOOL_CALLS]" in t:
        return MISTRAL
    if '"parameters": ' in t or "<|python_tag|>" in t:
        return LLAMA3
    return GENERIC


def generic_system_text(tools: list[dict], parallel: bool) -> str:
    """The system message that teaches the generic format to a model whose template knows no tools."""
    listed = json.dumps([t["function"] for t in tools], indent=2)
    many = "one or more calls" if parallel else "one call"
    return (f"You can call these tools:\n{listed}\n\nTo call tools, answer with only this JSON object ({many}): "
            '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}\n'
            "Otherwise answer the user normally.")


def tools_grammar(fmt: ToolFormat, tools: list[dict], choice: str, parallel: bool, literal) -> str:
    """Lark text for llguidance. `choice`: "auto" (text, or calls from a trigger on, in `fmt` or one of its `also`
    forms) or "required" (calls only, in `fmt`); the caller narrows `tools` to one for a named choice.
    `literal(text)` writes text as the grammar must name it (control tokens by id, the rest quoted)."""
    def lit(text: str) -> str:
        return literal(text) if text else ""

    def arguments(tool: dict, loose: bool) -> str:
        schema = dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})
        # a loose form's model writes its arguments pretty-printed: let it, within bounds
        style = dict(JSON_STYLE, whitespace_flexible=True, whitespace_pattern=r"[ \t\n]{1,64}") if loose \
            else dict(JSON_STYLE)
        schema.setdefault("x-guidance", style)
        return f"%json {json.dumps(schema)}"

    def closer(f: ToolFormat) -> str:
        return f"/{_WS}\\}}/" if f.loose else lit(f.closer)

    def call_rules(f: ToolFormat, tag: str) -> tuple[list[str], str]:
        """(rules, tail): rule `call{tag}` is one whole call of any tool; `tail` is what may follow the first call
        (more calls, the end), as an expression (maybe empty)."""
        rules = ["call" + tag + ": " + " | ".join(f"call{tag}_{i}" for i in range(len(tools)))]
        for i, t in enumerate(tools):
            name = t["function"]["name"]
            head = f"/{_WS}{f.loose_opener(name)}/" if f.loose else lit(f.opener(name))
            rules.append(f"call{tag}_{i}: {head} {arguments(t, f.loose)} {closer(f)}")
        separator = "" if f.loose else lit(f.separator)
        more = f"({separator} call{tag})*" if parallel and f.parallel else ""
        end = f"/{_WS}```/?" if f.loose else lit(f.suffix)
        return rules, f"{more} {end}".strip()

    def head(rule: str, trigger: str) -> str:
        """Free text, then `trigger`: a lazy lexeme (the shortest text that ends in it), except where the trigger
        is a control token, which no text can hold (llguidance keeps tokens out of lexemes)."""
        return f"{rule}: TEXT {trigger}" if trigger.startswith("<[") else f"{rule}[lazy]: TEXT {trigger}"

    lines = ["%llguidance {}"]
    if choice != "auto":
        rules, tail = call_rules(fmt, "")
        return "\n".join(lines + [f"start: {lit(fmt.prefix)} call {tail}"] + rules) + "\n"
    alternatives = ["TEXT"]
    lines.append("TEXT: /(.|\\n)*/")
    for k, f in enumerate((fmt,) + fmt.also):
        rules, tail = call_rules(f, str(k))
        lines += rules
        if f.prefix:
            alternatives.append(f"head{k} call{k} {tail}")
            lines.append(head(f"head{k}", lit(f.prefix)))
            continue
        for i, t in enumerate(tools):  # the trigger runs to the end of a tool's name (then the rest of that call)
            name = t["function"]["name"]
            alternatives.append(f"head{k}_{i} rest{k}_{i} {tail}")
            if f.loose:
                lines.append(head(f"head{k}_{i}", f"/{f.loose_named(name)}/"))
                rest = f"/{_LOOSE_BEFORE_ARGS}/"
            else:
                lines.append(head(f"head{k}_{i}", lit(f.named(name))))
                rest = lit(f.before_args)
            lines.append(f"rest{k}_{i}: {rest} {arguments(t, f.loose)} {closer(f)}")
    return "\n".join(lines[:1] + ["start: " + " | ".join(alternatives)] + lines[1:]) + "\n"
