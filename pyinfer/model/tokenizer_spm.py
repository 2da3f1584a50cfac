"""SentencePiece vocabularies (GGUF `tokenizer.ggml.model == "llama"`) as `tokenizers` BPE models with llama.cpp's ids.

llama.cpp's SPM tokenizer (llm_tokenizer_spm) starts from the characters of the text and keeps merging the adjacent
pair whose concatenation is the vocabulary token with the highest score (the leftmost pair on a tie); a character
that is not a token becomes the byte tokens <0xNN> of its UTF-8 encoding. A `tokenizers` BPE model does the same when
its merges are every split of every token into two tokens, ranked by the merged token's score, and byte_fallback is
on: this is how transformers' GGUF integration builds Llama and Gemma tokenizers.

Around the merges, llama.cpp first cuts user-defined tokens (and, when asked, control tokens) out of the text; in
each remaining piece it writes " " as "▁" and, with add_space_prefix, puts one "▁" in front. `tokenizers` does the
cutting with added tokens and normalizes each piece between them separately, so a normalizer reproduces the rest."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import ModelFormatError

# Token types in GGUF (llama.cpp's llama_token_type).
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6
SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
# Tokens llama.cpp treats as end-of-generation; it retypes them as control when it loads a vocabulary, whatever the
# file says, so with parse_special off their text is ordinary text (Gemma 3 ships "</s>" as user-defined).
_LLAMACPP_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
})


class SpmTokenizers(NamedTuple):
    plain: object               # tokenizers.Tokenizer: user-defined tokens are matched, control-token text is text
    special: object             # the same, and control tokens in the text become their ids
    special_ids: frozenset      # control, unknown and user-defined ids (as llama.cpp types them)
    control_ids: frozenset      # control and unknown ids only: what the plain tokenizer never produces from text
    max_token_bytes: int        # bytes of input text the longest token stands for


def build_spm_tokenizers(tokens: list[str], types: list[int], metadata: dict, unk_id: int | None) -> SpmTokenizers:
    """The two `tokenizers` tokenizers for a SentencePiece vocabulary (tokens and types already checked), or a
    one-line ModelFormatError."""
    from tokenizers import AddedToken, models
    from tokenizers import Tokenizer as HFTokenizer

    scores = _checked_scores(metadata.get("tokenizer.ggml.scores"), len(tokens))
    vocab = _checked_token_ids(tokens)
    add_space_prefix = _flag(metadata, "tokenizer.ggml.add_space_prefix", True)  # llama.cpp's default for SPM
    # One model shared by both tokenizers: the merge table is built once.
    unk = None if unk_id is None else tokens[unk_id]
    model = models.BPE(vocab=vocab, merges=_merges_by_score(tokens, scores, vocab), unk_token=unk,
                       byte_fallback=True, fuse_unk=False)
    types = _llamacpp_types(tokens, types)
    user_defined = [AddedToken(tokens[i], special=False, normalized=False)
                    for i, t in enumerate(types) if t == TOKEN_TYPE_USER_DEFINED]
    control = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)]

    def make(with_control: bool) -> HFTokenizer:
        tk = HFTokenizer(model)
        tk.normalizer, tk.decoder = _normalizer(add_space_prefix), _decoder(add_space_prefix)
        # llama.cpp cuts user-defined tokens out even when not parsing special tokens. It tries the longest token
        # first where `tokenizers` takes the leftmost-longest match: the two differ only for tokens that overlap
        # (a suffix of one starting another), and Gemma 3 has none but runs of one character, where they agree.
        tk.add_tokens(user_defined)
        if with_control:
            tk.add_special_tokens(control)
        return tk

    special_ids = frozenset(i for i, t in enumerate(types)
                            if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED))
    control_ids = frozenset(i for i, t in enumerate(types) if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN))
    return SpmTokenizers(make(False), make(True), special_ids, control_ids, _max_token_bytes(tokens, types))


def _merges_by_score(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every way to write a token as two tokens, best merged score first. llama.cpp looks a pair up by the text it
    would form, so a token reachable by several splits gets each of them, all at the token's priority.

    On equal scores llama.cpp merges the leftmost pair while `tokenizers` merges the pair listed first (here in id
    order); the results differ only if two such merges compete for a symbol. Gemma 3's normal tokens all have
    distinct scores (ties are among control, user-defined and byte tokens)."""
    merges = []
    # sorted() is stable with reverse=True too: equal scores keep id order.
    for i in sorted(range(len(tokens)), key=scores.__getitem__, reverse=True):
        text = tokens[i]
        for cut in range(1, len(text)):
            left, right = text[:cut], text[cut:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges


def _llamacpp_types(tokens: list[str], types: list[int]) -> list[int]:
    """Token types as llama.cpp uses them: end-of-generation texts are control tokens."""
    eog = {i for i, t in enumerate(tokens) if t in _LLAMACPP_EOG_TEXTS}
    if eog:
        return [TOKEN_TYPE_CONTROL if i in eog else t for i, t in enumerate(types)]
    return types


def _normalizer(add_space_prefix: bool):
    from tokenizers import normalizers

    escape = normalizers.Replace(" ", SPACE_MARK)
    if not add_space_prefix:
        return escape
    # Prepend leaves an empty piece empty, as llama.cpp does (it never tokenizes an empty fragment).
    return normalizers.Sequence([normalizers.Prepend(SPACE_MARK), escape])


def _decoder(add_space_prefix: bool):
    """▁ back to spaces, <0xNN> back to bytes and, when the encoder added a leading space, that space removed
    (llama.cpp's detokenize strips it likewise)."""
    from tokenizers import decoders

    steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def _max_token_bytes(tokens: list[str], types: list[int]) -> int:
    """Bytes of input text one token can stand for: ▁ is one space byte and a byte token is one byte."""
    return max(1 if ty == TOKEN_TYPE_BYTE else len(t.replace(SPACE_MARK, " ").encode("utf-8"))
               for t, ty in zip(tokens, types))


def _checked_scores(scores, n_tokens: int) -> list[float]:
    if isinstance(scores, np.ndarray) and scores.dtype.kind in "iuf":  # as the GGUF reader gives numeric arrays
        scores = scores.tolist()
    if not isinstance(scores, list) or len(scores) != n_tokens:
        got = f"{len(scores)} scores" if isinstance(scores, list) else "none"
        raise ModelFormatError(f"tokenizer.ggml.scores must give one score per token ({n_tokens} tokens, {got})")
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) and not math.isnan(s) for s in scores):
        raise ModelFormatError("tokenizer.ggml.scores holds a value that is not a number")
    return scores


def _checked_token_ids(tokens: list[str]) -> dict[str, int]:
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ModelFormatError(f"tokenizer.ggml.tokens lists {dup!r} twice")
    missing = [b for b in BYTE_TOKENS if b not in vocab]
    if missing:
        # Without them a character the vocabulary lacks has no ids (llama.cpp aborts on it).
        raise ModelFormatError(f"the SentencePiece vocabulary lacks {len(missing)} of the 256 byte tokens "
                               f"<0x00>..<0xFF> (first missing: {missing[0]})")
    return vocab


def _flag(metadata: dict, key: str, default: bool) -> bool:
    v = metadata.get(key, default)
    if not isinstance(v, bool):
        raise ModelFormatError(f"{key} is {v!r}, not a boolean")
    return v
