"""Calibration of input-sparse plans (TEAL): the distribution of |x| at each layer's four projection inputs over
calibration text (never evaluation text), kept as quantiles, so a plan at any sparsity level is read off it
without running the model again.

A level s cuts an input site of every layer at that layer's s-quantile of |x|: each projection reading it skips a
share s of its weight columns. TEAL allocates levels per layer by a greedy search; here one level per site for
all layers (the allocation is a next step), chosen by sparsity/input_choice.py within a quality bound.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .plan import INPUT_SITES, LayerPlan, SparsityPlan, SparsityFileError, read_npz
from .recorder import Recorder

# The four projection inputs, then the gate cut: |act(gate)| (CATS), which decides where up and down are read.
SITES = INPUT_SITES + ("ffn_mid", "gate")
LEVELS = np.linspace(0.0, 0.99, 100)   # the quantiles kept: level k / 100
SAMPLES_PER_WINDOW = 8192               # |x| values kept per layer, site and window (a uniform sample)
FORMAT, VERSION = "pyinfer-input-profile", 1


@dataclass
class InputProfile:
    quantiles: np.ndarray   # F32 [n_layers, 4 sites, 100 levels]: |x| below which a share `level` of inputs falls
    fingerprint: str
    tokens: int

    def plan(self, levels: dict[str, float], n_ff: int, info: dict | None = None) -> SparsityPlan:
        """Each site of `levels` (SITES; missing ones 0: dense) cut at that level's quantile in every layer."""
        for site, level in levels.items():
            if site not in SITES or not 0.0 <= level <= LEVELS[-1]:
                raise PyinferError(f"input sparsity: {site} must be one of {', '.join(SITES)} at a level in "
                                   f"[0, {LEVELS[-1]}], got {level}")
        lv = [float(levels.get(s, 0.0)) for s in SITES]
        thr = np.array([[np.interp(v, LEVELS, q) if v > 0 else 0.0 for v, q in zip(lv, layer)]
                        for layer in self.quantiles])
        layers = [LayerPlan(np.arange(n_ff, dtype=np.int32), float(t[3]), gate_threshold=float(t[4]),
                            inputs=(float(t[0]), float(t[1]), float(t[2]))) for t in thr]
        target = float(levels.get("ffn_mid", 0.0))
        return SparsityPlan("input", target, layers, self.fingerprint,
                            dict(info or {}, profile_tokens=self.tokens, levels=dict(zip(SITES, lv)),
                                 density=1.0 - target))

    def save(self, path: str | Path) -> Path:
        import json

        from ..tools.atomic_file import atomic_write

        header = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint, "tokens": self.tokens}
        arrays = {"header": np.frombuffer(json.dumps(header).encode(), np.uint8),
                  "quantiles": self.quantiles.astype(np.float32)}
        return atomic_write(Path(path), lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: str | Path, fingerprint: str, n_layers: int) -> "InputProfile":
        header, data = read_npz(Path(path), "input profile", FORMAT, VERSION)
        q = data.get("quantiles")
        if header.get("fingerprint") != fingerprint:
            raise SparsityFileError(f"{path} was calibrated for a different model")
        if q is None or q.shape != (n_layers, len(SITES), len(LEVELS)) or not np.all(np.isfinite(q)):
            raise SparsityFileError(f"{path} is corrupt (its quantiles)")
        return cls(q.astype(np.float32), fingerprint, int(header.get("tokens", 0)))


def profile_inputs(gguf: GGUFModelFile, cfg: LlamaConfig, ids: list[int], max_tokens: int, n_threads: int,
                   progress: bool = True, seed: int = 0) -> InputProfile:
    """Runs the model over `ids` and keeps, per layer and site, a uniform sample of |x| reduced to quantiles."""
    rng = np.random.default_rng(seed)
    samples: list[dict[str, list[np.ndarray]]] = [{s: [] for s in SITES} for _ in range(cfg.n_layers)]

    def on_layer(il: int, sites: dict) -> None:
        for s in SITES:
            a = (sites[s] if s == "gate" else np.abs(sites[s])).ravel()
            samples[il][s].append(a[rng.integers(0, a.size, min(a.size, SAMPLES_PER_WINDOW))].copy())

    tokens = Recorder(gguf, cfg, n_threads).run_sites(ids, max_tokens, on_layer, progress=progress)
    q = np.array([[np.quantile(np.concatenate(samples[il][s]), LEVELS) for s in SITES]
                  for il in range(cfg.n_layers)], dtype=np.float32)
    return InputProfile(q, gguf.fingerprint(), tokens)
