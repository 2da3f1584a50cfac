"""The check every stateful model's test makes: a prompt's first tokens in one run, then the rest one at a time,
give the logits the whole prompt gave (a KV cache, a recurrent state or a borrowed cache carried between runs)."""
import numpy as np


def assert_decode_gives(m, ids: list[int], want: np.ndarray, split: int = 8) -> None:
    """`want`: F32 [len(ids), vocab], every position's logits from one run."""
    m.forward(ids[:split], 0, np.arange(split))
    steps = np.stack([m.forward([t], split + i, np.array([0]))[0] for i, t in enumerate(ids[split:])])
    np.testing.assert_allclose(steps, want[split:], rtol=1e-4, atol=1e-4 * np.abs(want).max())
