"""Qwen 3.5 (`qwen35`, dense): three of every four layers are gated DeltaNet linear attention (runtime/recurrent.py:
a causal conv1d over the projected q, k and v, per-head decay and beta, and a fixed-size state per sequence instead of
a KV cache); the others are gated full attention (q's projection holds each head's query and its output gate, QK-norm,
partial RoPE). Every layer normalises its FFN's input with `post_attention_norm` (llama.cpp's qwen35 graph). The
multi-token-prediction layers after the trunk are not run, as llama.cpp runs them only to draft tokens."""
from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import LlamaConfig
from .base import QK_NORMS, Architecture

LINEAR_ATTENTION = (r"blk\.N\.attn_qkv\.weight", r"blk\.N\.attn_gate\.weight", r"blk\.N\.ssm_conv1d\.weight",
                    r"blk\.N\.ssm_dt\.bias", r"blk\.N\.ssm_a", r"blk\.N\.ssm_(beta|alpha|out)\.weight",
                    r"blk\.N\.ssm_norm\.weight", r"blk\.N\.post_attention_norm\.weight",
                    r"blk\.N\.attn_q_gate\.weight")  # the last: presented from attn_q (present())


class Qwen35(Architecture):
    name = "qwen35"
    rope_neox = True  # llama.cpp's IMROPE rotates NEOX pairs; text positions make its sections one angle per pair
    tensor_patterns = QK_NORMS + LINEAR_ATTENTION

    def recurrent_layers(self, f) -> tuple[bool, ...]:
        p = self.name + "."
        n = self.trunk_layers(f)
        listed = f.get(p + "attention.recurrent_layers")
        if listed is not None:
            listed = list(np.atleast_1d(listed))
            if len(listed) < n:
                raise ModelFormatError(f"{f.path.name}: {p}attention.recurrent_layers must list every layer")
            return tuple(bool(v) for v in listed[:n])
        interval = int(f.get(p + "full_attention_interval", 4) or 4)
        if interval < 1:
            raise ModelFormatError(f"{f.path.name}: {p}full_attention_interval must be positive")
        return tuple((il + 1) % interval != 0 for il in range(n))

    def ssm_hparams(self, f) -> dict:
        p = self.name + "."
        kernel, inner, state = (int(f.require(p + k)) for k in ("ssm.conv_kernel", "ssm.inner_size", "ssm.state_size"))
        k_heads, v_heads = int(f.require(p + "ssm.group_count")), int(f.require(p + "ssm.time_step_rank"))
        if min(kernel, inner, state, k_heads, v_heads) < 1 or kernel < 2 or v_heads % k_heads:
            raise ModelFormatError(f"{f.path.name}: {p}ssm.* must be positive, conv_kernel >= 2, time_step_rank a "
                                   "multiple of group_count")
        if inner != v_heads * state:
            raise UnsupportedModelError(f"{p}ssm.inner_size {inner} is not time_step_rank x state_size: value heads "
                                        "of another size than key heads are not supported")
        return dict(ssm_conv_kernel=kernel, ssm_head_dim=state, ssm_k_heads=k_heads, ssm_v_heads=v_heads)

    def check_rope_sections(self, f, rope_dims: int) -> None:
        """llama.cpp's interleaved M-RoPE gives text tokens the position in its first three sections and 0 in the
        fourth: pairs of the fourth would not rotate, which the rope op does not express; refused by name."""
        sections = [int(v) for v in list(f.get(self.name + ".rope.dimension_sections", []))] + [0] * 4
        t, h, w = sections[:3]
        total = sum(sections[:4])
        if total == 0:
            return
        for pair in range(rope_dims // 2):
            sector = pair % total
            if not ((sector % 3 == 0 and sector < 3 * t) or (sector % 3 == 1 and sector < 3 * h)
                    or (sector % 3 == 2 and sector < 3 * w)):
                raise UnsupportedModelError(f"{self.name}.rope.dimension_sections {sections[:4]} leaves rotary pairs "
                                            "to the fourth section (not supported for text)")

    def config(self, f) -> LlamaConfig:
        hp = self.common_hparams(f)
        self.check_rope_sections(f, hp["rope_dims"] or hp["head_dim"])
        recurrent = self.recurrent_layers(f)
        ssm = self.ssm_hparams(f)
        if all(recurrent):
            raise ModelFormatError(f"{f.path.name}: every layer is recurrent; {self.name} needs attention layers too")
        channels = (2 * ssm["ssm_k_heads"] + ssm["ssm_v_heads"]) * ssm["ssm_head_dim"]
        value = ssm["ssm_v_heads"] * ssm["ssm_head_dim"]
        d = hp["d_model"]
        for il, rec in enumerate(recurrent):
            p = f"blk.{il}."
            want = ({"attn_qkv.weight": (d, channels), "attn_gate.weight": (d, value),
                     "ssm_conv1d.weight": (ssm["ssm_conv_kernel"], channels), "ssm_beta.weight": (d, ssm["ssm_v_heads"]),
                     "ssm_alpha.weight": (d, ssm["ssm_v_heads"]), "ssm_out.weight": (value, d),
                     "ssm_norm.weight": (ssm["ssm_head_dim"], 1), "ssm_dt.bias": (ssm["ssm_v_heads"], 1),
                     "ssm_a": (ssm["ssm_v_heads"], 1)} if rec else
                    {"attn_q.weight": (d, hp["n_heads"] * hp["head_dim"]), "attn_q_gate.weight":
                     (d, hp["n_heads"] * hp["head_dim"]), "attn_q_norm.weight": (hp["head_dim"], 1),
                     "attn_k_norm.weight": (hp["head_dim"], 1)})
            want["post_attention_norm.weight"] = (d, 1)
            for part, (cols, rows) in want.items():
                t = f.tensors.get(p + part)
                if t is None or (t.cols, t.rows) != (cols, rows):
                    got = "missing" if t is None else f"{t.rows} x {t.cols}"
                    raise ModelFormatError(f"{f.path.name}: {p}{part} is {got}, expected {rows} x {cols}")
            for part in ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a") if rec else ():
                if f.tensors[p + part].type_name not in ("F32", "F16"):
                    raise UnsupportedModelError(f"{p}{part} in {f.tensors[p + part].type_name} is not supported "
                                                "(F32 or F16)")
        return LlamaConfig(**hp, qk_norm=True, recurrent_layers=recurrent, attn_output_gate=True,
                           ffn_norm="post_attention_norm", **ssm)

    def present(self, f) -> None:
        """The full-attention layers' attn_q holds, per head, its query rows then its output gate's rows: presented
        as attn_q (the queries) and attn_q_gate (the gates), copies of the rows (a quantized row is whole blocks).
        attn_qkv here is the linear attention's fused input, which is not split."""
        from ..gguf_file import GGUFTensor

        p = self.name + "."
        n_heads = int(f.get(p + "attention.head_count", 0) or 0)
        head_dim = int(f.get(p + "attention.key_length", 0) or 0)
        for name in [n for n in f.tensors if n.endswith(".attn_q.weight")]:
            t = f.tensors[name]
            if n_heads < 1 or head_dim < 1 or t.rows != 2 * n_heads * head_dim:
                raise ModelFormatError(f"{f.path.name}: {name} has {t.rows} rows; queries and gates of "
                                       f"{n_heads} heads of {head_dim} need {2 * n_heads * head_dim}")
            data = np.asarray(t.data).reshape(t.rows, -1)
            heads = data.reshape(n_heads, 2, head_dim, *data.shape[1:])
            for part, half in (("attn_q", 0), ("attn_q_gate", 1)):
                rows = np.ascontiguousarray(heads[:, half]).reshape(n_heads * head_dim, *data.shape[1:])
                new = name.replace(".attn_q.", f".{part}.")
                f.tensors[new] = GGUFTensor(new, t.type_name, t.cols, n_heads * head_dim, rows)

    def build_layer(self, m, il: int, x):
        p = f"blk.{il}."
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        mixer = m.linear_attention(h, il) if m.cfg.is_recurrent(il) else m.attention(h, il, qk_norm=True,
                                                                                        output_gate=True)
        x = m.residual(x, mixer)
        h = m.norm(x, p + "post_attention_norm.weight", "ffn_in")
        return m.residual(x, m.ffn(h, il))


ARCH = Qwen35()
