"""LLaMA and its kin that GGUF files call `llama`: LLaMA 1-3.x, Mistral, SmolLM, ReluLLaMA, and PowerInfer's
files of them. Llama 3.1 and later carry RoPE frequency factors (rope_freqs.weight), used in every layer.
Mixtral is `llama` with experts (expert_count): softmax routing, its top k weights divided by their sum."""
from __future__ import annotations

from ..config import LlamaConfig
from .base import MOE_TENSORS, Architecture

# PowerInfer's converter stores down transposed and adds each layer's predictor MLP.
POWERINFER_TENSORS = (r"blk\.N\.ffn_down_t\.weight", r"blk\.N\.fc(1|2)\.weight")


class Llama(Architecture):
    name = "llama"
    tensor_patterns = (r"rope_freqs\.weight",) + POWERINFER_TENSORS + MOE_TENSORS

    def config(self, f) -> LlamaConfig:
        return LlamaConfig(**self.common_hparams(f), **self.moe_hparams(f, norm=True, width_key="feed_forward_length"))

    def attention_options(self, m, il: int) -> dict:
        return {"factors": m.optional("rope_freqs.weight")}


ARCH = Llama()
