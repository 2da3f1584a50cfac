"""The shared pieces an architecture's layer is built from (llama.cpp's build_norm / build_qkv / build_attn /
build_ffn): norms, attention with its optional biases, QK-norm, RoPE factors and KV cache, the residual add,
and the FFN, which is whatever runtime/ffn.py chose for this graph (dense, sparse, recorded, split, offloaded).

Nothing here places nodes on devices: runtime/placement.py does that afterwards, from where weights live."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._core import DType
from ..model.config import Activation, LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .graph_builder import GraphBuilder, T


@dataclass
class ModelGraph:
    """What an architecture's layer code builds with: the builder, the model's weights, the run's inputs,
    the KV cache layout and the FFN of this graph."""
    b: GraphBuilder
    gguf: GGUFModelFile
    cfg: LlamaConfig
    n_ctx: int
    weight_source: object            # (name) -> numpy data of a weight (resident copies under offload)
    ffn_builder: object              # runtime/ffn.py: (ModelGraph, h, il) -> F32 [T, d_model]
    positions: T                     # I32 [T]
    slots: T                         # I32 [T]: the cache row each token's K/V goes to
    kv_table: T | None = None        # I32 [T, max blocks] (paged KV)
    block_size: int = 0
    kv_dtype: DType = DType.F16
    seq_ctx: int = 0                 # the most positions one sequence can hold (n_ctx, or a paged table's)
    embedding: T | None = None       # the stream's first tensor (the embedding lookup's output)
    stream: T | None = None          # the residual stream after the latest residual add (the FFN's input, unnormed)
    # (ModelGraph, x, weight name, node name) -> x @ W.T: how a layer's projections are computed, chosen outside
    # the model code (runtime/input_sparse.py); None: the dense matmul.
    projection: object = None
    # Recurrent layers' state rows (runtime/recurrent.py): how many sequences hold one, and each token's (I32 [T];
    # None: one sequence, row 0).
    n_states: int = 1
    state_rows: T | None = None
    # Gemma 4's per-layer token embeddings (F32 [T, n_layers * per_layer_embd]; model/arch/gemma4.py), or None.
    per_layer_inputs: T | None = None
    tokens: T | None = None          # I32 [T]: the run's token ids
    host: int | None = None          # where lookup tables live (embed_rows): the CPU beside a device, else None
    _weights: dict[str, T] = field(default_factory=dict)
    _caches: dict[int, tuple[T, T]] = field(default_factory=dict)  # layer -> its (K, V) cache
    _ffn_layer: int = -1             # the layer of the last ffn() call

    # ---- weights --------------------------------------------------------------------------------------
    def w(self, name: str, mapped: bool = False) -> T:
        """A weight of the model, once per graph however many pieces read it. `mapped`: as the file holds it, never
        a resident copy under offload (a lookup table read by row)."""
        t = self._weights.get(name)
        if t is None:
            g = self.gguf.finite_norm(name) if name.endswith("norm.weight") else self.gguf.tensor(name)
            data = g.data
            if not data.flags.c_contiguous:  # a half of a fused tensor read on its own (a GPU split's CPU side)
                data = np.ascontiguousarray(data).reshape(g.rows, -1)
            data = data if mapped else self.weight_source(name, data)
            if g.rows == 1 and g.type_name == "F16" and not name.endswith("norm.weight"):  # biases, factors: F32
                data = np.asarray(data, np.float32)
                t = self.b.weight(name, int(DType.F32), g.cols, 1, data)
            else:
                t = self.b.weight(name, g.dtype_id, g.cols, g.rows, data)
            self._weights[name] = t
        return t

    def w_alias(self, name: str, alias: str) -> T:
        """A second weight tensor over the same bytes as `name` (a tied head living in another backend's memory)."""
        g = self.gguf.tensor(name)
        return self.b.weight(alias, g.dtype_id, g.cols, g.rows, self.weight_source(name, g.data))

    def project(self, x: T, weight: str, name: str) -> T:
        """x @ W.T by this graph's projection builder (dense, input-sparse or recorded)."""
        if self.projection is None:
            return self.b.matmul(self.w(weight), x, name)
        return self.projection(self, x, weight, name)

    def optional(self, name: str) -> T | None:
        return self.w(name) if name in self.gguf.tensors else None

    def embed_rows(self, table: str, name: str, scale: float = 0.0) -> T:
        """Each token's row of the lookup table `table` as F32 (times `scale`), the table kept in host memory as the
        token embedding is: only the rows of the run's tokens are read."""
        with self.b.weights_on(self.host):
            t = self.w(table, mapped=True)  # under a memory limit too: only the run's rows are read
        return self.b.get_rows(t, self.tokens, name, scale=scale)

    def constant(self, name: str, values) -> T:
        """A row of F32 values the graph computes with (a norm's weight the model folds or lacks), once per name."""
        if name not in self._weights:
            v = np.ascontiguousarray(values, np.float32).reshape(-1)
            self._weights[name] = self.b.weight(name, int(DType.F32), v.size, 1, v)
        return self._weights[name]

    def scaled(self, x: T, s: float) -> T:
        """x times s in place (llama.cpp's ggml_scale): an add of a row of zeros, times s."""
        return self.b.add(x, self.constant(f"zeros.{x.cols}", np.zeros(x.cols)), out=x, post=s)

    def ones(self, n: int) -> T:
        """An F32 row of n ones: the weight of a norm the model applies without one (Gemma 4's V norm)."""
        return self.constant(f"ones.{n}", np.ones(n))

    # ---- pieces ---------------------------------------------------------------------------------------
    def norm(self, x: T, weight: str, name: str, out: T | None = None, segment: int = 0) -> T:
        return self.b.rms_norm(x, self.w(weight), self.cfg.norm_eps, name, segment=segment, out=out)

    def linear(self, x: T, weight: str, name: str, bias: str | None = None) -> T:
        """x @ W.T (+ bias, when the file has one)."""
        y = self.project(x, weight, name)
        if bias is not None and bias in self.gguf.tensors:
            self.b.add(y, self.w(bias), out=y)
        return y

    def attention(self, h: T, il: int, qk_norm: bool = False, factors: T | None = None, rope_base: float | None = None,
                  window: int = 0, scale: float | None = None, freq_scale: float | None = None,
                  qk_norm_rows: bool = False, sinks: bool = False, rope: bool = True, output_gate: bool = False,
                  v_norm: bool = False) -> T:
        """Self-attention of layer `il` on h (F32 [T, d_model]) to the output projection (F32 [T, d_model]):
        q, k, v (with their biases if present), per-head RMS norm of q and k (`qk_norm`), RoPE (the
        architecture's pairing, `factors` dividing each pair's frequency), the KV cache, causal attention
        (`window`: sliding-window layers) and the output projection. `rope_base` and `freq_scale`: this layer's
        (default: the model's). `qk_norm_rows`: q and k are each normalised as whole rows, not per head (OLMoE).
        `sinks`: the layer's attn_sinks.weight joins every row's softmax, one logit per head (gpt-oss). `rope`
        False: positions are not rotated in (NoPE layers: SmallThinker's global ones). `output_gate`: the output is
        times sigmoid of attn_q_gate's projection of h before its projection (Qwen3.5's gated attention). `v_norm`:
        each value head RMS-normed (no weight) before the cache, and without attn_v the value is k's projection
        (Gemma 4). The layer's head size and KV heads are the config's for it; a layer that shares an earlier
        layer's cache (cfg.kv_owner) computes only q and attends over that cache."""
        b, c, p = self.b, self.cfg, f"blk.{il}."
        hd, kv_heads, owner = c.layer_head_dim(il), c.layer_kv_heads(il), c.kv_owner(il)
        segment = 0 if qk_norm_rows else hd
        base = c.rope_base if rope_base is None else rope_base
        scale_f = c.rope_freq_scale if freq_scale is None else freq_scale

        def rotate(x: T, heads: int) -> None:
            b.rope(x, self.positions, heads, hd, base, neox=c.rope_neox, factors=factors, freq_scale=scale_f,
                   attn_factor=c.rope_attn_factor, n_rot=c.layer_rope_dims(il),
                   yarn=(c.rope_ext_factor, c.rope_yarn_low, c.rope_yarn_high) if c.rope_ext_factor else None)

        q = self.linear(h, p + "attn_q.weight", "q", p + "attn_q.bias")  # F32 [T, n_heads * head_dim]
        if qk_norm or qk_norm_rows:  # each head normalised on its own, or each whole row
            q = self.norm(q, p + "attn_q_norm.weight", "q_normed", segment=segment)
        if rope:
            rotate(q, c.n_heads)
        if owner == il:
            k = self.linear(h, p + "attn_k.weight", "k", p + "attn_k.bias")  # F32 [T, kv_heads * head_dim]
            v = (k if v_norm and p + "attn_v.weight" not in self.gguf.tensors
                 else self.linear(h, p + "attn_v.weight", "v", p + "attn_v.bias"))
            if v_norm:  # a tensor of its own: k (when v is k's projection) is normed apart below
                v = b.rms_norm(v, self.ones(hd), c.norm_eps, "v_normed", segment=hd)
            if qk_norm or qk_norm_rows:
                k = self.norm(k, p + "attn_k_norm.weight", "k_normed", segment=segment)
            if rope:
                rotate(k, kv_heads)
            width = c.layer_kv_width(il)
            k_cache = b.state(f"k_cache.{il}", width, self.n_ctx, self.kv_dtype)  # F16|Q8_0 [n_ctx, kv width]
            v_cache = b.state(f"v_cache.{il}", width, self.n_ctx, self.kv_dtype)
            b.kv_store(k_cache, k, self.slots)
            b.kv_store(v_cache, v, self.slots)
            self._caches[il] = (k_cache, v_cache)
        k_cache, v_cache = self._caches[owner]
        o = b.attention(q, k_cache, v_cache, self.positions, c.n_heads, kv_heads, hd, "attn",
                        self.kv_table, self.block_size, window=window, scale=scale,
                        sinks=self.w(p + "attn_sinks.weight") if sinks else None)
        if output_gate:
            o = b.gated_mul(self.linear(h, p + "attn_q_gate.weight", "q_gate"), o, out=o, act=Activation.SIGMOID)
        return self.linear(o, p + "attn_output.weight", "attn_out", p + "attn_output.bias")  # F32 [T, d_model]

    def linear_attention(self, h: T, il: int) -> T:
        """Layer `il`'s gated DeltaNet (Qwen3.5's linear attention) on h (F32 [T, d_model]) to its output
        projection: runtime/recurrent.py."""
        from .recurrent import gated_delta_net

        return gated_delta_net(self, h, il)

    def latent_attention(self, h: T, il: int) -> T:
        """DeepSeek-V2's multi-head latent attention of layer `il` (llama.cpp's deepseek2 graph, absorbed form), h
        (F32 [T, d_model]) to the output projection. Each token caches one row, [latent | rotary] (kv_lora_rank +
        rope_dims values), for every head: the key is the row, the value its latent part. A query head is q's
        non-rotary part taken into the latent space by the head's attn_k_b, then its rotary part; the attention's
        per-head latent output is taken back by attn_v_b. q's rows are presented non-rotary parts of every head
        first, then the rotary parts (model/arch/deepseek2.py), so each part is one view."""
        b, c, p = self.b, self.cfg, f"blk.{il}."
        heads, rot, rank = c.n_heads, c.rope_dims, c.kv_lora_rank
        nope = c.head_dim - rot
        if c.q_lora_rank:  # V2 / V3: a low-rank q with its own norm
            q_a = self.norm(self.linear(h, p + "attn_q_a.weight", "q_a"), p + "attn_q_a_norm.weight", "q_a_normed")
            q = self.linear(q_a, p + "attn_q_b.weight", "q")
        else:
            q = self.linear(h, p + "attn_q.weight", "q")                   # F32 [T, heads * (nope + rot)]
        q_rot = b.view(q, "q_rot", col_offset=heads * nope)               # [T, heads * rot]
        kv = self.linear(h, p + "attn_kv_a_mqa.weight", "kv")             # F32 [T, rank + rot]: the cache row
        latent, k_rot = b.view(kv, "kv_latent", cols=rank), b.view(kv, "k_rot", col_offset=rank)
        self.norm(latent, p + "attn_kv_a_norm.weight", "kv_latent", out=latent)
        yarn = (c.rope_ext_factor, c.rope_yarn_low, c.rope_yarn_high) if c.rope_ext_factor else None
        for x, n in ((q_rot, heads), (k_rot, 1)):
            b.rope(x, self.positions, n, rot, c.rope_base, neox=c.rope_neox, freq_scale=c.rope_freq_scale,
                   attn_factor=c.rope_attn_factor, yarn=yarn)
        # q's non-rotary part of each head into the latent space: [T, heads * rank]
        q_latent = b.moe_matmul(self.w(p + "attn_k_b.weight"), b.view(q, "q_nope", cols=heads * nope), None, heads,
                                heads, "q_latent")
        cache = b.state(f"k_cache.{il}", rank + rot, self.n_ctx, self.kv_dtype)
        b.kv_store(cache, kv, self.slots)
        o = b.attention(q_latent, cache, b.view(cache, f"v_cache.{il}", cols=rank), self.positions, heads, 1,
                        rank + rot, "attn", self.kv_table, self.block_size, scale=c.attn_scale, q_rope=q_rot,
                        v_dim=rank)                                       # F32 [T, heads * rank]
        o = b.moe_matmul(self.w(p + "attn_v_b.weight"), o, None, heads, heads, "attn_v")  # [T, heads * v dim]
        return self.linear(o, p + "attn_output.weight", "attn_out")

    def route(self, x: T, il: int) -> T:
        """Layer `il`'s expert choice from x (F32 [T, 2k]; runtime/moe_ffn.py), made before its FFN: SmallThinker
        routes the layer's input, ahead of attention, and under expert streaming the chosen experts' reads start
        here and run while attention computes. Hand it to ffn(route=...)."""
        return self.ffn_builder.route(self, x, il)

    def ffn(self, h: T, il: int, route: T | None = None, dense: bool = False) -> T:
        """The layer's FFN on h (F32 [T, d_model]), as this graph's FFN builder makes it; `route`: the layer's
        expert choice made earlier (route()), else the FFN routes h itself. `dense`: the layer's dense FFN
        (ffn_gate/up/down) even where it also runs experts (Gemma 4's MoE layers run both, on inputs normed
        apart). A layer's FFN calls count as one span of its nodes (b.ffn_nodes[layer])."""
        first = len(self.b.node_ops)
        out = self.ffn_builder(self, h, il, route=route, dense=dense)
        if self._ffn_layer == il and self.b.ffn_nodes:  # the layer's second FFN: one span from its first
            first = self.b.ffn_nodes.pop().start
        self.b.ffn_nodes.append(range(first, len(self.b.node_ops)))
        self._ffn_layer = il
        return out

    def residual(self, x: T, y: T, post: float = 0.0) -> T:
        """x + y, in place on the residual stream; its first add makes the stream a tensor of its own, so the
        stream is written where the layers run, not where the embedding lookup ran. `post`: the sum times it
        (Gemma 4's layer output scale; 0: not)."""
        scale = self.cfg.residual_scale  # Granite: each branch scaled before its add (0: not)
        if self.embedding is not None and x.id == self.embedding.id:
            self.stream = self.b.add(x, y, name="x_stream", scale=scale, post=post)
        else:
            self.stream = self.b.add(x, y, out=x, scale=scale, post=post)
        return self.stream
