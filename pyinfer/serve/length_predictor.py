"""The lower end l of a request's output-length interval [l, u] (u is max_tokens).

A client may send one (`pyinfer_min_output_tokens`, an extension field). Otherwise it is learned
online from finished requests, per bucket of prompt length (powers of two): the 10th percentile of
the output lengths seen in the bucket, once it holds 8 of them; 1 before that."""
from __future__ import annotations

from collections import defaultdict, deque

import numpy as np


class LengthPredictor:
    def __init__(self, quantile: float = 0.1, min_samples: int = 8, window: int = 512):
        self.quantile, self.min_samples = quantile, min_samples
        self._seen: dict[int, deque] = defaultdict(lambda: deque(maxlen=window))

    @staticmethod
    def _bucket(prompt_len: int) -> int:
        return max(0, int(prompt_len).bit_length() - 1)

    def lower_bound(self, prompt_len: int, upper: int, client_lower: int | None = None) -> int:
        if client_lower is not None:
            return int(min(max(1, client_lower), upper))
        seen = self._seen.get(self._bucket(prompt_len))
        if not seen or len(seen) < self.min_samples:
            return 1
        return int(min(upper, max(1, np.quantile(np.asarray(seen), self.quantile))))

    def observe(self, prompt_len: int, output_len: int) -> None:
        self._seen[self._bucket(prompt_len)].append(max(1, output_len))
