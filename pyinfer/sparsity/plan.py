"""The sparsity plan of one model, and its versioned sidecar file.

One `.npz` file (no pickles) holds everything the sparse decode path needs: the criterion and
per-layer thresholds, the hot-first neuron permutation, the always-on hot prefix and the predictors
(stored as Q8_0 blocks, the format the engine runs). It is bound to one model by a fingerprint,
and a mismatch is a clear error, never a silent wrong answer.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import PyinferError
from ..tools.atomic_file import atomic_write

FORMAT = "pyinfer-sparsity"
FORMAT_VERSION = 1
# contrib: |act(gate) * up| > t (ours); gate: |act(gate)| > t (CATS, SiLU or GELU); relu: gate > 0 (ReLU models);
# input: TEAL, every projection skips the weight columns of its input's small entries (|x| > t per input site)
MODES = ("contrib", "gate", "relu", "input")
# The input sites of an input-sparse layer, each with its own threshold: what q, k and v read (the attention
# norm's output), what the output projection reads, what gate and up read (the FFN norm's output). The fourth,
# down's input act(gate) * up, is the layer's `threshold`.
INPUT_SITES = ("attn_in", "attn_out", "ffn_in")


class SparsityFileError(PyinferError):
    """A sidecar file that is missing, corrupt, of another version or for another model."""


def read_npz(path: Path, what: str, fmt: str, version: int) -> tuple[dict, dict[str, np.ndarray]]:
    """(JSON header, arrays) of one of our .npz files, or a one-line SparsityFileError."""
    if not path.is_file():
        raise SparsityFileError(f"{what} not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(bytes(z["header"]).decode())
            data = {k: z[k] for k in z.files if k != "header"}
    except Exception as e:
        raise SparsityFileError(f"{path} is not a pyinfer {what} ({type(e).__name__})") from None
    if not isinstance(header, dict) or header.get("format") != fmt:
        raise SparsityFileError(f"{path} is not a pyinfer {what}")
    if header.get("version") != version:
        raise SparsityFileError(f"{path} has format version {header.get('version')}; this pyinfer reads "
                                f"version {version} (re-create it with this version)")
    return header, data


def is_number(x) -> bool:
    """A JSON number of a sidecar's header: int or float, not a bool, not NaN (inf passes)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _check_header_types(path: Path, h: dict) -> None:
    """The header values read outside the per-layer loop, of the types save() writes (a file edited or damaged
    by hand used to end in a TypeError traceback: found by fuzzing the header)."""
    stats = h.get("predictor_stats")
    bad = [k for k, ok in (("fingerprint", isinstance(h.get("fingerprint"), str)), ("mode", h.get("mode") in MODES),
                           ("target", is_number(h.get("target")) and math.isfinite(h["target"])), ("info", isinstance(h.get("info", {}), dict)),
                           ("predictor_stats", stats is None or (isinstance(stats, list) and
                                                                 all(x is None or isinstance(x, dict) for x in stats))))
           if not ok]
    if bad:
        raise SparsityFileError(f"{path} is corrupt (its header's {', '.join(bad)})")


@dataclass
class Predictor:
    """Low-rank MLP d_model -> rank -> (n_ff - hot): logits of the cold neurons, in permuted order."""
    w1_q8: np.ndarray     # U8 [rank, Q8_0 row bytes of d_model]
    b1: np.ndarray        # F32 [rank]
    w2_q8: np.ndarray     # U8 [n_ff - hot, Q8_0 row bytes of rank]
    cut: np.ndarray       # F32 [n_ff - hot]: a neuron is predicted active when its logit > cut
    stats: dict = field(default_factory=dict)  # recall, precision, densities, bytes (held-out)

    @property
    def rank(self) -> int:
        return int(self.b1.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.w1_q8.nbytes + self.b1.nbytes + self.w2_q8.nbytes + self.cut.nbytes)


@dataclass
class LayerPlan:
    perm: np.ndarray                 # I32 [n_ff]: perm[k] = original neuron at position k, hottest first
    threshold: float                 # criterion cut-off t_l
    hot: int = 0                     # perm[:hot] always run (only with a predictor)
    predictor: Predictor | None = None
    # Without a predictor, contrib mode can filter candidates first: up and down run only where
    # |act(gate)| > gate_threshold (0: gate and up dense, only down sparse).
    gate_threshold: float = 0.0
    # F32 [n_ff] in perm order: how often each neuron fired in calibration (None: not recorded). Offload keeps
    # the neurons that save the most reads.
    freq: np.ndarray | None = None
    # Decode this layer dense: `auto` timed its sparse path slower than its dense FFN on this machine
    # (sparsity/auto_choice.py; offload and a device split run every layer sparse all the same).
    dense: bool = False
    # Mode "input": |x| thresholds of the INPUT_SITES (0: that site dense).
    inputs: tuple[float, float, float] | None = None


@dataclass
class SparsityPlan:
    mode: str
    target: float                    # calibrated FFN sparsity (fraction of neurons skipped)
    layers: list[LayerPlan]
    fingerprint: str                 # of the model this plan was calibrated for
    info: dict = field(default_factory=dict)

    @property
    def has_predictors(self) -> bool:
        return all(lp.predictor is not None for lp in self.layers)

    def with_dense_layers(self, dense: set[int] | list[int]) -> "SparsityPlan":
        """A copy that decodes the layers in `dense` dense and the others sparse (arrays shared, not copied)."""
        dense = set(int(i) for i in dense)
        layers = [replace(lp, dense=il in dense) for il, lp in enumerate(self.layers)]
        return replace(self, layers=layers, info=dict(self.info))

    def fixed_top_k(self, site: str, n: int) -> int:
        """Inputs of `site` (mode "input") each token keeps where the plan fixes its density
        (info["fixed_density"][site]: each token its k largest |x| instead of |x| > t), else 0. A fixed density is
        what speed at a given density needs where thresholds cannot give one: a random-weight model of a real
        shape keeps all or none of an input at decode (bench/input_sparsity.py --fixed-density)."""
        d = (self.info.get("fixed_density") or {}).get(site) if isinstance(self.info, dict) else None
        return max(1, min(n, int(round(float(d) * n)))) if is_number(d) else 0

    @property
    def dense_layers(self) -> list[int]:
        return [il for il, lp in enumerate(self.layers) if lp.dense]

    def predictor_bytes(self) -> int:
        return sum(lp.predictor.nbytes for lp in self.layers if lp.predictor is not None)

    # ---- file ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        header = {"format": FORMAT, "version": FORMAT_VERSION, "mode": self.mode, "target": self.target,
                  "fingerprint": self.fingerprint, "n_layers": len(self.layers), "created": time.time(),
                  "info": self.info, "hot": [lp.hot for lp in self.layers],
                  "thresholds": [float(lp.threshold) for lp in self.layers],
                  "gate_thresholds": [float(lp.gate_threshold) for lp in self.layers],
                  "dense_layers": self.dense_layers,
                  "input_thresholds": [list(map(float, lp.inputs)) if lp.inputs is not None else None
                                       for lp in self.layers],
                  "predictor_stats": [lp.predictor.stats if lp.predictor else None for lp in self.layers]}
        arrays: dict[str, np.ndarray] = {"header": np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)}
        for il, lp in enumerate(self.layers):
            arrays[f"perm.{il}"] = lp.perm.astype(np.int32)
            if lp.freq is not None:
                arrays[f"freq.{il}"] = np.asarray(lp.freq, dtype=np.float32)
            if lp.predictor is not None:
                p = lp.predictor
                arrays.update({f"w1.{il}": p.w1_q8, f"b1.{il}": p.b1.astype(np.float32),
                               f"w2.{il}": p.w2_q8, f"cut.{il}": p.cut.astype(np.float32)})
        return atomic_write(path, lambda f: np.savez(f, **arrays))  # never a half file, whoever else writes it

    @classmethod
    def load(cls, path: str | Path, fingerprint: str | None = None, n_layers: int | None = None,
             n_ff: int | None = None) -> "SparsityPlan":
        path = Path(path)
        header, data = read_npz(path, "sparsity file", FORMAT, FORMAT_VERSION)
        _check_header_types(path, header)
        if fingerprint is not None and header["fingerprint"] != fingerprint:
            raise SparsityFileError(f"{path} was calibrated for a different model (fingerprint "
                                    f"{header['fingerprint'][:12]}, this model is {fingerprint[:12]})")
        try:
            layers = []
            for il in range(int(header["n_layers"])):
                pred = None
                if f"w1.{il}" in data:
                    stats = (header.get("predictor_stats") or [None] * (il + 1))[il] or {}
                    pred = Predictor(data[f"w1.{il}"], data[f"b1.{il}"], data[f"w2.{il}"], data[f"cut.{il}"], stats)
                layers.append(LayerPlan(np.asarray(data[f"perm.{il}"]), float(header["thresholds"][il]),
                                        int(header["hot"][il]), pred, float(header["gate_thresholds"][il]),
                                        data.get(f"freq.{il}")))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise SparsityFileError(f"{path} is corrupt ({type(e).__name__}: {e})") from None
        for il, lp in enumerate(layers):
            n = len(lp.perm)
            if lp.perm.ndim != 1 or lp.perm.dtype.kind not in "iu" or not np.array_equal(np.sort(lp.perm), np.arange(n)):
                raise SparsityFileError(f"{path}: layer {il}'s neuron order is not a permutation of 0..{n - 1}")
            if not 0 <= lp.hot <= n or not np.isfinite(lp.threshold) or not np.isfinite(lp.gate_threshold):
                raise SparsityFileError(f"{path}: layer {il} has an invalid hot prefix or threshold")
            if lp.freq is not None and (lp.freq.shape != (n,) or not np.all(np.isfinite(lp.freq))):
                raise SparsityFileError(f"{path}: layer {il}'s firing frequencies do not match its neurons")
            pr = lp.predictor
            if pr is not None and len(pr.cut) != n - lp.hot:
                raise SparsityFileError(f"{path}: layer {il}'s predictor does not match its hot prefix")
            if pr is not None and not (pr.w1_q8.dtype == np.uint8 and pr.w2_q8.dtype == np.uint8 and pr.w1_q8.ndim == 2
                                       and pr.w2_q8.ndim == 2 and pr.b1.ndim == 1 and pr.cut.ndim == 1
                                       and pr.b1.dtype.kind == "f" and pr.cut.dtype.kind == "f"
                                       and len(pr.b1) == len(pr.w1_q8) and len(pr.w2_q8) == len(pr.cut)):
                raise SparsityFileError(f"{path}: layer {il}'s predictor arrays are not of the types and shapes "
                                        f"pyinfer writes")
        dense = header.get("dense_layers", [])
        if not isinstance(dense, list) or not all(isinstance(i, int) and 0 <= i < len(layers) for i in dense):
            raise SparsityFileError(f"{path}: its dense layers are not layer numbers")
        for il in dense:
            layers[il].dense = True
        inputs = header.get("input_thresholds") or [None] * len(layers)
        if not isinstance(inputs, list) or len(inputs) != len(layers) or not all(
                x is None or (isinstance(x, list) and len(x) == len(INPUT_SITES) and
                              all(is_number(v) and math.isfinite(v) for v in x)) for x in inputs):
            raise SparsityFileError(f"{path}: its input thresholds are not {len(INPUT_SITES)} numbers per layer")
        for lp, x in zip(layers, inputs):
            lp.inputs = tuple(float(v) for v in x) if x is not None else None
        if header["mode"] == "input" and any(lp.inputs is None for lp in layers):
            raise SparsityFileError(f"{path}: an input-sparse plan without input thresholds")
        plan = cls(header["mode"], float(header["target"]), layers, header["fingerprint"], header.get("info", {}))
        if n_layers is not None and len(layers) != n_layers:
            raise SparsityFileError(f"{path} has {len(layers)} layers; the model has {n_layers}")
        if n_ff is not None and any(len(lp.perm) != n_ff for lp in layers):
            raise SparsityFileError(f"{path} is for an FFN width other than this model's {n_ff}")
        return plan


def selective_layers(plan: SparsityPlan) -> list[bool]:
    """Layers whose decode reads only the neurons their predictor picks (the rest stream whole tails)."""
    return [lp.predictor is not None and lp.hot < len(lp.perm) for lp in plan.layers]
