"""Token sampling on the host: greedy, temperature, top-k, top-p (llama.cpp's defaults)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PyinferError


@dataclass
class SamplingParams:
    temperature: float = 0.8   # <= 0: greedy
    top_k: int = 40            # <= 0: whole vocabulary
    top_p: float = 0.95        # 1.0: off
    seed: int | None = None

    def validate(self) -> None:
        if not np.isfinite(self.temperature):
            raise PyinferError(f"temperature must be a finite number, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise PyinferError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """logits: F32 [vocab] -> token id."""
        if not np.isfinite(logits).all():  # corrupt weights (or an overflow): never sample from NaN
            raise PyinferError("the model produced non-finite logits (NaN or Inf): its weights may be corrupt")
        if self.p.temperature <= 0.0:
            return int(np.argmax(logits))
        k = self.p.top_k if 0 < self.p.top_k < logits.shape[0] else logits.shape[0]
        cand = np.argpartition(logits, -k)[-k:] if k < logits.shape[0] else np.arange(logits.shape[0])
        cand = cand[np.argsort(logits[cand])[::-1]]          # best first
        z = logits[cand].astype(np.float64) / self.p.temperature
        probs = np.exp(z - z[0])
        probs /= probs.sum()
        if self.p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.p.top_p) + 1)
            probs = probs[:keep] / probs[:keep].sum()
            cand = cand[:keep]
        return int(cand[self.rng.choice(len(cand), p=probs)])
