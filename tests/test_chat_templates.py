"""The chat templates of the families pyinfer runs (Qwen 2.5, Qwen 3, Llama 3.1/3.2, Phi-3.5, Mistral Nemo,
Ministral 3; copies of llama.cpp's models/templates) render through pyinfer's sandboxed jinja2 as their models
expect: the expected texts are the formats the model cards document."""
from pathlib import Path

import pytest

from pyinfer.model.chat_template import render_chat

HERE = Path(__file__).parent / "data" / "chat_templates"
MSGS = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}]
CHATML = ("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
          "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n")
LLAMA3 = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
          "Today Date: 26 Jul 2024\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>"
          "\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>"
          "user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
CASES = [
    ("Qwen-Qwen2.5-7B-Instruct", "", "<|im_end|>", CHATML),
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>", CHATML),
    ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>", LLAMA3),
    ("meta-llama-Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>", LLAMA3),
    ("microsoft-Phi-3.5-mini-instruct", "<s>", "<|endoftext|>",
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
     "<|user|>\nWho are you<|end|>\n<|assistant|>\n"),
    # Mistral Nemo puts the system prompt before the last user message
    ("mistralai-Mistral-Nemo-Instruct-2407", "<s>", "</s>",
     "<s>[INST]Hello[/INST]Hi there</s>[INST]You are a helpful assistant\n\nWho are you[/INST]"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "<s>", "</s>",
     "<s>[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
     "[INST]Who are you[/INST]"),
]


@pytest.mark.parametrize("name,bos,eos,want", CASES, ids=[c[0] for c in CASES])
def test_template_renders_as_the_model_expects(name, bos, eos, want):
    assert render_chat((HERE / f"{name}.jinja").read_text(encoding="utf-8"), MSGS, bos, eos, True) == want


def test_qwen3_without_a_system_message():
    """One user message, no system turn: the template opens no system block and ends in the assistant turn."""
    text = render_chat((HERE / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"), MSGS[1:2], "", "<|im_end|>", True)
    assert text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
