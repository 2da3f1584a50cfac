"""Measured behaviour of a sparsity plan on text: per layer, the share of neurons each decode step
computes and the recall of the truly active ones (what `pyinfer bench --sparsity` reports)."""
from __future__ import annotations

import numpy as np

from .plan import SparsityPlan
from .predictor import q8_scores
from .recorder import Recorder, criterion, silu


def _predicted(lp, h: np.ndarray, gate: np.ndarray, n_ff: int) -> np.ndarray:
    """bool [T, n_ff] in hot-first order: the neurons whose gate/up rows a decode step computes."""
    if lp.predictor is not None:
        p = lp.predictor
        hot = np.ones((len(h), lp.hot), bool)
        return np.concatenate([hot, q8_scores(p.w1_q8, p.b1, p.w2_q8, h) > p.cut], axis=1)
    if lp.gate_threshold > 0:
        return np.abs(silu(gate[:, lp.perm])) > lp.gate_threshold
    return np.ones((len(h), n_ff), bool)


def measure_plan(model, plan: SparsityPlan, ids: list[int], max_tokens: int = 1024) -> list[dict]:
    cfg = model.config
    acc = [dict(computed=0.0, active=0.0, true=0.0, rows=0) for _ in range(cfg.n_layers)]

    def on_layer(il, h, gate, up):
        lp = plan.layers[il]
        crit = criterion(plan.mode, gate, up, cfg.activation)[:, lp.perm]
        true = crit > lp.threshold
        comp = _predicted(lp, h, gate, cfg.d_ff)
        a = acc[il]
        a["computed"] += comp.sum()
        a["active"] += (comp & true).sum()  # computed and truly active: what the down axpy runs
        a["true"] += true.sum()
        a["rows"] += len(h)

    Recorder(model.gguf, cfg, model.n_threads).run(ids, max_tokens, on_layer, "measuring sparsity", progress=False)
    out = []
    for il, a in enumerate(acc):
        n = a["rows"] * cfg.d_ff
        out.append({"layer": il, "computed_density": a["computed"] / n, "active_density": a["active"] / n,
                    "true_density": a["true"] / n, "recall": a["active"] / max(1.0, a["true"])})
    return out
