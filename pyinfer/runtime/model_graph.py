"""A model's forward pass as an op graph: the inputs, the embedding lookup, each layer as its architecture's
file builds it (model/arch/), the final norm and the output head. What the FFN is (runtime/ffn.py) and which
backend runs each node (runtime/placement.py) are decided here, outside the model code."""
from __future__ import annotations

import numpy as np

from .._core import DType, RowMode
from ..errors import UnsupportedModelError
from ..model.arch import architecture
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import SparsityPlan
from .blocks import ModelGraph
from .ffn import choose_ffn
from .graph_builder import GraphBuilder
from .input_sparse import InputSparseProjections, RecordedInputs
from .placement import CPU, Placement, assign_split
from .sparse_ffn import SparseRuns

# KV cache element types by their llama.cpp names.
CACHE_TYPES = {"f16": DType.F16, "q8_0": DType.Q8_0, "f32": DType.F32}


def build_model_graph(gguf: GGUFModelFile, cfg: LlamaConfig, n_ctx: int, sparsity: SparsityPlan | None = None,
                      runs: SparseRuns = SparseRuns(), record: bool = False, down_type: str = "auto",
                      paged: tuple[int, int] | None = None, cache_type: str = "f16", offload=None,
                      placement: Placement | None = None, experts=None, expert_cuts=None,
                      states: int = 1, input_copies=None) -> GraphBuilder:
    """`sparsity`: neuron-aware decode (runtime/sparse_ffn.py), in the runs `runs` picks. `record`: keeps each layer's FFN input,
    gate and up readable after a run (the profiler's view; b.records[layer] = (ffn_in, gate, up) ids).
    `paged` = (block size, max blocks per sequence): a KV cache of n_ctx rows shared by many sequences
    in blocks (continuous batching); each run then also takes every token's KV slot and block table, and for a model
    with recurrent layers (Qwen 3.5) every token's state row, of `states` rows (one per sequence that may run).
    `cache_type`: "f16", "q8_0" (llama.cpp's -ctk/-ctv q8_0: half the bytes per cached token) or "f32" (twice;
    attention reads keys and values unrounded: what llama.cpp computes with -ctk f32 -ctv f32).
    `offload`: an offload.OffloadedFfn (with `sparsity`): the FFN rows come from its neuron store.
    `experts`: an offload.ExpertOffload (a Mixture of Experts under a memory limit): the experts come from its
    expert store. `expert_cuts`: a sparsity.expert_cuts.ExpertCuts (a Mixture of Experts): decode reads each
    chosen expert's up only for the neurons whose gate passes the expert's cut.
    `placement`: a GPU placement (runtime/placement.py), whose `device` is the engine backend that stands for the
    GPU: the residual stream, norms and attention, each layer's placed FFN blocks and, if
    placed, the output head run there. Only the embedding lookup and the CPU's FFN blocks run on the CPU, so
    a layer wholly on the GPU costs no copy and a split one two (its FFN input down, the CPU's sum up).
    `input_copies`: where an input-sparse plan's input-major copies come from (None: made in RAM;
    offload.input_copies.MappedInputCopies under a memory limit)."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"cache type must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
    arch = architecture(gguf.architecture)
    b = GraphBuilder()
    b.records = []
    b.expert_gates = []  # a recorded Mixture of Experts: each layer's gate of its chosen experts
    b.input_records = []  # recorded: each layer's (attn_in, attn_out) ids

    tokens = b.input("tokens")                          # I32 [T]
    positions = b.input("positions")                    # I32 [T]
    out_ids = b.input("out_ids", RowMode.OUTPUTS)       # I32 [O]: batch rows that produce logits
    b.graph.input_tokens, b.graph.input_positions, b.graph.input_out_ids = tokens.id, positions.id, out_ids.id
    slots, kv_table, block_size = positions, None, 0
    if paged is not None:
        block_size, max_blocks = paged
        slots = b.input("slots")                        # I32 [T]: cache row each token's K/V goes to
        kv_table = b.input("kv_table", cols=max_blocks)  # I32 [T, max_blocks]: its sequence's blocks
        b.graph.input_slots, b.graph.input_kv_table = slots.id, kv_table.id
    state_rows = None
    if paged is not None and cfg.recurrent_layers:
        if states < 1:
            raise ValueError("a paged graph of a model with recurrent layers needs states >= 1")
        state_rows = b.input("state_rows")              # I32 [T]: its sequence's recurrent state row
        b.graph.input_state_rows = state_rows.id

    def weight_source(name: str, data):
        return data if offload is None else offload.resident_copy(name, data)

    ffn = choose_ffn(sparsity, runs, down_type, offload, placement, record, experts, expert_cuts)
    m = ModelGraph(b, gguf, cfg, n_ctx, weight_source, ffn, positions, slots, kv_table, block_size,
                   CACHE_TYPES[cache_type], seq_ctx=block_size * paged[1] if paged else n_ctx,
                   n_states=states if state_rows is not None else 1, state_rows=state_rows)
    if record:
        m.projection = RecordedInputs()
    elif sparsity is not None and sparsity.mode == "input":
        if offload is not None or placement is not None:
            raise UnsupportedModelError("an input-sparse plan runs on the CPU, its copies in RAM or mapped from "
                                        "disk under --mem-limit (no --ram-budget or device)")
        m.projection = InputSparseProjections(sparsity, runs, gguf)
    b.input_copies = input_copies
    # Where weights live (a split graph only): the embedding table in host memory; attention, norms and the
    # placed FFN neurons on the device (the split FFN tags its own); the head where the placement put it.
    device = placement.device if placement is not None else None
    with b.weights_on(CPU if device is not None else None):
        embed = m.w("token_embd.weight")                # [vocab, d_model]
    x = b.get_rows(embed, tokens, "x", scale=cfg.embed_scale)  # F32 [T, d_model], the residual stream
    m.embedding, m.tokens, m.host = x, tokens, CPU if device is not None else None
    with b.weights_on(device):
        arch.prepare(m, x)
        for il in range(cfg.n_layers):
            x = arch.build_layer(m, il, x)
        # Only rows that need logits go through the final norm and the (large) output head.
        xo = b.select_rows(x, out_ids, "x_out")         # F32 [O, d_model]
        if cfg.logit_scale:  # Granite's logits / logit_scale: linear in h, so folded into the final norm's weight
            g = gguf.finite_norm("output_norm.weight")
            scaled = np.asarray(g.data, np.float32) * np.float32(1.0 / cfg.logit_scale)
            h = b.rms_norm(xo, b.weight("output_norm.logit_scaled", int(DType.F32), g.cols, 1, scaled), cfg.norm_eps,
                           "out_in")
        else:
            h = m.norm(xo, "output_norm.weight", "out_in")
    head_home = (device if placement.head_on_gpu else CPU) if device is not None else None
    with b.weights_on(head_home):
        # A tied head on the device is its own weight tensor over the same bytes (uploaded there; the lookup's
        # stays in host memory).
        head = (m.w_alias("token_embd.weight", "output.tied") if cfg.tied_output and head_home == device
                and device is not None else embed if cfg.tied_output else m.w("output.weight"))
    logits = b.matmul(head, h, "logits")                # F32 [O, vocab]
    if cfg.logit_softcap:  # Gemma 4: cap * tanh(logits / cap), where the head ran
        b.softcap(logits, cfg.logit_softcap, out=logits)
    b.graph.output_logits = logits.id
    if device is not None:
        assign_split(b, device)
    return b
