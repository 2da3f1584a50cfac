"""Which experts of a Mixture of Experts the GPU computes under a VRAM budget: PowerInfer's placement at the
grain of whole experts, the CPU computing the others at the same time (runtime/moe_ffn.py's split).

What every token reads comes first: attention, norms, routers and shared experts of every block, the KV cache
for the context and a scratch reserve. What is left holds experts and, as one more item, the output head.
Each layer's experts are taken in order of a routing profile (offload/experts.py: how often each was chosen),
and each is worth the CPU time per token it takes over: the share of tokens that choose it times its bytes at
the CPU's seconds per byte. Attention, router and the residual stream live on the device, so every layer with
any expert on the CPU pays one synchronization and transfer of the hidden vector (down and back up); only a
layer placed whole avoids it. The program (place/knapsack.py's prefix knapsack, solved by HiGHS) maximizes the
time saved net of those synchronizations: placing a layer whole earns its synchronization back (the knapsack's
whole-layer bonus). The greedy fill it is compared with (PowerInfer's released solver) fills by value per byte
and never asks."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .gpu_placement import SCRATCH_BYTES, GpuCosts, head_bytes, kv_cache_bytes
from .knapsack import KnapsackAnswer, PrefixKnapsack, solve_greedy, solve_highs

FORMAT = "pyinfer-expert-placement"
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass
class ExpertPlacement:
    fingerprint: str
    vram_budget: int
    fixed: dict                     # bytes every token reads, on the GPU first: attention (with routers and
    minimum: int                    #   shared experts), kv_cache, scratch; and their sum
    n_expert: int
    gpu_experts: list[list[int]]    # per layer: the experts the GPU computes
    head_on_gpu: bool
    expert_bytes_on_gpu: int
    expert_bytes: int
    head_bytes: int
    mass_on_gpu: float              # share of the profile's routes that land on the GPU
    cpu_seconds_moved: float        # expected CPU time per token the GPU takes over
    cpu_seconds_total: float        # the experts' and head's CPU time per token without a GPU
    net_seconds: float              # moved, less one synchronization per layer not placed whole
    solver: str
    solve_seconds: float
    costs: dict
    greedy: dict                    # the greedy fill by value per byte, without the communication constraint
    info: dict = field(default_factory=dict)

    @property
    def split_layers(self) -> list[int]:
        return [il for il, g in enumerate(self.gpu_experts) if 0 < len(g) < self.n_expert]

    def summary(self) -> dict:
        return {"format": FORMAT, "version": 1, "kind": "experts", **asdict(self), "split_layers": self.split_layers}


def expert_bytes(gguf: GGUFModelFile, cfg: LlamaConfig) -> list[int]:
    """Per layer: bytes of one expert (its gate, up and down)."""
    out = [0] * cfg.n_layers  # 0 for a dense layer (GLM-4.5's first): nothing to place
    for name, t in gguf.tensors.items():
        m = _EXPERTS.match(name)
        if m and int(m.group(1)) < cfg.n_layers:  # (not GLM's multi-token-prediction layers, never run)
            out[int(m.group(1))] += int(t.data.nbytes) // cfg.n_expert
    return out


def fixed_bytes(gguf: GGUFModelFile, cfg: LlamaConfig, n_ctx: int, cache_type: str = "f16") -> dict:
    """What every token reads, placed first: each block's tensors but its experts, the KV cache, a scratch."""
    shared = sum(int(t.data.nbytes) for n, t in gguf.tensors.items()
                 if (b := _BLOCK.match(n)) and int(b.group(1)) < cfg.n_layers and not _EXPERTS.match(n))
    return {"attention": shared, "kv_cache": kv_cache_bytes(cfg, n_ctx, cache_type), "scratch": SCRATCH_BYTES}


def route_shares(cfg: LlamaConfig, counts: np.ndarray | None) -> np.ndarray:
    """F64 [n_layers, n_expert]: the share of tokens that choose each expert (each row sums to k); without a
    profile, k / n_expert everywhere."""
    k, n = cfg.n_expert_used, cfg.n_expert
    if counts is None or np.asarray(counts).sum() == 0:
        return np.full((cfg.n_layers, n), k / n)
    c = np.asarray(counts, np.float64)
    return c / np.maximum(c.sum(1, keepdims=True), 1e-30) * k


def fill_leftover(kept: list[int], per_expert: list[int], n_expert: int, capacity: float, head: int) -> list[int]:
    """The program's answer with the room it left filled by the experts it did not take: experts the profile
    never saw chosen are worth nothing to it (value 0), yet a later prompt may choose them, and a layer made
    whole needs no synchronization. Layers nearest to whole are completed first, then the rest take what still
    fits, in profile order. Adds only experts that fit; the head (last item) is left as chosen."""
    kept = list(kept)
    per = [float(b) for b in per_expert]
    room = capacity - sum(k * b for k, b in zip(kept[:-1], per)) - (head if kept[-1] else 0)
    for il in sorted(range(len(per)), key=lambda i: (n_expert - kept[i]) * per[i]):
        missing = (n_expert - kept[il]) * per[il]
        if 0 < missing <= room:
            kept[il] = n_expert
            room -= missing
    for il in range(len(per)):
        extra = min(n_expert - kept[il], int(room // per[il]) if per[il] > 0 else 0)
        if extra > 0:
            kept[il] += extra
            room -= extra * per[il]
    return kept


def place_experts(gguf: GGUFModelFile, cfg: LlamaConfig, vram_budget: int, n_ctx: int, costs: GpuCosts,
                  counts: np.ndarray | None = None, time_limit: float = 10.0,
                  cache_type: str = "f16") -> ExpertPlacement:
    """The placement under `vram_budget` bytes; refused (PyinferError, naming the minimum) below the minimum.
    counts: the routing profile ([n_layers, n_expert] times chosen; None: every expert alike)."""
    fixed = fixed_bytes(gguf, cfg, n_ctx, cache_type)
    minimum = sum(fixed.values())
    if vram_budget < minimum:
        raise PyinferError(f"a VRAM budget of {vram_budget / 2**20:.1f} MiB is below the minimum of "
                           f"{minimum / 2**20:.1f} MiB (attention, routers and shared experts "
                           f"{fixed['attention'] / 2**20:.1f}, KV cache {fixed['kv_cache'] / 2**20:.1f} for {n_ctx} "
                           f"positions, scratch {fixed['scratch'] / 2**20:.1f})")
    share = route_shares(cfg, counts)
    per_expert = expert_bytes(gguf, cfg)
    order = [np.argsort(-share[il], kind="stable") for il in range(cfg.n_layers)]  # most chosen first
    value = [list(share[il][o] * per_expert[il] * costs.cpu_seconds_per_byte) for il, o in enumerate(order)]
    head = head_bytes(gguf)
    head_s = head * costs.cpu_seconds_per_byte
    sync = costs.sync_seconds
    # The head is one more "layer" of one item. Net of synchronizations: every layer pays one unless placed
    # whole, which earns it back (the constant n_layers * sync is left out of the objective).
    items = [[float(b)] * cfg.n_expert for b in per_expert] + [[float(head)]]
    program = PrefixKnapsack(group_bytes=items, group_value=value + [[head_s]], capacity=float(vram_budget - minimum),
                             whole_bonus=[sync] * cfg.n_layers + [0.0])
    answer = solve_highs(program, time_limit)
    plain = PrefixKnapsack(items, value + [[head_s]], program.capacity)
    greedy = solve_greedy(plain)

    def net(kept: list[int]) -> float:  # CPU time moved, less a synchronization per layer not wholly placed
        return plain.value(kept) - sync * sum(k < cfg.n_expert for k in kept[:-1])

    if answer.solver != "highs" and net(greedy.kept) > net(answer.kept):
        # No HiGHS optimum or incumbent, and the program's own greedy fallback (which ignores the whole-layer
        # bonus) did worse: the plain greedy fill is the better answer to give.
        answer = KnapsackAnswer(greedy.kept, 0.0, greedy.used, "greedy", answer.seconds + greedy.seconds,
                                answer.info)
    kept = fill_leftover(answer.kept, per_expert, cfg.n_expert, program.capacity, head)
    if kept != answer.kept:
        answer = KnapsackAnswer(kept, plain.value(kept), answer.used, answer.solver, answer.seconds,
                                dict(answer.info, filled_leftover=int(sum(kept[:-1]) - sum(answer.kept[:-1]))))
    # (a dense layer's zero-byte "experts" are none: its FFN is placed with attention)
    gpu = [sorted(int(e) for e in o[:k]) if per_expert[il] else [] for il, (o, k) in enumerate(zip(order, answer.kept))]
    # Greedy's split layers whose missing experts are worth less than the synchronization finishing them saves.
    losing = [il for il, k in enumerate(greedy.kept[:-1]) if 0 < k < cfg.n_expert and sum(value[il][k:]) < sync]
    return ExpertPlacement(
        fingerprint=gguf.fingerprint(), vram_budget=int(vram_budget), fixed=fixed, minimum=int(minimum),
        n_expert=cfg.n_expert, gpu_experts=gpu, head_on_gpu=bool(answer.kept[-1]),
        expert_bytes_on_gpu=int(sum(len(g) * b for g, b in zip(gpu, per_expert))),
        expert_bytes=int(sum(per_expert) * cfg.n_expert), head_bytes=head,
        mass_on_gpu=float(sum(share[il][g].sum() for il, g in enumerate(gpu)) / max(share.sum(), 1e-30)),
        cpu_seconds_moved=plain.value(answer.kept), cpu_seconds_total=float(sum(map(sum, value))) + head_s,
        net_seconds=net(answer.kept), solver=answer.solver, solve_seconds=answer.seconds, costs=asdict(costs),
        greedy={"gpu_experts": [int(k) for k in greedy.kept[:-1]], "head_on_gpu": bool(greedy.kept[-1]),
                "value": greedy.value, "net_seconds": net(greedy.kept),
                "gpu_experts_total": int(sum(greedy.kept[:-1])),
                "split_layers": [il for il, k in enumerate(greedy.kept[:-1]) if 0 < k < cfg.n_expert],
                "split_layers_losing_time": losing, "differs": greedy.kept != answer.kept},
        info=dict(answer.info, n_ctx=n_ctx, cache_type=cache_type, profiled=counts is not None))


def check_expert_placement(d: dict, cfg: LlamaConfig, n_ctx: int, cache_type: str, path: str) -> dict:
    """A placement file fits this load: same context and KV cache type, expert lists in range."""
    info = d.get("info", {})
    try:
        for k, v in {"n_ctx": n_ctx, "cache_type": cache_type}.items():
            if info.get(k) != v:
                raise PyinferError(f"{path} was placed for {k} {info.get(k)!r}, this load has {v!r}; run "
                                   f"`pyinfer place` again")
        lists = d["gpu_experts"]
        if d.get("kind") != "experts" or len(lists) != cfg.n_layers or any(
                not 0 <= int(e) < cfg.n_expert for g in lists for e in g):
            raise PyinferError(f"{path}: its expert lists do not fit this model")
    except (KeyError, TypeError, ValueError) as e:
        raise PyinferError(f"{path} is not a valid expert placement ({e})") from None
    return d
