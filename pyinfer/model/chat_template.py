"""Renders the model's own chat template (GGUF `tokenizer.chat_template`) with jinja2, the way
Hugging Face transformers does: sandboxed, trim_blocks/lstrip_blocks, raise_exception().

Two things more than transformers:
- The sandbox is bounded: strings, lists and integers a template makes are capped in size, and so are the
  arguments of calls and filters that run as one C call (`center`, format widths), and a render whose own code
  runs past its deadline stops, however its loops nest (a template is data from a downloaded file; rendering it
  must not take the process's memory or a server's thread).
- `chat_spans` says which characters of the rendered prompt came from the messages' content, so that only the
  template's own text may become control tokens (a user who types `<|im_end|>` writes text, not a turn)."""
from __future__ import annotations

import contextlib
import functools
import re
import sys
import time

from ..errors import PyinferError

# ChatML, for models whose GGUF carries no template.
DEFAULT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
                    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|im_start|>assistant\n' }}{% endif %}")
# Roles every chat model's template is written for (OpenAI's names); a template may name more.
STANDARD_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})
ROLE_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")
MAX_RENDER_CHARS = 1 << 24      # anything a template makes: strings, lists, the prompt itself
MAX_RENDER_SECONDS = 2.0        # a real template renders in milliseconds
# Content stands in as these while the template is rendered once more to find where it lands (private use
# characters: no tokenizer merges them with their neighbours, `trim` and `lower` leave them alone).
_MARK = "\ue000{}\ue001"
_MARK_RE = re.compile("\ue000(\\d+)\ue001")


class ChatTemplateError(PyinferError):
    """The template refused these messages, failed, or went past its bounds."""


MAX_INT_BITS = 1 << 16          # integers a template computes (a 20,000-digit number is plenty)
MAX_RENDER_ITEMS = 1 << 20      # lists, tuples and dicts a template makes
# Format specs that could make a million characters in one C call: a width of 7+ digits, a `*` width (%-format)
# or a nested field (str.format). A real chat template has none of them.
_BIG_PERCENT_SPEC = re.compile(r"%[-#0 +]*(\d{7,}|\*)|%[-#0 +]*\d*\.(\d{7,}|\*)")
_BIG_BRACE_SPEC = re.compile(r"\{[^{}]*:[^{}]*(\d{7,}|\{)")
_JINJA_DIR = None                # set on first use: frames of jinja2's own files run under the deadline too


def _estimated_size(name: str, value, args) -> int:
    """What a str method or filter that multiplies its input would make, before it runs (0: not one of them)."""
    if not isinstance(value, str):
        return 0
    if name in ("replace", "do_replace") and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        old, new = args[0], args[1]
        return len(value) + (value.count(old) if old else len(value) + 1) * len(new)
    if name == "expandtabs":
        width = args[0] if args and isinstance(args[0], int) else 8
        return len(value) + value.count("\t") * max(width, 0)
    if name == "do_indent":
        width = args[0] if args else 4
        return len(value) + (value.count("\n") + 1) * (len(width) if isinstance(width, str) else max(int(width), 0))
    if name in ("join", "do_join") and args and hasattr(args[0], "__len__"):
        items = args[0]
        return len(value) * len(items) + sum(len(x) for x in items if isinstance(x, str))
    return 0


@functools.lru_cache(maxsize=None)
def _environment():
    import os

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    global _JINJA_DIR
    _JINJA_DIR = os.path.dirname(jinja2.__file__)

    def refuse(why: str):
        raise SecurityError(why)

    def bounded(v):
        if isinstance(v, str) and len(v) > MAX_RENDER_CHARS:
            refuse(f"a string of over {MAX_RENDER_CHARS} characters")
        if isinstance(v, (list, tuple, dict)) and len(v) > MAX_RENDER_ITEMS:
            refuse(f"a collection of over {MAX_RENDER_ITEMS} items")
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_BITS:
            refuse(f"an integer of over {MAX_INT_BITS} bits")
        return v

    def check_call(name: str, value, args, kwargs) -> None:
        """A single C call (str.center, replace, a filter) cannot be stopped once it runs: its sizes first."""
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_RENDER_CHARS:
                refuse(f"an argument of {a}")
        if _estimated_size(name, value, args) > MAX_RENDER_CHARS:
            refuse(f"{name.removeprefix('do_')} would make over {MAX_RENDER_CHARS} characters")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
                        refuse(f"a value of over {MAX_RENDER_CHARS} items")
                if isinstance(left, int) and isinstance(right, int) and \
                        left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    refuse(f"an integer of over {MAX_INT_BITS} bits")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                    (right > MAX_INT_BITS or left.bit_length() * right > MAX_INT_BITS):
                refuse(f"an integer of over {MAX_INT_BITS} bits")
            if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)) \
                    and len(left) + len(right) > MAX_RENDER_CHARS:
                refuse(f"a value of over {MAX_RENDER_CHARS} items")
            if operator == "%" and isinstance(left, str) and _BIG_PERCENT_SPEC.search(left):
                refuse("a %-format width or precision of a million characters or more")
            return bounded(super().call_binop(context, operator, left, right))

        def call(self, context, obj, *args, **kwargs):
            check_call(getattr(obj, "__name__", ""), getattr(obj, "__self__", None), args, kwargs)
            return bounded(super().call(context, obj, *args, **kwargs))

        def wrap_str_format(self, value):  # str.format and format_map, however they are reached (jinja2 >= 3.1.5)
            if getattr(value, "__name__", "") in ("format", "format_map") and \
                    isinstance(getattr(value, "__self__", None), str) and _BIG_BRACE_SPEC.search(value.__self__):
                refuse("a format width of a million characters or more, or a nested one")
            return super().wrap_str_format(value)

        def getattr(self, obj, attribute):
            return bounded(super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            return bounded(super().getitem(obj, argument))

    def bounded_filter(f):
        skip = 1 if hasattr(f, "jinja_pass_arg") else 0  # the context or environment comes first

        @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
        def run(*args, **kwargs):
            value, rest = (args[skip], args[skip + 1:]) if len(args) > skip else (None, ())
            check_call(f.__name__, value, rest, kwargs)
            if f.__name__ == "do_format" and isinstance(value, str) and _BIG_PERCENT_SPEC.search(value):
                refuse("a %-format width or precision of a million characters or more")
            return bounded(f(*args, **kwargs))
        return run

    def raise_exception(msg):
        raise ChatTemplateError(f"chat template: {msg}")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.filters = {name: bounded_filter(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    return env


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    """A template compiled once (a server renders the same one for every request)."""
    return _environment().from_string(template)


@contextlib.contextmanager
def _deadline(seconds: float):
    """Stops a render once `seconds` have passed, however its loops nest: a trace on this thread that looks at the
    clock on every Python call and on every line of the template's compiled code (named <template>) and of
    jinja2's own files (its filters' loops). A loop inside one C call is bounded by sizes instead (_environment).
    Its cost, measured: a 1,024-message chat renders and splits in about 80 ms instead of 18 ms; on Python 3.12
    and 3.13, where settrace rides on sys.monitoring, other threads' Python runs about 1.6x slower while a
    render is under way (3.11: unaffected)."""
    deadline = time.monotonic() + seconds

    def over():
        raise ChatTemplateError(f"chat template: rendering took over {seconds:g} s")

    def on_line(frame, event, arg):
        if event == "line" and time.monotonic() > deadline:
            over()
        return on_line

    def on_call(frame, event, arg):
        if time.monotonic() > deadline:
            over()
        name = frame.f_code.co_filename
        return on_line if name == "<template>" or name.startswith(_JINJA_DIR) else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def _check_messages(messages: list[dict]) -> None:
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ChatTemplateError("each chat message must be a dict with 'role' and 'content'")
        if not isinstance(m["content"], str):
            raise ChatTemplateError("a chat message's content must be a string")


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    _check_messages(messages)
    return _render(template, messages, bos_token, eos_token, add_generation_prompt, tools)


def _render(template, messages, bos_token, eos_token, add_generation_prompt, tools=None) -> str:
    import jinja2

    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"this model's tokenizer.chat_template is {type(template).__name__}, not a string")
    out, size = [], 0
    try:
        compiled = _compiled(template or DEFAULT_TEMPLATE)
        with _deadline(MAX_RENDER_SECONDS):
            # `tools`: OpenAI's tool list, as Hugging Face's apply_chat_template passes it (None: no tools)
            for piece in compiled.generate(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                           add_generation_prompt=add_generation_prompt, tools=tools):
                size += len(piece)
                if size > MAX_RENDER_CHARS:
                    raise ChatTemplateError(f"the chat template made a prompt of over {MAX_RENDER_CHARS} characters")
                out.append(piece)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:  # SecurityError included
        raise ChatTemplateError(f"chat template failed to render: {e}") from None
    except (ArithmeticError, MemoryError, RecursionError, TypeError, ValueError, LookupError, AttributeError) as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None
    return "".join(out)


def template_roles(template: str | None) -> frozenset[str]:
    """The roles a request may use with this template: the standard ones and any the template compares a role
    with (`message['role'] == 'model'`)."""
    if not isinstance(template, str):
        template = None
    named = re.findall(r"""role['"]?\]?\s*(?:==|!=)\s*['"]([A-Za-z0-9_-]{1,32})['"]""", template or "")
    return STANDARD_ROLES | frozenset(named)


def check_roles(template: str | None, messages: list[dict]) -> None:
    allowed = template_roles(template)
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str) or not ROLE_PATTERN.fullmatch(role) or role not in allowed:
            shown = role[:40] + "…" if isinstance(role, str) and len(role) > 40 else role
            raise ChatTemplateError(f"messages[{i}].role {shown!r} is not one of this model's roles "
                                    f"({', '.join(sorted(allowed))})")


def chat_spans(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
               add_generation_prompt: bool = True, tools: list[dict] | None = None) -> tuple[str, list[tuple[int, int]] | None]:
    """(the rendered prompt, the [start, end) character spans of it that are message content), or spans None when
    the template does something with the content that cannot be traced (then the caller must treat the whole
    prompt with suspicion).

    The template is rendered twice: as is, and with each content replaced by a marker. The second render gives the
    template's own text between the markers; walking the first render along it finds each content, as given or as
    the template trimmed it."""
    check_roles(template, messages)
    _check_messages(messages)
    text = _render(template, messages, bos_token, eos_token, add_generation_prompt, tools)
    marked = [dict(m, content=_MARK.format(i)) for i, m in enumerate(messages)]
    skeleton = _render(template, marked, bos_token, eos_token, add_generation_prompt, tools)
    pieces = _MARK_RE.split(skeleton)  # template text, index, template text, index, ...
    spans, pos = [], 0
    for k in range(0, len(pieces), 2):
        own = pieces[k]
        if not text.startswith(own, pos):
            return text, None
        pos += len(own)
        if k + 1 == len(pieces):
            break
        content, after = messages[int(pieces[k + 1])]["content"], pieces[k + 2]
        for cand in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
            if text.startswith(cand, pos) and text.startswith(after, pos + len(cand)):
                if cand:
                    spans.append((pos, pos + len(cand)))
                pos += len(cand)
                break
        else:
            return text, None
    return (text, spans) if pos == len(text) else (text, None)
