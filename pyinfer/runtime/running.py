"""A graph and its engine made from a model's parts (build_running: the one place), and RunningModel, what callers
may ask of that engine. The device names ('cpu', 'standin', 'cuda:N') and the backends an engine gets for one
live here too: the session, the server's batch engine and the sparsity auto choice all build through this file."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .. import _core
from ..errors import PyinferError
from .model_graph import build_model_graph
from .placement import Placement
from .sparse_ffn import SparseRuns


def parse_device(device: str) -> tuple[str, int]:
    """'cpu' | 'standin' | 'cuda' | 'cuda:N' -> (kind, index)."""
    m = re.fullmatch(r"(cpu|standin|cuda)(?::(\d+))?", str(device))
    if not m or (m.group(2) is not None and m.group(1) != "cuda"):
        raise PyinferError(f"device must be cpu, cuda, cuda:N or standin, got {device!r}")
    return m.group(1), int(m.group(2) or 0)


def engine_backends(kind: str, index: int, n_threads: int, placement: list[int]) -> dict:
    """The engine's backends for a device: backend 0 is the CPU; backend 1, in memory space 1, is the GPU
    (or a one-thread CPU backend standing in for it)."""
    if kind == "cpu":
        return {}
    return {"placement": placement, "backend_threads": [n_threads, 1], "backend_memory": [0, 1],
            "backend_kinds": ["cpu", "cpu" if kind == "standin" else f"cuda:{index}"]}


@dataclass(frozen=True)
class ModelParts:
    """What a graph and its engine are built from: the model's file and hyper-parameters, and what its session
    resolved from the load's options (the sparsity plan, the offload weight source, the device and its placement,
    a Mixture of Experts' streamed experts and cuts). Session.parts() makes it; the auto choice and the memory
    probe change a field or two."""
    gguf: object
    config: object
    n_threads: int
    sparsity: object = None
    neuron_down: str = "auto"
    cache_type: str = "f16"
    offload: object = None
    device: str = "cpu"
    placement: Placement | None = None  # on backend 1 (engine_backends)
    isa: str = "auto"
    experts: object = None
    expert_cuts: object = None
    input_copies: object = None  # an input-sparse plan's copies mapped from disk (a memory limit), else None


def build_running(parts: ModelParts, n_ctx: int, max_tokens: int, runs: SparseRuns,
                  paged: tuple[int, int] | None = None, states: int = 1) -> RunningModel:
    """The one place a graph and its engine are made from a model's parts (Session.build, BatchEngine, the auto
    choice's engines). `paged`: (block size, max blocks per sequence) for a server's paged KV cache; `states`: its
    recurrent state rows (a model with recurrent layers: one per sequence that may run at once)."""
    p = parts
    kind, index = parse_device(p.device)
    try:  # a weight whose shape disagrees with the metadata is refused by the graph: one line
        b = build_model_graph(p.gguf, p.config, n_ctx, p.sparsity, runs, down_type=p.neuron_down, paged=paged,
                              cache_type=p.cache_type, offload=p.offload,
                              placement=p.placement, experts=p.experts,
                              expert_cuts=p.expert_cuts, states=states, input_copies=p.input_copies)
        engine = _core.Engine(b.graph, max_tokens=max_tokens, max_outputs=max_tokens, n_threads=p.n_threads,
                              isa=p.isa, **engine_backends(kind, index, p.n_threads, b.placement))
    except ValueError as e:
        raise PyinferError(f"{p.gguf.path.name}: {e}") from None
    return RunningModel(engine, [t.id for t in b.unions], b.ffn_nodes)


@dataclass
class RunningModel:
    """An engine and what callers may ask of it: run, logits, each layer's active union of the last run, op
    timing and copy counts. Nothing else holds the engine."""
    engine: object
    union_ids: list[int]
    ffn_nodes: list[range] = field(default_factory=list)  # per layer: its FFN's node ids

    def run(self, n_tokens: int, tokens, positions, out_rows, slots=None, kv_table=None, state_rows=None) -> None:
        try:
            if slots is None:
                self.engine.run(n_tokens, tokens, positions, out_rows)
            else:
                self.engine.run(n_tokens, tokens, positions, out_rows, slots, kv_table, state_rows)
        except ValueError as e:  # the engine refused the input (one line, as every user error)
            raise PyinferError(str(e)) from None

    def logits(self) -> np.ndarray:
        return self.engine.logits()

    def unions(self) -> list[np.ndarray]:
        """Per FFN layer, the last run's active union: I32 [n_ff + 1], count (-1: the run went dense), ids."""
        return [np.array(self.engine.tensor(i, 1)[0]) for i in self.union_ids]

    def sparse_share(self) -> float:
        """Share of FFN layers that took the sparse path in the last run (0 without a sparsity plan)."""
        u = self.unions()
        return sum(int(x[0]) >= 0 for x in u) / len(u) if u else 0.0

    def set_op_timing(self, on: bool) -> None:
        self.engine.set_op_timing(on)

    def op_timing(self):
        return self.engine.op_timing()

    def ffn_seconds(self) -> np.ndarray:
        """F64 [layers]: each layer's FFN seconds since set_op_timing(True) (its nodes' wall time summed)."""
        t = self.engine.node_timing()
        return np.array([t[r.start:r.stop].sum() if r.start < len(t) else 0.0 for r in self.ffn_nodes])

    @property
    def n_copies(self) -> int:
        return self.engine.n_copies

    @property
    def isa(self) -> str:
        return self.engine.isa

    def reserve_memory(self) -> None:
        self.engine.reserve_memory()

    # ---- for timelines and debugging (bench/timeline.py) ----------------------------------------------------
    @property
    def n_segments(self) -> int:
        return self.engine.n_segments

    def node_names(self) -> list[str]:
        return self.engine.node_names()

    def segments(self):
        return self.engine.segments()

    def set_timeline(self, on: bool) -> None:
        self.engine.set_timeline(on)

    def timeline(self):
        return self.engine.timeline()


def last_unions(model) -> list[np.ndarray]:
    """Per sparse layer: the neuron ids (hot-first order) its FFN computed in the model's last run, every id
    where the run went dense."""
    out = []
    for u in model.layer_unions():  # I32 [n_ff + 1]: count (-1: dense), ids
        out.append(u[1:1 + u[0]].copy() if u[0] >= 0 else np.arange(len(u) - 1))
    return out
