"""Phi-3 and Phi-4 (mini): the llama layer with a fused QKV (attn_qkv), a fused gate-up (ffn_up holds the gate's
rows, then the up's), NEOX RoPE, and for the 128k models LongRoPE: per-pair frequency factors, `short` up to
the original context and `long` beyond it, with cos and sin times rope.scaling.attn_factor.

Like llama.cpp, the sliding window that some Phi-3 files declare is not applied (llama.cpp turned it off
for Phi: its converters do not write the pattern)."""
from __future__ import annotations

from ...errors import ModelFormatError
from ..config import LlamaConfig
from .base import Architecture, row_slice, split_fused_qkv


class Phi3(Architecture):
    name = "phi3"
    rope_neox = True
    tensor_patterns = (r"rope_factors_(long|short)\.weight",)

    def present(self, f) -> None:
        split_fused_qkv(f, self)
        n_ff = int(f.require(self.name + ".feed_forward_length"))
        for name in [n for n in f.tensors if n.endswith(".ffn_up.weight")]:
            gate = name.replace(".ffn_up.", ".ffn_gate.")
            if gate in f.tensors:
                continue
            t = f.tensors[name]
            if t.rows != 2 * n_ff:
                raise ModelFormatError(f"{f.path.name}: {name} has {t.rows} rows; a fused gate-up has {2 * n_ff}")
            f.tensors[gate] = row_slice(t, gate, 0, n_ff)
            f.tensors[name] = row_slice(t, name, n_ff, n_ff)

    def config(self, f) -> LlamaConfig:
        hp = self.common_hparams(f)
        orig = int(f.get(self.name + ".rope.scaling.original_context_length", hp["train_ctx"]))
        return LlamaConfig(**hp, rope_orig_ctx=orig)

    def attention_options(self, m, il: int) -> dict:
        # Long factors when one sequence may run past the original context (llama.cpp: n_ctx_seq).
        kind = "long" if m.seq_ctx > m.cfg.rope_orig_ctx else "short"
        return {"factors": m.optional(f"rope_factors_{kind}.weight")}  # None: a 4k model, plain RoPE


ARCH = Phi3()
