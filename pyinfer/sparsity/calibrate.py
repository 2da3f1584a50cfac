"""The offline pipeline: profile -> thresholds + hot-first order -> predictors -> a SparsityPlan."""
from __future__ import annotations

import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import PyinferError
from ..model.config import GATE_FIRST, LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .plan import LayerPlan, SparsityPlan
from .predictor import TrainConfig, train_layer
from .profile import Profile
from .recorder import Recorder, criterion, gate_criterion


def default_mode(cfg: LlamaConfig) -> str:
    return "relu" if cfg.ffn_relu else "contrib"


def bundled_calibration_text() -> str:
    """A public-domain excerpt (Jane Austen, Pride and Prejudice) shipped with the package, so that
    `sparsity="auto"` works offline. Never evaluation text."""
    return resources.files("pyinfer.data").joinpath("calibration.txt").read_text(encoding="utf-8")


def read_calibration(path: str | Path | None) -> str:
    if path is None:
        return bundled_calibration_text()
    p = Path(path)
    if not p.is_file():
        raise PyinferError(f"calibration text not found: {p}")
    return p.read_text(encoding="utf-8", errors="replace")


def profile_model(gguf: GGUFModelFile, cfg: LlamaConfig, ids: list[int], max_tokens: int, n_threads: int,
                  mode: str | None = None, progress: bool = True, info: dict | None = None) -> Profile:
    mode = mode or default_mode(cfg)
    prof = Profile.empty(mode, cfg.n_layers, cfg.d_ff, gguf.fingerprint(), dict(info or {}))

    # The |act(gate)| histogram feeds gate-first (CATS) cuts, which the engine runs for SiLU and GELU.
    gate_first = cfg.activation in GATE_FIRST and mode != "relu"

    def on_layer(il, h, gate, up):
        gate_crit = gate_criterion(cfg.activation, gate) if gate_first else None
        prof.add(il, criterion(mode, gate, up, cfg.activation), gate_crit)

    prof.tokens = Recorder(gguf, cfg, n_threads).run(ids, max_tokens, on_layer, "profiling", progress)
    return prof


def collect_training_data(gguf: GGUFModelFile, cfg: LlamaConfig, ids: list[int], max_tokens: int, n_threads: int,
                          mode: str, thresholds: np.ndarray, perms: np.ndarray, progress: bool = True):
    """Per layer: FFN inputs (F16 [N, d]) and packed active labels in hot-first order."""
    xs: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layers)]
    ys: list[list[np.ndarray]] = [[] for _ in range(cfg.n_layers)]

    def on_layer(il, h, gate, up):
        xs[il].append(h.astype(np.float16))
        ys[il].append(np.packbits(criterion(mode, gate, up, cfg.activation)[:, perms[il]] > thresholds[il], axis=1))

    Recorder(gguf, cfg, n_threads).run(ids, max_tokens, on_layer, "collecting", progress)
    return xs, ys


def build_plan(gguf: GGUFModelFile, cfg: LlamaConfig, profile: Profile, target: float, ids: list[int] | None,
               max_tokens: int, n_threads: int, train: TrainConfig | None, criterion_name: str | None = None,
               progress: bool = True, info: dict | None = None, gate_recall: float | None = None) -> SparsityPlan:
    """Thresholds for `target` and the hot-first order from the profile; predictors when `train` is
    given (trained on `ids`); else, with `gate_recall`, gate-first candidate cuts that keep that share
    of the active neurons."""
    from tqdm import tqdm

    if not 0.0 <= target < 1.0:
        raise PyinferError(f"target sparsity must be in [0, 1), got {target}")
    mode = criterion_name or profile.mode
    thr = profile.thresholds(target, "gate" if mode == "gate" else None)
    # Each neuron's firing counts are kept for the profile's own criterion: a gate-first plan cut from a contrib
    # profile orders its neurons by how often they pass the contrib cut at the same target.
    freq_thr = profile.thresholds(target) if mode != profile.mode else thr
    perms = profile.hot_first_order(freq_thr)
    freq_sorted = np.take_along_axis(profile.frequencies(freq_thr), perms, axis=1).astype(np.float32)
    layers = [LayerPlan(perms[il], float(thr[il]), freq=freq_sorted[il]) for il in range(cfg.n_layers)]
    # Expected share of neurons active per token (for ReLU models the target says nothing about it).
    info = dict(info or {}, density=float(profile.frequencies(freq_thr).mean()))
    if train is None and gate_recall is not None and mode == "contrib" and cfg.activation in GATE_FIRST:
        for lp, cut in zip(layers, profile.gate_cuts(thr, gate_recall)):
            lp.gate_threshold = float(cut)
        info = dict(info or {}, gate_recall=gate_recall)
    info = dict(info or {}, profile_tokens=profile.tokens)
    if train is not None:
        if ids is None:
            raise PyinferError("predictor training needs calibration text")
        t0 = time.time()
        xs, ys = collect_training_data(gguf, cfg, ids, max_tokens, n_threads, mode, thr, perms, progress)
        freq = np.take_along_axis(profile.frequencies(thr), perms, axis=1)
        neuron_bytes = _neuron_bytes(gguf)
        for il in tqdm(range(cfg.n_layers), desc="training predictors", unit="layer", disable=not progress,
                       file=sys.stderr):
            x = np.concatenate(xs[il]).astype(np.float32)
            y = np.unpackbits(np.concatenate(ys[il]), axis=1, count=cfg.d_ff).astype(bool)
            xs[il] = ys[il] = None  # free as we go
            layers[il].predictor, layers[il].hot = train_layer(x, y, freq[il], train, neuron_bytes)
        info.update(train_tokens=int(len(x)), train_seconds=round(time.time() - t0, 1), recall_target=train.recall)
    return SparsityPlan(mode, float(target), layers, gguf.fingerprint(), info)


def _neuron_bytes(gguf: GGUFModelFile) -> float:
    """Bytes one neuron costs a decode step: its gate and up rows plus its Q8_0 down row."""
    g = gguf.tensor("blk.0.ffn_gate.weight")
    row = np.asarray(g.data).reshape(g.rows, -1).shape[1]
    return 2 * row + g.cols * 34 / 32
