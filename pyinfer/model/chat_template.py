"""Renders the model's own chat template (GGUF `tokenizer.chat_template`) with jinja2, the way
Hugging Face transformers does: sandboxed, trim_blocks/lstrip_blocks, raise_exception()."""
from __future__ import annotations

from ..errors import PyinferError

# ChatML, for models whose GGUF carries no template.
DEFAULT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
                    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PyinferError("each chat message must be a dict with 'role' and 'content'")

    def raise_exception(msg):
        raise PyinferError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template or DEFAULT_TEMPLATE).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt)
    except jinja2.TemplateError as e:
        raise PyinferError(f"chat template failed to render: {e}") from None
