"""`sparsity="input"`: the input-sparse plan (TEAL's cuts on projection inputs, CATS's gate cut) with the most
skipping that stays within a quality bound, chosen once per model and cached.

Thresholds come from the calibration text's first CALIBRATION_TOKENS tokens (sparsity/input_calibrate.py). The
plan is then chosen by perplexity on held-out windows of the same text (its tail, which calibration never saw;
never evaluation text): the rungs of LADDER, each skipping more bytes than the one before, are scored by a
binary search, every token computed as sparse decode computes it, and the last rung within `quality` percent of
the dense model's perplexity is kept, then `auto`'s timing keeps it only where it decodes faster (session.py).
Per model and method: bench/results/sparsity/input_*.md. A per-layer allocation (TEAL's greedy search) would fit
the bound tighter; the ladder is what a first load can afford.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import PyinferError
from ..model.pull import cache_dir
from ..tools.atomic_file import file_lock
from .input_calibrate import InputProfile, profile_inputs
from .plan import SparsityFileError, SparsityPlan

DEFAULT_QUALITY = 3.0        # percent of perplexity the plan may add on the held-out text
CALIBRATION_TOKENS = 4096
# Held-out windows: with 3 of 256 tokens Gemma 3's cut on down's input at 70% scored +2.3% where WikiText-2
# measured +15.7% (bench/results/sparsity/input_gemma3.md); more windows narrow that noise, never the shift
# between a novel and an encyclopedia.
HELDOUT_CTX, HELDOUT_WINDOWS = 256, 6
# Rungs of skipping, least first: down's input alone (the cheapest in quality: Qwen2.5-Coder-0.5B's perplexity moved
# +3.7% at 80% of its inputs cut, +38% at 90%, WikiText-2; and the only cut that pays: bench/results/sparsity/
# input_*.md). The attention output's cut is not on the ladder: its copy (Q8_0 rows, 8.5 bits) reads more than a
# 4-5 bit source at half its inputs, and it decoded at 0.88-0.99x dense on every model measured. Nor is the gate
# cut (CATS): reading up's rows for half the neurons took as long as reading them all on this machine (the
# hardware prefetcher fetches the gaps between 0.9 KB rows), so it only cost quality.
LADDER = (
    {"ffn_mid": 0.5},
    {"ffn_mid": 0.6},
    {"ffn_mid": 0.7},
    {"ffn_mid": 0.75},
    {"ffn_mid": 0.8},
    {"ffn_mid": 0.85},
    {"ffn_mid": 0.9},
)


def input_plan_path(fingerprint: str, quality: float) -> Path:
    return cache_dir() / "sparsity" / f"{fingerprint[:20]}-input-q{round(quality * 10):03d}.npz"


def input_profile_path(fingerprint: str) -> Path:
    return cache_dir() / "sparsity" / f"{fingerprint[:20]}-input-profile.npz"


def heldout_ids(session, ids: list[int] | None = None) -> np.ndarray:
    """The held-out windows: the calibration text's last HELDOUT_WINDOWS x HELDOUT_CTX tokens (`ids`: the whole
    text's, when the caller has them)."""
    from .calibrate import bundled_calibration_text

    ids = session.tokenizer.encode(bundled_calibration_text()) if ids is None else ids
    return np.clip(np.asarray(ids[-HELDOUT_CTX * HELDOUT_WINDOWS:]), 0, session.config.vocab_size - 1)


def heldout_perplexity(session, plan: SparsityPlan | None, ids: np.ndarray, ctx: int = HELDOUT_CTX) -> float:
    """Perplexity of `ids` (whole windows of ctx tokens, each from an empty cache, the second half scored, as
    llama.cpp's protocol), every token computed as decode computes it under `plan` (None: dense)."""
    from ..runtime.running import build_running
    from ..runtime.sparse_ffn import SparseRuns

    runs = SparseRuns.every_token(ctx) if plan is not None else SparseRuns()
    running = build_running(session.parts(sparsity=plan), ctx, ctx, runs)
    rows = np.arange(ctx // 2, ctx - 1, dtype=np.int32)
    nll, count = 0.0, 0
    for w0 in range(0, len(ids) - ctx + 1, ctx):
        chunk = np.asarray(ids[w0:w0 + ctx], np.int32)
        running.run(ctx, chunk, np.arange(ctx, dtype=np.int32), rows)
        lp = _log_prob_at(running.logits(), chunk[rows + 1].astype(np.int64))
        nll -= float(lp.sum())
        count += len(lp)
    return math.exp(nll / max(count, 1))


def _log_prob_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """F64 [n]: log-softmax of each row of `logits` at its target."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return x[np.arange(len(targets)), targets] - lse


def input_plan(session, quality: float = DEFAULT_QUALITY, progress: bool = True) -> SparsityPlan:
    """The cached input-sparse plan of this model for `quality` (percent), or one chosen now and cached."""
    if not 0.0 < quality <= 100.0:
        raise PyinferError(f"sparsity quality must be a perplexity increase in percent in (0, 100], got {quality}")
    if session.config.is_moe:
        raise PyinferError("input sparsity runs on dense models; a Mixture of Experts takes --sparsity auto with "
                           "--target (cuts inside its experts)")
    fp = session.gguf.fingerprint()
    path = input_plan_path(fp, quality)
    with file_lock(path):
        try:
            return SparsityPlan.load(path, fp, session.config.n_layers, session.config.d_ff)
        except SparsityFileError as e:
            if path.is_file():
                print(f"pyinfer: warning: the cached input-sparse plan is unusable ({e}); choosing it again",
                      file=sys.stderr)
        plan = choose_input_plan(session, quality, progress)
        try:
            plan.save(path)
        except OSError as e:
            print(f"pyinfer: warning: could not cache the input-sparse plan at {path}: {e}", file=sys.stderr)
        return plan


def _profile(session, ids: list[int], progress: bool) -> InputProfile:
    fp, cfg = session.gguf.fingerprint(), session.config
    path = input_profile_path(fp)
    try:
        return InputProfile.load(path, fp, cfg.n_layers)
    except SparsityFileError:
        prof = profile_inputs(session.gguf, cfg, ids, CALIBRATION_TOKENS, session.n_threads, progress)
        try:
            prof.save(path)
        except OSError:
            pass  # only costs a calibration next time
        return prof


def choose_input_plan(session, quality: float, progress: bool = True) -> SparsityPlan:
    from tqdm import tqdm

    from .calibrate import bundled_calibration_text

    t0 = time.time()
    cfg = session.config
    ids = session.tokenizer.encode(bundled_calibration_text())
    need = CALIBRATION_TOKENS + HELDOUT_CTX * HELDOUT_WINDOWS
    if len(ids) < need:
        raise PyinferError(f"the calibration text has {len(ids)} tokens; input sparsity needs {need}")
    if progress:
        print(f"pyinfer: choosing input sparsity within +{quality:g}% perplexity on first use (calibration, then "
              f"up to {len(LADDER)} plans scored on held-out text); cached afterwards", file=sys.stderr)
    prof = _profile(session, ids[:CALIBRATION_TOKENS], progress)
    heldout = heldout_ids(session, ids)
    dense = heldout_perplexity(session, None, heldout)
    bound = dense * (1.0 + quality / 100.0)
    # Binary search over the rungs (perplexity grows with skipping, near enough): about log2(len(LADDER)) scores.
    rungs, chosen = [], None
    lo, hi = 0, len(LADDER) - 1
    bar = tqdm(total=math.ceil(math.log2(len(LADDER) + 1)), desc="scoring input sparsity", unit="plan",
               disable=not progress, file=sys.stderr)
    while lo <= hi:
        mid = (lo + hi) // 2
        levels = LADDER[mid]
        ppl = heldout_perplexity(session, prof.plan(levels, cfg.d_ff), heldout)
        rungs.append({"levels": levels, "ppl": round(ppl, 4), "change": round(ppl / dense - 1.0, 5)})
        bar.update(1)
        bar.set_postfix(change=f"{(ppl / dense - 1) * 100:+.2f}%")
        if ppl <= bound:
            chosen, lo = levels, mid + 1
        else:
            hi = mid - 1
    bar.close()
    if chosen is None:
        chosen = {}  # every rung costs more than the bound: nothing is cut (decode runs dense)
    kept = next((r for r in rungs if r["levels"] == chosen), None)
    info = {"calibration": "bundled", "quality": {"bound_pct": quality, "dense_ppl": round(dense, 4),
                                                  "heldout_tokens": int(len(heldout)), "rungs": rungs,
                                                  "change": kept["change"] if kept else 0.0},
            "choose_seconds": round(time.time() - t0, 1)}
    plan = prof.plan(chosen, cfg.d_ff, info)
    if progress:
        what = ", ".join(f"{k} {v:.0%}" for k, v in chosen.items()) or "nothing (every rung past the bound)"
        print(f"pyinfer: input sparsity: {what}"
              + (f" ({kept['change'] * 100:+.2f}% held-out perplexity)" if kept else ""), file=sys.stderr)
    return plan
