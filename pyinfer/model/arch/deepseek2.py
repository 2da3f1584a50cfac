"""DeepSeek-V2 / V2-Lite, and the files converted as `deepseek2` (GLM-4.7-Flash, Kimi/Moonlight class): multi-head
latent attention (runtime/blocks.py latent_attention: one cached latent row per token, absorbed per-head projections
attn_k_b / attn_v_b), q directly (V2-Lite) or through a low-rank q_a / q_b with its norm, RoPE on each head's last
rope.dimension_count values (adjacent pairs), YaRN with DeepSeek's magnitude folded into the attention scale; the
first leading_dense_block_count layers dense, the rest a Mixture of Experts (softmax or sigmoid, an optional
selection bias, optional expert groups, renormalized and scaled as the file says) plus ungated shared experts
(llama.cpp's deepseek2 graph). Files of the older conversion with one attn_kv_b are refused: convert them again."""
from __future__ import annotations

import math

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import LlamaConfig
from .base import MOE_TENSORS, SHARED_EXPERT_TENSORS, Architecture


class Deepseek2(Architecture):
    name = "deepseek2"
    latent_attention = True
    tensor_patterns = MOE_TENSORS + SHARED_EXPERT_TENSORS + (
        r"blk\.N\.attn_q_a\.weight", r"blk\.N\.attn_q_a_norm\.weight", r"blk\.N\.attn_q_b\.weight",
        r"blk\.N\.attn_kv_a_mqa\.weight", r"blk\.N\.attn_kv_a_norm\.weight", r"blk\.N\.attn_(k|v)_b\.weight",
        r"blk\.N\.exp_probs_b\.bias")

    def head_shape(self, f) -> tuple[int, int, int, int]:
        """A query head's size is key_length_mla (nope + rope); the cache's one latent head is key_length."""
        p = self.name + "."
        d_model, n_heads, _, _ = super().head_shape(f)
        if p + "attention.key_length_mla" not in f.metadata:
            raise UnsupportedModelError(f"{f.path.name} has no {p}attention.key_length_mla (a conversion without "
                                        "latent attention's split attn_k_b / attn_v_b): convert it again with a "
                                        "current llama.cpp")
        return d_model, n_heads, 1, int(f.metadata[p + "attention.key_length_mla"])

    def mla_shape(self, f) -> dict:
        p = self.name + "."
        _, heads, _, head_dim = self.head_shape(f)
        rot = int(f.require(p + "rope.dimension_count"))
        rank = int(f.require(p + "attention.kv_lora_rank"))
        v_dim = int(f.require(p + "attention.value_length_mla"))
        if not (0 < rot < head_dim and rot % 2 == 0 and rank > 0 and v_dim > 0):
            raise ModelFormatError(f"{f.path.name}: latent attention sizes out of range (rope {rot}, head "
                                   f"{head_dim}, kv_lora_rank {rank}, value_length_mla {v_dim})")
        for key, want in (("key_length", rank + rot), ("value_length", rank), ("head_count_kv", 1)):
            if int(f.get(p + "attention." + key, want)) != want:
                raise ModelFormatError(f"{f.path.name}: {p}attention.{key} must be {want} with kv_lora_rank {rank}")
        return dict(heads=heads, head_dim=head_dim, rot=rot, rank=rank, v_dim=v_dim,
                    q_rank=int(f.get(p + "attention.q_lora_rank", 0) or 0))

    def present(self, f) -> None:
        """q's rows per head are [nope | rope]; presented as every head's nope part, then every head's rope part
        (a copy in memory), so the graph reads each part as one view of q (runtime/blocks.py)."""
        super().present(f)
        if any(n.endswith(".attn_kv_b.weight") for n in f.tensors):
            raise UnsupportedModelError(f"{f.path.name} holds attn_kv_b (an older deepseek2 conversion without "
                                        "latent attention's split attn_k_b / attn_v_b): convert it again with a "
                                        "current llama.cpp")
        from ..gguf_file import GGUFTensor

        s = self.mla_shape(f)
        heads, hd, rot = s["heads"], s["head_dim"], s["rot"]
        rows = np.arange(heads * hd).reshape(heads, hd)
        order = np.concatenate([rows[:, :hd - rot].reshape(-1), rows[:, hd - rot:].reshape(-1)])
        for name in [n for n in f.tensors if n.endswith((".attn_q.weight", ".attn_q_b.weight"))]:
            t = f.tensors[name]
            if t.rows != heads * hd:
                raise ModelFormatError(f"{f.path.name}: {name} has {t.rows} rows; {heads} heads of {hd} need "
                                       f"{heads * hd}")
            f.tensors[name] = GGUFTensor(name, t.type_name, t.cols, t.rows, np.ascontiguousarray(t.data[order]))

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        if float(f.get(p + "attention.temperature_scale", 0.0) or 0.0) != 0.0:
            raise UnsupportedModelError(f"{p}attention.temperature_scale (Mistral Large's) is not supported yet")
        s = self.mla_shape(f)
        hp = self.common_hparams(f)
        n_layers = hp["n_layers"]
        lead = int(f.get(p + "leading_dense_block_count", 0) or 0)
        if not 0 <= lead < n_layers:
            raise ModelFormatError(f"{f.path.name}: {p}leading_dense_block_count {lead} must be below the layer count")
        # llama.cpp: unset means softmax, but sigmoid for GLM-4.7-Flash (by its shape)
        gating = self.expert_gating(f, unset=2 if n_layers in (47, 48) and hp["vocab_size"] == 154880 else 1)
        moe = self.moe_hparams(f, norm=bool(f.get(p + "expert_weights_norm", False)), shared=True,
                               shared_gated=False, layers=range(lead, n_layers))
        if not moe:
            raise ModelFormatError(f"{f.path.name}: deepseek2 needs deepseek2.expert_count and its expert tensors")
        groups = (int(f.get(p + "expert_group_count", 0) or 0), int(f.get(p + "expert_group_used_count", 0) or 0))
        if groups[0] <= 1:
            groups = (0, 0)
        attn_factor, scale = self.yarn_magnitude(f, hp, s["head_dim"])
        q_parts = ["attn_q_a.weight", "attn_q_a_norm.weight", "attn_q_b.weight"] if s["q_rank"] else ["attn_q.weight"]
        for il in range(n_layers):
            need = q_parts + ["attn_kv_a_mqa.weight", "attn_kv_a_norm.weight", "attn_k_b.weight", "attn_v_b.weight"]
            for part in need + (["ffn_gate.weight"] if il < lead else []):
                if f"blk.{il}.{part}" not in f.tensors:
                    raise ModelFormatError(f"{f.path.name}: blk.{il}.{part} is missing")
            kb, vb = f.tensors[f"blk.{il}.attn_k_b.weight"], f.tensors[f"blk.{il}.attn_v_b.weight"]
            nope = s["head_dim"] - s["rot"]
            if (kb.cols, kb.rows) != (nope, s["heads"] * s["rank"]) or \
                    (vb.cols, vb.rows) != (s["rank"], s["heads"] * s["v_dim"]):
                raise ModelFormatError(f"{f.path.name}: blk.{il}.attn_k_b / attn_v_b do not fit {s['heads']} heads "
                                       f"of latent {s['rank']}")
        hp.update(n_kv_heads=1, rope_attn_factor=attn_factor)
        return LlamaConfig(**hp, **moe, expert_gating=gating, dense_lead=lead,
                           expert_bias=f"blk.{lead}.exp_probs_b.bias" in f.tensors,
                           expert_scale=float(f.get(p + "expert_weights_scale", 0.0) or 0.0), expert_groups=groups,
                           kv_lora_rank=s["rank"], q_lora_rank=s["q_rank"], mla_v_dim=s["v_dim"], attn_scale=scale)

    def yarn_magnitude(self, f, hp: dict, head_dim: int) -> tuple[float, float]:
        """(RoPE's cos/sin factor as the kernel takes it, q.k's scale), as llama.cpp's deepseek2 graph and context
        set them: with YaRN, the rotation's magnitude is cancelled (DeepSeek-V2's mscale equals its mscale_all_dim)
        and the attention scale carries (1 + 0.1 mscale_all_dim ln factor)^2 instead."""
        p = self.name + "."
        raf = float(f.get(p + "rope.scaling.attn_factor", 1.0) or 1.0)
        if not hp.get("rope_ext_factor"):
            return raf, raf * raf / math.sqrt(head_dim)
        factor = 1.0 / hp["rope_freq_scale"]
        log_mul = float(f.get(p + "rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / 0.1  # the converter's 0.1x
        kept = 1.0 if log_mul else 1.0 + 0.1 * math.log(factor)  # the rotation's own magnitude, before the kernel's
        mscale = kept * raf * (1.0 + 0.1 * log_mul * math.log(factor))
        return kept * raf / (1.0 + 0.1 * math.log(factor)), mscale * mscale / math.sqrt(head_dim)

    def build_layer(self, m, il: int, x):
        p = f"blk.{il}."
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        x = m.residual(x, m.latent_attention(h, il))
        h = m.norm(x, p + "ffn_norm.weight", "ffn_in")
        return m.residual(x, m.ffn(h, il))


ARCH = Deepseek2()
