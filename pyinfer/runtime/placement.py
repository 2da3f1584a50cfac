"""Which backend runs each node of a graph split between the CPU and a device, decided after the model code
built it (as ggml's scheduler assigns nodes from where their weights and inputs live):
  - the FFN builder's own nodes keep what it gave them (a split FFN places its two halves);
  - the embedding lookup runs on the CPU (its table stays in host memory);
  - the output head (its matmul and the Q8 copy of its input) runs on the device when the placement put it
    there, else on the CPU;
  - a node that writes in place into a tensor runs where that tensor lives (where its first writer ran: the
    norm after a CPU-side FFN stays on the CPU);
  - everything else (norms, attention, the residual stream) runs on the device."""
from __future__ import annotations

from .._core import Op
from .graph_builder import GraphBuilder

CPU = 0


def assign_split(b: GraphBuilder, ffn_spans: list[tuple[int, int]], head_span: tuple[int, int], device: int,
                 head_on_device: bool) -> None:
    own = set()
    for first, end in ffn_spans:
        own.update(range(first, end))
    home: dict[int, int] = {}  # tensor id -> the backend whose memory holds it
    for node, (op, _) in enumerate(b.node_ops):
        dst = b.node_dst[node]
        if node in own:
            backend = b.placement[node]
        elif head_span[0] <= node < head_span[1]:
            backend = device if head_on_device else CPU
        elif op == Op.GET_ROWS:
            backend = CPU
        elif dst in home:
            backend = home[dst]
        else:
            backend = device
        b.place(node, backend)
        home.setdefault(dst, backend)
