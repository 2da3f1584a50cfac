"""Constrained decoding: grammars compiled by llguidance, one token mask per constrained sequence per step.

Why llguidance and not xgrammar: one abi3 wheel with no dependencies (xgrammar needs torch), a mask in about 25 µs
for a 152k-token vocabulary, and bounds on everything: its lexer never backtracks (a "catastrophic" regex is linear
there) and each compile and each mask step runs on a fuel budget (LLParserLimits), so a hostile schema ends in an
error, never a stuck engine thread. It reads JSON Schema, Lark (with lazy triggers: a tool call inside free text)
and regular expressions.

A grammar is compiled once per text and kept (least recently used first out); each request gets a copy of the
compiled matcher (`deep_copy`), so one sequence's state never touches another's. The masks of a step are filled
together into one buffer (MaskBuffer), each into its own row."""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict

import numpy as np

from ..errors import PyinferError
from ..model.token_bytes import token_bytes

# JSON as models were trained on it (Python's json.dumps): ", " and ": ", no other whitespace, so a small model
# cannot fill its answer with newlines.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHED_GRAMMARS = 64
# Tighter than llguidance's defaults where a request could make a server work for long: a grammar of at most
# 200k symbols, at most 50k lexer states (about 100 MB), a compile of at most about 100 ms of lexer work.
LIMITS = dict(max_grammar_size=200_000, max_lexer_states=50_000, initial_lexer_fuel=5_000_000)


class GrammarError(PyinferError):
    """A grammar the library refused (a 400 naming `param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise GrammarError("structured outputs and tool calls need llguidance: pip install 'pyinfer[serve]'") from None
    return llguidance


class Grammars:
    """One model's grammar compiler: its token table (built on first use, about half a second) and the grammars
    compiled so far."""

    def __init__(self, tokenizer, n_vocab: int, eos_ids):
        self.tokenizer, self.n_vocab, self.eos_ids = tokenizer, n_vocab, sorted(eos_ids)
        self._lock = threading.Lock()
        self._lltokenizer = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self._controls: tuple[dict[str, int], re.Pattern | None] | None = None

    def lltokenizer(self):
        llg = _llguidance()
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = llg.LLTokenizer(llg.TokenizerWrapper(_TokenTable(self.tokenizer, self.n_vocab)),
                                                    n_vocab=self.n_vocab, eos_token=self.eos_ids)
            return self._lltokenizer

    @staticmethod
    def from_json_schema(schema: dict) -> str:
        """A JSON Schema as llguidance's grammar text (compiled by `constraint`)."""
        llg = _llguidance()
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=dict(JSON_STYLE))

    @staticmethod
    def from_lark(lark: str) -> str:
        return _llguidance().LLMatcher.grammar_from_lark(lark)

    def literal(self, text: str) -> str:
        """`text` as a Lark expression: the tokenizer's control tokens in it by id (<[id]>: a model writes them as
        one token, never as text), the rest as quoted strings."""
        if self._controls is None:
            tk = self.tokenizer
            by_text = {tk.tokens[i]: i for i in sorted(tk.control_ids) if tk.tokens[i]}
            names = sorted(by_text, key=len, reverse=True)
            self._controls = (by_text, re.compile("|".join(map(re.escape, names))) if names else None)
        by_text, pattern = self._controls
        parts, pos = [], 0
        for m in pattern.finditer(text) if pattern is not None else ():
            if m.start() > pos:
                parts.append(json.dumps(text[pos:m.start()]))
            parts.append(f"<[{by_text[m.group()]}]>")
            pos = m.end()
        if pos < len(text):
            parts.append(json.dumps(text[pos:]))
        return " ".join(parts)

    def constraint(self, grammar: str, param: str) -> Constraint:
        """A fresh sequence state for `grammar`, compiled now or taken from the cache. Raises GrammarError naming
        `param` where the library refuses the grammar (too large, unsupported keyword, bad regex)."""
        return Constraint(self._compiled_matcher(grammar, param).deep_copy())

    def _compiled_matcher(self, grammar: str, param: str):
        with self._lock:
            if grammar in self._compiled:
                self._compiled.move_to_end(grammar)
                return self._compiled[grammar]
        llg = _llguidance()
        matcher = llg.LLMatcher(self.lltokenizer(), grammar, log_level=0, limits=llg.LLParserLimits(**LIMITS))
        if matcher.is_error():
            raise GrammarError(f"'{param}' cannot be compiled: {_first_line(matcher.get_error())}", param)
        with self._lock:
            self._compiled[grammar] = matcher
            while len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        return matcher


class Constraint:
    """One sequence's place in its grammar."""

    def __init__(self, matcher):
        self.matcher = matcher

    def consume(self, token: int) -> None:
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            raise GrammarError(f"the grammar refused token {token}: {_first_line(self.matcher.get_error())}")

    @property
    def finished(self) -> bool:
        """No token but end-of-generation can follow (the grammar is complete)."""
        return self.matcher.is_stopped()

    @property
    def failed(self) -> str | None:
        return _first_line(self.matcher.get_error()) if self.matcher.is_error() else None


class MaskBuffer:
    """The step's masks: bool [n, vocab] rows, their bits in one buffer that grows with the batch.

    The masks are filled one after the other on the engine thread, each into its own row: on Qwen2.5-Coder-0.5B
    (2 cores, batch 16) that took 0.8-1.0 ms per step against 1.4-1.5 ms with llguidance's parallel fill
    (LLExecutor, a thread pool beside the engine's compute threads); a step there takes about 135 ms."""

    def __init__(self, n_vocab: int):
        self.n_vocab = n_vocab
        self._bits = np.zeros((0, (n_vocab + 31) // 32), np.int32)

    def fill(self, constraints: list[Constraint]) -> np.ndarray:
        """bool [len(constraints), vocab]: the tokens each sequence's grammar allows next."""
        n = len(constraints)
        if self._bits.shape[0] < n:
            self._bits = np.zeros((n, self._bits.shape[1]), np.int32)
        row_bytes = self._bits.shape[1] * 4
        for i, c in enumerate(constraints):
            c.matcher.unsafe_compute_mask_ptr(self._bits[i].ctypes.data, row_bytes)
        bits = self._bits[:n]
        return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.n_vocab].view(bool)


class _TokenTable:
    """What llguidance's TokenizerWrapper reads of a tokenizer: every token's bytes, and how to tokenize text."""

    def __init__(self, tokenizer, n_vocab: int):
        self._tokenizer = tokenizer
        # rows of the logits past the vocabulary (an embedding padded to a round size) are tokens of no text
        self.tokens = token_bytes(tokenizer)
        self.tokens += [b""] * (n_vocab - len(self.tokens))
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.control_ids)

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return self._tokenizer.encode(text, add_bos=False)


def _first_line(message: str) -> str:
    lines = (message or "").strip().splitlines()
    return lines[0][:300] if lines else "unknown error"
