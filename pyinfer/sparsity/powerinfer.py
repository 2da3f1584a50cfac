"""PowerInfer's own model files (ReluLLaMA, ProSparse, Bamboo as PowerInfer's converter writes them).

What the converter (convert-hf-to-powerinfer-gguf.py) writes, and how pyinfer reads it:
  - the magic "PWRI" instead of "GGUF" (same layout after it);
  - per layer a predictor MLP `blk.N.fc1.weight` [rank, d_model] and `blk.N.fc2.weight` [n_ff, rank], no
    biases: neuron j is predicted active when (fc2 relu(fc1 x))[j] >= `powerinfer.sparse_threshold`
    (0 when absent);
  - the FFN down projection stored transposed, `blk.N.ffn_down_t.weight` [n_ff, d_model] (row j = neuron j's
    down column, which is the neuron-major layout pyinfer's sparse path uses); GGUFModelFile presents the
    usual `ffn_down.weight` for the dense path;
  - no activation key: every model PowerInfer converts is ReLU-gated.
The predictors become a SparsityPlan in "relu" mode (no calibration), quantized to Q8_0 like pyinfer's own.
An optional `MODEL.generated.gpuidx` GGUF (PowerInfer's GPU split: `blk.N.gpu_idx`, `blk.N.gpu_bucket`) is
read and reported; placing neurons on a GPU is the CUDA work's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, quants

from ..errors import ModelFormatError
from ..model.config import LlamaConfig
from ..model.arch import open_model
from ..model.gguf_file import GGUFModelFile
from .plan import LayerPlan, Predictor, SparsityPlan

THRESHOLD_KEY = "powerinfer.sparse_threshold"


def has_predictors(gguf: GGUFModelFile) -> bool:
    return "blk.0.fc1.weight" in gguf.tensors and "blk.0.fc2.weight" in gguf.tensors


def _float(gguf: GGUFModelFile, name: str) -> np.ndarray:
    t = gguf.tensor(name)
    return quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name]).reshape(t.rows, t.cols)


def predictor_plan(gguf: GGUFModelFile, cfg: LlamaConfig) -> SparsityPlan:
    """The file's predictors as a plan: original neuron order, no hot prefix, cut = the file's threshold."""
    threshold = float(gguf.get(THRESHOLD_KEY, 0.0))
    layers = []
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        if p + "fc1.weight" not in gguf.tensors or p + "fc2.weight" not in gguf.tensors:
            raise ModelFormatError(f"{gguf.path.name}: PowerInfer predictor of layer {il} (fc1/fc2) is missing")
        w1, w2 = _float(gguf, p + "fc1.weight"), _float(gguf, p + "fc2.weight")  # [rank, d], [n_ff, rank]
        rank = w1.shape[0]
        if w1.shape[1] != cfg.d_model or w2.shape != (cfg.d_ff, rank):
            raise ModelFormatError(f"{gguf.path.name}: predictor of layer {il} has shapes {w1.shape} and "
                                   f"{w2.shape}, expected [rank, {cfg.d_model}] and [{cfg.d_ff}, rank]")
        if rank % 32 or cfg.d_model % 32:
            raise ModelFormatError(f"{gguf.path.name}: predictor rank {rank} and d_model must be multiples of 32")
        # ">= threshold" in PowerInfer; the engine's cut is strict, so it sits one float below.
        cut = np.full(cfg.d_ff, np.nextafter(np.float32(threshold), np.float32(-np.inf)), np.float32)
        pred = Predictor(quants.quantize(np.ascontiguousarray(w1, np.float32), GGMLQuantizationType.Q8_0),
                         np.zeros(rank, np.float32),
                         quants.quantize(np.ascontiguousarray(w2, np.float32), GGMLQuantizationType.Q8_0), cut,
                         {"source": "powerinfer"})
        layers.append(LayerPlan(np.arange(cfg.d_ff, dtype=np.int32), 0.0, 0, pred))
    info = {"calibration": "powerinfer predictors", "sparse_threshold": threshold}
    return SparsityPlan("relu", 0.0, layers, gguf.fingerprint(), info)


def gpu_index(model_path: str | Path, n_layers: int) -> dict | None:
    """PowerInfer's GPU split file next to the model, summarised: per layer, how many neurons it puts on the
    GPU. None when there is none."""
    path = Path(str(model_path) + ".generated.gpuidx")
    if not path.is_file():
        return None
    f = open_model(path)
    per_layer = []
    for il in range(n_layers):
        t = f.tensors.get(f"blk.{il}.gpu_idx")
        if t is None:
            raise ModelFormatError(f"{path.name}: blk.{il}.gpu_idx is missing")
        per_layer.append(int(np.count_nonzero(np.asarray(t.data))))
    return {"file": path.name, "gpu_neurons_per_layer": per_layer}
