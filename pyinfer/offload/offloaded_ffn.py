"""A RAM budget for weights: what must stay (attention, norms, embeddings, head, predictors, Q4T scales and
the read ring) stays, the rest of the budget keeps each layer's hottest FFN neurons, and the cold tails are
streamed from the bundle file by the neuron store's reader thread while the model computes."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from .._core import DType
from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import SparsityPlan, selective_layers  # noqa: F401  (selective_layers: offload's callers)
from ..tools.sizes import fmt_size, parse_size  # noqa: F401  (parse_size: offload's callers)
from .bundles import ALIGN, BundleLayout, align, open_or_write, read_scales
from .resident import ResidentChoice, greedy_resident, solve_resident

_FFN_WEIGHT = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)(_t)?\.weight$")
# A read request costs about this long on top of its bytes (QD1 4 KiB reads measured 132 MB/s against
# 1 GB/s at 1 MiB on the test VM: ~30 us per request); in bytes at 1 GB/s it is what a layer kept whole saves.
READ_REQUEST_BYTES = 32 * 1024
RING_SLOTS = 2
# Listed reads are cut at this many bytes (the read cluster size; `pyinfer plan` picks it).
MAX_RANGE = 256 * 1024
# Listed page ranges closer than this are read as one (`pyinfer plan` picks it).
MERGE_GAP = 8192
# Share of the budget above the minimum that the neuron cache gets when the plan has selective layers
# (bench/results/offload/neuron_cache_smollm2_*.md measured it); the rest keeps the hottest neurons resident.
CACHE_SHARE = 0.0
# Share of each selective layer's neurons read ahead after its resident prefix (default; `pyinfer plan` picks).
WINDOW_SHARE = 0.0


class BudgetBelowMinimum(PyinferError):
    """A weight budget below what must stay in RAM; `minimum` is that floor in bytes."""

    def __init__(self, message: str, minimum: int):
        super().__init__(message)
        self.minimum = minimum


@dataclass
class OffloadPlan:
    """What stays in RAM and what is streamed, under one budget."""
    budget: int
    fixed_bytes: int                 # non-FFN weights + predictors + scales + ring
    non_ffn_bytes: int
    ring_bytes: int
    cache_bytes: int                 # the LRU cache of selective layers' cold neurons
    resident: list[int]              # per layer: hottest neurons kept
    resident_bytes: int
    streamed_bytes: int              # expected bundle bytes read per token
    ffn_bytes: int                   # all bundles
    choice: ResidentChoice
    greedy: ResidentChoice
    info: dict = field(default_factory=dict)
    window: list[int] = field(default_factory=list)  # per selective layer: cold neurons read ahead

    def summary(self) -> dict:
        return {"ram_budget": self.budget, "fixed_bytes": self.fixed_bytes, "non_ffn_bytes": self.non_ffn_bytes,
                "ring_bytes": self.ring_bytes, "cache_bytes": self.cache_bytes, "window_neurons": self.window,
                "resident_ffn_bytes": self.resident_bytes, "streamed_bytes_per_token": self.streamed_bytes,
                "ffn_bundle_bytes": self.ffn_bytes, "resident_neurons": self.resident,
                "solver": self.choice.solver, "solve_seconds": round(self.choice.seconds, 4),
                "greedy_value": self.greedy.value, "solver_value": self.choice.value,
                "solver_differs_from_greedy": self.choice.counts != self.greedy.counts,
                "solver_fallback": self.choice.info.get("fallback"), **self.info}


def highs_workspace(groups: int) -> int:
    """Memory HiGHS takes while it solves the resident program of `groups` neuron groups: 18-48 MiB measured
    for 774 variables (6 layers of 4096 neurons), a transient that a memory limit must have room for."""
    return (48 << 20) + groups * (32 << 10)


def non_ffn_bytes(gguf: GGUFModelFile) -> int:
    return sum(t.data.nbytes for name, t in gguf.tensors.items() if not _FFN_WEIGHT.match(name))


def window_neurons(layout: BundleLayout, selective: list[bool], window_share: float) -> list[int]:
    """Per layer: how many cold neurons a selective layer reads ahead (0 for streamed layers)."""
    return [round(window_share * e["n_ff"]) if sel else 0 for e, sel in zip(layout.layers, selective)]


def ring_bytes(layout: BundleLayout, selective: list[bool], ring_slots: int = RING_SLOTS,
               window_share: float = 0.0) -> int:
    """Read buffers: ring slots for what the reader thread reads ahead (streamed tails, sized for a whole layer
    since a tail can be one, and selective layers' windows), one buffer for a selective layer's reads, all
    page-aligned at both ends; and one for the original down matrix a dense run (prefill) reads."""
    span = [align(e["n_ff"] * e["bundle_bytes"]) + ALIGN for e in layout.layers]
    windows = window_neurons(layout, selective, window_share)
    ahead = [s for s, sel in zip(span, selective) if not sel]
    ahead += [align(w * e["bundle_bytes"]) + ALIGN for w, e in zip(windows, layout.layers) if w > 0]
    picked = [s for s, sel in zip(span, selective) if sel]
    dense = max((align(e["dense_rows"] * e["dense_row_bytes"]) for e in layout.layers), default=0)
    return min(ring_slots, len(ahead)) * max(ahead, default=0) + max(picked, default=0) + dense


def minimum_budget(gguf: GGUFModelFile, plan: SparsityPlan, layout: BundleLayout, ring_slots: int = RING_SLOTS,
                   window_share: float = 0.0) -> int:
    """What must stay in RAM whatever the budget: every weight but the FFN's, the predictors, the Q4T
    scales and the read buffers."""
    scales = sum(int(np.prod(e["scales_shape"])) * 2 for e in layout.layers if "scales_shape" in e)
    return (non_ffn_bytes(gguf) + plan.predictor_bytes() + scales
            + ring_bytes(layout, selective_layers(plan), ring_slots, window_share))


def neuron_values(plan: SparsityPlan, layout: BundleLayout) -> list[np.ndarray]:
    """Expected bytes per token that keeping each neuron saves: a streamed tail is read whole every token
    (every neuron is worth its bundle); a selective layer reads a neuron only when it fires (its profiled
    frequency, or the plan's mean density where the plan has none; the hot prefix always)."""
    out = []
    density = float(plan.info.get("density", 1.0 - plan.target))
    for lp, sel, e in zip(plan.layers, selective_layers(plan), layout.layers):
        n, b = e["n_ff"], float(e["bundle_bytes"])
        if not sel:
            out.append(np.full(n, b))
            continue
        f = np.asarray(lp.freq, dtype=np.float64) if lp.freq is not None else np.full(n, density)
        f = f.copy()
        f[:lp.hot] = 1.0
        out.append(f * b)
    return out


def plan_offload(gguf: GGUFModelFile, plan: SparsityPlan, layout: BundleLayout, budget: int,
                 ring_slots: int = RING_SLOTS, cache_share: float | None = None,
                 window_share: float | None = None, solver_room: int | None = None) -> OffloadPlan:
    """`cache_share` of the budget above the minimum goes to the neuron cache (selective layers only; default
    CACHE_SHARE), the rest to resident neurons chosen by the solver. `window_share` of each selective layer's
    neurons after its resident prefix are read ahead every token (default WINDOW_SHARE; their buffers count
    in the minimum)."""
    n_ff = [e["n_ff"] for e in layout.layers]
    bundle = [e["bundle_bytes"] for e in layout.layers]
    wshare = WINDOW_SHARE if window_share is None else float(window_share)
    if not 0.0 <= wshare <= 1.0:
        raise PyinferError(f"the read-ahead window share must be in [0, 1], got {wshare}")
    ring = ring_bytes(layout, selective_layers(plan), ring_slots, wshare)
    fixed = minimum_budget(gguf, plan, layout, ring_slots, wshare)
    if budget < fixed:
        raise BudgetBelowMinimum(f"a RAM budget of {fmt_size(budget)} is below the minimum of {fmt_size(fixed)} "
                                 f"(attention, embeddings, head, predictors and the read buffers must stay in RAM)",
                                 fixed)
    share = CACHE_SHARE if cache_share is None else float(cache_share)
    if not 0.0 <= share < 1.0:
        raise PyinferError(f"the cache share must be in [0, 1), got {share}")
    cache = int((budget - fixed) * share) if any(selective_layers(plan)) else 0
    capacity = budget - fixed - cache
    values = neuron_values(plan, layout)
    greedy = greedy_resident(n_ff, bundle, capacity, value_per_neuron=values)
    groups = sum(-(-n // 32) for n in n_ff)
    if solver_room is not None and solver_room < highs_workspace(groups):
        choice = greedy  # HiGHS's own memory would not fit under the limit now
        choice.info["fallback"] = (f"memory limit: {fmt_size(solver_room)} free while planning, HiGHS needs about "
                                   f"{fmt_size(highs_workspace(groups))} for {groups} groups")
    else:
        choice = solve_resident(n_ff, bundle, capacity, value_per_neuron=values, layer_bonus=READ_REQUEST_BYTES)
    resident_bytes = sum(k * b for k, b in zip(choice.counts, bundle))
    ffn = sum(n * b for n, b in zip(n_ff, bundle))
    # Bytes read per token: every streamed tail, and the expected firing share of each selective tail.
    streamed = sum(float(v[k:].sum()) for v, k in zip(values, choice.counts))
    windows = [min(w, n - k) for w, n, k in zip(window_neurons(layout, selective_layers(plan), wshare), n_ff,
                                                 choice.counts)]
    return OffloadPlan(budget, fixed, non_ffn_bytes(gguf), ring, cache, choice.counts, resident_bytes, int(streamed),
                       ffn, choice, greedy, {"selective_layers": int(sum(selective_layers(plan))),
                                             "window_share": wshare}, windows)


class OffloadedFfn:
    """The neuron store of one model under one budget, and the paged weights the graph reads from it."""

    def __init__(self, gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan, down_type: str, budget: int,
                 cache, ring_slots: int | None = None, direct_io: bool = True, progress: bool = True,
                 io_threads: int = 4, cache_share: float | None = None, window_share: float | None = None,
                 max_range: int | None = None, merge_gap: int | None = None, solver_room: int | None = None):
        from ..runtime.sparse_ffn import pick_neuron_down

        ring_slots = ring_slots or RING_SLOTS
        self.ring_slots, self.io_threads = ring_slots, io_threads
        self.predicted: dict | None = None  # from a `pyinfer plan` file
        self._copies: dict[str, np.ndarray] = {}
        self._gguf = gguf
        self.cfg = cfg
        self.down_type = pick_neuron_down(plan, down_type)
        self.layout = open_or_write(cache, gguf, cfg, plan, self.down_type, progress)
        self.plan = plan_offload(gguf, plan, self.layout, budget, ring_slots, cache_share, window_share, solver_room)
        self._selective = selective_layers(plan)
        layers = []
        for il, e in enumerate(self.layout.layers):
            layers.append({"n_ff": e["n_ff"], "resident": self.plan.resident[il], "file_offset": e["file_offset"],
                           "bundle_bytes": e["bundle_bytes"], "part_offsets": e["part_offsets"],
                           "selective": self._selective[il], "window": self.plan.window[il],
                           "dense_offset": e["dense_offset"],
                           "dense_rows": e["dense_rows"], "dense_row_bytes": e["dense_row_bytes"],
                           "down_rows": plan.layers[il].perm.astype(np.int32).tolist() if e["down_rows"] else None})
        try:
            self.max_range = max_range or MAX_RANGE
            self.merge_gap = MERGE_GAP if merge_gap is None else merge_gap
            self.store = _core.NeuronStore(str(self.layout.path), layers, ring_slots, direct_io, io_threads,
                                           self.plan.cache_bytes, max_range=self.max_range, merge_gap=self.merge_gap)
        except (RuntimeError, ValueError) as e:
            raise PyinferError(str(e)) from None
        self._scales = [read_scales(self.layout, il) for il in range(len(layers))]

    def layer_weights(self, b, il: int):
        """(gate, up, down, Q4T scales or None) of layer `il`: paged weights, readable after a fetch node."""
        e, d, n_ff = self.layout.layers[il], self.cfg.d_model, self.cfg.d_ff
        p = f"blk.{il}."
        gate = b.paged_weight(p + "ffn_gate.paged", e["types"][0], d, n_ff, self.store, il, 0)
        up = b.paged_weight(p + "ffn_up.paged", e["types"][1], d, n_ff, self.store, il, 1)
        down = b.paged_weight(p + "ffn_down.paged", e["types"][2], d, n_ff, self.store, il, 2)
        scales = None
        if self._scales[il] is not None:
            scales = b.weight(p + "ffn_down.q4t_scales", int(DType.F16), 2 * d, n_ff // 32, self._scales[il])
        return gate, up, down, scales

    # The neuron source calls of runtime/sparse_ffn.py (InRamNeurons is the in-RAM one): each adds the fetch
    # node that makes the rows readable before their readers run.
    def before_lists(self, b, il: int) -> None:
        """Not selective: the whole cold tail, since gate (and up) may run dense before any list exists."""
        if not self.selective(il):
            b.neuron_fetch(il)

    def after_union(self, b, il: int, union) -> None:
        """Selective: only the union's rows are read from disk."""
        if self.selective(il):
            b.neuron_fetch(il, union=union)

    def dense_down(self, b, il: int, guard):
        """The layer's original down [d, n_ff] for dense runs: a paged weight, read whole from the bundle file in
        large reads by a dense-down fetch in the runs `guard` picks."""
        b.neuron_fetch(il, dense_down=True, run_if=guard)
        e = self.layout.layers[il]
        return b.paged_weight(f"blk.{il}.ffn_down.dense", e["dense_type"], self.cfg.d_ff, e["dense_rows"],
                              self.store, il, 3)

    def done(self, b, il: int) -> None:
        b.neuron_fetch(il, release=True)

    def resident_copy(self, name: str, data: np.ndarray) -> np.ndarray:
        """The weights that must stay are copied out of the model's mmap into RAM the budget counts: page
        cache can be evicted under memory pressure, and a mapped page faulted back in drags its readahead
        window along, which evicts the next hot page (a thrash the budget never accounted for). The FFN's
        original tensors stay mapped and unread: dense runs read the bundle file's copy of down."""
        if _FFN_WEIGHT.match(name):
            return data
        if name not in self._copies:  # read, not copied through the mapping: nothing of it stays in page cache
            self._copies[name] = self._gguf.read_copy(name) if self._gguf.tensors.get(name) is not None \
                and self._gguf.tensors[name].data is data else np.array(data, copy=True)
        return self._copies[name]

    def selective(self, il: int) -> bool:
        return self._selective[il]

    def stats(self) -> dict:
        return dict(self.store.stats())
