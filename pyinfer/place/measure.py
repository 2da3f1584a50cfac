"""What the GPU placement weighs, measured on this machine: the CPU's decode time per weight byte, a split
layer's synchronization cost on the GPU (when there is one), and neurons' firing frequencies where the
sparsity plan does not carry them."""
from __future__ import annotations

import re

import numpy as np

from .gpu_placement import DEFAULT_SYNC_SECONDS, GpuCosts

_MATMUL_WEIGHT = re.compile(r"^(blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))|output)\.weight$")


def cpu_seconds_per_byte(model, tokens: int = 16) -> float:
    """Seconds the engine's matrix-vector products take per weight byte in a dense greedy decode (decode is
    bound by the bytes it streams, so a neuron costs its bytes at this rate)."""
    ids = model.tokenize("Once upon a time")
    with model._lock:
        logits = model.forward(ids, 0, np.array([len(ids) - 1]))[0]
        model.set_op_timing(False)
        model.set_op_timing(True)
        for i in range(tokens):
            logits = model.forward([int(np.argmax(logits))], len(ids) + i, np.array([0]))[0]
        timing = model.op_timing()
        model.set_op_timing(False)
    names = set(model.gguf.tensors)
    weights = sum(int(t.data.nbytes) for n, t in model.gguf.tensors.items() if _MATMUL_WEIGHT.match(n))
    if "output.weight" not in names:  # a tied head reads token_embd
        weights += int(model.gguf.tensors["token_embd.weight"].data.nbytes)
    if model.config.is_moe:  # a token reads k of each layer's experts
        c = model.config
        weights += sum(int(t.data.nbytes) for n, t in model.gguf.tensors.items() if n.endswith("_exps.weight")) \
            * c.n_expert_used // c.n_expert
    matmul_s = sum(s for op, (s, _) in timing.items() if "mat" in op or "gather" in op or "axpy" in op)
    return matmul_s / tokens / max(weights, 1)


def sync_seconds(device: int = 0, vector_bytes: int = 4096) -> tuple[float, str]:
    """One split layer's synchronization and transfer of the hidden vector (`vector_bytes`, F32 d_model) on
    GPU `device`, or the default."""
    from .. import _core

    devices = _core.cuda_devices() if _core.cuda_built() else []
    if device < len(devices) and hasattr(_core, "cuda_sync_seconds"):
        return float(_core.cuda_sync_seconds(vector_bytes, 200, device)), "measured on " + devices[device]["name"]
    return DEFAULT_SYNC_SECONDS, "default (no GPU to measure: an event wait and two small PCIe copies)"


def measure_costs(model, tokens: int = 16, sync: float | None = None) -> GpuCosts:
    per_byte = cpu_seconds_per_byte(model, tokens)
    if sync is None:
        sync, how = sync_seconds(0, 4 * model.config.d_model)
    else:
        how = "given"
    return GpuCosts(per_byte, sync, {"cpu_seconds_per_byte": f"measured: dense decode of {tokens} tokens, "
                                     f"{model.n_threads} threads", "sync_seconds": how})


def firing_frequencies(model, text: str, tokens: int = 128) -> list[np.ndarray]:
    """Per layer: how often each hot-first neuron was in the active union over a one-token-at-a-time pass of
    `text` (layers that ran dense count every neuron)."""
    from ..runtime.running import last_unions

    ids = model.tokenize(text)[:tokens]
    counts = [np.zeros(model.config.d_ff) for _ in model.layer_unions()]
    with model._lock:
        for pos, tok in enumerate(ids):
            model.forward([tok], pos, np.array([0]))
            for il, active in enumerate(last_unions(model)):
                counts[il][active] += 1
    return [c / max(len(ids), 1) for c in counts]
