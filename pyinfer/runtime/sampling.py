"""Token sampling on the host: greedy, temperature, top-k, top-p (llama.cpp's defaults), and OpenAI's presence and
frequency penalties.

Every value is checked when the sampler is built (a bad one is a one-line PyinferError naming it), and sampling
itself cannot produce NaN: the softmax runs in log space from the best candidate, so even a temperature of 1e-308
gives probabilities in [0, 1], and anything not finite falls back to the best token."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..errors import PyinferError

SEED_MAX = (1 << 64) - 1      # seeds are 0..2^64-1 (numpy's generators take any non-negative integer)
MIN_TEMPERATURE = 1e-6        # below this, temperature sampling is greedy in all but name: run greedy
PENALTY_LIMIT = 2.0           # OpenAI's range for presence_penalty and frequency_penalty


@dataclass
class SamplingParams:
    temperature: float = 0.8   # <= MIN_TEMPERATURE (0 or less included): greedy
    top_k: int = 40            # 0: whole vocabulary
    top_p: float = 0.95        # 1.0: off
    seed: int | None = None
    presence_penalty: float = 0.0    # subtracted once from every token already generated
    frequency_penalty: float = 0.0   # subtracted per occurrence

    def validate(self) -> None:
        def number(name: str, v) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not np.isfinite(v):
                raise PyinferError(f"{name} must be a finite number, got {v!r}")
            return float(v)

        number("temperature", self.temperature)  # <= 0 is greedy, as in llama.cpp
        if not (0.0 < number("top_p", self.top_p) <= 1.0):
            raise PyinferError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise PyinferError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or not 0 <= self.seed <= SEED_MAX):
            raise PyinferError(f"seed must be an integer in [0, 2^64 - 1], got {self.seed!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if abs(number(name, getattr(self, name))) > PENALTY_LIMIT:
                raise PyinferError(f"{name} must be in [-{PENALTY_LIMIT:g}, {PENALTY_LIMIT:g}], "
                                   f"got {getattr(self, name)}")


MAX_TOP_LOGPROBS = 20  # alternatives per token a client may ask for (OpenAI's limit)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """F32 [..., vocab] -> F64 log-probabilities over the last axis (the model's own distribution: no temperature,
    no penalties), log-sum-exp taken from each row's largest logit."""
    x = logits.astype(np.float64)
    mx = x.max(axis=-1, keepdims=True)
    return x - (np.log(np.exp(x - mx).sum(axis=-1, keepdims=True)) + mx)


def token_logprob(logits: np.ndarray, token: int, top: int) -> tuple[int, float, list[tuple[int, float]]]:
    """(token, its log-probability, the `top` most likely tokens and theirs, best first) from F32 [vocab] logits."""
    lp = log_softmax(logits)
    best: list[tuple[int, float]] = []
    if top > 0:
        ids = np.argpartition(-lp, top - 1)[:top] if top < lp.shape[0] else np.arange(lp.shape[0])
        ids = ids[np.argsort(-lp[ids], kind="stable")]
        best = [(int(i), float(lp[i])) for i in ids]
    return int(token), float(lp[token]), best


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest logits, in no order. A partition of a whole 152k vocabulary costs about 1 ms per
    token, so a large one is first cut at a bound: the k-th largest of every 64th logit. At least k logits reach
    it (those k among them), so the k largest all do, and the partition runs over the few thousand that pass."""
    n = logits.shape[0]
    if k >= n:
        return np.arange(n)
    if n >= 64 * k and n > 8192:
        bound = np.partition(logits[::64], -k)[-k]
        passing = np.flatnonzero(logits >= bound)
        return passing if passing.shape[0] == k else passing[np.argpartition(logits[passing], -k)[-k:]]
    return np.argpartition(logits, -k)[-k:]


class Sampler:
    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.rng = np.random.default_rng(params.seed)
        self.counts: Counter[int] = Counter()  # tokens sampled so far (the penalties' history)

    @property
    def greedy(self) -> bool:
        return self.p.temperature <= MIN_TEMPERATURE

    def __call__(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> int:
        """logits: F32 [vocab] -> token id (and remembered for the penalties). `allowed`: bool [vocab], the tokens a
        grammar lets come next (the rest are never picked); at least one must be allowed."""
        scores = self._penalized(logits)
        if allowed is None:
            tok = self._pick(scores)
        else:  # sampling among the allowed alone is sampling from the masked distribution
            ids = np.flatnonzero(allowed)
            if ids.size == 0:
                raise PyinferError("the grammar allows no next token")
            tok = int(ids[self._pick(scores[ids])])
        self.counts[tok] += 1
        return tok

    def _penalized(self, logits: np.ndarray) -> np.ndarray:
        if not np.isfinite(logits).all():  # corrupt weights (or an overflow): never sample from NaN
            raise PyinferError("the model produced non-finite logits (NaN or Inf): its weights may be corrupt")
        if not self.counts or (self.p.presence_penalty == 0.0 and self.p.frequency_penalty == 0.0):
            return logits
        ids = np.fromiter(self.counts.keys(), np.int64, len(self.counts))
        n = np.fromiter(self.counts.values(), np.float64, len(self.counts))
        out = logits.astype(np.float64)
        out[ids] -= self.p.presence_penalty + self.p.frequency_penalty * n
        return out

    def _pick(self, logits: np.ndarray) -> int:
        best = int(np.argmax(logits))
        if self.greedy:
            return best
        k = self.p.top_k if 0 < self.p.top_k < logits.shape[0] else logits.shape[0]
        cand = top_k_ids(logits, k)
        cand = cand[np.argsort(logits[cand])[::-1]]          # best first
        # Log space from the best candidate: z <= 0, so exp never overflows; a tiny temperature sends the rest to
        # -inf and their probabilities to exactly 0.
        z = (logits[cand].astype(np.float64) - float(logits[cand[0]])) / self.p.temperature
        probs = np.exp(z)
        total = probs.sum()
        if not np.isfinite(total) or total <= 0.0:
            return best
        probs /= total
        if self.p.top_p < 1.0:
            keep = min(int(np.searchsorted(np.cumsum(probs), self.p.top_p) + 1), len(cand))
            probs = probs[:keep] / probs[:keep].sum()
            cand = cand[:keep]
        return int(cand[self.rng.choice(len(cand), p=probs)])
