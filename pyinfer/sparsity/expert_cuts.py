"""CATS inside the experts of a Mixture of Experts: per layer and expert, the |act(gate)| below which a neuron is
left out of a decode step (its up row is not read and it adds nothing to down), calibrated so that a share
`target` of the expert's neurons falls below it on calibration text.

The router already skips all but k experts; this is the neuron grain beneath it (TurboSparse's idea, here with
calibrated cuts instead of ReLU fine-tuning and predictors). One threshold per expert, from the gate values of
the tokens routed to it; an expert routed too few tokens to be measured takes its layer's threshold. Cached per
model and target beside the routing profile (offload/experts.py), measured on the bundled calibration text.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _core
from ..errors import PyinferError, UnsupportedModelError
from ..model.config import GATE_FIRST, Activation, LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .recorder import Recorder, gate_criterion

CALIBRATION_TOKENS = 512
# The engine's GateFn per activation the cut inside the experts takes: the gate-first ones, and ReLU (ReGLU experts).
CUT_FN = {**GATE_FIRST, Activation.RELU: 3}
MIN_TOKENS = 8                    # tokens an expert must be routed to get a threshold of its own
_LOG_LO, _LOG_HI, _BINS = -8.0, 4.0, 1536   # log10 |act(gate)| histogram: 0.8% wide bins


@dataclass
class ExpertCuts:
    """thresholds: F32 [n_layers, n_expert], the |act(gate)| a neuron must exceed; tokens: I64 [n_layers,
    n_expert], how many calibration tokens each expert's threshold was measured on (0: its layer's)."""
    fingerprint: str
    target: float
    gate_fn: int                  # CUT_FN: the engine's GateFn of the model's activation
    thresholds: np.ndarray
    tokens: np.ndarray

    def bounds(self, il: int) -> np.ndarray:
        """F32 [n_expert, 3]: layer il's cuts as gate bounds (the expert matmul's `cut`)."""
        return np.ascontiguousarray(_core.gate_cut_bounds(self.gate_fn, self.thresholds[il]), dtype=np.float32)

    def summary(self) -> dict:
        own = self.tokens >= MIN_TOKENS
        return {"target": self.target, "experts_with_own_cut": float(own.mean()),
                "threshold_median": float(np.median(self.thresholds)), "exact": self.exact}

    @property
    def exact(self) -> bool:
        """ReGLU's cut at 0: the skipped neurons' terms are exactly 0."""
        return self.gate_fn == CUT_FN[Activation.RELU] and not self.thresholds.any()

    def save(self, path: Path) -> None:
        from ..tools.atomic_file import atomic_write

        atomic_write(path, lambda f: np.savez(f, fingerprint=self.fingerprint, target=self.target,
                                               gate_fn=self.gate_fn, thresholds=self.thresholds, tokens=self.tokens))

    @staticmethod
    def load(path: Path, fingerprint: str, cfg: LlamaConfig) -> "ExpertCuts | None":
        """The cached cuts, or None when absent, unreadable or for another model (then calibrated again)."""
        try:
            with np.load(path) as z:
                cuts = ExpertCuts(str(z["fingerprint"]), float(z["target"]), int(z["gate_fn"]),
                                  z["thresholds"].astype(np.float32), z["tokens"].astype(np.int64))
        except (OSError, ValueError, KeyError):
            return None
        shape = (cfg.n_layers, cfg.n_expert)
        if cuts.fingerprint != fingerprint or cuts.thresholds.shape != shape or cuts.tokens.shape != shape \
                or not np.isfinite(cuts.thresholds).all():
            return None
        return cuts


def exact_relu_cuts(gguf: GGUFModelFile, cfg: LlamaConfig) -> ExpertCuts:
    """A ReGLU MoE's cuts at 0 (SmallThinker): a neuron whose gate is not positive adds exactly nothing, so decode
    reads up only for the neurons whose gate is; nothing to calibrate, nothing lost."""
    shape = (cfg.n_layers, cfg.n_expert)
    return ExpertCuts(gguf.fingerprint(), 0.0, CUT_FN[Activation.RELU], np.zeros(shape, np.float32),
                      np.zeros(shape, np.int64))


def cuts_path(fingerprint: str, target: float) -> Path:
    from ..model.pull import cache_dir

    return cache_dir() / "experts" / f"{fingerprint[:20]}-cuts-t{round(target * 100):02d}.npz"


def calibrate_expert_cuts(gguf: GGUFModelFile, cfg: LlamaConfig, ids: list[int], target: float, n_threads: int,
                          progress: bool = True, max_tokens: int = CALIBRATION_TOKENS) -> ExpertCuts:
    """Runs `ids` through the model recording each layer's route and the chosen experts' gate, and returns the
    `target` quantile of |act(gate)| per expert (a log-spaced histogram per expert, so memory stays small)."""
    if cfg.activation not in CUT_FN:
        raise UnsupportedModelError(f"cuts inside the experts need a SiLU, GELU or ReLU gate; this model's is "
                                    f"{cfg.activation.name}")
    n, k, d_e = cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert
    hist = np.zeros((cfg.n_layers, n * _BINS), np.int64)
    tokens = np.zeros((cfg.n_layers, n), np.int64)

    def on_layer(il: int, route: np.ndarray, gate: np.ndarray) -> None:
        chosen = route[:, k:].astype(np.int64)                                  # [T, k]
        crit = gate_criterion(cfg.activation, gate.reshape(len(route), k, d_e))  # [T, k, d_e]
        logv = np.log10(np.maximum(crit, 10.0 ** _LOG_LO))
        b = np.clip(((logv - _LOG_LO) / (_LOG_HI - _LOG_LO) * _BINS).astype(np.int64), 0, _BINS - 1)
        hist[il] += np.bincount((chosen[:, :, None] * _BINS + b).ravel(), minlength=n * _BINS)
        np.add.at(tokens[il], chosen.ravel(), 1)

    Recorder(gguf, cfg, n_threads).run_experts(ids, max_tokens, on_layer, desc="expert cuts", progress=progress)
    h = hist.reshape(cfg.n_layers, n, _BINS)
    layer_h = h.sum(1)                                                           # [n_layers, bins]
    own = _quantile_edges(h, target)                                             # [n_layers, n]
    layer = _quantile_edges(layer_h[:, None, :], target)                         # [n_layers, 1]
    thresholds = np.where(tokens >= MIN_TOKENS, own, layer).astype(np.float32)
    return ExpertCuts(gguf.fingerprint(), target, CUT_FN[cfg.activation], thresholds, tokens)


def _quantile_edges(h: np.ndarray, q: float) -> np.ndarray:
    """The upper edge of the bin where each histogram's cumulative share first reaches q (0 for an empty one)."""
    total = h.sum(-1, keepdims=True)
    cdf = np.cumsum(h, -1) >= q * np.maximum(total, 1)
    first = np.argmax(cdf, -1)
    edge = 10.0 ** (_LOG_LO + (first + 1) * (_LOG_HI - _LOG_LO) / _BINS)
    return np.where(total[..., 0] > 0, edge, 0.0)


def resolve_expert_cuts(gguf: GGUFModelFile, cfg: LlamaConfig, tokenize, target: float, n_threads: int,
                        progress: bool = True) -> ExpertCuts:
    """The model's cuts for `target`: cached, else calibrated on the bundled calibration text and cached."""
    from ..tools.atomic_file import file_lock
    from .calibrate import bundled_calibration_text

    if not 0.0 < target < 1.0:
        raise PyinferError(f"the target share of expert neurons to skip must be in (0, 1), got {target}")
    fp = gguf.fingerprint()
    path = cuts_path(fp, target)
    cuts = ExpertCuts.load(path, fp, cfg)
    if cuts is not None:
        return cuts
    with file_lock(path):  # two processes starting at once calibrate once
        cuts = ExpertCuts.load(path, fp, cfg)
        if cuts is not None:
            return cuts
        if progress:
            print(f"pyinfer: calibrating cuts inside the experts (target {target:.0%} of each expert's neurons "
                  "skipped in decode) on first use; cached afterwards", file=sys.stderr)
        cuts = calibrate_expert_cuts(gguf, cfg, tokenize(bundled_calibration_text()), target, n_threads, progress)
        try:
            cuts.save(path)
        except OSError as e:  # a read-only cache only costs a calibration next time
            print(f"pyinfer: warning: could not cache the expert cuts at {path}: {e}", file=sys.stderr)
    return cuts
