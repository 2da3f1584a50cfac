"""Builds the model's tokenizer from GGUF metadata with the `tokenizers` library.

Token ids must equal llama.cpp's, so the pre-tokenizer follows llama.cpp's table for
`tokenizer.ggml.pre` and special tokens are only matched when asked for (parse_special).
SentencePiece vocabularies ("llama") are built in tokenizer_spm.py."""
from __future__ import annotations

import bisect
from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, PyinferError, UnsupportedModelError
from .tokenizer_spm import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED, build_spm_tokenizers

# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp), per `tokenizer.ggml.pre`: splits applied in order
# before byte-level BPE. The case-insensitive contractions are spelled out ('[sS]) as llama.cpp adapts them.
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_REGEX = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# gpt-4o / o200k (gpt-oss, Llama 4): the models' own tokenizer.json regex (llama.cpp rewrites its letter classes
# with lookaheads for its regex engine; `tokenizers` takes the original). llama.cpp's vocab tests have no o200k file.
_GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"  # Han, the ranges llama.cpp lists, Hangul
_DEEPSEEK_LLM = [
    "[\\r\\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    _CJK,
    "\\p{N}+",
]
_DEEPSEEK_CODER = ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}"]
_FALCON = ["[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2_REGEX, "[0-9][0-9][0-9]"]
_STARCODER = [r"\p{N}", _GPT2_REGEX]  # every digit its own token, then GPT-2 splitting
PRE_TOKENIZERS = {
    # llama.cpp's default, for BPE files that name no pre-tokenizer (it warns that they may tokenize poorly)
    "default": ["[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2_REGEX, "\\p{N}+", "[0-9][0-9][0-9]"],
    "gpt2": [_GPT2_REGEX], "gpt-2": [_GPT2_REGEX], "phi-2": [_GPT2_REGEX],
    "mpt": [_GPT2_REGEX], "olmo": [_GPT2_REGEX], "roberta-bpe": [_GPT2_REGEX],
    "smollm": _STARCODER, "starcoder": _STARCODER, "refact": _STARCODER, "command-r": _STARCODER,
    "codeshell": _STARCODER, "exaone": _STARCODER,
    "llama-bpe": [_LLAMA3_REGEX], "llama3": [_LLAMA3_REGEX], "llama-v3": [_LLAMA3_REGEX], "dbrx": [_LLAMA3_REGEX],
    "smaug-bpe": [_LLAMA3_REGEX], "falcon3": [_LLAMA3_REGEX], "pixtral": [_LLAMA3_REGEX],
    "chatglm-bpe": [_LLAMA3_REGEX],
    "qwen2": [_QWEN2_REGEX], "deepseek-r1-qwen": [_QWEN2_REGEX], "stablelm2": [_QWEN2_REGEX],
    "qwen35": [_QWEN35_REGEX],
    "gpt-4o": [_GPT4O_REGEX], "llama4": [_GPT4O_REGEX],
    "deepseek-llm": _DEEPSEEK_LLM, "deepseek-coder": _DEEPSEEK_CODER, "falcon": _FALCON,
}
# Gemma 4 splits only at newlines (its merges run over whole lines).
_GEMMA4_REGEX = "[^\\n]+|[\\n]+"
# Pre-tokenizers whose words that are whole tokens of the vocabulary skip the merges (llama.cpp's
# ignore_merges; Hugging Face's BPE(ignore_merges=True)).
IGNORE_MERGES = {"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}
# Control tokens that end a turn even when they are not the declared EOS.
_END_OF_GENERATION_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["}
# Tokens llama.cpp makes control tokens by their text whatever type the file gives them (its vocabulary loader's
# "auto-detect special tokens by text"): every end-of-generation text above, and per fill-in-the-middle role
# whose id the metadata does not give, that role's texts. So with special tokens on, "</s>" in a Qwen 2 prompt
# is one token, as llama.cpp makes it. (llama.cpp stops at the first text of a role in its hash map's order;
# a vocabulary with two texts of one role gets both here.)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def _control_by_text(metadata: dict) -> set[str]:
    texts = set(_END_OF_GENERATION_TEXTS)
    for role, names in _FIM_TEXTS.items():
        if metadata.get(f"tokenizer.ggml.{role}_token_id") is None:
            texts.update(names)
    return texts


class Tokenizer:
    """Byte-level BPE ("gpt2") or SentencePiece ("llama") tokenizer with llama.cpp-compatible ids."""

    def __init__(self, metadata: dict):
        kind = metadata.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama", "gemma4"):
            raise UnsupportedModelError(f"tokenizer model '{kind}' is not supported yet (supported: \"gpt2\" "
                                        "byte-level BPE, \"llama\" SentencePiece, \"gemma4\" SentencePiece-style BPE)")
        regexes = _pre_tokenizer_regexes(metadata) if kind == "gpt2" else [_GEMMA4_REGEX] if kind == "gemma4" else []
        ignore_merges = str(metadata.get("tokenizer.ggml.pre") or "default") in IGNORE_MERGES
        tokens, merges, types = _checked_vocab(metadata)
        by_text = _control_by_text(metadata)
        types = [TOKEN_TYPE_CONTROL if t in by_text else ty for t, ty in zip(tokens, types)]
        if kind == "llama":
            unk_id = _opt_id(metadata.get("tokenizer.ggml.unknown_token_id"), len(tokens), "unknown")
            spm = build_spm_tokenizers(tokens, types, metadata, unk_id)
            self._plain, self._special, self.special_ids = spm.plain, spm.special, set(spm.special_ids)
            self.control_ids = set(spm.control_ids)
            self._max_token_bytes = spm.max_token_bytes
        else:
            self._plain, self._special, self.special_ids = _byte_level_bpe(tokens, merges, types, regexes,
                                                                           ignore_merges, kind != "gemma4")
            self.control_ids = {i for i in self.special_ids if types[i] == TOKEN_TYPE_CONTROL}
            # byte-level: one character per byte; gemma4: characters of up to 4 bytes
            self._max_token_bytes = max(len(t) for t in tokens) * (4 if kind == "gemma4" else 1)
        self.tokens = tokens
        self.kind, self.types = kind, types  # what token_bytes.token_bytes reads
        self.vocab_size = len(tokens)
        self.bos_id = _opt_id(metadata.get("tokenizer.ggml.bos_token_id"), len(tokens), "bos")
        self.eos_id = _opt_id(metadata.get("tokenizer.ggml.eos_token_id"), len(tokens), "eos")
        # llama.cpp adds BOS to SentencePiece prompts unless the file says not to.
        add_bos = metadata.get("tokenizer.ggml.add_bos_token", kind == "llama")
        self.add_bos = bool(add_bos) and self.bos_id is not None
        self.end_of_generation = {i for i in self.special_ids if tokens[i] in _END_OF_GENERATION_TEXTS}
        if self.eos_id is not None:
            self.end_of_generation.add(self.eos_id)

    def encode(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        tk = self._special if special else self._plain
        ids = tk.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def has_control_text(self, text: str) -> bool:
        return any(t in self.control_ids for t in self._special.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, text: str, content_spans: list[tuple[int, int]] | None,
                    contents: list[str] | None = None) -> list[int]:
        """A rendered chat prompt's ids (no BOS added) where only the template's own text may become control
        tokens: the characters in `content_spans` (from chat_spans) are the messages' text, and a control token
        found there is text typed by a user. Benign prompts get exactly `encode(text, special=True)`; a prompt
        whose content holds control-token text is tokenized piece by piece, template text with special tokens and
        content without (user-defined tokens match in both, as in llama.cpp; with a SentencePiece vocabulary that
        adds a space prefix, each piece then gets its own, which only such prompts see). `content_spans` None (a
        template that rewrites content): refused if one of `contents` holds control-token text, since nothing
        says where it landed."""
        enc = self._special.encode(text, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
        controls = [(s, e) for t, (s, e) in zip(ids, offsets) if t in self.control_ids]
        if content_spans is None:
            if contents is not None and any(self.has_control_text(c) for c in contents):
                raise PyinferError("this chat template rewrites message content, so control tokens in it cannot be "
                                   "told from the template's own: remove special-token text from the messages")
            return list(ids)
        if not any(_overlaps(content_spans, s, e) for s, e in controls):
            return list(ids)
        out, pos = [], 0
        for cs, ce in content_spans:
            if cs > pos:
                out += self._special.encode(text[pos:cs], add_special_tokens=False).ids
            out += self._plain.encode(text[cs:ce], add_special_tokens=False).ids
            pos = ce
        if pos < len(text):
            out += self._special.encode(text[pos:], add_special_tokens=False).ids
        return out

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self._special.decode(list(ids), skip_special_tokens=skip_special)

    def max_token_bytes(self) -> int:
        """Bytes of text the longest token stands for, so a text of B bytes has at least B / max_token_bytes()
        tokens."""
        return self._max_token_bytes

    def token_text(self, token_id: int) -> str:
        return self.tokens[token_id]


class IncrementalDecoder:
    """Turns a growing list of ids into text pieces without splitting multi-byte characters
    (the prefix/read offset method used by vLLM and TGI). A character takes at most 4 byte tokens, so a tail that
    still does not decode after MAX_PENDING tokens is invalid UTF-8: it is emitted as is (with U+FFFD), which keeps
    each push's work bounded however long a run of invalid bytes the model writes."""

    MAX_PENDING = 6

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        """`skip_special` off: special tokens are written as their text (a tool call's <tool_call> or [TOOL_CALLS],
        which the tool-call parser reads)."""
        self.tok, self.skip_special = tokenizer, skip_special
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tok.decode(self.ids[self.prefix:self.read], self.skip_special)
        after = self.tok.decode(self.ids[self.prefix:], self.skip_special)
        stuck = len(self.ids) - self.read > self.MAX_PENDING
        if len(after) > len(before) and (stuck or not after.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        if stuck:  # nothing new to show (a token of no text): drop the window rather than let it grow
            self.prefix = self.read = len(self.ids)
        return ""


def _overlaps(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) meets one of `spans` (sorted, disjoint [s, e) pairs): a bisection, not a scan."""
    i = bisect.bisect_right(spans, (start, float("inf"))) - 1  # the last span starting at or before `start`
    return any(s < end and start < e for s, e in spans[max(i, 0):i + 2])


def _pre_tokenizer_regexes(metadata: dict) -> list[str]:
    pre = str(metadata.get("tokenizer.ggml.pre") or "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"pre-tokenizer '{pre}' is not supported (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    return PRE_TOKENIZERS[pre]


def _byte_level_bpe(tokens: list[str], merges: list[tuple[str, str]], types: list[int], regexes: list[str],
                    ignore_merges: bool = False, byte_level: bool = True):
    """(plain, special, special ids) for a byte-level BPE vocabulary, or with `byte_level` off a
    SentencePiece-style one (Gemma 4: spaces become U+2581, merges run on raw UTF-8, <0xXX> byte tokens for
    what no token spells)."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {tok: i for i, tok in enumerate(tokens)}
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in regexes]
    # ByteLevel maps bytes to GPT-2's printable alphabet; its own regex is off because the
    # splits above already reproduce llama.cpp's.
    if byte_level:
        pre_tok = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        pre_tok = pre_tokenizers.Sequence(splits)

    def make() -> HFTokenizer:
        try:
            tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges,
                                        byte_fallback=not byte_level))
        except Exception as e:  # tokenizers reports a merge of unknown tokens as a plain Exception
            raise ModelFormatError(f"the tokenizer in this file is inconsistent ({str(e).splitlines()[0][:200]})") from None
        tk.pre_tokenizer = pre_tok
        if byte_level:
            tk.decoder = decoders.ByteLevel()
        else:
            tk.normalizer = normalizers.Replace(" ", "\u2581")
            tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        return tk

    plain = make()              # control-token text is ordinary text
    special = make()            # control tokens in the text become their ids
    special_ids = {i for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)}
    # User-defined tokens (MPT's runs of spaces) match in plain text too, as llama.cpp matches them without
    # parse_special; their text is raw, not in the byte-level alphabet.
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types)
            if t == TOKEN_TYPE_USER_DEFINED]
    if user:
        plain.add_tokens(user)
    special.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special_ids)])
    return plain, special, special_ids


def _opt_id(v, n: int, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise ModelFormatError(f"tokenizer.ggml.{what}_token_id {v!r} is not a token id of this vocabulary")
    return v


def _checked_vocab(metadata: dict) -> tuple[list[str], list[tuple[str, str]], list[int]]:
    """tokens, merges and token types, or a one-line ModelFormatError (a corrupt file decodes to None or to
    values of the wrong type)."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelFormatError("tokenizer.ggml.tokens is missing or not a list of UTF-8 strings")
    merges_raw = metadata.get("tokenizer.ggml.merges") or []
    if not isinstance(merges_raw, list) or not all(isinstance(m, str) and " " in m for m in merges_raw):
        raise ModelFormatError("tokenizer.ggml.merges is not a list of 'a b' strings")
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        types = [1] * len(tokens)
    if isinstance(types, np.ndarray) and types.dtype.kind in "iu":  # as the GGUF reader gives numeric arrays
        types = types.tolist()
    if (not isinstance(types, list) or len(types) != len(tokens)
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in types)):
        raise ModelFormatError("tokenizer.ggml.token_type does not give one integer type per token")
    return tokens, [tuple(m.split(" ", 1)) for m in merges_raw], types
