"""Gemma 3: the llama layer with embeddings times sqrt(d_model), per-head RMS norm of q and k, NEOX RoPE,
five sliding-window layers (RoPE base 10000) per global one, norms after attention and after the FFN, and a
GELU(tanh)-gated FFN."""
from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import Activation, LlamaConfig
from .base import QK_NORMS, Architecture

# Layout facts that llama.cpp fixes in code unless the file says otherwise (attention.sliding_window_pattern,
# rope.freq_base_swa).
GLOBAL_EVERY = 6
LOCAL_ROPE_BASE = 10000.0


class Gemma3(Architecture):
    name = "gemma3"
    rope_neox = True
    activation = Activation.GELU_TANH
    tensor_patterns = QK_NORMS + (r"blk\.N\.post_(attention|ffw)_norm\.weight",)

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)
        if float(f.get(p + "final_logit_softcapping", 0.0) or 0.0) != 0.0:
            raise UnsupportedModelError(f"{p}final_logit_softcapping is not supported yet; the logits would be wrong")
        # The local layers: a per-layer list, a period (every n-th layer global), or llama.cpp's default 6.
        pattern = f.get(p + "attention.sliding_window_pattern", GLOBAL_EVERY)
        local, every = (), GLOBAL_EVERY
        if isinstance(pattern, (list, tuple, np.ndarray)):
            local = tuple(bool(v) for v in pattern)
            if len(local) != hp["n_layers"]:
                raise ModelFormatError(f"{f.path.name}: {p}attention.sliding_window_pattern lists {len(local)} "
                                       f"layers, the model has {hp['n_layers']}")
        else:
            every = int(pattern)
        # Gemma 3 27B scales q.k by 1/sqrt(d_model / heads), the others by 1/sqrt(head size) (llama.cpp,
        # after gemma_pytorch's config); 62 layers is llama.cpp's test for the 27B.
        scale = (hp["d_model"] // hp["n_heads"]) ** -0.5 if hp["n_layers"] == 62 else hp["head_dim"] ** -0.5
        return LlamaConfig(**hp, embed_scale=float(np.sqrt(hp["d_model"])), qk_norm=True, post_norms=True,
                           sliding_window=int(f.get(p + "attention.sliding_window", 0)), global_every=every,
                           local_layers=local,
                           rope_base_local=float(f.get(p + "rope.freq_base_swa", LOCAL_ROPE_BASE)),
                           attn_scale=scale)

    def build_layer(self, m, il: int, x):
        p, cfg = f"blk.{il}.", m.cfg
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        o = m.attention(h, il, qk_norm=True, window=cfg.window(il), rope_base=cfg.layer_rope_base(il),
                        freq_scale=cfg.layer_freq_scale(il), scale=cfg.attn_scale)
        o = m.norm(o, p + "post_attention_norm.weight", "attn_out_normed", out=o)
        x = m.residual(x, o)
        h = m.norm(x, p + "ffn_norm.weight", "ffn_in")
        f = m.ffn(h, il)
        f = m.norm(f, p + "post_ffw_norm.weight", "ffn_out_normed", out=f)
        return m.residual(x, f)


ARCH = Gemma3()
