"""The one FFN call every architecture makes (ModelGraph.ffn), and the choice of what it builds, made once per
graph outside the model code: dense, neuron-aware (with its weights in RAM or streamed from a neuron store),
split between the CPU and a device, or recorded for the profiler. A Mixture-of-Experts layer runs its chosen
experts (runtime/moe_ffn.py) under the dense choice, with CATS inside the experts when given their cuts; the
neuron-level plans of dense models do not take experts."""
from __future__ import annotations

from ..errors import UnsupportedModelError
from .graph_builder import T
from .hybrid_ffn import hybrid_ffn
from .moe_ffn import early_route, moe_ffn, split_moe_ffn
from .placement import Placement
from .sparse_ffn import SparseRuns, dense_ffn, sparse_ffn


class FfnBuilder:
    """What every FFN choice answers: the layer's FFN (called), and a layer's expert choice made before it
    (`route`: SmallThinker routes ahead of attention; the FFN is then called with it)."""

    def route(self, m, x: T, il: int) -> T:
        return early_route(m.b, m.w, x, il, m.cfg)


class DenseFfn(FfnBuilder):
    """act(gate) * up, then down: every neuron (a Mixture of Experts: every neuron of the chosen experts, read
    through `experts`, an offload.ExpertOffload, when they stream from storage)."""

    def __init__(self, experts=None, cuts=None):
        self.experts, self.cuts = experts, cuts

    def __call__(self, m, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        if m.cfg.moe_layer(il) and not dense:
            return moe_ffn(m.b, m.w, h, il, m.cfg, self.experts, stream=m.stream, cuts=self.cuts, route=route)
        return dense_ffn(m.b, m.w, h, il, m.cfg, project=m.project)

    def route(self, m, x: T, il: int) -> T:
        """With streamed experts and read-ahead on, the chosen experts' reads start with the route."""
        return early_route(m.b, m.w, x, il, m.cfg, self.experts)


def _dense_only(m, what: str) -> None:
    if m.cfg.is_moe:
        raise UnsupportedModelError(f"{what} does not take Mixture-of-Experts models yet; run them without it "
                                    "(their experts already skip what a token does not route to)")


class RecordedFfn(FfnBuilder):
    """The dense FFN, keeping each layer's input, gate and up readable after a run (the profiler's view:
    b.records[layer] = (ffn_in, gate, up) ids)."""

    def __call__(self, m, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        if m.cfg.moe_layer(il) and not dense:  # the routing profile: each layer's route
            return moe_ffn(m.b, m.w, h, il, m.cfg, record=True, route=route)
        if m.cfg.is_moe:  # a leading dense layer of a MoE model: nothing to profile (records hold routes only)
            return dense_ffn(m.b, m.w, h, il, m.cfg)
        return dense_ffn(m.b, m.w, h, il, m.cfg, record=True)


class SparseFfn(FfnBuilder):
    """Neuron-aware decode from a sparsity plan (runtime/sparse_ffn.py). The neuron rows come from a source:
    in RAM (sparse_ffn.InRamNeurons), or with `offload` its neuron store (a weight source, not a branch).
    A layer the plan marks dense (`auto` timed it slower sparse here) runs the dense FFN, except under offload,
    where its dense weights are not in RAM and sparse decode saves reads."""

    def __init__(self, plan, runs: SparseRuns, down_type: str = "auto", offload=None):
        self.plan, self.runs, self.down_type, self.offload = plan, runs, down_type, offload

    def __call__(self, m, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        _dense_only(m, "neuron-level sparsity")
        if self.plan.layers[il].dense and self.offload is None:
            return dense_ffn(m.b, m.w, h, il, m.cfg)
        return sparse_ffn(m.b, m.w, m.gguf, h, il, m.cfg, self.plan, self.runs, self.down_type, self.offload)


class InputSparseFfn(FfnBuilder):
    """An input-sparse plan's FFN (mode "input"): a layer with a gate cut runs the neuron-aware writer in file
    order (gate dense, up only for the neurons whose |act(gate)| passes the cut, down by input for those whose
    |act(gate) * up| passes the layer's threshold: CATS with TEAL's cut on down); a layer without one runs the
    dense writer through the graph's projections (each of gate, up and down skipping its input's small entries)."""

    def __init__(self, plan, runs: SparseRuns):
        self.plan, self.runs = plan, runs

    def __call__(self, m, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        _dense_only(m, "input sparsity")
        lp = self.plan.layers[il]
        if lp.dense:  # (projections of a dense layer run dense too: input_sparse.site_threshold)
            return dense_ffn(m.b, m.w, h, il, m.cfg)
        if lp.gate_threshold > 0:
            return sparse_ffn(m.b, m.w, m.gguf, h, il, m.cfg, self.plan, self.runs)
        return dense_ffn(m.b, m.w, h, il, m.cfg, project=m.project)


class SplitFfn(FfnBuilder):
    """Each layer's FFN split between the CPU and a device by a placement (runtime/hybrid_ffn.py; a Mixture of
    Experts by whole experts, runtime/moe_ffn.py); the split places its own nodes, the only FFN that does."""

    def __init__(self, placement: Placement, plan=None, runs: SparseRuns = SparseRuns(), down_type: str = "auto"):
        self.placement, self.plan, self.runs, self.down_type = placement, plan, runs, down_type

    def __call__(self, m, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        pl = self.placement
        if m.cfg.moe_layer(il) and not dense:  # an expert placement (place/expert_placement.py): whole experts
            return split_moe_ffn(m.b, m.w, m.gguf, h, il, m.cfg, list(pl.gpu_experts[il]), pl.device, route=route)
        if m.cfg.is_moe:  # a dense layer of a MoE model (GLM-4.5's first): placed with attention, on the device
            return dense_ffn(m.b, m.w, h, il, m.cfg)
        return hybrid_ffn(m.b, m.gguf, h, il, m.cfg, list(pl.gpu_blocks[il]), pl.block, pl.device, self.plan,
                          self.runs, self.down_type, m.w)


def choose_ffn(sparsity=None, runs: SparseRuns = SparseRuns(), down_type: str = "auto", offload=None,
               placement: Placement | None = None, record: bool = False, experts=None, expert_cuts=None):
    if record:
        return RecordedFfn()
    if placement is not None:
        if expert_cuts is not None:
            raise UnsupportedModelError("cuts inside the experts (--target with a Mixture of Experts) run on the "
                                        "CPU only; an expert placement runs its experts whole")
        return SplitFfn(placement, sparsity, runs, down_type)
    if sparsity is not None and sparsity.mode == "input":
        return InputSparseFfn(sparsity, runs)
    if sparsity is not None:
        return SparseFfn(sparsity, runs, down_type, offload)
    return DenseFfn(experts, expert_cuts)
