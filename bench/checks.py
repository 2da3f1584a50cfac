"""Numpy references the benchmarks check their result against once, before timing: a broken kernel must
fail here instead of looking fast."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, quants


def deq(blocks: np.ndarray, qtype, rows: int, cols: int) -> np.ndarray:
    """F32 [rows, cols] from stored blocks (gguf-py is the reference for the weight formats)."""
    return quants.dequantize(np.asarray(blocks), GGMLQuantizationType(int(qtype))).reshape(rows, cols)


def q8a(x: np.ndarray) -> np.ndarray:
    """What the integer-dot kernels see of an activation: per 32 values, d = amax/127, q = rint(x/d)."""
    xb = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(xb).max(-1, keepdims=True)
    idv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return (np.rint(xb * idv) * (amax / np.float32(127.0))).reshape(x.shape).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def check_close(got: np.ndarray, want: np.ndarray, what: str, rel: float = 2e-2) -> None:
    """Relative to the result's scale: loose enough for activation and down re-quantization, far too tight
    for a kernel that skips rows, reads the wrong ones or writes garbage."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-6)
    err = float(np.abs(got - want).max()) / scale
    if not np.isfinite(err) or err > rel:
        raise AssertionError(f"{what}: result differs from the numpy reference (max error {err:.3g} of scale)")


def run_and_check(eng, n_tok: int, out_id: int, want: np.ndarray, what: str, rel: float = 2e-2, **run_kw) -> None:
    eng.run(n_tok, **run_kw)
    check_close(eng.tensor(out_id, want.shape[0]), want, what, rel)
