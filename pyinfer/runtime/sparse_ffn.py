"""The FFN writers of a dense model's layer (llama.cpp's build_ffn): `dense_ffn` and the neuron-aware
`sparse_ffn`. Every path calls them with its own side: where the weights or neuron rows come from (the model in
RAM, an offload neuron store, a split layer's sub-model on a backend, a shared expert's tensors) and, for the
sparse writer, whether a run decides sparse or dense from one union (the CPU) or each token keeps its own list
(a device's share of a split layer). runtime/moe_ffn.py is the other writer, for experts.

With a sparsity plan, gate and up are row-permuted copies (hot neurons first) and down gets a
neuron-major copy (row j = neuron j's down column), so the three matrices of one neuron share an id.
  - decode (one token, or a few tokens of a batch of sequences): predictor -> each token's active list ->
    their union -> gather-GEMV of the union's gate/up rows -> each token's gated activation and threshold
    -> axpy of each token's active down rows. Without predictors, gate/up run dense and only down is sparse.
    When the lists or their union are denser than the measured break-even, the run goes dense instead.
  - prefill (many tokens): dense GEMM, un-permuted before the original down; sparsity across many tokens
    aggregates away (PowerInfer-2). `SparseRuns.every_token` instead computes every token exactly as
    decode would, which is how perplexity measures the quality of the sparse path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, quants

from .. import _core
from .._core import DType
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import LayerPlan, SparsityPlan
from .graph_builder import INTEGER_DOT_WEIGHTS, GraphBuilder, Guard, T
from .input_major import by_input_weight, raw_rows, transposed_weight
from .threads import physical_cores

_FLOAT_TYPES = {"F32", "F16", "BF16"}


FFN_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


def dense_ffn(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig, record: bool = False, tag: str = "",
              parts: tuple[str, str, str] = FFN_PARTS, project=None) -> T:
    """act(gate) * up, then down: F32 [T, d_model]; the one dense writer. `w`: the side's weights by the model's
    names (blk.{il}.{part}.weight for `parts`: the layer's FFN, or a shared expert's tensors); `tag` names the
    side's tensors apart. `record`: the activation gets a tensor of its own, so the layer's input, gate and up stay
    readable after a run (the profiler's view: b.records[layer]). `project`: (x, weight name, node name) -> x @ W.T
    when the graph computes its projections otherwise than densely (ModelGraph.project: input-sparse)."""
    p = f"blk.{il}."
    if project is None:
        def project(x, weight, name):
            return b.matmul(w(weight), x, name)
    gate = project(h, p + f"{parts[0]}.weight", "gate" + tag)  # F32 [T, d_ff], pre-activation
    up = project(h, p + f"{parts[1]}.weight", "up" + tag)
    act = b.gated_mul(gate, up, name="act" + tag, out=None if record else gate, act=cfg.activation)
    if record:
        for t in (h, gate, up):
            b.graph.pin(t.id)
        b.records.append((h.id, gate.id, up.id))
    return project(act, p + f"{parts[2]}.weight", "ffn_out" + tag)  # F32 [T, d_model]


NEURON_DOWN_TYPES = {"q4_1": DType.Q4_1, "q8_0": DType.Q8_0}
NEURON_DOWN_CHOICES = ("auto", "q4t", "q8_0", "q4_1")
# Q4T shares each 32-neuron group's scales (20% of its bytes), read whenever one neuron of the group is
# active; below this density most groups hold one or two active neurons and Q8_0's per-neuron scales
# read fewer bytes (bench/results/kernels/sparse_kernels.md).
Q4T_MIN_DENSITY = 0.2


def pick_neuron_down(plan: SparsityPlan, requested: str) -> str:
    if requested != "auto":
        return requested
    density = plan.info.get("density", 1.0 - plan.target)
    return "q4t" if density >= Q4T_MIN_DENSITY else "q8_0"


def q4t_down(gguf: GGUFModelFile, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The lossless neuron-major form of a Q4_1 / Q4_0 down [d, n_ff]: nibbles U8 [n_ff, d/2] (row j =
    neuron j, original order) and the blocks' scales and offsets F16 [n_ff/32, 2d], which 32 neurons share.
    None for other types."""
    t = gguf.tensor(name)
    if t.type_name not in ("Q4_1", "Q4_0"):
        return None
    return q4t_from_blocks(np.asarray(t.data), t.type_name, t.rows, t.cols)


def q4t_from_blocks(data: np.ndarray, type_name: str, d: int, n_ff: int) -> tuple[np.ndarray, np.ndarray]:
    """data: the raw Q4_1 / Q4_0 blocks of a [d, n_ff] matrix."""
    groups = n_ff // 32
    block = 20 if type_name == "Q4_1" else 18
    raw = np.asarray(data).reshape(d, groups, block)
    if type_name == "Q4_0":  # Q4_0 stores d * (q - 8): nibbles are the same, the offset is -8 d
        raw = np.concatenate([raw[:, :, :2], np.zeros((d, groups, 2), np.uint8), raw[:, :, 2:]], axis=2)
    block = 20
    scale = raw[:, :, 0:2].copy().view(np.float16)[..., 0]                       # [d, G]
    if type_name == "Q4_1":
        offset = raw[:, :, 2:4].copy().view(np.float16)[..., 0]
    else:  # -8 d is exact in fp16
        offset = (scale.astype(np.float32) * -8.0).astype(np.float16)
    qs = raw[:, :, block - 16:]                                                  # [d, G, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)                             # [d, G, 32]: element i of the block
    qn = q.transpose(1, 2, 0).reshape(n_ff, d // 32, 2, 16)                      # neuron-major, per 32 outputs
    nibbles = np.ascontiguousarray((qn[:, :, 0, :] | (qn[:, :, 1, :] << 4)).reshape(n_ff, d // 2), dtype=np.uint8)
    scales = np.ascontiguousarray(np.concatenate([scale.T, offset.T], axis=1))  # [G, 2d]
    return nibbles, scales


def neuron_major_down(gguf: GGUFModelFile, name: str, perm: np.ndarray, down_type: str = "q4_1"
                      ) -> tuple[DType, np.ndarray]:
    """down [d_model, d_ff] -> [d_ff, d_model] in permuted neuron order. Quantized models re-quantize it
    along the other axis: Q4_1 (as many bytes as the source, a second rounding) or Q8_0 (1.7x the bytes,
    nearly lossless). Float models stay exact in F32."""
    t = gguf.tensor(name)
    dt = NEURON_DOWN_TYPES[down_type]
    if dt == DType.Q8_0 or t.type_name in _FLOAT_TYPES or t.rows % 32:  # the input-sparse projections' copy
        return transposed_weight(gguf, name, perm)                    # (Q8_0 rows, or exact F32 [n, d_model])
    wt = _core.neuron_major(raw_rows(gguf, name), DType(t.dtype_id), t.cols, np.ascontiguousarray(perm, np.int32),
                            DType.F32, physical_cores()).view(np.float32)
    return dt, quants.quantize(wt, GGMLQuantizationType[dt.name])


def permuted_rows(gguf: GGUFModelFile, name: str, perm: np.ndarray) -> np.ndarray:
    t = gguf.tensor(name)
    raw = np.asarray(t.data).reshape(t.rows, -1)
    return np.ascontiguousarray(raw[perm])


@dataclass(frozen=True)
class SparseRuns:
    """Which runs take the neuron-aware FFN. A run of at most `max_tokens` tokens (decode, or a decode
    step of a batch of sequences) computes each token's active list and their union. One token runs
    sparse (the plan's density was chosen for decode); several run sparse while the mean list density
    and the union's density stay under the break-even measured by bench/test_bench_batch_union.py
    (LLaMA-7B shape, the lower of its batch sizes 2-16; the real model's are higher), per layer kind:
    `predicted` (gate/up gathered over the union too) or `threshold` (down only). Other runs go dense."""
    max_tokens: int = 16
    predicted: tuple[float, float] = (0.3, 0.75)   # (mean list density, union density)
    threshold: tuple[float, float] = (0.15, 0.75)
    single: float = float("inf")

    @staticmethod
    def every_token(max_tokens: int) -> "SparseRuns":
        """Every token sparse, whatever the density: what perplexity of the sparse path measures."""
        inf = float("inf")
        return SparseRuns(max_tokens, (inf, inf), (inf, inf), inf)

    @staticmethod
    def never() -> "SparseRuns":
        """Every run dense (the active lists are still computed, then ignored)."""
        return SparseRuns(16, (-1.0, -1.0), (-1.0, -1.0), -1.0)


@dataclass
class FfnArrays:
    """The bytes the neuron-aware path reads for one layer: neuron k of the plan's hot-first order is row k
    of gate and up, and row `down_rows[k]` of down (Q4T keeps down in the original neuron order)."""
    gate_type: int
    gate: np.ndarray           # U8 [n_ff, gate row bytes], permuted
    up_type: int
    up: np.ndarray             # U8 [n_ff, up row bytes], permuted
    down_type: int
    down: np.ndarray           # [n_ff, down row bytes]: neuron-major down
    scales: np.ndarray | None  # F16 [n_ff / 32, 2 d] (Q4T only): shared by 32 neurons, never offloaded
    down_rows: np.ndarray | None  # I32 [n_ff]: down row of hot-first neuron k (Q4T), else None (row k)


def ffn_arrays(gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan, il: int, down_type: str = "auto"
               ) -> FfnArrays:
    p = f"blk.{il}."
    perm = plan.layers[il].perm.astype(np.int32)
    g_src, u_src = gguf.tensor(p + "ffn_gate.weight"), gguf.tensor(p + "ffn_up.weight")
    gate, up = permuted_rows(gguf, g_src.name, perm), permuted_rows(gguf, u_src.name, perm)
    down_type = pick_neuron_down(plan, down_type)
    q4t = q4t_down(gguf, p + "ffn_down.weight") if down_type == "q4t" and cfg.d_model % 32 == 0 else None
    if q4t is not None:  # lossless; rows stay in the original order, so list ids are mapped through perm
        return FfnArrays(g_src.dtype_id, gate, u_src.dtype_id, up, int(DType.Q4T), q4t[0], q4t[1], perm)
    dt_type, dt_data = neuron_major_down(gguf, p + "ffn_down.weight", perm, "q8_0" if down_type == "q4t"
                                         else down_type)
    return FfnArrays(g_src.dtype_id, gate, u_src.dtype_id, up, int(dt_type), dt_data.reshape(cfg.d_ff, -1),
                     None, None)


class InRamNeurons:
    """Where a sparse FFN's neuron rows come from when they are all in RAM: copies made here (hot-first gate
    and up, neuron-major down) from `gguf` (the model, or a split layer's sub-model). offload/offloaded_ffn.py's
    OffloadedFfn is the other source, with the same calls: its rows are read from the bundle file by the nodes
    these calls add. `tag` names this side's weights apart."""

    def __init__(self, gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan, down_type: str, w, tag: str = ""):
        self.gguf, self.cfg, self.plan, self.down_type, self.w, self.tag = gguf, cfg, plan, down_type, w, tag

    def layer_weights(self, b: GraphBuilder, il: int):
        """(gate, up, neuron-major down, Q4T scales or None) of layer `il`."""
        if self.plan.mode == "input":  # neurons in file order: gate and up as they are, down by input
            down_t = by_input_weight(b, self.gguf, f"blk.{il}.ffn_down.weight", self.tag)
            return self.w(f"blk.{il}.ffn_gate.weight"), self.w(f"blk.{il}.ffn_up.weight"), down_t, None
        fa = ffn_arrays(self.gguf, self.cfg, self.plan, il, self.down_type)
        p, d, n_ff, tag = f"blk.{il}.", self.cfg.d_model, self.cfg.d_ff, self.tag
        gate_w = b.weight(p + "ffn_gate.perm" + tag, fa.gate_type, d, n_ff, fa.gate)
        up_w = b.weight(p + "ffn_up.perm" + tag, fa.up_type, d, n_ff, fa.up)
        down_t = b.weight(p + ("ffn_down.q4t" if fa.scales is not None else "ffn_down.neurons") + tag, fa.down_type,
                          d, n_ff, fa.down)
        scales = None
        if fa.scales is not None:
            scales = b.weight(p + "ffn_down.q4t_scales" + tag, int(DType.F16), 2 * d, n_ff // 32, fa.scales)
        return gate_w, up_w, down_t, scales

    def before_lists(self, b: GraphBuilder, il: int) -> None:
        """Rows needed before any active list exists (in RAM: always readable)."""

    def after_union(self, b: GraphBuilder, il: int, union: T) -> None:
        """The rows of this run's union (in RAM: always readable)."""

    def dense_down(self, b: GraphBuilder, il: int, guard: Guard) -> T:
        """The layer's original down [d, n_ff] for dense runs."""
        return self.w(f"blk.{il}.ffn_down.weight")

    def done(self, b: GraphBuilder, il: int) -> None:
        """The layer's readers are done (in RAM: nothing to release)."""


def predicted_lists(b: GraphBuilder, h: T, pred, hot: int, n: int, prefix: str, tag: str, guard: Guard) -> T:
    """Each token's active list from a layer's predictor (PowerInfer's low-rank MLP: neuron hot + j runs when
    (w2 relu(w1 h + b1))[j] > cut[j]; the hot prefix always runs): I32 [T, n + 1]. The one predictor subgraph,
    for the CPU's sparse FFN and a device's share of a split one (`tag` names its tensors apart)."""
    w1 = b.weight(prefix + "pred.w1" + tag, int(DType.Q8_0), h.cols, pred.rank, pred.w1_q8)
    b1 = b.weight(prefix + "pred.b1" + tag, int(DType.F32), pred.rank, 1, pred.b1.astype(np.float32))
    w2 = b.weight(prefix + "pred.w2" + tag, int(DType.Q8_0), pred.rank, n - hot, pred.w2_q8)
    cut = b.weight(prefix + "pred.cut" + tag, int(DType.F32), n - hot, 1, pred.cut.astype(np.float32))
    z = b.bias_relu(b.matmul(w1, h, "pred_hidden" + tag, run_if=guard), b1, run_if=guard)
    logits = b.matmul(w2, z, "pred_logits" + tag, run_if=guard)
    return b.active_set(logits, n, "active" + tag, cut=cut, hot=hot, run_if=guard)


def sparse_ffn(b: GraphBuilder, w, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, plan: SparsityPlan,
               runs: SparseRuns, down_type: str = "auto", neurons=None, tag: str = "", per_token: bool = False) -> T:
    """The one neuron-aware writer. `neurons`: where the layer's neuron rows come from (InRamNeurons by default,
    or an offload.OffloadedFfn whose neuron store streams them); the graph is the same either way. `tag` names
    this side's tensors apart. `per_token` (a device's share of a split layer, predictor layers only): runs of up
    to runs.max_tokens tokens compute each token's own list, without a union (whose dense/sparse choice a GPU
    would read on the host: it reads a row again per token from its cache instead), and longer runs go dense."""
    lp: LayerPlan = plan.layers[il]
    p = f"blk.{il}."
    n_ff, act_kind = cfg.d_ff, cfg.activation
    neurons = neurons or InRamNeurons(gguf, cfg, plan, down_type, w, tag)
    perm_w = b.weight(p + "ffn.perm" + tag, int(DType.I32), n_ff, 1, lp.perm.astype(np.int32))
    gate_w, up_w, down_t, scales = neurons.layer_weights(b, il)
    in_order = plan.mode == "input"  # neurons in file order: no permutation to map or undo
    row_map = perm_w if scales is not None and not in_order else None  # Q4T rows stay in the original order
    neurons.before_lists(b, il)
    out = b.activation("ffn_out" + tag, cfg.d_model, rows=h.rows)
    if gate_w.dtype in INTEGER_DOT_WEIGHTS:
        b.quantize(h, weight=gate_w.dtype)  # one Q8A copy of h for both paths (and the predictor, if its scheme)

    # 1. Each token's active list (runs of at most max_tokens tokens), then the union, which picks the path.
    few = Guard(max_tokens=runs.max_tokens)
    pred = lp.predictor if lp.predictor is not None and lp.hot < n_ff else None
    if per_token and pred is None:
        raise ValueError("a per-token sparse side needs a predictor layer with cold neurons")
    gate_first = pred is None and (plan.mode == "gate" or lp.gate_threshold > 0)
    cats = plan.mode == "gate"
    gate = up = None  # computed before the choice only where the choice needs them (both paths use them)
    if pred is not None:
        lists = predicted_lists(b, h, pred, lp.hot, n_ff, p, tag, few)  # I32 [T, n_ff + 1]
    elif gate_first:
        # CATS stops at |act(gate)| > cut (SiLU or GELU); the contrib mode then also drops neurons whose
        # |act(gate) * up| is below its threshold.
        gate = b.matmul(gate_w, h, "gate")  # F32 [T, n_ff], hot-first order
        lists = b.active_set(gate, n_ff, "active", threshold=lp.threshold if cats else lp.gate_threshold,
                             gate_act=act_kind, run_if=few)
    else:  # threshold only: gate and up dense, down over the active neurons
        gate = b.matmul(gate_w, h, "gate")
        up = b.matmul(up_w, h, "up")
        b.gated_mul(gate, up, out=gate, act=act_kind)
        top_k = plan.fixed_top_k("ffn_mid", n_ff) if in_order else 0
        lists = b.active_set(gate, n_ff, "active", threshold=lp.threshold, top_k=top_k, run_if=few)
    if per_token:  # each token's own list; the run's length picks the path
        union, rows = None, lists
        sparse, dense = few, Guard(min_tokens=runs.max_tokens + 1)
    else:
        limits = runs.predicted if pred is not None or gate_first else runs.threshold
        # I32 [1, n_ff + 1]: count (-1: dense) and ids
        union = b.active_union(lists, n_ff, p + "ffn.union" + tag, runs.max_tokens, *limits, max_single=runs.single)
        neurons.after_union(b, il, union)
        rows = union
        sparse, dense = Guard(when=union), Guard(when=union, sparse=False)

    # 2. Sparse: gate/up rows of the union (or of each token's list) for every token (each row read once), each
    #    token's own activations, and the down rows of each token's list (column tiles shared by the batch).
    act = gate
    if pred is not None:
        act = b.matmul(gate_w, h, "gate_s" + tag, active=rows, run_if=sparse)
        up_s = b.matmul(up_w, h, "up_s" + tag, active=rows, run_if=sparse)
        b.gated_act(act, up_s, lists, 0.0 if cats else lp.threshold, act=act_kind, run_if=sparse)
    elif gate_first:
        up_s = b.matmul(up_w, h, "up_s" + tag, active=rows, run_if=sparse)
        b.gated_act(gate, up_s, lists, 0.0 if cats else lp.threshold, act=act_kind, run_if=sparse)
    b.down_axpy(down_t, act, lists, out=out, scales=scales, row_map=row_map, union=union, run_if=sparse)

    # 3. Dense: the GEMMs, un-permuted before the original down.
    if gate is None:
        gate = b.matmul(gate_w, h, "gate_d" + tag, run_if=dense)
    if up is None:
        up = b.matmul(up_w, h, "up_d" + tag, run_if=dense)
        b.gated_mul(gate, up, out=gate, act=act_kind, run_if=dense)
    act_d = gate if in_order else b.scatter_cols(gate, perm_w, "act" + tag, run_if=dense)
    b.matmul(neurons.dense_down(b, il, dense), act_d, "ffn_out" + tag, out=out, run_if=dense)
    neurons.done(b, il)
    return out
