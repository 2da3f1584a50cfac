"""The activation profile of a model: per layer, the distribution of the activation criterion and
how often each neuron fires. Thresholds for any target sparsity and the hot-first neuron order are
read from it.

Histograms are over log10 of the criterion: fine and global per layer (for thresholds), coarse per
neuron (for firing frequencies), so a profile costs a few MB whatever the number of tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import PyinferError
from ..tools.atomic_file import atomic_write
from .plan import MODES, SparsityFileError, read_npz

LOG_LO, LOG_HI = -8.0, 3.0
FINE_BINS, COARSE_BINS = 4096, 88   # 372 and 8 bins per decade
JOINT_BINS = 220                    # 20 per decade, for the joint (|act(gate)|, criterion) histogram
PROFILE_FORMAT, PROFILE_VERSION = "pyinfer-profile", 1


def _bins(v: np.ndarray, n: int) -> np.ndarray:
    """Bin index of each value; zeros (and anything below 1e-8) land in bin 0."""
    with np.errstate(divide="ignore"):
        lg = np.log10(np.maximum(v, 1e-30))
    return np.clip(((lg - LOG_LO) / (LOG_HI - LOG_LO) * n).astype(np.int64), 0, n - 1)


def _edge(i: float, n: int) -> float:
    return 10.0 ** (LOG_LO + (LOG_HI - LOG_LO) * i / n)


@dataclass
class Profile:
    mode: str
    tokens: int
    hist: np.ndarray                  # I64 [L, FINE_BINS] per layer, all neurons
    gate_hist: np.ndarray             # I64 [L, FINE_BINS] of |act(gate)| (CATS), SwiGLU and GeGLU only
    neuron_hist: np.ndarray           # I64 [L, d_ff, COARSE_BINS]
    joint_hist: np.ndarray            # I64 [L, JOINT_BINS (gate), JOINT_BINS (criterion)]
    fingerprint: str
    info: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, mode: str, n_layers: int, d_ff: int, fingerprint: str, info: dict) -> "Profile":
        if mode not in MODES:
            raise PyinferError(f"unknown sparsity mode {mode!r} (choose from {', '.join(MODES)})")
        z = np.zeros((n_layers, FINE_BINS), np.int64)
        return cls(mode, 0, z, z.copy(), np.zeros((n_layers, d_ff, COARSE_BINS), np.int64),
                   np.zeros((n_layers, JOINT_BINS, JOINT_BINS), np.int64), fingerprint, info)

    def add(self, layer: int, crit: np.ndarray, gate_crit: np.ndarray | None) -> None:
        """crit: F32 [T, d_ff] criterion values of one batch."""
        self.hist[layer] += np.bincount(_bins(crit, FINE_BINS).ravel(), minlength=FINE_BINS)
        if gate_crit is not None:
            self.gate_hist[layer] += np.bincount(_bins(gate_crit, FINE_BINS).ravel(), minlength=FINE_BINS)
            joint = _bins(gate_crit, JOINT_BINS) * JOINT_BINS + _bins(crit, JOINT_BINS)
            self.joint_hist[layer] += np.bincount(joint.ravel(), minlength=JOINT_BINS ** 2).reshape(JOINT_BINS,
                                                                                                   JOINT_BINS)
        d_ff = crit.shape[1]
        flat = (np.arange(d_ff) * COARSE_BINS + _bins(crit, COARSE_BINS)).ravel()
        self.neuron_hist[layer] += np.bincount(flat, minlength=d_ff * COARSE_BINS).reshape(d_ff, COARSE_BINS)

    # ---- queries ----------------------------------------------------------------------------
    @staticmethod
    def _quantile(hist: np.ndarray, q: float) -> float:
        """Value below which a fraction q of samples lies (log-interpolated within the bin)."""
        c = np.cumsum(hist) / max(1, hist.sum())
        i = int(np.searchsorted(c, q))
        if i >= len(hist):
            return _edge(len(hist), len(hist))
        below = c[i - 1] if i > 0 else 0.0
        frac = (q - below) / max(1e-12, c[i] - below)
        return _edge(i + frac, len(hist))

    def thresholds(self, target: float, criterion: str | None = None) -> np.ndarray:
        """Per-layer t_l such that a fraction `target` of neuron activations fall below it."""
        if self.mode == "relu":
            return np.zeros(len(self.hist))  # exact sparsity: a ReLU neuron is off at zero
        hist = self.gate_hist if criterion == "gate" else self.hist
        return np.array([self._quantile(h, target) for h in hist])

    def gate_cuts(self, thresholds: np.ndarray, recall: float) -> np.ndarray:
        """Per layer: the largest cut on |act(gate)| that keeps at least `recall` of the neurons whose
        criterion exceeds the layer's threshold (the gate-first candidate filter)."""
        out = np.zeros(len(thresholds))
        for il, t in enumerate(thresholds):
            # floor: the bin holding t counts as active, which errs toward keeping more (recall first)
            lo = int(np.floor((np.log10(max(t, 1e-30)) - LOG_LO) / (LOG_HI - LOG_LO) * JOINT_BINS))
            g = self.joint_hist[il][:, max(lo, 0):].sum(axis=1)  # gate distribution of the active
            if g.sum() == 0:
                continue
            kept_from_top = np.cumsum(g[::-1]) / g.sum()
            b = JOINT_BINS - 1 - int(np.searchsorted(kept_from_top, recall))
            out[il] = _edge(max(b, 0), JOINT_BINS) if b > 0 else 0.0
        return out

    def frequencies(self, thresholds: np.ndarray) -> np.ndarray:
        """F64 [L, d_ff]: how often each neuron's criterion exceeds its layer's threshold."""
        out = np.zeros(self.neuron_hist.shape[:2])
        for il, t in enumerate(thresholds):
            nh = self.neuron_hist[il]
            pos = (np.log10(max(t, 1e-30)) - LOG_LO) / (LOG_HI - LOG_LO) * COARSE_BINS
            b = int(np.clip(np.floor(pos), 0, COARSE_BINS - 1))
            frac_above = 1.0 - (pos - b) if 0 <= pos < COARSE_BINS else 0.0
            above = nh[:, b + 1:].sum(axis=1) + frac_above * nh[:, b]
            out[il] = above / max(1, nh[0].sum())
        return out

    def hot_first_order(self, thresholds: np.ndarray) -> np.ndarray:
        """I32 [L, d_ff]: neurons by descending firing frequency (stable)."""
        f = self.frequencies(thresholds)
        return np.argsort(-f, axis=1, kind="stable").astype(np.int32)

    def share_for_mass(self, thresholds: np.ndarray, mass: float = 0.8) -> np.ndarray:
        """Per layer: the fraction of neurons that produce `mass` of all activations (PowerInfer's skew)."""
        f = np.sort(self.frequencies(thresholds), axis=1)[:, ::-1]
        c = np.cumsum(f, axis=1) / np.maximum(f.sum(axis=1, keepdims=True), 1e-12)
        return (np.argmax(c >= mass, axis=1) + 1) / f.shape[1]

    # ---- file -------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        header = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "mode": self.mode, "tokens": self.tokens,
                  "fingerprint": self.fingerprint, "info": self.info}
        return atomic_write(path, lambda f: np.savez_compressed(
            f, header=np.frombuffer(json.dumps(header).encode(), np.uint8), hist=self.hist, gate_hist=self.gate_hist,
            neuron_hist=self.neuron_hist.astype(np.uint32), joint_hist=self.joint_hist))

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None, n_layers: int | None = None,
             d_ff: int | None = None) -> "Profile":
        path = Path(path)
        header, z = read_npz(path, "profile", PROFILE_FORMAT, PROFILE_VERSION)
        try:
            hist, gate_hist, nh, joint = z["hist"], z["gate_hist"], z["neuron_hist"], z["joint_hist"]
        except KeyError:
            raise SparsityFileError(f"{path} is not a complete pyinfer profile") from None
        tokens = header.get("tokens")
        if not (isinstance(header.get("fingerprint"), str) and header.get("mode") in MODES
                and isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0
                and isinstance(header.get("info", {}), dict)):
            raise SparsityFileError(f"{path} is corrupt (its header's fingerprint, mode, tokens or info)")
        # The shapes every query indexes by (a damaged file used to fail deep inside numpy, in a traceback).
        n_layers = hist.shape[0] if hist.ndim == 2 else -1
        want = {"hist": (hist, (n_layers, FINE_BINS)), "gate_hist": (gate_hist, (n_layers, FINE_BINS)),
                "neuron_hist": (nh, (n_layers, nh.shape[1] if nh.ndim == 3 else -1, COARSE_BINS)),
                "joint_hist": (joint, (n_layers, JOINT_BINS, JOINT_BINS))}
        for name, (a, shape) in want.items():
            if a.shape != shape or a.dtype.kind not in "iu" or n_layers < 1 or (a.size and a.min() < 0):
                raise SparsityFileError(f"{path} is corrupt ({name} is {a.dtype} {list(a.shape)}, "
                                        f"expected non-negative counts of shape {list(shape)})")
        if fingerprint is not None and header["fingerprint"] != fingerprint:
            raise SparsityFileError(f"{path} was profiled on a different model")
        if (n_layers, d_ff) != (None, None) and nh.shape[:2] != (n_layers, d_ff):
            raise SparsityFileError(f"{path} holds {nh.shape[0]} layers of {nh.shape[1]} neurons; the model has "
                                    f"{n_layers} of {d_ff}")
        counts = [a.astype(np.int64, copy=False) for a in (hist, gate_hist, nh, joint)]
        return cls(header["mode"], tokens, *counts, header["fingerprint"], header.get("info", {}))
