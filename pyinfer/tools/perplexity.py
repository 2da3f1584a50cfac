"""Perplexity with llama.cpp's protocol: consecutive non-overlapping windows of n_ctx tokens,
each evaluated from an empty cache; the second half of each window is scored."""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np

from ..runtime.sampling import log_softmax

from ..errors import PyinferError


@dataclass
class PerplexityResult:
    perplexity: float
    windows: int
    ctx: int
    scored_tokens: int
    total_tokens: int
    window_ppl: list[float]
    path: str = "dense"  # "dense", or "sparse decode" when every token ran the sparse FFN

    def as_dict(self) -> dict:
        return asdict(self)


def log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits: F32 [n, vocab]; targets: [n] -> F64 [n] log-probabilities of the targets."""
    return log_softmax(logits)[np.arange(len(targets)), targets]


def perplexity(model, text: str, ctx: int = 512, windows: int | None = None, progress: bool = True) -> PerplexityResult:
    """Each window is one run of ctx tokens. A sparse model scores its sparse path only when loaded with
    emulate_prefill=True (what `pyinfer perplexity --sparsity` does); otherwise prefill runs dense."""
    from tqdm import tqdm

    if ctx < 4:
        raise PyinferError("--ctx must be at least 4")
    if ctx > model.n_ctx:
        raise PyinferError(f"--ctx {ctx} exceeds the model context {model.n_ctx}")
    tokens = model.tokenize(text, add_bos=False)
    n_avail = len(tokens) // ctx
    if n_avail == 0:
        raise PyinferError(f"text has {len(tokens)} tokens; need at least {ctx} for one window")
    n = n_avail if windows is None else min(windows, n_avail)
    first = ctx // 2
    # As llama.cpp: logits at positions first .. ctx-2 predict tokens first+1 .. ctx-1.
    rows = np.arange(first, ctx - 1)
    nll, count, per_window = 0.0, 0, []
    bar = tqdm(range(n), desc="perplexity", unit="window", disable=not progress, file=sys.stderr)
    for w in bar:
        chunk = list(tokens[w * ctx:(w + 1) * ctx])
        if model.tokenizer.add_bos:
            chunk[0] = model.tokenizer.bos_id  # llama.cpp replaces the first token with BOS
        logits = model.forward(chunk, 0, rows)
        lp = log_softmax_at(logits, np.asarray(chunk, dtype=np.int64)[rows + 1])
        nll -= lp.sum()
        count += len(lp)
        per_window.append(math.exp(-lp.mean()))
        bar.set_postfix(ppl=f"{math.exp(nll / count):.4f}")
    path = "sparse decode" if getattr(model, "emulate_prefill", False) else "dense"
    return PerplexityResult(math.exp(nll / count), n, ctx, count, len(tokens), per_window, path)
