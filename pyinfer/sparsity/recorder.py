"""Runs a model over calibration text and hands each layer's FFN input, gate and up to a callback.

It uses the C++ engine with a recording graph (the same kernels as inference), evaluating the
text as independent windows, so calibration over tens of thousands of tokens takes a minute or two.
"""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from .. import _core
from ..errors import PyinferError
from ..model.config import GATE_FIRST, Activation, LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..runtime.model_graph import build_model_graph

# callback(layer, h F32 [T, d_model], gate F32 [T, d_ff] pre-activation, up F32 [T, d_ff]); views valid
# until the next window
LayerCallback = Callable[[int, np.ndarray, np.ndarray, np.ndarray], None]
# Input sites: callback(layer, {site: F32 [T, width]}) for attn_in, attn_out, ffn_in and ffn_mid (act(gate) * up)
SitesCallback = Callable[[int, dict], None]
# A Mixture of Experts: callback(layer, route F32 [T, 2k] (weights, then ids), gate F32 [T, k * d_ff_expert]
# of the chosen experts, pre-activation)
ExpertCallback = Callable[[int, np.ndarray, np.ndarray], None]


class Recorder:
    def __init__(self, gguf: GGUFModelFile, cfg: LlamaConfig, n_threads: int, window: int = 256):
        self.cfg, self.window = cfg, window
        b = build_model_graph(gguf, cfg, window, record=True)
        self._records, self._expert_gates, self._inputs = b.records, b.expert_gates, b.input_records
        self._engine = _core.Engine(b.graph, max_tokens=window, max_outputs=1, n_threads=n_threads)

    def run(self, ids: list[int], max_tokens: int, on_layer: LayerCallback, desc: str = "calibrating",
            progress: bool = True) -> int:
        """Feeds up to max_tokens of `ids` in windows; returns the number of tokens used."""
        n_win = min(len(ids), max_tokens) // self.window
        if n_win < 1:
            raise PyinferError(f"calibration text is too short: {len(ids)} tokens, need at least {self.window}")
        tensor = self._engine.tensor
        for n in self._windows(ids, n_win * self.window, desc, progress):
            for il, (h_id, g_id, u_id) in enumerate(self._records):
                on_layer(il, tensor(h_id, n), tensor(g_id, n), tensor(u_id, n))
        return n_win * self.window

    def run_sites(self, ids: list[int], max_tokens: int, on_layer: SitesCallback, desc: str = "calibrating inputs",
                  progress: bool = True) -> int:
        """Like run(), handing each layer's four projection inputs and |act(gate)| (zeros where the activation
        has no gate-first cut) to `on_layer`; returns the tokens used."""
        if len(self._inputs) != len(self._records) or any(i is None for r in self._inputs for i in r):
            raise PyinferError("this architecture's attention does not go through the shared projections")
        n_win = min(len(ids), max_tokens) // self.window
        if n_win < 1:
            raise PyinferError(f"calibration text is too short: {len(ids)} tokens, need at least {self.window}")
        tensor, act = self._engine.tensor, self.cfg.activation
        for n in self._windows(ids, n_win * self.window, desc, progress):
            for il, ((h_id, g_id, u_id), (a_id, o_id)) in enumerate(zip(self._records, self._inputs)):
                on_layer(il, {"attn_in": tensor(a_id, n), "attn_out": tensor(o_id, n), "ffn_in": tensor(h_id, n),
                              "ffn_mid": gated(act, tensor(g_id, n), tensor(u_id, n)),
                              "gate": gate_criterion(act, tensor(g_id, n)) if act in GATE_FIRST else
                              np.zeros_like(tensor(g_id, n))})
        return n_win * self.window

    def run_experts(self, ids: list[int], max_tokens: int, on_layer: ExpertCallback, desc: str = "routing profile",
                    progress: bool = True) -> int:
        """A Mixture of Experts: feeds up to max_tokens of `ids` (a shorter text is one short window); returns the
        number of tokens used."""
        tensor, seen = self._engine.tensor, 0
        for n in self._windows(ids, max(min(len(ids), max_tokens), 1), desc, progress):
            for i, (r_id, g_id) in enumerate(zip(self._records, self._expert_gates)):  # (MoE layers only)
                on_layer(self.cfg.dense_lead + i, tensor(r_id, n), tensor(g_id, n))
            seen += n
        return seen

    def _windows(self, ids: list[int], total: int, desc: str, progress: bool):
        """Runs the first `total` tokens of `ids` window by window; yields each window's token count."""
        from tqdm import tqdm

        positions = np.arange(self.window, dtype=np.int32)
        with tqdm(total=total, desc=desc, unit="tok", disable=not progress, file=sys.stderr) as bar:
            for w0 in range(0, total, self.window):
                chunk = np.asarray(ids[w0:min(w0 + self.window, total)], dtype=np.int32)
                if len(chunk) == 0:
                    break
                self._engine.run(len(chunk), chunk, positions[:len(chunk)], np.zeros(0, np.int32))
                yield len(chunk)
                bar.update(len(chunk))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with the sigmoid as a tanh: no overflow warning where |x| is large (random weights)."""
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def gate_criterion(act: Activation, gate: np.ndarray) -> np.ndarray:
    """|act(gate)|: what a gate-first (CATS) active set cuts on, for the activations in GATE_FIRST (and ReLU, the cut
    inside ReGLU experts)."""
    if act == Activation.RELU:
        return np.maximum(gate, 0.0)
    return np.abs(silu(gate) if act == Activation.SILU else gelu_tanh(gate))


def gated(act: Activation, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """act(gate) * up, as the engine's gated_mul computes it (GELU there goes through an fp16 table)."""
    if act == Activation.SILU:
        return silu(gate) * up
    if act == Activation.GELU_TANH:
        return gelu_tanh(gate) * up
    if act == Activation.RELU:
        return np.maximum(gate, 0.0) * up
    if act == Activation.RELU2:
        return np.maximum(gate, 0.0) ** 2 * up
    return np.maximum(gate, 0.0) * np.maximum(up, 0.0)  # dReLU


def criterion(mode: str, gate: np.ndarray, up: np.ndarray, act: Activation = Activation.SILU) -> np.ndarray:
    """The per-neuron activation criterion (bigger = more active). F32 [T, d_ff]. contrib: |act(gate) * up|
    for any gated FFN (SwiGLU, GeGLU); gate: |act(gate)| (CATS, SwiGLU and GeGLU); relu: ReLU models."""
    if mode == "contrib":
        return np.abs(gated(act, gate, up))
    if mode == "gate":
        if act not in GATE_FIRST:
            raise PyinferError(f"the 'gate' criterion (CATS) is defined for SiLU and GELU models; this one uses "
                               f"{act.name} (use contrib)")
        return gate_criterion(act, gate)
    if mode == "relu":
        return np.maximum(gate, 0.0) * np.abs(up)
    raise PyinferError(f"unknown sparsity mode {mode!r}")
