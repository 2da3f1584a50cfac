"""Log-probabilities as OpenAI's two APIs shape them, from the engine's (token, logprob, alternatives) entries
(runtime/sampling.token_logprob: the model's own distribution, before temperature and penalties, as vLLM and
llama-server report it).

Completions (legacy): {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, with `echo` the prompt's tokens
first (the very first has no log-probability: nothing comes before it). Chat: {"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}]}. A token's text is its own decoding, which may be part of a character; its bytes
are that text's UTF-8."""
from __future__ import annotations

Entry = tuple  # (token id, log-probability or None, [(alternative id, log-probability), ...] or None)


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special=False)


def completion_logprobs(tokenizer, entries: list[Entry], offset: int = 0) -> dict:
    """The legacy object for `entries`, text offsets counted from `offset` (the characters before them)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for token, lp, alternatives in entries:
        text = token_text(tokenizer, token)
        tokens.append(text)
        logprobs.append(lp)
        tops.append(None if alternatives is None else {token_text(tokenizer, t): v for t, v in alternatives})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer, entries: list[Entry]) -> dict:
    def item(token: int, lp: float) -> dict:
        text = token_text(tokenizer, token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [dict(item(token, lp), top_logprobs=[item(t, v) for t, v in alternatives or []])
                        for token, lp, alternatives in entries]}


def prompt_entries(prompt_ids: list[int], scores: list[Entry], alternatives: int) -> list[Entry]:
    """`echo`: the prompt's first token (no log-probability) and the scored rest."""
    return [(prompt_ids[0], None, None)] + [(t, lp, alts if alternatives else []) for t, lp, alts in scores]
