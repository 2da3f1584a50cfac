"""Per-layer activation predictors, trained in numpy.

A predictor is a low-rank MLP, d_model -> r -> (n_ff - hot), that reads the FFN input and scores
each cold neuron; hot neurons (the prefix of the hot-first order) always run. No deep-learning
framework: at these sizes (r <= 256, a few 10k samples) Adam on numpy matmuls trains a layer in
about a second.

Loss: weighted binary cross-entropy, positives weighted up so that recall comes first. The decision
cut-off is then calibrated on a validation split to hit the recall target exactly; epochs stop early
when the density needed for that recall stops falling. Recall and density are reported on a third,
held-out split that neither training nor calibration saw.

Rank is sized per layer (PowerInfer §5.1): start from the layer's sparsity and skew, then shrink while
the cost model (predictor bytes + the gate/up/down bytes the predicted set reads) improves and the
held-out recall stays at the target, and grow when held-out recall falls below it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, quants

from .plan import Predictor

RANKS = (32, 64, 128, 256)


@dataclass
class TrainConfig:
    recall: float = 0.95          # target recall of active neurons (held out)
    recall_margin: float = 0.005  # the cut-off is calibrated this much higher, so held-out recall clears the target
    epochs: int = 20
    batch: int = 256
    lr: float = 1e-2
    pos_weight: float = 4.0       # BCE weight of active neurons
    hot_frequency: float = 0.9    # neurons firing at least this often always run
    fixed_rank: int | None = None  # skip the rank search (the quick `auto` path)
    seed: int = 0


def _q8(w: np.ndarray) -> np.ndarray:
    return quants.quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.Q8_0)


def _dq8(q: np.ndarray, cols: int) -> np.ndarray:
    return quants.dequantize(q, GGMLQuantizationType.Q8_0).reshape(-1, cols)


def q8_scores(w1_q8: np.ndarray, b1: np.ndarray, w2_q8: np.ndarray, x: np.ndarray) -> np.ndarray:
    """relu(x @ W1.T + b1) @ W2.T with the Q8_0 weights the engine runs (no output bias: the engine
    folds it into the per-neuron cut-offs). x: F32 [N, d] -> F32 [N, n_cold]."""
    w1 = _dq8(w1_q8, x.shape[1])
    return np.maximum(x @ w1.T + b1, 0) @ _dq8(w2_q8, w1.shape[0]).T


class _MLP:
    def __init__(self, d: int, r: int, n: int, rng: np.random.Generator, prior: np.ndarray):
        self.w1 = (rng.standard_normal((d, r)) / np.sqrt(d)).astype(np.float32)
        self.b1 = np.zeros(r, np.float32)
        self.w2 = (rng.standard_normal((r, n)) / np.sqrt(r) * 0.1).astype(np.float32)
        p = np.clip(prior, 1e-4, 1 - 1e-4)
        self.b2 = np.log(p / (1 - p)).astype(np.float32)  # start at each neuron's base rate
        self.params = [self.w1, self.b1, self.w2, self.b2]
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.t = 0

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2

    def step(self, x: np.ndarray, y: np.ndarray, pos_weight: float, lr: float) -> None:
        z = np.maximum(x @ self.w1 + self.b1, 0)
        lg = z @ self.w2 + self.b2
        p = 1.0 / (1.0 + np.exp(-np.clip(lg, -30, 30)))
        g = np.where(y, pos_weight * (p - 1.0), p).astype(np.float32) / len(x)
        gw2, gb2 = z.T @ g, g.sum(0)
        gz = (g @ self.w2.T) * (z > 0)
        grads = [x.T @ gz, gz.sum(0), gw2, gb2]
        self.t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        for prm, gr, m, v in zip(self.params, grads, self.m, self.v):
            m *= b1
            m += (1 - b1) * gr
            v *= b2
            v += (1 - b2) * gr * gr
            prm -= lr * (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + eps)


def _cut_for_recall(logits: np.ndarray, y: np.ndarray, recall: float) -> float:
    """Largest global logit cut-off whose recall over all active (sample, neuron) pairs is >= recall."""
    pos = np.sort(logits[y])
    if len(pos) == 0:
        return float(np.inf)
    k = int(np.floor((1.0 - recall) * len(pos)))
    return float(pos[k]) - 1e-6


def _metrics(logits: np.ndarray, y: np.ndarray, cut: float, hot: int, n_ff: int) -> dict:
    pred = logits > cut
    tp = float((pred & y).sum())
    n_pos, n_pred = float(y.sum()), float(pred.sum())
    rows = len(y)
    return {"recall": tp / max(1.0, n_pos), "precision": tp / max(1.0, n_pred),
            "predicted_density": (n_pred + hot * rows) / (rows * n_ff),
            "true_density_cold": n_pos / max(1.0, rows * (n_ff - hot))}


def _train_rank(x_tr, y_tr, x_val, y_val, r: int, cfg: TrainConfig, prior: np.ndarray):
    rng = np.random.default_rng(cfg.seed + r)
    mlp = _MLP(x_tr.shape[1], r, y_tr.shape[1], rng, prior)
    best, best_density, stale = None, np.inf, 0
    for _ in range(cfg.epochs):
        order = rng.permutation(len(x_tr))
        for i in range(0, len(order), cfg.batch):
            idx = order[i:i + cfg.batch]
            mlp.step(x_tr[idx], y_tr[idx], cfg.pos_weight, cfg.lr)
        lg = mlp.logits(x_val)
        cut = _cut_for_recall(lg, y_val, cfg.recall)
        density = float((lg > cut).mean())
        if density < best_density - 1e-4:
            best, best_density, stale = [p.copy() for p in mlp.params], density, 0
        else:
            stale += 1
            if stale >= 2:  # early stopping: the density at target recall stopped improving
                break
    return best


def _quantized_predictor(params, x_val, y_val, x_test, y_test, recall: float, hot: int, n_ff: int) -> Predictor:
    """Quantizes to Q8_0 (the engine's format), then calibrates the cut-off with the quantized weights."""
    w1, b1, w2, b2 = params
    w1_q8, w2_q8 = _q8(w1.T), _q8(w2.T)          # [r, d], [n_cold, r]

    def logits(x):
        return q8_scores(w1_q8, b1, w2_q8, x) + b2

    cut = _cut_for_recall(logits(x_val), y_val, recall)
    stats = _metrics(logits(x_test), y_test, cut, hot, n_ff)
    pred = Predictor(w1_q8, b1.astype(np.float32), w2_q8, (cut - b2).astype(np.float32))
    stats.update(rank=int(b1.shape[0]), hot=hot, bytes=pred.nbytes)
    pred.stats = stats
    return pred


def layer_cost(pred: Predictor, n_ff: int, neuron_bytes: float) -> float:
    """Bytes one decode token reads in this layer's FFN: predictor + gate/up/down of predicted neurons."""
    return pred.nbytes + pred.stats["predicted_density"] * n_ff * neuron_bytes


def train_layer(x: np.ndarray, y: np.ndarray, freq: np.ndarray, cfg: TrainConfig, neuron_bytes: float) -> tuple[Predictor, int]:
    """x: F32 [N, d] FFN inputs; y: bool [N, n_ff] active labels in hot-first order; freq: [n_ff] firing
    frequencies in that order. Returns (predictor, hot count)."""
    n, n_ff = y.shape
    hot = int(min((freq >= cfg.hot_frequency).sum(), n_ff - 32))
    yc = y[:, hot:]
    a, b = int(n * 0.7), int(n * 0.85)  # train / validation (cut-off, early stop) / held-out test
    x_tr, x_val, x_te = x[:a], x[a:b], x[b:]
    y_tr, y_val, y_te = yc[:a], yc[a:b], yc[b:]
    prior = y_tr.mean(0)

    def fit(r: int) -> Predictor:
        return _quantized_predictor(_train_rank(x_tr, y_tr, x_val, y_val, r, cfg, prior), x_val, y_val, x_te, y_te,
                                    min(0.999, cfg.recall + cfg.recall_margin), hot, n_ff)

    if cfg.fixed_rank:
        return fit(cfg.fixed_rank), hot
    # Start: dense or unskewed layers need more capacity to separate their neurons.
    density = float(y.mean())
    i = 1 if density < 0.6 else 2
    tried: dict[int, Predictor] = {RANKS[i]: fit(RANKS[i])}

    def ok(p: Predictor) -> bool:
        return p.stats["recall"] >= cfg.recall  # on the held-out split

    def cost(p: Predictor) -> float:
        return layer_cost(p, n_ff, neuron_bytes) + (0 if ok(p) else 1e12)

    while i > 0:  # shrink while cheaper and still on target
        p = fit(RANKS[i - 1])
        tried[RANKS[i - 1]] = p
        if cost(p) >= cost(tried[RANKS[i]]):
            break
        i -= 1
    while not ok(tried[RANKS[i]]) and i + 1 < len(RANKS):  # grow while held-out recall is short
        i += 1
        tried.setdefault(RANKS[i], fit(RANKS[i]))
    best = min(tried.values(), key=cost)
    return best, hot
