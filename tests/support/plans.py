"""Sparsity plans made for tests on the tiny model (support/tiny_model.py's TINY shape), and decoding one token at a
time: the sparse path's references."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

from pyinfer.sparsity.plan import LayerPlan, Predictor, SparsityPlan

from .tiny_model import TINY

D, FF, L = TINY["d_model"], TINY["d_ff"], TINY["n_layers"]
TOKENS = [5, 17, 33, 2, 40, 41, 8, 60, 12]


def all_active_plan(fingerprint: str, mode: str = "contrib", hot: int = 16, rank: int = 32, seed: int = 0,
                    threshold: float = 0.0) -> SparsityPlan:
    """Predictors that say "every neuron is active" (zero weights, cut-off below zero) and a random
    neuron order, so the permutation is exercised too."""
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(L):
        pred = Predictor(quants.quantize(np.zeros((rank, D), np.float32), Q.Q8_0), np.zeros(rank, np.float32),
                         quants.quantize(np.zeros((FF - hot, rank), np.float32), Q.Q8_0),
                         np.full(FF - hot, -1.0, np.float32), {"recall": 1.0})
        layers.append(LayerPlan(rng.permutation(FF).astype(np.int32), threshold, hot, pred))
    return SparsityPlan(mode, 0.0, layers, fingerprint)


def decode_logits(model, tokens):
    """Logits of each position, computed one token at a time (the decode path)."""
    out = [model.forward([t], i, np.array([0]))[0] for i, t in enumerate(tokens)]
    return np.stack(out)


def varying_predictor_plan(fp, seed=5, hot=8):
    """Random predictors: each token's list is a different ~half of the cold neurons."""
    plan = all_active_plan(fp, seed=seed, hot=hot)
    rng = np.random.default_rng(seed)
    for lp in plan.layers:
        p = lp.predictor
        rank, d = p.b1.shape[0], TINY["d_model"]
        p.w1_q8 = quants.quantize(rng.normal(0, 0.5, (rank, d)).astype(np.float32), Q.Q8_0)
        p.b1 = rng.normal(0, 0.1, rank).astype(np.float32)
        p.w2_q8 = quants.quantize(rng.normal(0, 0.5, (FF - hot, rank)).astype(np.float32), Q.Q8_0)
        p.cut = np.zeros(FF - hot, np.float32)
        lp.freq = np.linspace(1.0, 0.1, FF).astype(np.float32)
    return plan
