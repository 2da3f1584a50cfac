"""A thin, typed layer over `_core.Graph`: creates result tensors of the right shape for each op,
so model code reads like a forward pass."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from .. import _core
from .._core import DType, Op, RowMode, RunIf, Storage
from ..model.config import GATE_FIRST, Activation

INTEGER_DOT_WEIGHTS = {DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q4_K, DType.Q5_K,
                       DType.Q6_K, DType.Q2_K, DType.Q3_K, DType.IQ4_NL, DType.IQ4_XS, DType.MXFP4, DType.IQ2_XXS,
                       DType.IQ2_XS, DType.IQ2_S, DType.IQ3_XXS, DType.IQ3_S}


@dataclass(frozen=True)
class T:
    """Handle of a graph tensor: id plus the shape facts later ops need."""
    id: int
    cols: int
    dtype: DType
    rows: RowMode
    n_rows: int = 0  # for fixed-row tensors (weights, state)


@dataclass(frozen=True)
class Guard:
    """When a node runs: its RunIf, at most `max_tokens` and at least `min_tokens` tokens (0: any), and, with
    `when`, only on the path (sparse or dense) that an ActiveUnion result chose for this run."""
    run_if: RunIf | Guard = RunIf.ALWAYS
    max_tokens: int = 0
    when: T | None = None
    sparse: bool = True
    min_tokens: int = 0


def _guard(g: RunIf | Guard) -> Guard:
    return g if isinstance(g, Guard) else Guard(g)


class GraphBuilder:
    def __init__(self) -> None:
        self.graph = _core.Graph()
        # (f32 activation id, guard, scheme) -> its Q8A copy, valid until the activation is rewritten
        self._quantized: dict[tuple[int, Guard, int], T] = {}
        self.unions: list[T] = []  # ActiveUnion results, in layer order: which path each run took
        self.ffn_nodes: list[range] = []  # per layer: the ids of the nodes its FFN built (timed per layer)
        self.node_ops: list[tuple[Op, str]] = []  # per node: its op and the name of the tensor it writes
        self.node_dst: list[int] = []             # per node: the id of the tensor it writes
        self.node_srcs: list[list[int]] = []      # per node: the ids of the tensors it reads
        self.node_params: list[dict] = []         # per node: its scalar parameters, by name
        # Per node: the engine backend that runs it (Engine(placement=...)); 0 until runtime/placement.py
        # assigns it from where weights live (weight_home).
        self.placement: list[int] = []
        # Weight tensor id -> the backend whose memory holds it, for weights made inside weights_on(backend).
        self.weight_home: dict[int, int] = {}
        self._home: int | None = None
        self._names: dict[int, str] = {}
        self._view_of: dict[int, int] = {}  # view id -> the tensor whose memory it shares
        # Where input-major copies come from (runtime/input_major.by_input_weight): None makes them in RAM; under a
        # memory limit, files mapped from disk (offload/input_copies.py)
        self.input_copies = None

    @contextmanager
    def weights_on(self, backend: int | None):
        """Weights made inside live on `backend` (None: untagged). The model skeleton and a split FFN say
        where weights live; runtime/placement.py then assigns every node from that, never model code."""
        outer, self._home = self._home, backend
        try:
            yield
        finally:
            self._home = outer

    # ---- tensors ----------------------------------------------------------------------
    def weight(self, name: str, dtype: int, cols: int, rows: int, data) -> T:
        dt = DType(dtype)
        t = T(self.graph.add_weight(name, dt, cols, rows, data), cols, dt, RowMode.FIXED, rows)
        if self._home is not None:
            self.weight_home[t.id] = self._home
        return t

    def paged_weight(self, name: str, dtype: int, cols: int, rows: int, store, layer: int, part: int) -> T:
        """A weight whose rows a NeuronStore holds (part 0: gate, 1: up, 2: down); read it only after
        neuron_fetch(layer)."""
        dt = DType(dtype)
        return T(self.graph.add_paged_weight(name, dt, cols, rows, store, layer, part), cols, dt, RowMode.FIXED, rows)

    def expert_weight(self, name: str, dtype: int, cols: int, rows: int, store, layer: int, part: int) -> T:
        """Merged experts an ExpertStore holds (part 0: gate, 1: up, 2: down); read them only after
        expert_fetch(layer)."""
        dt = DType(dtype)
        return T(self.graph.add_expert_weight(name, dt, cols, rows, store, layer, part), cols, dt, RowMode.FIXED, rows)

    def expert_fetch(self, route: T, layer: int, prefetch: bool = False) -> T:
        """The experts `route` chose in `layer` become readable (read from the file where they are not in RAM);
        with `prefetch`, `route` is a prediction: their reads start and nothing waits (the layer's fetch does)."""
        dst = self.state(f"blk.{layer}.experts.{'prefetched' if prefetch else 'fetched'}", 1, 1, DType.I32)
        return self._node(Op.EXPERT_FETCH, dst, {"route": route}, {"layer": layer, "prefetch": int(prefetch)})

    def neuron_fetch(self, layer: int, release: bool = False, union: T | None = None, dense_down: bool = False,
                     run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """Makes every row of the layer's paged weights readable (reads its cold tail, or waits for the
        read-ahead that already did), or with `union` (an active_union result) the rows it lists; with
        `release`, says its readers are done (its buffer may be reused); with `dense_down`, reads the layer's
        original down matrix whole for a dense run (offload.dense_down)."""
        mode = 2 if dense_down else int(release)
        dst = self.state(f"blk.{layer}.ffn.{('fetched', 'released', 'dense_down')[mode]}", 1, 1, DType.I32)
        return self._node(Op.NEURON_FETCH, dst, {"union_list": union}, {"layer": layer, "mode": mode}, run_if=run_if)

    def view(self, base: T, name: str, cols: int | None = None, rows: int | None = None, col_offset: int = 0,
             row_offset: int = 0) -> T:
        """Rows [row_offset, row_offset + rows) and columns [col_offset, col_offset + cols) of `base`, sharing
        its memory (per-token bases: every row, some columns). Writes through a view land in the base."""
        cols = base.cols - col_offset if cols is None else cols
        elem = _core.row_bytes(base.dtype, 32) / 32  # bytes per element (quantized: whole blocks)
        stride = self.graph.row_stride(base.id)
        offset = row_offset * stride + int(col_offset * elem)
        n_rows = (base.n_rows - row_offset if rows is None else rows) if base.rows == RowMode.FIXED else 0
        t = T(self.graph.add_view(name, base.id, cols, n_rows, offset, stride), cols, base.dtype, base.rows, n_rows)
        self._names[t.id] = name
        self._view_of[t.id] = self.origin(base.id)
        return t

    def origin(self, tensor: int) -> int:
        """The tensor whose memory `tensor` is (itself, or the base of the view it is)."""
        return self._view_of.get(tensor, tensor)

    def activation(self, name: str, cols: int, dtype: DType = DType.F32, rows: RowMode = RowMode.TOKENS) -> T:
        # An op over a fixed-row tensor (a test feeding weights as inputs) still yields one row per token.
        rows = RowMode.TOKENS if rows == RowMode.FIXED else rows
        t = T(self.graph.add_tensor(name, dtype, cols, rows, Storage.SCRATCH), cols, dtype, rows)
        self._names[t.id] = name
        return t

    def state(self, name: str, cols: int, n_rows: int, dtype: DType = DType.F16) -> T:
        return T(self.graph.add_tensor(name, dtype, cols, RowMode.FIXED, Storage.STATE, n_rows), cols, dtype,
                 RowMode.FIXED, n_rows)

    def input(self, name: str, rows: RowMode = RowMode.TOKENS, cols: int = 1) -> T:
        return T(self.graph.add_tensor(name, DType.I32, cols, rows, Storage.INPUT), cols, DType.I32, rows)

    def _node(self, op: Op, dst: T, src: dict[str, T | None], params: dict[str, float | int] | None = None,
              run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """Adds a node; `src` and `params` by the names `_core.op_signature(op)` lists."""
        g = _guard(run_if)
        self.graph.add_node(op, dst.id, {k: s.id for k, s in src.items() if s is not None}, params or {},
                            g.run_if, g.max_tokens, g.when.id if g.when is not None else -1, g.sparse, g.min_tokens)
        self.node_ops.append((op, self._names.get(dst.id, "")))
        self.node_dst.append(dst.id)
        self.node_srcs.append([t.id for t in src.values() if t is not None])
        self.node_params.append(dict(params or {}))
        self.placement.append(0)
        for key in [k for k in self._quantized if k[0] == dst.id]:
            del self._quantized[key]
        return dst

    def place(self, node: int, backend: int) -> None:
        """Runs node `node` on the engine's backend `backend` (Engine(backend_threads=[...]) lists them)."""
        self.placement[node] = backend

    # ---- ops ----------------------------------------------------------------------------
    def get_rows(self, table: T, ids: T, name: str, scale: float = 0.0) -> T:
        """Rows of `table` as F32, times `scale` (0: unscaled)."""
        return self._node(Op.GET_ROWS, self.activation(name, table.cols, rows=ids.rows), {"table": table, "ids": ids},
                          {"scale": scale})

    def rms_norm(self, x: T, weight: T, eps: float, name: str, segment: int = 0, out: T | None = None) -> T:
        """With `segment`, each run of `segment` columns (a head) is normalised on its own, all with `weight`."""
        return self._node(Op.RMS_NORM, out or self.activation(name, x.cols, rows=x.rows), {"x": x, "weight": weight},
                          {"segment": segment, "eps": eps})

    def quantize(self, x: T, run_if: RunIf | Guard = RunIf.ALWAYS, weight: DType | None = None) -> T:
        """Q8A copy of an activation, shared by every matmul that reads it in the same runs and quantizes as the
        same weight type does (`weight`'s scheme: llama.cpp's for that type, csrc/kernels/act_quant.h)."""
        scheme = _core.act_scheme(weight) if weight is not None else 0
        key = (x.id, _guard(run_if), scheme)
        q = self._quantized.get((x.id, Guard(), scheme)) or self._quantized.get(key)  # an unguarded copy serves all
        if q is None:
            name = f"q8({x.id})" if scheme == 0 else f"q8({x.id}, {scheme})"
            q = self._node(Op.QUANTIZE, self.activation(name, x.cols, DType.Q8A, x.rows), {"x": x},
                           {"scheme": scheme}, run_if=run_if)
            self._quantized[key] = q
        return q

    def matmul(self, w: T, x: T, name: str, active: T | None = None, out: T | None = None,
               run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """dst = x @ w.T; with `active` (an active list), only the listed rows (gather-GEMV)."""
        src = self.quantize(x, run_if, w.dtype) if w.dtype in INTEGER_DOT_WEIGHTS else x
        dst = out or self.activation(name, w.n_rows, rows=x.rows)
        return self._node(Op.MAT_MUL, dst, {"weight": w, "x": src, "active": active}, run_if=run_if)

    def rope(self, x: T, positions: T, heads: int, head_dim: int, base: float, neox: bool = False,
             factors: T | None = None, freq_scale: float = 1.0, attn_factor: float = 1.0, n_rot: int = 0,
             yarn: tuple[float, float, float] | None = None) -> T:
        """In place. `neox`: element i pairs with i + n_rot / 2 (Gemma, Qwen, Phi-3); else adjacent pairs
        (llama). `factors` (F32 [1, n_rot / 2]) divide each pair's frequency (Llama 3.1's rope_freqs,
        LongRoPE); `freq_scale` multiplies every frequency (linear scaling); cos and sin are times `attn_factor`.
        `n_rot` (0: head_dim): only each head's first n_rot values rotate (partial RoPE). `yarn`: (ext_factor, low,
        high), YaRN's mix of scaled and unscaled angles (op_params.h RopeParams)."""
        params = {"heads": heads, "head_dim": head_dim, "mode": int(neox), "base": base, "freq_scale": freq_scale,
                  "attn_factor": attn_factor}
        if n_rot and n_rot != head_dim:
            params["n_rot"] = n_rot
        if yarn is not None:
            params.update(ext_factor=yarn[0], yarn_low=yarn[1], yarn_high=yarn[2])
        return self._node(Op.ROPE, x, {"x": x, "positions": positions, "factors": factors}, params)

    def kv_store(self, cache: T, x: T, positions: T, run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        return self._node(Op.KV_STORE, cache, {"x": x, "rows": positions}, run_if=run_if)

    def attention(self, q: T, k_cache: T, v_cache: T, positions: T, heads: int, kv_heads: int, head_dim: int,
                  name: str, kv_table: T | None = None, block_size: int = 0, window: int = 0,
                  scale: float | None = None, sinks: T | None = None, q_rope: T | None = None,
                  v_dim: int = 0) -> T:
        """With `kv_table` (I32 [T, max blocks]) the cache is paged: many sequences share it. `window`: each
        token sees only the keys of its last `window` positions (sliding-window layers; 0: all). `scale`
        multiplies q.k (default 1/sqrt(head_dim)). The caches may be F16 or Q8_0. `sinks` (F32 [1, heads]): a
        logit per head in every row's softmax that adds no value (gpt-oss). MLA (DeepSeek-V2): `q_rope` (F32
        [T, heads * r]) holds each query head's last r values (q then holds the first head_dim - r), and `v_dim`
        (0: head_dim) is a value head's size, read as the first v_dim values of each V cache row."""
        out = self.activation(name, heads * (v_dim or head_dim), rows=q.rows)
        src = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "positions": positions, "table": kv_table,
               "sinks": sinks, "q_rope": q_rope}
        return self._node(Op.ATTENTION, out, src, {
            "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "block_size": block_size, "window": window,
            "scale": head_dim ** -0.5 if scale is None else scale, "v_dim": v_dim})

    def add(self, a: T, b: T, out: T | None = None, name: str = "add", scale: float = 0.0, post: float = 0.0) -> T:
        """(a + scale * b) * post (each 0: 1; Granite scales each residual branch, Gemma 4 each layer's output)."""
        params = {k: v for k, v in (("scale", scale), ("post", post)) if v} or None
        return self._node(Op.ADD, out or self.activation(name, a.cols, rows=a.rows), {"a": a, "b": b}, params)

    def softcap(self, x: T, cap: float, out: T | None = None, name: str = "softcap") -> T:
        """cap * tanh(x / cap) (Gemma's final logit soft-capping); in place with out=x."""
        return self._node(Op.SOFTCAP, out or self.activation(name, x.cols, rows=x.rows), {"x": x}, {"cap": cap})

    def gated_mul(self, gate: T, up: T, out: T | None = None, name: str = "act", act: int = 0,
                  run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """act(gate) * up; `act` is a model.config.Activation (SiLU by default)."""
        return self._node(Op.SILU_MUL, out or self.activation(name, gate.cols, rows=gate.rows),
                          {"gate": gate, "up": up}, {"act": int(act)}, run_if=run_if)

    # ---- neuron-aware FFN ops (see graph.h for the active-list layout) ---------------------
    def bias_relu(self, x: T, bias: T, run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        return self._node(Op.BIAS_RELU, x, {"x": x, "bias": bias}, run_if=run_if)

    def active_set(self, scores: T, n_ff: int, name: str, cut: T | None = None, hot: int = 0,
                   threshold: float = 0.0, gate_act: Activation | None = None, top_k: int = 0,
                   run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """Predictor mode when `cut` is given (logits > cut, hot prefix always on), else
        |scores| > threshold (|act(scores)| with `gate_act`, SiLU or GELU: gate-first sets), or with `top_k` each
        token's top_k largest |scores| (a fixed density)."""
        dst = self.activation(name, n_ff + 1, DType.I32, scores.rows)
        mode = 0 if cut is not None else 1
        return self._node(Op.ACTIVE_SET, dst, {"scores": scores, "cut": cut},
                          {"n_ff": n_ff, "hot": hot, "mode": mode,
                           "gate_fn": 0 if gate_act is None else GATE_FIRST[gate_act], "threshold": threshold,
                           "top_k": top_k},
                          run_if=run_if)

    def gated_act(self, gate: T, up: T, active: T, threshold: float, act: int = 0,
                  run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        return self._node(Op.GATED_ACT, gate, {"gate": gate, "up": up, "active": active},
                          {"act": int(act), "threshold": threshold}, run_if=run_if)

    def down_axpy(self, down_t: T, act: T, active: T, name: str = "down", out: T | None = None,
                  scales: T | None = None, row_map: T | None = None, union: T | None = None,
                  run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """`scales`: the group scales of a Q4T down; `row_map`: I32 [1, n_ff], list id -> down row;
        `union`: the batch's ActiveUnion result (sizes the column tiles by the rows the batch reads)."""
        dst = out or self.activation(name, down_t.cols, rows=act.rows)
        return self._node(Op.DOWN_AXPY, dst, {"down": down_t, "act": act, "active": active, "scales": scales,
                                              "row_map": row_map, "union_list": union}, run_if=run_if)

    def active_union(self, lists: T, n_ff: int, name: str, max_tokens: int, max_density: float = 1.0,
                     max_union: float = 1.0, max_single: float = 1.0, run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        """One list for the whole run: the union of `lists` (I32 [T, n_ff + 1]), or count -1 (the dense
        path) for runs of more than `max_tokens` tokens, a mean list density over `max_density` or a union
        denser than `max_union` (one token: a list denser than `max_single`). Nodes guarded by it follow
        its choice."""
        dst = self.state(name, n_ff + 1, 1, DType.I32)
        self.unions.append(dst)
        return self._node(Op.ACTIVE_UNION, dst, {"lists": lists},
                          {"n_ff": n_ff, "max_tokens": max_tokens, "max_density": max_density,
                           "max_union": max_union, "max_single": max_single}, run_if=run_if)

    def scatter_cols(self, x: T, perm: T, name: str, run_if: RunIf | Guard = RunIf.ALWAYS) -> T:
        return self._node(Op.SCATTER_COLS, self.activation(name, x.cols, rows=x.rows), {"x": x, "perm": perm},
                          run_if=run_if)

    # ---- Mixture of Experts (see graph.h for the route layout) -------------------------------------
    def moe_route(self, logits: T, k: int, name: str = "route", norm: bool = True, gating: int = 0,
                  scale: float = 0.0, bias: T | None = None, groups: tuple[int, int] = (0, 0),
                  expert_scale: T | None = None) -> T:
        """F32 [T, 2k]: each token's top k experts of softmax (gating 0) or sigmoid (1) of the router's
        `logits` (F32 [T, n_expert]): their weights (divided by their sum with `norm`, times `scale` unless 0),
        then their ids as floats. `bias` (F32 [1, n_expert]): added to the probabilities for choosing only.
        `groups` = (n_group, group_used): DeepSeek-V3's grouped routing (op_params.h MoeRouteParams).
        `expert_scale` (F32 [1, n_expert]): each chosen weight times its expert's value, last (Gemma 4)."""
        return self._node(Op.MOE_ROUTE, self.activation(name, 2 * k, rows=logits.rows),
                          {"logits": logits, "bias": bias, "expert_scale": expert_scale},
                          {"n_expert": logits.cols, "k": k, "gating": gating, "norm": int(norm), "scale": scale,
                           "n_group": groups[0], "group_used": groups[1]})

    def moe_route_split(self, route: T, expert_map: T, n_local: int, k: int, name: str) -> T:
        """F32 [T, 2k]: one backend's share of `route`: slots whose expert `expert_map` (I32 [1, n_expert], a
        weight) maps to a local id keep their weight and take that id; the others get weight 0 and id -1, which
        the expert matmul leaves at 0."""
        return self._node(Op.MOE_ROUTE_SPLIT, self.activation(name, 2 * k, rows=route.rows),
                          {"route": route, "map": expert_map}, {"n_expert": n_local, "k": k})

    def moe_matmul(self, experts: T, x: T, route: T | None, n_expert: int, k: int, name: str, gate: T | None = None,
                   cut: T | None = None, gate_fn: int = 0, bias: T | None = None) -> T:
        """F32 [T, k * rows_e]: slot s of token t is x[t] (or, when x has k segments, its segment s) times
        expert route[t].id[s]'s rows of `experts` (the merged [n_expert * rows_e, cols] tensor). Only the
        chosen experts run (llama.cpp's mul_mat_id). With `gate` (the same route's gate matmul, F32 [T, k *
        rows_e]) and `cut` (F32 [n_expert, 3] from _core.gate_cut_bounds for `gate_fn`), a one-token run computes
        only the rows whose |act(gate)| passes their expert's cut and leaves the others 0 (CATS). `bias` (F32
        [n_expert, rows_e]): each slot's rows plus its expert's bias (gpt-oss). `route` None: slot s runs expert s
        for every token (k == n_expert; a matmul per head, as MLA's absorbed projections)."""
        src = self.quantize(x, weight=experts.dtype) if experts.dtype in INTEGER_DOT_WEIGHTS else x
        dst = self.activation(name, k * (experts.n_rows // n_expert), rows=x.rows)
        return self._node(Op.MOE_MAT_MUL, dst, {"weight": experts, "x": src, "route": route, "gate": gate, "cut": cut,
                                                "bias": bias}, {"n_expert": n_expert, "k": k, "gate_fn": gate_fn})

    def moe_combine(self, experts: T, route: T, k: int, name: str = "moe_out", shared: T | None = None,
                    shared_gate: T | None = None) -> T:
        """F32 [T, d]: the k slots of `experts` (F32 [T, k * d]) weighted by the route, plus a shared expert's
        output times sigmoid(shared_gate) when given."""
        dst = self.activation(name, experts.cols // k, rows=experts.rows)
        return self._node(Op.MOE_COMBINE, dst, {"experts": experts, "route": route, "shared": shared,
                                                "shared_gate": shared_gate}, {"n_expert": 0, "k": k})

    # ---- recurrent layers (op_params.h: one state row per sequence, reset at position 0) ------------------
    def ssm_conv(self, x: T, weight: T, state: T, positions: T, name: str, rows: T | None = None,
                 silu: bool = True) -> T:
        """F32 [T, C]: each channel of x (F32 [T, C]) through its causal conv1d (`weight` F32 [C, K], oldest tap
        first) over its last K inputs, kept in `state` (F32 state [sequences, C * (K - 1)]; `rows`: each token's
        row, else row 0); SiLU of the result with `silu`."""
        return self._node(Op.SSM_CONV, self.activation(name, x.cols, rows=x.rows),
                          {"x": x, "weight": weight, "state": state, "positions": positions, "rows": rows},
                          {"silu": int(silu)})

    def delta_net(self, qkv: T, beta: T, alpha: T, decay: T, state: T, positions: T, k_heads: int, v_heads: int,
                  head_dim: int, eps: float, name: str, rows: T | None = None, grouped: bool = False) -> T:
        """F32 [T, v_heads * head_dim]: the gated delta rule (Qwen3.5's linear attention) over `qkv` (the conv's
        output: q heads, k heads, v heads), `beta` and `alpha` (F32 [T, v_heads]) and `decay` (F32 [2, v_heads]:
        dt bias, A), each sequence's S x S matrices per head in `state` (F32 state [sequences, v_heads S S]). v head h
        reads k head h % k_heads, or with `grouped` h / (v_heads / k_heads)."""
        return self._node(Op.DELTA_NET, self.activation(name, v_heads * head_dim, rows=qkv.rows),
                          {"qkv": qkv, "beta": beta, "alpha": alpha, "decay": decay, "state": state,
                           "positions": positions, "rows": rows},
                          {"k_heads": k_heads, "v_heads": v_heads, "head_dim": head_dim, "eps": eps,
                           "grouped": int(grouped)})

    def select_rows(self, x: T, row_ids: T, name: str) -> T:
        return self._node(Op.SELECT_ROWS, self.activation(name, x.cols, rows=row_ids.rows), {"x": x, "rows": row_ids})


def single_op_engine(build, max_tokens: int = 16, n_threads: int = 1, isa: str = "auto"):
    """Builds a small graph with `build(builder) -> T | tuple[T, ...]`, pins the returned tensors so
    they stay readable, and returns (engine, outputs). Used by op tests and kernel benchmarks."""
    b = GraphBuilder()
    out = build(b)
    for t in (out if isinstance(out, tuple) else (out,)):
        b.graph.pin(t.id)
    return _core.Engine(b.graph, max_tokens=max_tokens, max_outputs=max_tokens, n_threads=n_threads, isa=isa), out
