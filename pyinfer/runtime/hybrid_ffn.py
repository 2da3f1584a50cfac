"""An FFN layer split between two backends (PowerInfer's hybrid layer): the neurons a GPU placement
(place/gpu_placement.py) gives the device run there, the rest on the CPU, both at the same time, and the two
partial sums meet in one add on the device (where the residual stream lives: runtime/placement.py).

The split is by whole quantization blocks of the original down matrix [d, n_ff]: each side's down is those
blocks of every row and its gate and up the matching rows, byte for byte, so neither side re-quantizes
anything and the sum equals the single-backend FFN up to the order of float additions.

With a sparsity plan the CPU side runs sparse (PowerInfer's split: the GPU computes its hot neurons, the CPU
only the cold ones that fire): its blocks become an FFN of their own (SubFfnModel) and the layer's plan is
restricted to them (restrict_plan: the same hot-first order, hot prefix and predictor rows), so
runtime/sparse_ffn.py builds it unchanged. The device's share of a predictor layer is the same writer on its own
blocks, each token keeping its own list (sparse_ffn's per_token side).

Nothing here restates gate, up, activation and down: each side is one of sparse_ffn.py's two writers on a
sub-model's weights (SubFfnModel.weights) under the side's backend."""
from __future__ import annotations

import dataclasses

import numpy as np

from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile, GGUFTensor
from ..sparsity.plan import LayerPlan, Predictor, SparsityPlan
from .._core import DType
from .graph_builder import INTEGER_DOT_WEIGHTS, GraphBuilder, T
from .sparse_ffn import InRamNeurons, SparseRuns, dense_ffn, raw_rows, sparse_ffn


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
    """The listed blocks' FFN, dense, on `backend`: F32 [T, d_model] (the dense writer, on their rows)."""
    sub = SubFfnModel(gguf, il, blocks, block, cfg.layer_ffn_width(il))
    with b.weights_on(backend):
        return dense_ffn(b, sub.weights(b, "." + tag), h, il, cfg, tag="." + tag)


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

    def weights(self, b: GraphBuilder, tag: str, w=None):
        """The FFN writers' weight getter for this side: the layer's own gate, up and down as weights named with
        `tag` (made under the caller's weights_on), any other name from `w` (the model's)."""
        def get(name: str) -> T:
            if name not in self.own:
                return w(name)
            t = self.own[name]
            return b.weight(name + tag, t.dtype_id, t.cols, t.rows, t.data)
        return get


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


def device_down(gguf: GGUFModelFile, cfg: LlamaConfig, il: int) -> str:
    """The neuron-major down layer il's device side decodes with when it has a predictor (below):
    "q4t" for a Q4_0/Q4_1 down (lossless, 5/8 byte per weight), "q8_0" for other quantized ones, "f32" for
    float ones."""
    down_t = gguf.tensors[f"blk.{il}.ffn_down.weight"]
    if down_t.type_name in ("F32", "F16", "BF16") or cfg.d_model % 32:
        return "f32"
    return "q4t" if down_t.type_name in ("Q4_0", "Q4_1") else "q8_0"


def _gpu_predictor_side(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int],
                        block: int, backend: int, sparsity: SparsityPlan, few_tokens: int) -> T:
    """A predictor layer's device share, F32 [T, d_model]: the sparse writer on the blocks' sub-model, each
    token's own list in runs of up to `few_tokens` tokens (decode, a batch's decode step: PowerInfer's GPU side),
    all of the blocks' neurons in longer runs. One copy of gate and up (hot-first rows) serves both; the down is
    held twice, as the model's blocks (long runs) and neuron-major (few tokens: Q4T for Q4_0/Q4_1 models,
    lossless, else Q8_0; device_down), which the placement charges (gpu_placement.neuron_bytes)."""
    neurons = block_neurons(blocks, block)
    sub, sub_cfg = SubFfnModel(gguf, il, blocks, block, cfg.d_ff), dataclasses.replace(cfg, d_ff=len(neurons))
    sub_plan = restrict_plan(sparsity, il, neurons, cfg.d_ff)
    w_sub = sub.weights(b, ".gpu")
    down = "q4t" if device_down(gguf, cfg, il) == "q4t" else "q8_0"
    with b.weights_on(backend):  # every weight of this share lives on the device
        return sparse_ffn(b, w_sub, sub, h, il, sub_cfg, sub_plan, SparseRuns(max_tokens=few_tokens),
                          neurons=InRamNeurons(sub, sub_cfg, sub_plan, down, w_sub, ".gpu"), tag=".gpu",
                          per_token=True)


def hybrid_ffn(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, gpu_blocks: list[int],
               block: int, device: int, sparsity: SparsityPlan | None = None, runs=None, down_type: str = "auto",
               w=None) -> T:
    """The layer's FFN output, F32 [T, d_model]: blocks `gpu_blocks` on backend `device`, the rest on 0. Under
    `sparsity` the CPU side runs sparse, and the device side too, in runs of up to `runs.max_tokens` tokens,
    where the layer has a predictor."""
    predictor = sparsity is not None and sparsity.layers[il].predictor is not None  # its w1 is Q8_0, any model
    gate_type = DType(gguf.tensor(f"blk.{il}.ffn_gate.weight").dtype_id)
    # One Q8A copy of h per scheme its readers quantize with (the predictor's Q8_0, gate and up's own), made on
    # the device (h is written there) and shared by both sides: the CPU reads a copy of it, 40 bytes per 32
    # values instead of h's 128. (Left to a side, the CPU's guarded copy would serve the device too, which would
    # then wait for the CPU's half.) h lives on the device, so these copies are made there (runtime/placement.py).
    for weight in sorted({gate_type} & INTEGER_DOT_WEIGHTS | ({DType.Q8_0} if predictor else set()), key=int):
        b.quantize(h, weight=weight)
    n_blocks = cfg.layer_ffn_width(il) // block
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
        w_sub = sub.weights(b, ".cpu", w)  # the dense path's down: the CPU blocks of it
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
    return _gpu_predictor_side(b, gguf, h, il, cfg, blocks, block, device, sparsity, few)
