"""Renders the model's own chat template (GGUF `tokenizer.chat_template`) with jinja2, the way
Hugging Face transformers does: sandboxed, trim_blocks/lstrip_blocks, raise_exception().

Two things more than transformers:
- The sandbox is bounded: strings and lists a template makes are capped in size, `**` in magnitude, and a render
  that runs past its deadline stops (a template is data from a downloaded file; rendering it must not take the
  process's memory or a server's thread).
- `chat_spans` says which characters of the rendered prompt came from the messages' content, so that only the
  template's own text may become control tokens (a user who types `<|im_end|>` writes text, not a turn)."""
from __future__ import annotations

import re
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


def _environment():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.deadline = float("inf")

        def _tick(self) -> None:
            if time.monotonic() > self.deadline:
                raise jinja2.sandbox.SecurityError(f"rendering took over {MAX_RENDER_SECONDS:g} s")

        @staticmethod
        def _bounded(v):
            if isinstance(v, (str, list, tuple, dict)) and len(v) > MAX_RENDER_CHARS:
                raise jinja2.sandbox.SecurityError(f"a value of over {MAX_RENDER_CHARS} items")
            return v

        def call_binop(self, context, operator, left, right):
            self._tick()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDER_CHARS:
                        raise jinja2.sandbox.SecurityError(f"a value of over {MAX_RENDER_CHARS} items")
            if operator == "**" and isinstance(right, int) and abs(right) > 64 and not (
                    isinstance(left, (int, float)) and abs(left) <= 1):
                raise jinja2.sandbox.SecurityError("an exponent over 64")
            if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)) \
                    and len(left) + len(right) > MAX_RENDER_CHARS:
                raise jinja2.sandbox.SecurityError(f"a value of over {MAX_RENDER_CHARS} items")
            return super().call_binop(context, operator, left, right)

        def call(self, context, obj, *args, **kwargs):
            self._tick()
            return self._bounded(super().call(context, obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            self._tick()
            return self._bounded(super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            self._tick()
            return self._bounded(super().getitem(obj, argument))

    def raise_exception(msg):
        raise ChatTemplateError(f"chat template: {msg}")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env


def _check_messages(messages: list[dict]) -> None:
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ChatTemplateError("each chat message must be a dict with 'role' and 'content'")
        if not isinstance(m["content"], str):
            raise ChatTemplateError("a chat message's content must be a string")


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    _check_messages(messages)
    return _render(template, messages, bos_token, eos_token, add_generation_prompt)


def _render(template, messages, bos_token, eos_token, add_generation_prompt) -> str:
    import jinja2

    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"this model's tokenizer.chat_template is {type(template).__name__}, not a string")
    env = _environment()
    try:
        compiled = env.from_string(template or DEFAULT_TEMPLATE)
        env.deadline = time.monotonic() + MAX_RENDER_SECONDS
        out = compiled.render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                              add_generation_prompt=add_generation_prompt)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:  # SecurityError included
        raise ChatTemplateError(f"chat template failed to render: {e}") from None
    except (ArithmeticError, MemoryError, RecursionError, TypeError, ValueError, LookupError, AttributeError) as e:
        raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None
    if len(out) > MAX_RENDER_CHARS:
        raise ChatTemplateError(f"the chat template made a prompt of over {MAX_RENDER_CHARS} characters")
    return out


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
               add_generation_prompt: bool = True) -> tuple[str, list[tuple[int, int]] | None]:
    """(the rendered prompt, the [start, end) character spans of it that are message content), or spans None when
    the template does something with the content that cannot be traced (then the caller must treat the whole
    prompt with suspicion).

    The template is rendered twice: as is, and with each content replaced by a marker. The second render gives the
    template's own text between the markers; walking the first render along it finds each content, as given or as
    the template trimmed it."""
    check_roles(template, messages)
    _check_messages(messages)
    text = _render(template, messages, bos_token, eos_token, add_generation_prompt)
    marked = [dict(m, content=_MARK.format(i)) for i, m in enumerate(messages)]
    skeleton = _render(template, marked, bos_token, eos_token, add_generation_prompt)
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
