"""ReLU-fication by distillation: the student (the model with ReLU on its gate) learns the teacher's next-token
distributions (KL) plus the text itself (cross-entropy), with ProSparse's L1 penalty on the gate activations
rising in stages until the FFN is as sparse as asked. Only the FFN trains.

The loss never holds [tokens, vocabulary] logits: ChunkedDistillLoss walks the vocabulary in chunks twice
(log-sum-exps, then the loss and its gradient), so a 49k or 262k vocabulary fits."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .torch_llama import Llama

VOCAB_CHUNK = 8192


def _lse(h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Log-sum-exp over the vocabulary of h @ head.T, chunk by chunk. F32 [N]."""
    out = torch.full((h.shape[0],), -math.inf, dtype=torch.float32, device=h.device)
    for lo in range(0, head.shape[0], VOCAB_CHUNK):
        out = torch.logaddexp(out, (h @ head[lo:lo + VOCAB_CHUNK].T).float().logsumexp(-1))
    return out


class ChunkedDistillLoss(torch.autograd.Function):
    """mean over tokens of KL(teacher || student) + lm * cross-entropy(student, targets), from the hidden
    states and the frozen head; the gradient flows to the student's hidden states only."""

    @staticmethod
    def forward(ctx, hs, ht, head, targets, lm: float):
        with torch.no_grad():
            lse_s, lse_t = _lse(hs, head), _lse(ht, head)
            kl = torch.zeros((), dtype=torch.float32, device=hs.device)
            nll = torch.zeros((), dtype=torch.float32, device=hs.device)
            for lo in range(0, head.shape[0], VOCAB_CHUNK):
                w = head[lo:lo + VOCAB_CHUNK]
                ls = (hs @ w.T).float() - lse_s[:, None]
                lt = (ht @ w.T).float() - lse_t[:, None]
                kl += (lt.exp() * (lt - ls)).sum()
                inside = (targets >= lo) & (targets < lo + w.shape[0])
                if inside.any():
                    nll -= ls[inside, (targets[inside] - lo)].sum()
        ctx.save_for_backward(hs, ht, head, targets, lse_s, lse_t)
        ctx.lm = lm
        ctx.mark_non_differentiable(kl, nll)
        n = hs.shape[0]
        return (kl + lm * nll) / n, kl / n, nll / n

    @staticmethod
    def backward(ctx, grad, _g_kl, _g_nll):
        hs, ht, head, targets, lse_s, lse_t = ctx.saved_tensors
        lm, n = ctx.lm, hs.shape[0]
        gh = torch.zeros_like(hs)
        rows = torch.arange(n, device=hs.device)
        for lo in range(0, head.shape[0], VOCAB_CHUNK):
            w = head[lo:lo + VOCAB_CHUNK]
            ps = ((hs @ w.T).float() - lse_s[:, None]).exp()
            pt = ((ht @ w.T).float() - lse_t[:, None]).exp()
            g = (1 + lm) * ps - pt                                 # d(KL + lm * CE) / d student logits
            inside = (targets >= lo) & (targets < lo + w.shape[0])
            g[rows[inside], targets[inside] - lo] -= lm
            gh += (g.to(hs.dtype) @ w)
        return gh * (grad / n), None, None, None, None


@dataclass
class DistillConfig:
    tokens: int = 4096            # training tokens (the student sees each once, in order)
    seq_len: int = 128
    batch: int = 4
    lr: float = 1e-4
    lm: float = 0.5               # weight of the cross-entropy beside the KL
    l1: float = 1e-3              # the L1 factor's last stage (ProSparse raises it in stages)
    l1_stages: int = 4
    target_sparsity: float = 0.9  # the factor stops rising once the FFN is this sparse
    seed: int = 0
    max_seconds: float = 0.0      # stop once training has run this long (0: no limit)


@dataclass
class Curve:
    steps: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    sparsity: list[float] = field(default_factory=list)   # share of zeros of ReLU(gate), all layers
    l1: list[float] = field(default_factory=list)
    seconds: float = 0.0


def batches(ids: np.ndarray, cfg: DistillConfig):
    """[B, seq_len + 1] windows of the token stream, in order, until cfg.tokens are covered (wrapping)."""
    span = cfg.seq_len + 1
    n_windows = max(1, (len(ids) - 1) // cfg.seq_len)
    k = 0
    for _ in range(math.ceil(cfg.tokens / (cfg.batch * cfg.seq_len))):
        rows = []
        for _ in range(cfg.batch):
            start = (k % n_windows) * cfg.seq_len
            w = ids[start:start + span]
            rows.append(np.pad(w, (0, span - len(w)), mode="wrap") if len(w) < span else w)
            k += 1
        yield torch.from_numpy(np.stack(rows).astype(np.int64))


def distill(teacher: Llama, student: Llama, ids: np.ndarray, cfg: DistillConfig, checkpoint: Path | None = None,
            resume: bool = False, progress: bool = True, device: str = "cpu") -> Curve:
    """Trains student's FFN on the token stream `ids`. Checkpoints (FFN weights, optimizer, curve) go to
    `checkpoint` every few steps and at the end; `resume` continues from it."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(student.ffn_parameters(), lr=cfg.lr, weight_decay=0.0)
    curve, start = Curve(), 0
    if resume and checkpoint is not None and checkpoint.exists():
        from ..errors import PyinferError

        state = torch.load(checkpoint, map_location=device, weights_only=True)
        same = ("tokens", "seq_len", "batch", "seed")  # what decides the data each step sees
        if any(state.get("config", {}).get(k) != getattr(cfg, k) for k in same):
            raise PyinferError(f"{checkpoint} was made with other {', '.join(same)} "
                               f"({ {k: state.get('config', {}).get(k) for k in same} }); resume with those")
        missing = student.load_state_dict(state["student"], strict=False).missing_keys
        if any(".ffn_" in k for k in missing):
            raise PyinferError(f"{checkpoint} does not hold this model's FFN")
        opt.load_state_dict(state["optimizer"])
        curve, start = Curve(**state["curve"]), state["step"]
    steps = math.ceil(cfg.tokens / (cfg.batch * cfg.seq_len))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else _null()
    stage_l1, t0 = (curve.l1[-1] if curve.l1 else 0.0), time.perf_counter() - curve.seconds
    bar = tqdm(total=steps, initial=start, desc="relufy", unit="step", disable=not progress, dynamic_ncols=True)
    for step, batch in enumerate(batches(ids, cfg)):
        if step < start:
            continue
        batch = batch.to(device)
        x, y = batch[:, :-1], batch[:, 1:].reshape(-1)
        # ProSparse: the L1 factor rises stage by stage, and stops rising once the target sparsity is reached.
        done = step / steps  # the share of training behind us: by steps, or by time under a time limit
        if cfg.max_seconds > 0:
            done = max(done, (time.perf_counter() - t0) / cfg.max_seconds)
        stage = min(cfg.l1_stages, 1 + int(done * cfg.l1_stages))
        if not curve.sparsity or curve.sparsity[-1] < cfg.target_sparsity:
            stage_l1 = cfg.l1 * stage / cfg.l1_stages
        with autocast:
            with torch.no_grad():
                ht = teacher(x).flatten(0, 1)
            acts: list = []
            hs = student(x, acts).flatten(0, 1)
            # ProSparse's penalty: each token's summed |activation| per layer, averaged over tokens and layers.
            l1 = sum(a.abs().sum(-1).mean() for a in acts) / len(acts)
        # The loss in fp32, outside autocast: its forward and its hand-written backward see the same numbers.
        loss, kl, _ = ChunkedDistillLoss.apply(hs.float(), ht.float(), student.head.float(), y, cfg.lm)
        total = loss + stage_l1 * l1.float()
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        with torch.no_grad():
            sparsity = float(sum((a == 0).float().mean() for a in acts) / len(acts))
        seen = (step + 1) * cfg.batch * cfg.seq_len
        curve.steps.append(step + 1)
        curve.tokens.append(seen)
        curve.loss.append(float(loss.detach()))
        curve.kl.append(float(kl.detach()))
        curve.sparsity.append(sparsity)
        curve.l1.append(stage_l1)
        curve.seconds = time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix(loss=f"{curve.loss[-1]:.3f}", kl=f"{curve.kl[-1]:.3f}", sparsity=f"{sparsity:.1%}",
                        tok_s=f"{seen / max(curve.seconds, 1e-9):.0f}")
        out_of_time = cfg.max_seconds > 0 and curve.seconds >= cfg.max_seconds
        if checkpoint is not None and ((step + 1) % 50 == 0 or step + 1 == steps or out_of_time):
            save_checkpoint(checkpoint, student, opt, curve, step + 1, cfg)
        if out_of_time:
            break
    bar.close()
    return curve


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def save_checkpoint(path: Path, student: Llama, opt, curve: Curve, step: int, cfg: DistillConfig) -> None:
    """Whole or not at all: written beside, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    ffn = {k: v for k, v in student.state_dict().items() if ".ffn_" in k}
    try:
        torch.save({"student": ffn, "optimizer": opt.state_dict(), "curve": asdict(curve), "step": step,
                    "config": asdict(cfg)}, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_curve(curve: Curve, path: Path) -> None:
    path.write_text(json.dumps(asdict(curve)))
