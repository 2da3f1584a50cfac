"""A Mixture of Experts' routing profile: per layer and expert how often it was chosen, and how much consecutive
tokens reuse, measured once per model on the bundled calibration text and cached. The GPU placement
(place/expert_placement.py) and the memory limit's resident experts (offload/experts.py) both read it."""
from __future__ import annotations

import sys

import numpy as np

from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .calibrate import bundled_calibration_text
from .recorder import Recorder

PROFILE_TOKENS = 512
PROFILE_WINDOW = 256


def profile_path(fingerprint: str):
    from ..model.pull import cache_dir

    return cache_dir() / "experts" / f"{fingerprint[:20]}.npz"


def profile_routing(gguf: GGUFModelFile, cfg: LlamaConfig, ids: list[int], n_threads: int,
                    progress: bool = True, max_tokens: int = PROFILE_TOKENS) -> dict:
    """Runs `ids` in windows through a graph that keeps each layer's route readable: per layer and expert how
    often it was chosen ([n_layers, n_expert] counts), and per layer the share of a token's experts that the
    token before it also chose (what an expert cache can reuse from one decode step to the next)."""
    k = cfg.n_expert_used
    counts = np.zeros((cfg.n_layers, cfg.n_expert))
    reused = np.zeros(cfg.n_layers)
    pairs = [0]

    def on_layer(il: int, route: np.ndarray, _gate: np.ndarray) -> None:
        chosen = route[:, k:].astype(np.int64)  # [n, k]
        np.add.at(counts[il], chosen.ravel(), 1)
        reused[il] += (chosen[1:, :, None] == chosen[:-1, None, :]).any(-1).sum() / k
        if il == cfg.dense_lead:  # the first layer with experts (a leading dense layer routes nothing)
            pairs[0] += len(chosen) - 1

    seen = Recorder(gguf, cfg, n_threads, PROFILE_WINDOW).run_experts(ids, max_tokens, on_layer, progress=progress)
    return {"counts": counts, "reuse": reused / max(pairs[0], 1), "tokens": seen}


def save_profile(prof: dict, path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **prof)


def describe_profile(prof: dict) -> str:
    """One line: how skewed the routing is and how much consecutive tokens reuse."""
    routed = prof["counts"].sum(1) > 0  # the layers with experts (not a leading dense layer's zero row)
    counts = prof["counts"][routed] if routed.any() else prof["counts"]
    top = max(1, counts.shape[1] // 10)
    share = np.sort(counts, axis=1)[:, -top:].sum(1) / np.maximum(counts.sum(1), 1)
    reuse = prof["reuse"][routed] if routed.any() else prof["reuse"]
    return (f"the top {top} of {counts.shape[1]} experts take {share.mean():.0%} of the routes (layers "
            f"{share.min():.0%}..{share.max():.0%}); a token shares {reuse.mean():.0%} of its experts with "
            "the token before")


def cached_profile(session, progress: bool) -> dict:
    """The model's routing profile: cached per model, else measured on the bundled calibration text."""
    path = profile_path(session.gguf.fingerprint())
    if path.is_file():
        try:
            with np.load(path) as z:
                if z["counts"].shape == (session.config.n_layers, session.config.n_expert):
                    return {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError):
            pass  # unreadable: measured again and replaced
    ids = session.tokenizer.encode(bundled_calibration_text())
    prof = profile_routing(session.gguf, session.config, ids, session.n_threads, progress)
    try:
        save_profile(prof, path)
    except OSError as e:
        print(f"pyinfer: warning: could not cache the routing profile at {path}: {e}", file=sys.stderr)
    return prof
