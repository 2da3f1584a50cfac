"""Reads a tool-calling answer as it streams: content text, then calls, in the pieces OpenAI streams.

The answer was held to its format by a grammar (tool_formats.py), so the parser needs no guessing: text up to the
format's trigger is content; from there come calls, each opener (its name), arguments (a JSON object, streamed as it
grows: text cannot be part of anything else while the object is open) and closer. A call's arguments string is the
model's own text of that object, so every prefix streamed is a prefix of the final string."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .tool_formats import ToolFormat



@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Parsed:
    content: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


class ToolCallParser:
    """push(text) -> deltas, finish() -> the last ones. A delta is ("content", text), ("call", index) when call
    `index` has its id and name, or ("arguments", index, text)."""

    def __init__(self, fmt: ToolFormat, names: list[str], auto: bool = True):
        """`fmt`: the format the grammar holds the calls to; with `auto` also its `also` forms (the first trigger
        seen decides)."""
        self.forms, self.names = ((fmt,) + fmt.also) if auto else (fmt,), names
        self._use(fmt)
        self.triggers = [(re.compile(f.trigger_re(names)), f) for f in self.forms]
        self.buf, self.pos, self.state = "", 0, "text"
        self.args_sent = 0
        self.scan = _ObjectEnd()
        self.result = Parsed()

    @property
    def calls_complete(self) -> bool:
        """Every call read to its end (none cut in its arguments by max_tokens or a stop string)."""
        return bool(self.result.calls) and self.state in ("between", "done")

    def _use(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.openers = [(re.compile(fmt.opener_re(n)), n) for n in self.names]
        self.closer, self.next = re.compile(fmt.closer_re()), re.compile(fmt.next_re())
        end = fmt.end_re()
        self.end = re.compile(end) if end else None

    def push(self, text: str) -> list[tuple]:
        self.buf += text
        out: list[tuple] = []
        while self._advance(out):
            pass
        return out

    def finish(self) -> list[tuple]:
        """Whatever was held back: text that only looked like the start of a trigger is content after all."""
        out: list[tuple] = []
        if self.state == "text" and self.pos < len(self.buf):
            self._content(out, self.buf[self.pos:])
            self.pos = len(self.buf)
        return out

    # ---- states ---------------------------------------------------------------------------------------------
    def _advance(self, out: list[tuple]) -> bool:
        """One move; False when it needs more text."""
        buf, pos = self.buf, self.pos
        if self.state == "text":
            found = [(m.start(), n, m, f) for n, (pattern, f) in enumerate(self.triggers)
                     for m in [pattern.search(buf, pos)] if m]
            if not found:
                keep = max(_held_back(buf[pos:], f, self.names) for f in self.forms)
                if len(buf) - pos > keep:
                    self._content(out, buf[pos:len(buf) - keep])
                    self.pos = len(buf) - keep
                return False
            start, _, m, fmt = min(found, key=lambda x: x[:2])
            if fmt.loose and any(len(buf) - _held_back(buf[pos:], f, self.names) <= start
                                 for f in self.forms if not f.loose):
                return False  # an exact form's trigger may be arriving around it (<tool_call> before its "{")
            self._use(fmt)
            text = buf[pos:start]
            if fmt.loose:  # the fence it opened around its call is not content
                text = _FENCE.sub("", text)
            self._content(out, text)
            self.pos = start + (len(fmt.prefix) if fmt.prefix else 0)
            self.state = "opener"
            return True
        if self.state == "opener":
            for pattern, name in self.openers:
                m = pattern.match(buf, pos)
                if m:
                    self.result.calls.append(ToolCall(self.fmt.call_id(), name))
                    out.append(("call", len(self.result.calls) - 1))
                    self.pos = self.args_sent = m.end()
                    self.scan = _ObjectEnd(m.end())
                    self.state = "arguments"
                    return True
            return False
        if self.state == "arguments":
            end = self.scan.feed(buf)  # None: the object is still open, all the text so far is arguments
            upto = len(buf) if end is None else end
            if upto > self.args_sent:
                piece = buf[self.args_sent:upto]
                self.result.calls[-1].arguments += piece
                out.append(("arguments", len(self.result.calls) - 1, piece))
                self.args_sent = upto
            if end is None:
                return False
            self.pos, self.state = end, "closer"
            return True
        if self.state == "closer":
            m = self.closer.match(buf, pos)  # an exact closer matches once whole; a loose one at its "}"
            if m:
                self.pos, self.state = m.end(), "between"
                return True
            return False
        if self.state == "between":
            if self.end is not None:
                m = self.end.match(buf, pos)
                if m and m.end() > pos:
                    self.pos, self.state = m.end(), "done"
                    return True
            m = self.next.match(buf, pos)
            if m and len(buf) > pos:  # an empty separator matches at once: wait for the next call's first text
                self.pos, self.state = m.end(), "opener"
                return True
            return False
        return False  # done: the grammar allows nothing more

    def _content(self, out: list[tuple], text: str) -> None:
        if text:
            self.result.content.append(text)
            out.append(("content", text))


class _ObjectEnd:
    """Finds where a JSON object that starts at `start` ends, reading each character once however the text
    arrives (the grammar made it valid JSON: only strings, their escapes and the nesting matter)."""

    def __init__(self, start: int = 0):
        self.at, self.depth, self.in_string, self.escaped = start, 0, False, False

    def feed(self, text: str) -> int | None:
        for i in range(self.at, len(text)):
            c = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.at = i + 1
                    return i + 1
        self.at = len(text)
        return None


_FENCE = re.compile(r"```(?:json)?\s*$")
# the end of a text that may still become a fence and a call's opening: ```json, then {, then "name"
_LOOSE_TAIL = re.compile(r"(?:`{1,3}(?:j(?:s(?:on?)?)?)?[ \t\n]{0,8})?(?:\{[^{}`]*)?$")


def _held_back(text: str, fmt: ToolFormat, names: list[str]) -> int:
    """How much of the end of `text` to hold back: it may be the start of `fmt`'s trigger (or, for a loose form,
    of a fence and the object it opens)."""
    if fmt.loose:
        m = _LOOSE_TAIL.search(text)
        return len(text) - m.start() if len(text) - m.start() <= 160 else 0  # a trigger: at most ~110 characters
    return max(_partial(text, trigger) for trigger in ([fmt.prefix] if fmt.prefix else
                                                        [fmt.named(n) for n in names]))


def _partial(text: str, trigger: str) -> int:
    """Length of the longest end of `text` that is a start of `trigger` (and not all of it)."""
    for n in range(min(len(text), len(trigger) - 1), 0, -1):
        if trigger.startswith(text[-n:]):
            return n
    return 0
