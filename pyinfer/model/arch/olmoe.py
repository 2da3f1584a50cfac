"""OLMoE (OLMoE-1B-7B): the llama layer with q and k each RMS-normalised as whole rows (not per head) before NEOX
RoPE, and in every layer a Mixture of Experts: softmax top `expert_used_count`, the chosen probabilities used as
they are (not renormalized), no shared expert (llama.cpp's olmoe graph)."""
from __future__ import annotations

from ...errors import ModelFormatError
from ..config import LlamaConfig
from .base import MOE_TENSORS, QK_NORMS, Architecture


class Olmoe(Architecture):
    name = "olmoe"
    rope_neox = True
    tensor_patterns = QK_NORMS + MOE_TENSORS

    def config(self, f) -> LlamaConfig:
        hp = self.common_hparams(f)
        moe = self.moe_hparams(f, norm=False, width_key="feed_forward_length")  # llama.cpp's n_ff, as Mixtral's
        if not moe:
            raise ModelFormatError(f"{f.path.name}: olmoe needs olmoe.expert_count and its expert tensors")
        q, kv = hp["n_heads"] * hp["head_dim"], hp["n_kv_heads"] * hp["head_dim"]
        for il in range(hp["n_layers"]):
            for part, width in (("q", q), ("k", kv)):
                t = f.tensors.get(f"blk.{il}.attn_{part}_norm.weight")
                if t is None or t.cols * t.rows != width:
                    raise ModelFormatError(f"{f.path.name}: blk.{il}.attn_{part}_norm.weight must hold {width} values "
                                           "(OLMoE normalises whole q and k rows)")
        return LlamaConfig(**hp, **moe)

    def attention_options(self, m, il: int) -> dict:
        return {"qk_norm_rows": True}


ARCH = Olmoe()
