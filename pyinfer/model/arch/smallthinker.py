"""SmallThinker (SmallThinker-4B-A0.6B, 21B-A3B: PowerInfer's MoE made to run from storage): every layer a Mixture of
Experts with ReGLU experts (relu(gate) * up), routed by softmax or sigmoid, renormalized, whose router reads the
layer's input *before* attention: a streamed layer's experts are read while its attention runs (runtime/moe_ffn.py
early_route). With a sliding window in the file, three of every four layers slide over 4096 positions (llama.cpp sets
that size whatever the file says) and the fourth, global, rotates no position (NoPE); NEOX RoPE elsewhere
(llama.cpp's smallthinker graph)."""
from __future__ import annotations

from ...errors import ModelFormatError
from ..config import Activation, LlamaConfig
from .base import MOE_TENSORS, Architecture

WINDOW = 4096          # llama.cpp's n_swa for SmallThinker, whatever attention.sliding_window holds
PATTERN = 4            # every 4th layer (the first of each 4) global and NoPE, the others sliding


class SmallThinker(Architecture):
    name = "smallthinker"
    rope_neox = True
    activation = Activation.RELU
    tensor_patterns = MOE_TENSORS

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)
        n_layers = hp["n_layers"]
        gating = self.expert_gating(f, unset=0)  # the converter always writes it
        moe = self.moe_hparams(f, norm=True)
        if not moe:
            raise ModelFormatError(f"{f.path.name}: smallthinker needs {p}expert_count and its expert tensors")
        local, nope = (), ()
        if int(f.get(p + "attention.sliding_window", 0) or 0) > 0:
            pattern = f.get(p + "attention.sliding_window_pattern", PATTERN)
            if isinstance(pattern, list):  # one flag per layer
                if len(pattern) < n_layers:
                    raise ModelFormatError(f"{f.path.name}: {p}attention.sliding_window_pattern lists {len(pattern)} "
                                           f"layers of {n_layers}")
                local = tuple(bool(v) for v in pattern[:n_layers])
            else:
                n = int(pattern)
                local = tuple(n == 0 or il % n != 0 for il in range(n_layers))
            # llama.cpp's n_no_rope_layer_step (4): a layer rotates unless il % 4 == 0, and every layer rotates in a
            # model of exactly 4 layers (its test reads the step equal to the layer count as "none")
            nope = tuple(n_layers != PATTERN and il % PATTERN == 0 for il in range(n_layers))
            hp.update(sliding_window=WINDOW, local_layers=local, nope_layers=nope,
                      rope_base_local=float(f.get(p + "rope.freq_base_swa", hp["rope_base"])))
        return LlamaConfig(**hp, **moe, expert_gating=gating, router_before_attention=True)

    def build_layer(self, m, il: int, x):
        p, c = f"blk.{il}.", m.cfg
        route = m.route(x, il)  # the layer's input routes its experts, before attention: their reads start now
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        x = m.residual(x, m.attention(h, il, window=c.window(il), rope_base=c.layer_rope_base(il), rope=c.rotates(il)))
        h = m.norm(x, p + "ffn_norm.weight", "ffn_in")
        return m.residual(x, m.ffn(h, il, route=route))


ARCH = SmallThinker()
