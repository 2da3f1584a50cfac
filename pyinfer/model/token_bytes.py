"""Each token's bytes, as the model writes them: what a grammar engine matches generated text against.

A GGUF vocabulary stores a token's text in its tokenizer's alphabet: byte-level BPE ("gpt2") maps each byte to a
printable character (GPT-2's table), SentencePiece ("llama") and its BPE form ("gemma4") write spaces as U+2581 and
bytes that are not text as <0xNN>. Control tokens (<|im_end|>, [TOOL_CALLS]) are not text at all: they get the
0xFF prefix llguidance reads as "special" (no UTF-8 text starts with 0xFF), so a grammar names them as tokens and a
string literal never matches them. User-defined tokens (Qwen's <tool_call>) are text: their raw characters."""
from __future__ import annotations

import re

from .tokenizer_spm import TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED

SPECIAL_PREFIX = b"\xff"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 bytes stand for themselves, the other 68
    bytes take the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def token_bytes(tokenizer) -> list[bytes]:
    """[vocab] the bytes each token id writes (control tokens: 0xFF + their text)."""
    alphabet = byte_level_alphabet() if tokenizer.kind == "gpt2" else None
    out, control = [], tokenizer.control_ids
    for i, (text, kind) in enumerate(zip(tokenizer.tokens, tokenizer.types)):
        if kind == TOKEN_TYPE_CONTROL or i in control:  # SentencePiece's <unk> too
            out.append(SPECIAL_PREFIX + text.encode("utf-8"))
        elif kind == TOKEN_TYPE_USER_DEFINED:
            out.append(text.encode("utf-8"))
        elif alphabet is not None:
            # a character outside the alphabet cannot come from a byte-level merge: keep its UTF-8 as is
            out.append(b"".join(bytes([alphabet[c]]) if c in alphabet else c.encode("utf-8") for c in text))
        elif kind == TOKEN_TYPE_BYTE and _BYTE_TOKEN.fullmatch(text):
            out.append(bytes([int(text[3:5], 16)]))
        else:
            out.append(text.replace("\u2581", " ").encode("utf-8"))
    return out
