"""Which backend runs each node of a graph split between the CPU and a device, decided after the graph is
built, from where its weights live (as ggml's scheduler assigns nodes): the model skeleton and a split FFN make
weights inside GraphBuilder.weights_on(backend), and then, in node order,
  1. a node that writes in place into a tensor runs where that tensor lives (where its first writer ran: the
     norm after a CPU-side FFN stays on the CPU, the merge of a split FFN runs on the device);
  2. a node that reads a weight runs where its weight lives (the CPU's FFN neurons on the CPU, attention and
     the device's neurons on the device, the embedding lookup on the CPU, the head where the placement put it);
  3. any other node runs on the device if one of its inputs lives there, else on the CPU (the residual stream
     moves to the device at the first add, the device's active lists stay with its predictor);
a recurrent layer's state lives where its node runs (the device's delta-rule kernel takes heads of a multiple of 32
values, at most 1024: a layer of other heads runs its delta rule on the CPU).
No model code places anything."""
from __future__ import annotations

from dataclasses import dataclass, field

from .._core import Op
from .graph_builder import GraphBuilder

CPU = 0


def device_runs(b: GraphBuilder, node: int) -> bool:
    """Whether the device has a kernel for the node's shape (cuda/kernels/recurrent.cu: whole warps per head)."""
    if b.node_ops[node][0] == Op.DELTA_NET:
        s = b.node_params[node]["head_dim"]
        return s % 32 == 0 and s <= 1024
    return True


@dataclass(frozen=True)
class Placement:
    """What a load puts on its device, as the graph reads it: per layer the FFN's down blocks on the device (`block`
    neurons each; a dense model) or its experts there (a Mixture of Experts), and whether the output head is;
    `device` is the engine backend standing for the GPU. place/ returns it (from its program or a file from
    `pyinfer place`); `report` is that placement's summary, what the file holds and `bench --json` reports."""
    head_on_gpu: bool
    gpu_blocks: tuple[tuple[int, ...], ...] = ()
    block: int = 0
    gpu_experts: tuple[tuple[int, ...], ...] | None = None
    device: int = 1
    report: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, summary: dict, device: int = 1) -> Placement:
        """From a placement's summary (place/gpu_placement.py or place/expert_placement.py)."""
        if "gpu_experts" in summary:
            return cls(bool(summary["head_on_gpu"]), gpu_experts=tuple(tuple(int(e) for e in layer)
                                                                      for layer in summary["gpu_experts"]),
                       device=device, report=summary)
        return cls(bool(summary["head_on_gpu"]), tuple(tuple(int(k) for k in layer) for layer in summary["gpu_blocks"]),
                   int(summary["block"]), device=device, report=summary)


def assign_split(b: GraphBuilder, device: int) -> None:
    home: dict[int, int] = {}  # tensor id -> the backend whose memory holds it (its first writer's); views: their base's
    for node, (dst, srcs) in enumerate(zip(b.node_dst, b.node_srcs)):
        dst, srcs = b.origin(dst), [b.origin(s) for s in srcs]
        weights = [b.weight_home[s] for s in srcs if s in b.weight_home]
        if not device_runs(b, node):
            backend = CPU
        elif dst in home:
            backend = home[dst]
        elif weights:
            backend = device if device in weights else CPU
        else:
            backend = device if any(home.get(s) == device for s in srcs) else CPU
        b.place(node, backend)
        home.setdefault(dst, backend)
