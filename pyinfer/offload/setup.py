"""`ram_budget=SIZE|PLAN`: the one place a streamed FFN is set up, for the Python API and the server alike."""
from __future__ import annotations

import os

from ..errors import PyinferError


def make_offload(gguf, cfg, plan, neuron_down: str, ram_budget, neuron_cache: float | None = None,
                 neuron_window: float | None = None, progress: bool = True, memory=None):
    """An OffloadedFfn for `ram_budget` (bytes, a size such as "80M", or a plan file from `pyinfer plan`), or
    None without one. A plan file's splits apply unless `neuron_cache` / `neuron_window` say otherwise; its
    prediction is kept as `.predicted` for `bench`. `memory` (a MemoryPlan of a total memory limit): the weight
    budget is what the limit leaves (a plan file then gives only its splits), and a limit too small for what
    must stay is refused with the whole minimum."""
    if ram_budget is None:
        if neuron_cache is not None or neuron_window is not None:
            raise PyinferError("a neuron cache or read-ahead window share needs a RAM budget")
        return None
    from ..model.pull import cache_dir
    from .offloaded_ffn import BudgetBelowMinimum, OffloadedFfn, parse_size

    if cfg is not None and cfg.is_moe:
        raise PyinferError("a Mixture-of-Experts model streams whole experts under its RAM budget "
                           "(offload/experts.py, which Session sets up), not FFN neurons")
    if plan is None:
        raise PyinferError("a RAM budget streams FFN neurons and needs a sparsity plan (--sparsity auto or a file)")
    planned = None
    if isinstance(ram_budget, (str, os.PathLike)) and str(ram_budget).endswith(".json"):
        from .planner import read_plan

        planned = read_plan(str(ram_budget), gguf.fingerprint())  # from `pyinfer plan`
        ram_budget = planned["budget"]
    if memory is not None:
        ram_budget = max(memory.weights, 1)  # at or below zero: refused below with the whole minimum
    got = planned or {}
    try:
        offload = OffloadedFfn(gguf, cfg, plan, neuron_down, parse_size(ram_budget), cache_dir(), progress=progress,
                               ring_slots=got.get("ring_slots"), io_threads=got.get("io_threads", 4),
                               cache_share=neuron_cache if neuron_cache is not None else got.get("cache_share"),
                               window_share=neuron_window if neuron_window is not None else got.get("window_share"),
                               max_range=got.get("max_range"), merge_gap=got.get("merge_gap"),
                               # under a limit, what is free while planning: all but the runtime loaded so far
                               solver_room=memory.limit - memory.runtime if memory is not None else None)
    except BudgetBelowMinimum as e:
        if memory is None:
            raise
        raise memory.below_minimum(e.minimum) from None
    if memory is not None and memory.limit < memory.minimum(offload.plan.fixed_bytes):
        raise memory.below_minimum(offload.plan.fixed_bytes)  # above the parts, below the load's own peak
    offload.predicted = planned
    return offload
