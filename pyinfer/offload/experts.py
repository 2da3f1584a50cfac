"""Experts that do not fit a memory limit, streamed from the model file (csrc/offload/expert_store.h).

Under `--mem-limit`, a Mixture-of-Experts model keeps what every token reads (attention, norms, routers, the
embedding rows and the output head: its "shared" weights) in the file's memory map, and its experts in RAM of
its own: per layer the hottest experts of a routing profile stay resident, and a cache of slots shared by
every layer holds the others a token chose (least recently used out, or least frequently used). An expert a
token chooses that is in neither is read from the file with many requests in flight, right after its layer's
router has run. Reads also start a layer early: right after a layer's fetch, the next layer's router is applied
to this layer's hidden state (pre-gated MoE, ProMoE) and the experts it picks are read on a thread of the store's
own while this layer computes. llama.cpp leaves all of this to the kernel's page cache, which reads ahead around
every fault and cannot tell an expert from its neighbours.

The experts are read from an expert bundle file (offload/expert_bundles.py: each expert's three matrices side by
side on pages, one read each), written once into the cache next to the model's other sidecar files; where it
cannot be written (no room), from the GGUF's merged tensors (three reads of the pages around each expert).

Budgets: under `--mem-limit` the experts get what the limit leaves after the runtime, KV cache, buffers and
the shared weights; under `--ram-budget SIZE` (weights in RAM, as for a dense model's neuron offload) what SIZE
leaves after the shared weights.

The resident set: experts are equal-sized items, so the knapsack the placement program would solve is the
greedy fill by routing frequency; without a profile, none stay resident and the cache takes the whole budget."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _core
from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..tools.sizes import fmt_size

PARTS = ("gate", "up", "down")
PAGE = 4096  # each part of a slot starts on a page, with a page to spare (expert_store.cpp: O_DIRECT reads)
CACHE_SHARE = 0.25  # of the expert budget kept for the cache when a profile names resident experts
POLICY = "lru"      # the cache's eviction policy under a memory limit ("lfu": bench/moe_synthetic.py compares)
PREFETCH = True     # read the next layer's predicted experts ahead (bench/moe_synthetic.py --prefetch compares)
SOURCE = "bundle"   # where experts are read from: "bundle" (the expert bundle file) or "gguf" (the model file)


def expert_names(il: int) -> list[str]:
    return [f"blk.{il}.ffn_{p}_exps.weight" for p in PARTS]


def expert_bytes(gguf: GGUFModelFile, cfg: LlamaConfig) -> int:
    """Bytes of every expert tensor of the model."""
    return sum(gguf.tensors[n].data.nbytes for il in cfg.moe_layers for n in expert_names(il))


def gguf_layers(gguf: GGUFModelFile, cfg: LlamaConfig) -> list[dict]:
    """Where each layer's experts lie in the model file, as the expert store reads them: per part, where the
    merged tensor starts and the bytes of one expert of it (experts one after another). Only the layers that run
    experts (the store's layers: GLM-4.5's leading dense layers are not among them)."""
    out = []
    for il in cfg.moe_layers:
        offsets, sizes, strides = [], [], []
        for name in expert_names(il):
            size = int(gguf.tensors[name].data.nbytes) // cfg.n_expert
            start, stride = gguf.expert_spans.get(name) or (gguf._ranges[name][0], size)
            offsets.append(int(start))
            sizes.append(size)
            strides.append(int(stride))
        out.append({"file_offsets": offsets, "expert_bytes": sizes, "expert_strides": strides})
    return out


def _page(n: int) -> int:
    return -(-n // PAGE) * PAGE


def slot_bytes(gguf: GGUFModelFile, cfg: LlamaConfig, layers: list[dict] | None = None) -> int:
    """RAM one expert takes in the store (expert_store.cpp's layout): its three parts, each rounded up to pages,
    plus one page each where experts do not all start on a page (the page-aligned range around an unaligned
    expert, read with O_DIRECT), in the layer whose experts are largest (a file may quantize layers
    differently; every slot fits any layer's expert). `layers`: the store's view of the file read (default:
    the GGUF's merged tensors)."""
    total = 0
    for layer in layers if layers is not None else gguf_layers(gguf, cfg):
        strides = layer.get("expert_strides") or layer["expert_bytes"]
        on_pages = all(o % PAGE == 0 and s % PAGE == 0 for o, s in zip(layer["file_offsets"], strides))
        total = max(total, sum(_page(n) + (0 if on_pages else PAGE) for n in layer["expert_bytes"]))
    return total


@dataclass
class ExpertPlan:
    budget: int             # bytes for experts
    slot: int               # bytes of one expert in RAM
    resident: list[list[int]]  # per layer, expert ids kept in RAM
    cache_slots: int
    policy: str

    def summary(self) -> dict:
        return {"expert_budget": self.budget, "expert_slot_bytes": self.slot,
                "resident_experts": sum(map(len, self.resident)), "cache_slots": self.cache_slots,
                "policy": self.policy}


def plan_experts(gguf: GGUFModelFile, cfg: LlamaConfig, budget: int, max_tokens: int,
                 profile: np.ndarray | None = None, policy: str = "lru", slot: int | None = None) -> ExpertPlan:
    """Splits `budget` bytes between resident experts (the most often chosen of `profile`, [n_layers, n_expert]
    counts) and cache slots of `slot` bytes (default: the GGUF's), at least as many as one run of `max_tokens`
    tokens can choose in one layer."""
    slot = slot or slot_bytes(gguf, cfg)
    need = min(cfg.n_expert, max_tokens * cfg.n_expert_used)
    total = budget // slot
    if total < need:
        raise PyinferError(f"the memory limit leaves {fmt_size(max(budget, 0))} for experts; one layer of a run "
                           f"may choose {need} experts of {fmt_size(slot)} ({fmt_size(need * slot)})")
    resident: list[list[int]] = [[] for _ in range(cfg.n_layers)]
    cache = total
    if profile is not None and profile.sum() > 0:
        cache = max(need, int(total * CACHE_SHARE))
        n_resident = min(total - cache, cfg.n_layers * cfg.n_expert)
        order = np.argsort(-profile.ravel(), kind="stable")[:n_resident]  # equal sizes: greedy is optimal
        for flat in order:
            if profile.ravel()[flat] > 0:
                resident[int(flat) // cfg.n_expert].append(int(flat) % cfg.n_expert)
        cache = total - sum(map(len, resident))
    return ExpertPlan(budget, slot, [sorted(r) for r in resident], cache, policy)


class ExpertOffload:
    """A model's experts in an ExpertStore; the graph reads them as paged weights after each layer's fetch."""

    def __init__(self, gguf: GGUFModelFile, cfg: LlamaConfig, plan: ExpertPlan, io_threads: int = 8,
                 prefetch: bool = True, direct_io: bool = True, bundle=None):
        """`bundle`: an ExpertBundleLayout to read the experts from (default: the model file)."""
        layers = bundle.store_layers() if bundle is not None else gguf_layers(gguf, cfg)
        self.lead = cfg.dense_lead  # the store's layer i is the model's layer lead + i
        for i, layer in enumerate(layers):
            layer.update(n_expert=cfg.n_expert, resident=plan.resident[self.lead + i])
        self.plan, self.n_expert, self.prefetch = plan, cfg.n_expert, prefetch
        path = bundle.path if bundle is not None else gguf.path
        self.source = "bundle" if bundle is not None else "gguf"
        try:
            self.store = _core.ExpertStore(str(path), layers, plan.cache_slots, plan.policy, io_threads,
                                           direct_io=direct_io)
        except (RuntimeError, ValueError) as e:
            raise PyinferError(f"{path.name}: {e}") from None
        self._gguf = gguf

    def store_layer(self, il: int) -> int:
        """The store's index of model layer il (its layers are the ones that run experts)."""
        return il - self.lead

    def weight(self, b, il: int, part: str):
        """The merged experts of one part of layer `il`, read through the store."""
        name = f"blk.{il}.ffn_{part}_exps.weight"
        t = self._gguf.tensors[name]
        return b.expert_weight(name, t.dtype_id, t.cols, t.rows, self.store, self.store_layer(il), PARTS.index(part))

    def report(self, tokens: int = 0) -> dict:
        """The store's counts since its last reset, with the hit rate and bytes read per token."""
        st = dict(self.store.stats())
        asked = max(st["requests"], 1)
        st.update(self.plan.summary(), hit_rate=(st["resident_hits"] + st["cache_hits"]) / asked,
                  resident_hit_rate=st["resident_hits"] / asked,
                  bytes_read_per_token=st["bytes_read"] / tokens if tokens else None, prefetch=self.prefetch,
                  source=self.source,
                  prediction_accuracy=st["predicted_right"] / st["predicted"] if st["predicted"] else None,
                  prefetch_used_share=st["prefetch_used"] / st["prefetched"] if st["prefetched"] else None)
        return st


def routing_profile(store, dense_lead: int = 0) -> np.ndarray:
    """[n_layers, n_expert] how often each expert was chosen since the store's last reset (zero rows for the
    `dense_lead` leading dense layers, which the store does not hold)."""
    chosen = np.asarray(store.chosen(), dtype=np.float64)
    return np.concatenate([np.zeros((dense_lead, chosen.shape[1])), chosen]) if dense_lead else chosen


def expert_bundle(session, progress: bool):
    """The expert bundle file of the session's model (written once into the cache), or None where experts are
    read from the model file: SOURCE says so, or the file cannot be written here (no room)."""
    import sys

    from ..model.pull import cache_dir
    from .expert_bundles import open_or_write_expert_bundles

    if SOURCE == "gguf":
        return None
    try:
        return open_or_write_expert_bundles(cache_dir(), session.gguf, session.config, progress)
    except PyinferError as e:
        if progress:
            print(f"pyinfer: warning: {e}; experts are read from the model file instead", file=sys.stderr)
        return None


def make_expert_offload(session, ram_budget=None, progress: bool = True) -> ExpertOffload | None:
    """Under a memory limit (session.memory) that leaves less than the model for weights, or a RAM budget for
    weights (`ram_budget`, bytes or a size) below the model's: the experts stream, the hottest of the routing
    profile resident. None where the whole model fits."""
    import sys

    from .offloaded_ffn import BudgetBelowMinimum, parse_size

    gguf, cfg, plan = session.gguf, session.config, session.memory
    if ram_budget is not None:
        if str(ram_budget).endswith(".json"):
            raise PyinferError("a plan file from `pyinfer plan` splits FFN neurons; give a Mixture-of-Experts model "
                               "its RAM budget as a size (--ram-budget 8G) or a memory limit (--mem-limit)")
        weights = parse_size(ram_budget)
        if plan is not None:  # a memory limit as well: the smaller of the two
            weights = min(weights, plan.weights)
    else:
        weights = plan.weights
    if weights >= gguf.weight_bytes:
        return None
    shared = gguf.weight_bytes - expert_bytes(gguf, cfg)  # stays mapped: every token reads it
    # The smallest budget is known before the bundle file is written (its slots are never larger than the GGUF's).
    need = min(cfg.n_expert, session.max_batch * cfg.n_expert_used) * slot_bytes(gguf, cfg)
    if weights - shared < need:
        if plan is not None:
            raise plan.below_minimum(shared + need)
        raise BudgetBelowMinimum(f"a RAM budget of {fmt_size(weights)} is below this model's minimum of "
                                 f"{fmt_size(shared + need)} (shared weights {fmt_size(shared)}, and one layer of a "
                                 f"run may choose {need // slot_bytes(gguf, cfg)} experts)", shared + need)
    bundle = expert_bundle(session, progress)
    slot = slot_bytes(gguf, cfg, bundle.store_layers() if bundle is not None else None)
    from ..sparsity.expert_profile import cached_profile

    profile = cached_profile(session, progress)
    eplan = plan_experts(gguf, cfg, weights - shared, session.max_batch, profile["counts"], POLICY, slot)
    if progress:
        source = bundle.path.name if bundle is not None else gguf.path.name
        print(f"pyinfer: experts stream from {source}: {sum(map(len, eplan.resident))} of "
              f"{cfg.n_layers * cfg.n_expert} resident, a cache of {eplan.cache_slots} "
              f"({fmt_size(eplan.cache_slots * eplan.slot)}); {fmt_size(shared)} of shared weights stay mapped",
              file=sys.stderr)
    return ExpertOffload(gguf, cfg, eplan, prefetch=PREFETCH, bundle=bundle)
