"""Tool calls and grammars without a model: each token's bytes, the format each chat template teaches, the grammar of
every format against its parser (whole and streamed a character at a time), and tools rendered by real templates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance")

from pyinfer.model.arch import open_model  # noqa: E402
from pyinfer.model.chat_template import render_chat  # noqa: E402
from pyinfer.model.token_bytes import byte_level_alphabet, token_bytes  # noqa: E402
from pyinfer.model.tokenizer import Tokenizer  # noqa: E402
from pyinfer.serve.grammar import Grammars  # noqa: E402
from pyinfer.serve.structured import OutputPlan, template_input  # noqa: E402
from pyinfer.serve.tool_formats import (FORMATS, GENERIC, HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS,  # noqa: E402
                                        tool_format, tools_grammar)
from pyinfer.serve.tool_parser import ToolCallParser  # noqa: E402

DATA = Path(__file__).parent / "data"
TEMPLATES = DATA / "chat_templates"
TEXT = "Hello world, héllo 日本語 🎉 {\"a\": [1, 2]}\n\ttabs  and  spaces"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                                               "required": ["city", "unit"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"],
             "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(open_model(DATA / "llamacpp_vocab" / "ggml-vocab-deepseek-coder.gguf").metadata)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    return Grammars(tokenizer, tokenizer.vocab_size, tokenizer.end_of_generation)


@pytest.mark.parametrize("vocab", ["deepseek-coder", "llama-spm", "phi-3"])
def test_token_bytes_spell_the_text(vocab):
    tk = Tokenizer(open_model(DATA / "llamacpp_vocab" / f"ggml-vocab-{vocab}.gguf").metadata)
    table = token_bytes(tk)
    assert len(table) == tk.vocab_size
    ids = tk.encode(TEXT, add_bos=False)
    spelled = b"".join(table[i] for i in ids).decode("utf-8")
    assert spelled == TEXT or spelled == " " + TEXT  # SentencePiece's added space prefix
    for i in tk.control_ids:
        assert table[i] == b"\xff" + tk.tokens[i].encode()  # llguidance's mark of a special token


def test_byte_level_alphabet_is_gpt2s():
    alphabet = byte_level_alphabet()
    assert len(alphabet) == 256 and sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == 32 and alphabet["Ċ"] == 10 and alphabet["a"] == 97


@pytest.mark.parametrize("name,fmt", [("Qwen-Qwen2.5-7B-Instruct", "hermes"), ("Qwen-Qwen3-0.6B", "hermes"),
                                      ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
                                      ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
                                      ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
                                      ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral_args"),
                                      ("microsoft-Phi-3.5-mini-instruct", "generic")])
def test_each_template_teaches_its_format(name, fmt):
    assert tool_format((TEMPLATES / f"{name}.jinja").read_text()).name == fmt
    assert tool_format(None) is GENERIC


def answer(fmt, calls, text=""):
    """The text of an answer with `calls` [(name, arguments text)] in format `fmt`."""
    body = fmt.separator.join(fmt.opener(n) + a + fmt.closer for n, a in calls)
    return text + fmt.prefix + body + fmt.suffix


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_the_grammar_allows_what_the_parser_reads(tokenizer, grammars, fmt, choice):
    calls = [("get_weather", '{"city": "Paris", "unit": "C"}'), ("get_time", '{"zone": "UTC+1"}')]
    calls = calls if fmt.parallel else calls[:1]
    text = answer(fmt, calls, "Let me look. " if choice == "auto" else "")
    grammar = grammars.from_lark(tools_grammar(fmt, TOOLS, choice, True, grammars.literal))
    c = grammars.constraint(grammar, "tools")
    ids = tokenizer.encode(text, add_bos=False)
    assert c.matcher.try_consume_tokens(ids) == len(ids) and c.matcher.is_accepting(), text
    # a call whose arguments break its schema is refused at the first wrong token
    bad = tokenizer.encode(answer(fmt, [("get_weather", '{"city": 5}')]), add_bos=False)
    assert grammars.constraint(grammar, "tools").matcher.try_consume_tokens(bad) < len(bad)

    whole = ToolCallParser(fmt, ["get_weather", "get_time"], choice == "auto")
    whole.push(text)
    whole.finish()
    assert [(c.name, c.arguments) for c in whole.result.calls] == calls
    assert "".join(whole.result.content) == ("Let me look. " if choice == "auto" else "")
    streamed, args = ToolCallParser(fmt, ["get_weather", "get_time"], choice == "auto"), {}
    for ch in text:
        for d in streamed.push(ch):
            if d[0] == "arguments":
                args[d[1]] = args.get(d[1], "") + d[2]
    streamed.finish()
    assert [args[i] for i in range(len(calls))] == [a for _, a in calls]


@pytest.mark.parametrize("text", [
    '{"name": "get_time", "arguments": {"zone": "UTC"}}',
    '```json\n{\n  "name": "get_time",\n  "arguments": {\n    "zone": "UTC"\n  }\n}\n```',
    'Sure:\n```json\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n{"name": "get_weather", '
    '"arguments": {"city": "Oslo", "unit": "C"}}\n```'])
def test_qwen_coders_bare_pretty_printed_calls_are_read_in_auto(tokenizer, grammars, text):
    """Qwen2.5-Coder, free to choose, writes its call as bare JSON, pretty-printed, often in a ```json fence."""
    grammar = grammars.from_lark(tools_grammar(HERMES, TOOLS, "auto", True, grammars.literal))
    ids = tokenizer.encode(text, add_bos=False)
    c = grammars.constraint(grammar, "tools")
    assert c.matcher.try_consume_tokens(ids) == len(ids) and c.matcher.is_accepting()
    bad = tokenizer.encode('```json\n{\n  "name": "get_time",\n  "arguments": {"zone": 5}}', add_bos=False)
    assert grammars.constraint(grammar, "tools").matcher.try_consume_tokens(bad) < len(bad)
    for pieces in ([text], list(text)):
        p = ToolCallParser(HERMES, ["get_weather", "get_time"])
        for piece in pieces:
            p.push(piece)
        p.finish()
        assert p.result.calls and p.result.calls[0].name == "get_time"
        assert json.loads(p.result.calls[0].arguments) == {"zone": "UTC"}
        assert "".join(p.result.content).strip() in ("", "Sure:")
        if "Oslo" in text:
            assert json.loads(p.result.calls[1].arguments) == {"city": "Oslo", "unit": "C"}


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3], ids=["hermes", "llama3"])
def test_auto_lets_an_answer_hold_json_that_names_no_tool(tokenizer, grammars, fmt):
    """A code answer's {"name": "Alice"} is text: only an object naming one of the tools is a call."""
    text = 'Example:\n```json\n{"name": "Alice", "age": 3}\n```'
    grammar = grammars.from_lark(tools_grammar(fmt, TOOLS, "auto", True, grammars.literal))
    ids = tokenizer.encode(text, add_bos=False)
    assert grammars.constraint(grammar, "tools").matcher.try_consume_tokens(ids) == len(ids)
    p = ToolCallParser(fmt, ["get_weather", "get_time"])
    for ch in text:
        p.push(ch)
    p.finish()
    assert "".join(p.result.content) == text and not p.result.calls


def test_a_control_token_trigger_compiles_in_auto(tokenizer, monkeypatch):
    """Mistral's [TOOL_CALLS] and [ARGS] are control tokens: no lazy lexeme can hold them."""
    g = Grammars(tokenizer, tokenizer.vocab_size, tokenizer.end_of_generation)
    ids = sorted(tokenizer.control_ids)[2:4]
    import re

    g._controls = ({"[TOOL_CALLS]": ids[0], "[ARGS]": ids[1]}, re.compile(r"\[TOOL_CALLS\]|\[ARGS\]"))
    for fmt in (MISTRAL, MISTRAL_ARGS):
        grammar = g.from_lark(tools_grammar(fmt, TOOLS, "auto", True, g.literal))
        c = g.constraint(grammar, "tools")
        text = tokenizer.encode("Sure. ", add_bos=False)
        rest = fmt.prefix[len("[TOOL_CALLS]"):] + (fmt.before_name + json.dumps("get_time") + fmt.before_args
                                                    if fmt.prefix else "get_time[ARGS]")
        call = [ids[0]] + tokenizer.encode(rest.replace("[TOOL_CALLS]", "").replace("[ARGS]", ""), add_bos=False)
        if fmt is MISTRAL_ARGS:
            call = [ids[0]] + tokenizer.encode("get_time", add_bos=False) + [ids[1]]
        call += tokenizer.encode('{"zone": "UTC"}' + fmt.closer + fmt.suffix, add_bos=False)
        assert c.matcher.try_consume_tokens(text + call) == len(text + call), fmt.name
        assert c.matcher.is_accepting()


def test_auto_lets_the_model_answer_in_text(tokenizer, grammars):
    grammar = grammars.from_lark(tools_grammar(HERMES, TOOLS, "auto", True, grammars.literal))
    ids = tokenizer.encode("The weather is nice, no tool needed.", add_bos=False)
    c = grammars.constraint(grammar, "tools")
    assert c.matcher.try_consume_tokens(ids) == len(ids) and c.matcher.is_accepting()
    p = ToolCallParser(HERMES, ["get_weather"])
    out = p.push("I think <tool") + p.finish()  # a trigger that never came is content after all
    assert "".join(d[1] for d in out) == "I think <tool" and not p.result.calls


def test_a_named_choice_allows_only_that_tool(tokenizer, grammars):
    grammar = grammars.from_lark(tools_grammar(HERMES, TOOLS[1:], "required", True, grammars.literal))
    other = tokenizer.encode(answer(HERMES, [("get_weather", '{"city": "Oslo", "unit": "C"}')]), add_bos=False)
    assert grammars.constraint(grammar, "tools").matcher.try_consume_tokens(other) < len(other)


def test_logits_wider_than_the_vocabulary_get_masks_of_their_width(tokenizer):
    """An embedding padded past the token list (rows of no text): the masks cover every row of the logits."""
    from pyinfer.serve.grammar import MaskBuffer

    width = tokenizer.vocab_size + 100
    g = Grammars(tokenizer, width, tokenizer.end_of_generation)
    mask = MaskBuffer(width).fill([g.constraint(g.from_json_schema({"enum": ["a"]}), "x")])
    assert mask.shape == (1, width) and mask.any() and not mask[0, tokenizer.vocab_size:].any()


def test_compiled_grammars_are_cached_and_states_are_separate(grammars, tokenizer):
    grammar = grammars.from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                         "required": ["a"], "additionalProperties": False})
    a, b = grammars.constraint(grammar, "response_format"), grammars.constraint(grammar, "response_format")
    assert len(grammars._compiled) == 1 or grammar in grammars._compiled
    ids = tokenizer.encode('{"a": 12}', add_bos=False)
    assert a.matcher.try_consume_tokens(ids) == len(ids) and a.finished
    assert not b.finished and b.matcher.try_consume_tokens(ids) == len(ids)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                                  "mistralai-Mistral-Nemo-Instruct-2407"])
def test_tools_and_earlier_calls_render_through_the_models_template(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "abcDEF123", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}}]},
                {"role": "tool", "tool_call_id": "abcDEF123", "content": "21 C and sunny"}]
    plan = OutputPlan(tools=TOOLS, tool_format=tool_format(template))
    msgs, tools = template_input(plan, messages)
    text = render_chat(template, msgs, "<s>", "</s>", tools=tools)
    assert "get_time" in text and "21 C and sunny" in text and '"Paris"' in text


def test_a_template_without_tools_gets_them_in_a_system_message():
    template = (TEMPLATES / "microsoft-Phi-3.5-mini-instruct.jinja").read_text()
    plan = OutputPlan(tools=TOOLS, tool_format=tool_format(template))
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
    msgs, tools = template_input(plan, messages)
    assert tools is None and msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"]) == {"tool_calls": [{"name": "get_time", "arguments": {"zone": "UTC"}}]}
    assert msgs[3] == {"role": "user", "content": "Result of tool call c1: noon"}
    assert "get_weather" in render_chat(template, msgs, "<s>", "</s>")


def test_control_tokens_in_a_format_are_matched_as_tokens(tokenizer, grammars):
    """Mistral's [TOOL_CALLS] is a control token: the grammar names it by id, and its text spelled out is refused."""
    control = min(tokenizer.control_ids)
    name = tokenizer.tokens[control]
    assert grammars.literal(f"{name}[") == f'<[{control}]> "["'
    grammar = grammars.from_lark(f"start: {grammars.literal(name + 'ok')}")
    assert grammars.constraint(grammar, "x").matcher.try_consume_tokens([control] + tokenizer.encode(
        "ok", add_bos=False)) == 1 + len(tokenizer.encode("ok", add_bos=False))
    spelled = tokenizer.encode(name + "ok", add_bos=False)
    assert control not in spelled and grammars.constraint(grammar, "x").matcher.try_consume_tokens(spelled) == 0
