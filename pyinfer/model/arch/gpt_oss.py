"""gpt-oss (gpt-oss-20b, 120b; llama.cpp's openai-moe graph): q/k/v/o biases, per-head attention sinks (a learned
logit in every row's softmax), sliding-window (128) and full attention alternating (the even layers slide), YaRN
RoPE (NEOX pairs), the FFN normed by `post_attention_norm`, and in every layer a Mixture of Experts with a biased
router, the top k logits softmaxed among themselves, every expert's gate, up and down biased, and the clamped
SwiGLU (min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)). Its experts ship in MXFP4."""
from __future__ import annotations

from ...errors import ModelFormatError
from ..config import Activation, LlamaConfig
from .base import MOE_TENSORS, Architecture

SWA_EVERY = 2  # llama.cpp's default pattern: of every 2 layers the first slides


class GptOss(Architecture):
    name = "gpt-oss"
    rope_neox = True
    activation = Activation.SWIGLU_OAI
    tensor_patterns = MOE_TENSORS + (r"blk\.N\.post_attention_norm\.weight", r"blk\.N\.attn_sinks\.weight",
                                     r"blk\.N\.ffn_gate_inp\.bias", r"blk\.N\.ffn_(gate|up|down)_exps\.bias")

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)
        hp["activation"] = Activation.SWIGLU_OAI
        moe = self.moe_hparams(f, norm=False)
        if not moe:
            raise ModelFormatError(f"{f.path.name}: gpt-oss needs gpt-oss.expert_count and its expert tensors")
        n, ff, d = moe["n_expert"], moe["d_ff_expert"], hp["d_model"]
        for il in range(hp["n_layers"]):
            want = {"attn_sinks.weight": (hp["n_heads"], 1), "ffn_gate_inp.bias": (n, 1), "ffn_gate_exps.bias": (ff, n),
                    "ffn_up_exps.bias": (ff, n), "ffn_down_exps.bias": (d, n), "post_attention_norm.weight": (d, 1)}
            for part, (cols, rows) in want.items():
                t = f.tensors.get(f"blk.{il}.{part}")
                if t is None or (t.cols, t.rows) != (cols, rows) and t.cols * t.rows != cols * rows:
                    raise ModelFormatError(f"{f.path.name}: blk.{il}.{part} must hold {rows} x {cols} values")
        pattern = f.get(p + "attention.sliding_window_pattern", SWA_EVERY)
        local = tuple(bool(v) for v in pattern) if isinstance(pattern, (list, tuple)) else \
            tuple(il % int(pattern) < int(pattern) - 1 for il in range(hp["n_layers"]))
        if len(local) != hp["n_layers"]:
            raise ModelFormatError(f"{f.path.name}: {p}attention.sliding_window_pattern lists {len(local)} layers")
        return LlamaConfig(**hp, **moe, expert_gating=2, expert_biases=True, ffn_norm="post_attention_norm",
                           sliding_window=int(f.require(p + "attention.sliding_window")), local_layers=local,
                           attn_scale=hp["head_dim"] ** -0.5)

    def build_layer(self, m, il: int, x):
        p, cfg = f"blk.{il}.", m.cfg
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        x = m.residual(x, m.attention(h, il, window=cfg.window(il), sinks=True))  # YaRN on every layer
        h = m.norm(x, p + "post_attention_norm.weight", "ffn_in")
        return m.residual(x, m.ffn(h, il))


ARCH = GptOss()
