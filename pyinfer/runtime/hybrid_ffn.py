"""An FFN layer split between two backends (PowerInfer's hybrid layer): the neurons a GPU placement
(place/gpu_placement.py) gives the device run there, the rest on the CPU, both at the same time, and the two
partial sums meet in one add on the device (where the residual stream lives: runtime/placement.py).

The split is by whole quantization blocks of the original down matrix [d, n_ff]: each side's down is those
blocks of every row and its gate and up the matching rows, byte for byte, so neither side re-quantizes
anything and the sum equals the single-backend FFN up to the order of float additions.

With a sparsity plan the CPU side runs sparse (PowerInfer's split: the GPU computes its hot neurons, the CPU
only the cold ones that fire): its blocks become an FFN of their own (SubFfnModel) and the layer's plan is
restricted to them (restrict_plan: the same hot-first order, hot prefix and predictor rows), so
runtime/sparse_ffn.py builds it unchanged."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile, GGUFTensor
from ..sparsity.plan import LayerPlan, Predictor, SparsityPlan
from .._core import DType
from .graph_builder import INTEGER_DOT_WEIGHTS, GraphBuilder, Guard, T
from .sparse_ffn import neuron_major_down, permuted_rows, predicted_lists, q4t_down, raw_rows, sparse_ffn


def block_neurons(blocks: list[int], block: int) -> np.ndarray:
    """I64: the neurons (original ids, ascending) of the listed down blocks."""
    return (np.asarray(blocks, np.int64)[:, None] * block + np.arange(block)).ravel()


def side_weights(gguf: GGUFModelFile, il: int, blocks: list[int], block: int, n_ff: int):
    """(gate rows, up rows, down blocks) of the listed down blocks, as U8 arrays in the stored types."""
    p = f"blk.{il}."
    neurons = block_neurons(blocks, block)
    gate, up = raw_rows(gguf, p + "ffn_gate.weight")[neurons], raw_rows(gguf, p + "ffn_up.weight")[neurons]
    down = raw_rows(gguf, p + "ffn_down.weight")                      # U8 [d, n_ff / block * block_bytes]
    per = down.shape[1] // (n_ff // block)
    down = down.reshape(down.shape[0], n_ff // block, per)[:, blocks, :].reshape(down.shape[0], -1)
    return np.ascontiguousarray(gate), np.ascontiguousarray(up), np.ascontiguousarray(down)


def _side(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int], block: int,
          tag: str, backend: int) -> T:
    """The listed blocks' FFN, dense, on `backend`: F32 [T, d_model]."""
    p = f"blk.{il}."
    gate, up, down = side_weights(gguf, il, blocks, block, cfg.d_ff)
    n = len(blocks) * block
    types = [gguf.tensor(p + f"ffn_{k}.weight").dtype_id for k in ("gate", "up", "down")]
    with b.weights_on(backend):
        gate_w = b.weight(p + f"ffn_gate.{tag}", types[0], cfg.d_model, n, gate)
        up_w = b.weight(p + f"ffn_up.{tag}", types[1], cfg.d_model, n, up)
        down_w = b.weight(p + f"ffn_down.{tag}", types[2], n, cfg.d_model, down)
    g = b.matmul(gate_w, h, f"gate.{tag}")                              # F32 [T, n]
    u = b.matmul(up_w, h, f"up.{tag}")
    b.gated_mul(g, u, out=g, act=cfg.activation)
    return b.matmul(down_w, g, f"ffn_out.{tag}")                        # F32 [T, d_model]


class SubFfnModel:
    """A model file whose layer `il` FFN is only the listed down blocks' neurons (in their original order):
    tensor() gives the gathered gate and up rows and down blocks for that layer, the model's own otherwise."""

    def __init__(self, gguf: GGUFModelFile, il: int, blocks: list[int], block: int, n_ff: int):
        self._gguf = gguf
        gate, up, down = side_weights(gguf, il, blocks, block, n_ff)
        n = len(blocks) * block
        self.own = {}
        for part, data, rows, cols in (("gate", gate, n, None), ("up", up, n, None), ("down", down, None, n)):
            name = f"blk.{il}.ffn_{part}.weight"
            t = gguf.tensor(name)
            if t.type_name in ("F32", "F16"):  # typed elements, as the reader gives float tensors
                data = data.view(np.float32 if t.type_name == "F32" else np.float16)
            self.own[name] = GGUFTensor(name, t.type_name, cols or t.cols, rows or t.rows,
                                         data.reshape(rows or t.rows, -1))

    def tensor(self, name: str):
        """What the sparse FFN and the device side read of a model file (no other attribute stands in)."""
        return self.own.get(name) or self._gguf.tensor(name)


def restrict_plan(plan: SparsityPlan, il: int, neurons: np.ndarray, n_ff: int) -> SparsityPlan:
    """The plan with layer `il` cut to `neurons` (original ids, ascending), renumbered 0..len-1 in that order:
    the same hot-first order among them, hot prefix and predictor rows (quantized rows slice exactly)."""
    lp = plan.layers[il]
    compact = np.full(n_ff, -1, np.int64)
    compact[neurons] = np.arange(len(neurons))
    keep = np.flatnonzero(compact[lp.perm] >= 0)              # hot-first positions of the kept neurons
    pred = None
    if lp.predictor is not None:
        rows = keep[keep >= lp.hot] - lp.hot
        p = lp.predictor
        pred = Predictor(p.w1_q8, p.b1, np.ascontiguousarray(p.w2_q8[rows]), np.ascontiguousarray(p.cut[rows]),
                         dict(p.stats))
    sub = LayerPlan(compact[lp.perm[keep]].astype(np.int32), lp.threshold, int(np.count_nonzero(keep < lp.hot)),
                    pred, lp.gate_threshold, None if lp.freq is None else np.asarray(lp.freq)[keep])
    layers = list(plan.layers)
    layers[il] = sub
    return dataclasses.replace(plan, layers=layers)


def _gpu_predictor_side(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int],
                        block: int, backend: int, sparsity: SparsityPlan, lp: LayerPlan, few_tokens: int) -> T:
    """A predictor layer's device share, F32 [T, d_model]: in runs of up to `few_tokens` tokens (decode, a
    batch's decode step), only the neurons of its blocks that the predictor picks, each token's own list
    (PowerInfer's GPU side; no batch union, whose dense/sparse choice would be read on the host: a GPU reads
    a row again per token from its cache instead); in longer runs, all of them. One copy of gate and up
    (hot-first rows) serves both; the down is held twice, as the model's blocks (long runs) and neuron-major
    (few tokens: Q4T for Q4_0/Q4_1 models, lossless, else Q8_0; device_down), which the placement
    charges (gpu_placement.neuron_bytes)."""
    with b.weights_on(backend):  # every weight of this share lives on the device
        return _gpu_predictor_nodes(b, gguf, h, il, cfg, blocks, block, sparsity, lp, few_tokens)


def device_down(gguf: GGUFModelFile, cfg: LlamaConfig, il: int) -> str:
    """The neuron-major down layer il's device side decodes with when it has a predictor (below):
    "q4t" for a Q4_0/Q4_1 down (lossless, 5/8 byte per weight), "q8_0" for other quantized ones, "f32" for
    float ones."""
    down_t = gguf.tensors[f"blk.{il}.ffn_down.weight"]
    if down_t.type_name in ("F32", "F16", "BF16") or cfg.d_model % 32:
        return "f32"
    return "q4t" if down_t.type_name in ("Q4_0", "Q4_1") else "q8_0"


def _gpu_predictor_nodes(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int],
                         block: int, sparsity: SparsityPlan, lp: LayerPlan, few_tokens: int) -> T:
    sub, n, p = SubFfnModel(gguf, il, blocks, block, cfg.d_ff), len(blocks) * block, f"blk.{il}."
    one, many = Guard(max_tokens=few_tokens), Guard(min_tokens=few_tokens + 1)
    perm, pred = lp.perm.astype(np.int32), lp.predictor
    gate_t, up_t, down_t = (sub.tensor(p + f"ffn_{k}.weight") for k in ("gate", "up", "down"))
    gate_w = b.weight(p + "ffn_gate.gpu", gate_t.dtype_id, cfg.d_model, n, permuted_rows(sub, gate_t.name, perm))
    up_w = b.weight(p + "ffn_up.gpu", up_t.dtype_id, cfg.d_model, n, permuted_rows(sub, up_t.name, perm))
    perm_w = b.weight(p + "ffn.perm.gpu", int(DType.I32), n, 1, perm)

    # Longer runs: the dense FFN in hot-first order, scattered back to the blocks' order for their down.
    g = b.matmul(gate_w, h, "gate.gpu", run_if=many)                   # F32 [T, n], hot-first
    b.gated_mul(g, b.matmul(up_w, h, "up.gpu", run_if=many), out=g, act=cfg.activation, run_if=many)
    down_blocks = b.weight(p + "ffn_down.gpu", down_t.dtype_id, n, cfg.d_model, down_t.data)
    out = b.matmul(down_blocks, b.scatter_cols(g, perm_w, "act.gpu", run_if=many), "ffn_out.gpu", run_if=many)

    # Few tokens: predictor, each token's list, gathered gate and up, its down rows.
    scales = row_map = None
    q4t = q4t_down(sub, p + "ffn_down.weight") if device_down(gguf, cfg, il) == "q4t" else None
    if q4t is not None:  # lossless; rows stay in the blocks' order, so list ids go through perm
        down_w = b.weight(p + "ffn_down.gpu_q4t", int(DType.Q4T), cfg.d_model, n, q4t[0])
        scales = b.weight(p + "ffn_down.gpu_q4t_scales", int(DType.F16), 2 * cfg.d_model, n // 32, q4t[1])
        row_map = perm_w
    else:
        down_type, down = neuron_major_down(sub, p + "ffn_down.weight", perm, "q8_0")  # [n, d], hot-first rows
        down_w = b.weight(p + "ffn_down.gpu_neurons", int(down_type), cfg.d_model, n, down.reshape(n, -1))
    lists = predicted_lists(b, h, pred, lp.hot, n, p, ".gpu", one)    # I32 [T, n + 1]
    act = b.matmul(gate_w, h, "gate_s.gpu", active=lists, run_if=one)  # F32 [T, n], listed entries only
    up_s = b.matmul(up_w, h, "up_s.gpu", active=lists, run_if=one)
    b.gated_act(act, up_s, lists, 0.0 if sparsity.mode == "gate" else lp.threshold, act=cfg.activation, run_if=one)
    b.down_axpy(down_w, act, lists, out=out, scales=scales, row_map=row_map, run_if=one)
    return out


def hybrid_ffn(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, gpu_blocks: list[int],
               block: int, device: int, sparsity: SparsityPlan | None = None, runs=None, down_type: str = "auto",
               w=None) -> T:
    """The layer's FFN output, F32 [T, d_model]: blocks `gpu_blocks` on backend `device`, the rest on 0. Under
    `sparsity` the CPU side runs sparse, and the device side too, in runs of up to `runs.max_tokens` tokens,
    where the layer has a predictor."""
    predictor = sparsity is not None and sparsity.layers[il].predictor is not None  # its w1 is Q8_0, any model
    if predictor or DType(gguf.tensor(f"blk.{il}.ffn_gate.weight").dtype_id) in INTEGER_DOT_WEIGHTS:
        # One Q8A copy of h, made on the device (h is written there) and shared by both sides: the CPU reads
        # a copy of it, 40 bytes per 32 values instead of h's 128. (Left to a side, the CPU's guarded copy
        # would serve the device too, which would then wait for the CPU's half.)
        b.quantize(h)  # h lives on the device, so this copy is made there (runtime/placement.py)
    n_blocks = cfg.d_ff // block
    gpu = sorted(set(int(k) for k in gpu_blocks))
    cpu = [k for k in range(n_blocks) if k not in set(gpu)]
    if not cpu:
        return _gpu_side(b, gguf, h, il, cfg, gpu, block, device, sparsity, runs)
    # The CPU's nodes first: the copy of the shared input they read closes the device's segment right after
    # that input, so the device's half is a segment of its own, after the CPU's in node order, that waits only
    # for the input; the two halves run at the same time and only the merge waits for both.
    if sparsity is None:
        out = _side(b, gguf, h, il, cfg, cpu, block, "cpu", 0)
    elif not gpu:
        with b.weights_on(0):  # the CPU's neurons live in host memory
            out = sparse_ffn(b, w, gguf, h, il, cfg, sparsity, runs, down_type)
    else:
        neurons = block_neurons(cpu, block)
        sub = SubFfnModel(gguf, il, cpu, block, cfg.d_ff)

        def w_sub(name: str) -> T:  # the dense path's down: the CPU blocks of it
            if name not in sub.own:
                return w(name)
            t = sub.tensor(name)
            return b.weight(name + ".cpu", t.dtype_id, t.cols, t.rows, t.data)
        with b.weights_on(0):
            out = sparse_ffn(b, w_sub, sub, h, il, dataclasses.replace(cfg, d_ff=len(neurons)),
                             restrict_plan(sparsity, il, neurons, cfg.d_ff), runs, down_type)
    if not gpu:
        return out  # F32 [T, d_model] in host memory
    dev_out = _gpu_side(b, gguf, h, il, cfg, gpu, block, device, sparsity, runs)
    b.add(dev_out, out, out=dev_out)  # the merge, in place on the device's sum: the CPU's comes up
    return dev_out


def _gpu_side(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int], block: int,
              device: int, sparsity: SparsityPlan | None, runs=None) -> T:
    """The device's share: dense, or with a predictor layer sparse in runs of up to `runs.max_tokens` tokens
    (one without `runs`) and dense in longer ones."""
    n = len(blocks) * block
    lp = sparsity.layers[il] if sparsity is not None else None
    if lp is None or lp.predictor is None:
        return _side(b, gguf, h, il, cfg, blocks, block, "gpu", device)
    sub_plan = restrict_plan(sparsity, il, block_neurons(blocks, block), cfg.d_ff).layers[il]
    if sub_plan.hot >= n:  # all hot: nothing to predict
        return _side(b, gguf, h, il, cfg, blocks, block, "gpu", device)
    few = runs.max_tokens if runs is not None else 1
    if few < 1 or (runs is not None and runs.single < 0):  # SparseRuns.never(): dense on the device too
        return _side(b, gguf, h, il, cfg, blocks, block, "gpu", device)
    return _gpu_predictor_side(b, gguf, h, il, cfg, blocks, block, device, sparsity, sub_plan, few)
