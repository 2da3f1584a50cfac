"""The llama-family forward pass (LLaMA, SmolLM, Gemma 3) as an op graph.

Gemma 3 is the llama layer plus a few switches in the config: scaled embeddings, per-head RMS norm of q
and k, NEOX RoPE with a base per layer kind, sliding-window local layers, norms after attention and after
the FFN, and a GELU-gated FFN."""
from __future__ import annotations

from .._core import DType, RowMode
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import SparsityPlan
from .graph_builder import GraphBuilder, T
from .hybrid_ffn import hybrid_ffn
from .sparse_ffn import SparseRuns, dense_ffn, sparse_ffn

# KV cache element types by their llama.cpp names.
CACHE_TYPES = {"f16": DType.F16, "q8_0": DType.Q8_0}


def build_llama_graph(gguf: GGUFModelFile, cfg: LlamaConfig, n_ctx: int, sparsity: SparsityPlan | None = None,
                      runs: SparseRuns = SparseRuns(), record: bool = False, down_type: str = "auto",
                      paged: tuple[int, int] | None = None, cache_type: str = "f16", offload=None,
                      hybrid: dict | None = None) -> GraphBuilder:
    """`sparsity`: neuron-aware decode (runtime/sparse_ffn.py), in the runs `runs` picks. `record`: keeps each layer's FFN input,
    gate and up readable after a run (the profiler's view; b.records[layer] = (ffn_in, gate, up) ids).
    `paged` = (block size, max blocks per sequence): a KV cache of n_ctx rows shared by many sequences
    in blocks (continuous batching); each run then also takes every token's KV slot and block table.
    `cache_type`: "f16" or "q8_0" (llama.cpp's -ctk/-ctv q8_0: half the bytes per cached token).
    `offload`: an offload.OffloadedFfn (with `sparsity`): the FFN rows come from its neuron store.
    `hybrid`: a GPU placement (place/gpu_placement.py, as its summary) and "device", the engine backend that
    stands for the GPU: the residual stream, norms and attention, each layer's placed FFN blocks and, if
    placed, the output head run there. Only the embedding lookup and the CPU's FFN blocks run on the CPU, so
    a layer wholly on the GPU costs no copy and a split one two (its FFN input down, the CPU's sum up)."""
    if cache_type not in CACHE_TYPES:
        raise ValueError(f"cache type must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
    kv_dtype = CACHE_TYPES[cache_type]
    b = GraphBuilder()
    b.records = []

    def w(name: str) -> T:
        t = gguf.finite_norm(name) if name.endswith("norm.weight") else gguf.tensor(name)
        data = t.data if offload is None else offload.resident_copy(name, t.data)
        return b.weight(name, t.dtype_id, t.cols, t.rows, data)

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

    embed = w("token_embd.weight")                      # [vocab, d_model]
    x = b.get_rows(embed, tokens, "x", scale=cfg.embed_scale)  # F32 [T, d_model], the residual stream
    device = hybrid["device"] if hybrid is not None else None

    def on_device(first: int) -> None:  # the nodes added since `first` run on the device
        if device is not None:
            for node in range(first, len(b.placement)):
                b.place(node, device)

    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        first = len(b.placement)
        h = b.rms_norm(x, w(p + "attn_norm.weight"), cfg.norm_eps, "attn_in")
        q = b.matmul(w(p + "attn_q.weight"), h, "q")    # F32 [T, n_heads * head_dim]
        k = b.matmul(w(p + "attn_k.weight"), h, "k")    # F32 [T, n_kv_heads * head_dim]
        v = b.matmul(w(p + "attn_v.weight"), h, "v")
        if cfg.qk_norm:                                 # each head normalised on its own
            q = b.rms_norm(q, w(p + "attn_q_norm.weight"), cfg.norm_eps, "q_normed", segment=cfg.head_dim)
            k = b.rms_norm(k, w(p + "attn_k_norm.weight"), cfg.norm_eps, "k_normed", segment=cfg.head_dim)
        base = cfg.layer_rope_base(il)
        b.rope(q, positions, cfg.n_heads, cfg.head_dim, base, neox=cfg.rope_neox)
        b.rope(k, positions, cfg.n_kv_heads, cfg.head_dim, base, neox=cfg.rope_neox)
        k_cache = b.state(f"k_cache.{il}", cfg.kv_width, n_ctx, kv_dtype)  # F16|Q8_0 [n_ctx, n_kv_heads * head_dim]
        v_cache = b.state(f"v_cache.{il}", cfg.kv_width, n_ctx, kv_dtype)
        b.kv_store(k_cache, k, slots)
        b.kv_store(v_cache, v, slots)
        o = b.attention(q, k_cache, v_cache, positions, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, "attn",
                        kv_table, block_size, window=cfg.window(il), scale=cfg.attn_scale)
        o = b.matmul(w(p + "attn_output.weight"), o, "attn_out")  # F32 [T, d_model]
        if cfg.post_norms:
            o = b.rms_norm(o, w(p + "post_attention_norm.weight"), cfg.norm_eps, "attn_out_normed", out=o)
        if device is not None and il == 0:  # from here the residual stream is written on the device
            x = b.add(x, o, name="x_device")
        else:
            b.add(x, o, out=x)
        h = b.rms_norm(x, w(p + "ffn_norm.weight"), cfg.norm_eps, "ffn_in")  # F32 [T, d_model]
        on_device(first)  # attention's weights and KV cache are in the placement's minimum
        if record:
            f = _recorded_ffn(b, w, h, il, cfg)
        elif hybrid is not None:
            f = hybrid_ffn(b, gguf, h, il, cfg, hybrid["gpu_blocks"][il], hybrid["block"], hybrid["device"],
                           sparsity, runs, down_type, w)
        elif sparsity is not None:
            f = sparse_ffn(b, w, gguf, h, il, cfg, sparsity, runs, down_type, offload)
        else:
            f = dense_ffn(b, w, h, il, cfg)
        first = len(b.placement)
        if cfg.post_norms:
            f = b.rms_norm(f, w(p + "post_ffw_norm.weight"), cfg.norm_eps, "ffn_out_normed", out=f)
            if device is not None and not hybrid["gpu_blocks"][il]:
                first = len(b.placement)  # in place on the CPU's FFN output, written there
        b.add(x, f, out=x)
        on_device(first)

    # Only rows that need logits go through the final norm and the (large) output head.
    first = len(b.placement)
    xo = b.select_rows(x, out_ids, "x_out")             # F32 [O, d_model]
    h = b.rms_norm(xo, w("output_norm.weight"), cfg.norm_eps, "out_in")
    on_device(first)
    head = embed if cfg.tied_output else w("output.weight")
    first = len(b.placement)
    logits = b.matmul(head, h, "logits")                # F32 [O, vocab]
    if hybrid is not None and hybrid.get("head_on_gpu"):
        on_device(first)
    b.graph.output_logits = logits.id
    return b


def _recorded_ffn(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig) -> T:
    p = f"blk.{il}."
    gate = b.matmul(w(p + "ffn_gate.weight"), h, "gate")  # F32 [T, d_ff], pre-activation
    up = b.matmul(w(p + "ffn_up.weight"), h, "up")
    act = b.gated_mul(gate, up, name="act", act=cfg.activation)
    for t in (h, gate, up):
        b.graph.pin(t.id)
    b.records.append((h.id, gate.id, up.id))
    return b.matmul(w(p + "ffn_down.weight"), act, "ffn_out")
