"""GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (`glm4moe`): q/k/v biases, optional per-head QK-norm, partial NEOX RoPE
(rope.dimension_count of each head), the FFN normed by `post_attention_norm`; the first `leading_dense_block_count`
layers run a dense FFN, the rest a Mixture of Experts routed by sigmoid with a selection bias (exp_probs_b: chosen by
probability plus bias, weighted by the probability), renormalized and scaled as the file says, plus ungated shared
experts. The file's multi-token-prediction layers (nextn_predict_layers, after the trunk) are not run, as llama.cpp
runs them only for speculative decoding (llama.cpp's glm4-moe graph)."""
from __future__ import annotations

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import LlamaConfig
from .base import MOE_TENSORS, QK_NORMS, SHARED_EXPERT_TENSORS, Architecture


class Glm4Moe(Architecture):
    name = "glm4moe"
    rope_neox = True
    tensor_patterns = QK_NORMS + MOE_TENSORS + SHARED_EXPERT_TENSORS + (
        r"blk\.N\.post_attention_norm\.weight", r"blk\.N\.exp_probs_b\.bias")

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)  # n_layers: the trunk, without the multi-token-prediction layers
        if any(int(v) for v in (f.get(p + "rope.dimension_sections", []) or [])):
            raise UnsupportedModelError(f"{p}rope.dimension_sections (multimodal M-RoPE) is not supported")
        lead = int(f.get(p + "leading_dense_block_count", 0) or 0)
        if not 0 <= lead < hp["n_layers"]:
            raise ModelFormatError(f"{f.path.name}: {p}leading_dense_block_count {lead} must be below the layer count")
        gating = self.expert_gating(f, unset=2)  # llama.cpp: none means sigmoid here
        moe = self.moe_hparams(f, norm=bool(f.get(p + "expert_weights_norm", False)), shared=True,
                               shared_gated=False, layers=range(lead, hp["n_layers"]))
        if not moe:
            raise ModelFormatError(f"{f.path.name}: glm4moe needs glm4moe.expert_count and its expert tensors")
        for il in range(hp["n_layers"]):
            need = ["post_attention_norm.weight"] + (["exp_probs_b.bias"] if il >= lead else ["ffn_gate.weight"])
            for part in need:
                if f"blk.{il}.{part}" not in f.tensors:
                    raise ModelFormatError(f"{f.path.name}: blk.{il}.{part} is missing")
        return LlamaConfig(**hp, **moe, expert_gating=gating, expert_bias=True, dense_lead=lead,
                           expert_scale=float(f.get(p + "expert_weights_scale", 0.0) or 0.0),
                           qk_norm="blk.0.attn_q_norm.weight" in f.tensors, ffn_norm="post_attention_norm")

    def build_layer(self, m, il: int, x):
        p = f"blk.{il}."
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        x = m.residual(x, m.attention(h, il, qk_norm=m.cfg.qk_norm))
        h = m.norm(x, p + "post_attention_norm.weight", "ffn_in")   # GLM's FFN norm
        return m.residual(x, m.ffn(h, il))


ARCH = Glm4Moe()
