"""An FFN layer split between two backends (PowerInfer's hybrid layer): the neurons a GPU placement
(place/gpu_placement.py) gives the device run there, the rest on the CPU, both at the same time, and the two
partial sums meet in one add on the CPU.

The split is by whole quantization blocks of the original down matrix [d, n_ff]: each side's down is those
blocks of every row and its gate and up the matching rows, byte for byte, so neither side re-quantizes
anything and the sum equals the single-backend FFN up to the order of float additions."""
from __future__ import annotations

import numpy as np

from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from .graph_builder import INTEGER_DOT_WEIGHTS, GraphBuilder, T


def raw_rows(gguf: GGUFModelFile, name: str) -> np.ndarray:
    """The tensor's bytes as U8 [rows, row_bytes] (a view of the mapped file)."""
    t = gguf.tensor(name)
    return np.asarray(t.data).view(np.uint8).reshape(t.rows, -1)


def side_weights(gguf: GGUFModelFile, il: int, blocks: list[int], block: int, n_ff: int):
    """(gate rows, up rows, down blocks) of the listed down blocks, as U8 arrays in the stored types."""
    p = f"blk.{il}."
    neurons = (np.asarray(blocks, np.int64)[:, None] * block + np.arange(block)).ravel()
    gate, up = raw_rows(gguf, p + "ffn_gate.weight")[neurons], raw_rows(gguf, p + "ffn_up.weight")[neurons]
    down = raw_rows(gguf, p + "ffn_down.weight")                      # U8 [d, n_ff / block * block_bytes]
    per = down.shape[1] // (n_ff // block)
    down = down.reshape(down.shape[0], n_ff // block, per)[:, blocks, :].reshape(down.shape[0], -1)
    return np.ascontiguousarray(gate), np.ascontiguousarray(up), np.ascontiguousarray(down)


def _side(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, blocks: list[int], block: int,
          tag: str, backend: int) -> T:
    p = f"blk.{il}."
    gate, up, down = side_weights(gguf, il, blocks, block, cfg.d_ff)
    n = len(blocks) * block
    types = [gguf.tensor(p + f"ffn_{k}.weight").dtype_id for k in ("gate", "up", "down")]
    first = len(b.placement)
    gate_w = b.weight(p + f"ffn_gate.{tag}", types[0], cfg.d_model, n, gate)
    up_w = b.weight(p + f"ffn_up.{tag}", types[1], cfg.d_model, n, up)
    down_w = b.weight(p + f"ffn_down.{tag}", types[2], n, cfg.d_model, down)
    g = b.matmul(gate_w, h, f"gate.{tag}")                              # F32 [T, n]
    u = b.matmul(up_w, h, f"up.{tag}")
    b.gated_mul(g, u, out=g, act=cfg.activation)
    out = b.matmul(down_w, g, f"ffn_out.{tag}")                         # F32 [T, d_model]
    for node in range(first, len(b.placement)):
        b.place(node, backend)
    return out


def hybrid_ffn(b: GraphBuilder, gguf: GGUFModelFile, h: T, il: int, cfg: LlamaConfig, gpu_blocks: list[int],
               block: int, device: int) -> T:
    """The layer's FFN output, F32 [T, d_model]: blocks `gpu_blocks` on backend `device`, the rest on 0."""
    if gguf.tensor(f"blk.{il}.ffn_gate.weight").dtype_id in INTEGER_DOT_WEIGHTS:
        b.quantize(h)  # one Q8A copy of h on the CPU, shared by both sides (the device reads a copy of it)
    n_blocks = cfg.d_ff // block
    gpu = sorted(set(int(k) for k in gpu_blocks))
    cpu = [k for k in range(n_blocks) if k not in set(gpu)]
    if not cpu:
        return _side(b, gguf, h, il, cfg, gpu, block, "gpu", device)
    out = _side(b, gguf, h, il, cfg, cpu, block, "cpu", 0)
    if gpu:
        b.add(out, _side(b, gguf, h, il, cfg, gpu, block, "gpu", device), out=out)
    return out
