"""`load(..., sparsity=...)`: turns "off" | "auto" | a path | a SparsityPlan into a plan or None.

"auto" looks for a plan cached for this model and target; when there is none it calibrates one on the
bundled calibration text (under a minute on 2 cores, like PowerInfer solving its placement on first
load) and caches it. What it calibrates follows the measurements in bench/results/sparsity/sparsity_curve.md:
- SwiGLU and GeGLU models: the |act(gate) * up| criterion at 40% FFN sparsity, thresholds only (gate and up
  run dense, down only for active neurons): on SmolLM2 +0.8% perplexity at about 1.04x our dense decode
  (bench/results/sparsity/sparse_decode.md). Trained predictors measured worse there (quality and speed).
  From the same profile, a second candidate: the same plan run gate-first (CATS's |act(gate)| cut first, so up
  and down are read only for the neurons that pass it; the cut keeps AUTO_GATE_RECALL of the neurons the
  threshold would keep). CATS's own plan (the gate cut alone at the same target) cost +12% perplexity on
  SmolLM2 and +15% on Gemma 3 (bench/results/sparsity/auto_choice_pure_cats.md), too much for a default. The candidate
  is cached beside the plan; sparsity/auto_choice.py times both against dense and keeps what pays here.
- ReLU models: exact sparsity (gate > 0) plus trained predictors, which then also skip the gate.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import PyinferError, UnsupportedModelError
from ..model.config import GATE_FIRST, LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..model.pull import cache_dir
from ..tools.atomic_file import file_lock
from .plan import SparsityFileError, SparsityPlan

AUTO_TARGET = 0.4           # SwiGLU: FFN sparsity; ReLU models are exact at any target
AUTO_PROFILE_TOKENS = 4096
AUTO_TRAIN_TOKENS = 8192
AUTO_GATE_RECALL = 0.96     # the gate-first candidate's cut keeps this share of the threshold plan's neurons


def auto_plan_path(fingerprint: str, target: float) -> Path:
    return cache_dir() / "sparsity" / f"{fingerprint[:20]}-t{round(target * 100):02d}.npz"


def gate_candidate_path(plan_path: Path) -> Path:
    """Where `auto` caches its gate-first candidate, beside the threshold plan at `plan_path`."""
    return plan_path.with_name(plan_path.stem + "-gate.npz")


def gate_candidate(plan_path: Path, fingerprint: str, cfg: LlamaConfig) -> SparsityPlan | None:
    """The cached gate-first candidate, or None (a model without one, a cache from before it existed, or an
    unusable file: the threshold plan is then weighed against dense alone)."""
    return _cached_plan(gate_candidate_path(plan_path), fingerprint, cfg, "gate-first sparsity candidate",
                        "auto weighs the threshold plan against dense alone")


def resolve_sparsity(spec, gguf: GGUFModelFile, cfg: LlamaConfig, tokenize, target: float | None,
                     n_threads: int, progress: bool = True) -> SparsityPlan | None:
    if spec is None or spec is False or spec == "off":
        return None
    if cfg.is_moe:  # the router already skips all but k experts; beneath it, cuts per expert (Session.expert_cuts)
        if spec != "auto":
            raise UnsupportedModelError("neuron-level sparsity plans do not take Mixture-of-Experts models; use "
                                        "--sparsity off, or auto with --target T (each chosen expert skips a share T "
                                        "of its neurons in decode, by calibrated cuts on its gate)")
        if progress:
            inside = (f"decode skips {target:.0%} of their neurons (cuts on each expert's gate)" if target else
                      "their neurons run whole (--target T skips a share T of them in decode)")
            print(f"pyinfer: Mixture of Experts: each token runs {cfg.n_expert_used} of {cfg.n_expert} experts; "
                  f"{inside}", file=sys.stderr)
        return None
    if not cfg.uniform_ffn:  # a plan holds d_ff neurons per layer (Gemma 4 E2B's shared layers are twice as wide)
        if spec == "auto":
            if progress:
                print("pyinfer: this model's layers have FFNs of different widths; auto runs them dense",
                      file=sys.stderr)
            return None
        raise UnsupportedModelError("neuron-level sparsity plans need FFNs of one width in every layer; this "
                                    f"model's widths are {sorted(set(cfg.ffn_widths))} (use --sparsity off or auto)")
    fp = gguf.fingerprint()
    if isinstance(spec, SparsityPlan):
        if spec.fingerprint != fp:
            raise PyinferError("this sparsity plan was calibrated for a different model")
        return spec
    if spec == "auto":
        from .powerinfer import has_predictors, predictor_plan

        if has_predictors(gguf):  # PowerInfer's own predictors: no calibration
            return predictor_plan(gguf, cfg)
        target = AUTO_TARGET if target is None else target
        path = auto_plan_path(fp, target)
        plan = _cached_plan(path, fp, cfg)
        if plan is not None:
            return plan
        with file_lock(path):  # two processes starting at once calibrate once
            plan = _cached_plan(path, fp, cfg)
            if plan is not None:
                return plan
            plan, gate_plan = calibrate_auto(gguf, cfg, tokenize, target, n_threads, progress)
            try:
                if gate_plan is not None:  # first: a threshold plan on disk means its candidate is there too
                    gate_plan.save(gate_candidate_path(path))
                plan.save(path)
            except OSError as e:  # a read-only cache only costs a recalibration next time
                print(f"pyinfer: warning: could not cache the sparsity plan at {path}: {e}", file=sys.stderr)
        return plan
    if isinstance(spec, (str, os.PathLike)):
        return SparsityPlan.load(spec, fp, cfg.n_layers, cfg.d_ff)
    raise PyinferError(f"sparsity must be 'off', 'auto', 'input' or a path to a sparsity file, got {spec!r}")


def _cached_plan(path: Path, fingerprint: str, cfg: LlamaConfig, what: str = "sparsity plan",
                 then: str = "calibrating it again") -> SparsityPlan | None:
    """A cached `auto` plan, or None when there is none or it is unreadable (then, as `then` says, it is
    calibrated again or done without: a cache file is never a reason a model cannot load)."""
    if not path.is_file():
        return None
    try:
        return SparsityPlan.load(path, fingerprint, cfg.n_layers, cfg.d_ff)
    except SparsityFileError as e:
        print(f"pyinfer: warning: the cached {what} is unusable ({e}); {then}", file=sys.stderr)
        return None


def calibrate_auto(gguf: GGUFModelFile, cfg: LlamaConfig, tokenize, target: float, n_threads: int,
                   progress: bool = True) -> tuple[SparsityPlan, SparsityPlan | None]:
    """(the plan, its gate-first candidate or None): one profile, both plans."""
    from .calibrate import build_plan, bundled_calibration_text, profile_model
    from .predictor import TrainConfig

    if progress:
        print(f"pyinfer: calibrating activation sparsity (target {target:.0%}) on first use; cached afterwards",
              file=sys.stderr)
    ids = tokenize(bundled_calibration_text())
    prof = profile_model(gguf, cfg, ids, AUTO_PROFILE_TOKENS, n_threads, progress=progress,
                         info={"calibration": "bundled"})
    info = {"calibration": "bundled", "auto": True}
    if prof.mode == "relu":
        return build_plan(gguf, cfg, prof, target, ids, AUTO_TRAIN_TOKENS, n_threads,
                          TrainConfig(fixed_rank=64, epochs=8), progress=progress, info=info), None
    plan = build_plan(gguf, cfg, prof, target, None, 0, n_threads, None, progress=progress, info=info)
    gate_plan = None
    if cfg.activation in GATE_FIRST:
        gate_plan = build_plan(gguf, cfg, prof, target, None, 0, n_threads, None, progress=progress,
                               info=dict(info, auto_candidate="gate"), gate_recall=AUTO_GATE_RECALL)
    return plan, gate_plan
