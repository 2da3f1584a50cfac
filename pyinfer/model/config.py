"""Hyper-parameters of a llama-family model (LLaMA, Mistral, SmolLM, Gemma 3, Qwen 2/3, Phi-3), read from GGUF
metadata by each architecture's file (model/arch/)."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Activation(enum.IntEnum):
    """The gated FFN's activation, act(gate) * up. Values are the engine's op parameter (graph/op_params.h)."""
    SILU = 0        # SwiGLU: LLaMA, Mistral, SmolLM2
    RELU = 1        # ReGLU: ReluLLaMA, ProSparse, Bamboo
    GELU_TANH = 2   # GeGLU, tanh approximation: Gemma
    RELU2 = 3       # squared ReLU on the gate
    DRELU = 4       # ReLU on gate and up: TurboSparse
    SWIGLU_OAI = 5  # gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
    SIGMOID = 6     # an output gate, never an FFN's: sigmoid(g) * u (Qwen3.5's gated attention)

    @classmethod
    def parse(cls, name: str) -> Activation:
        key = name.strip().lower().replace("-", "_").replace("²", "2")
        aliases = {"silu": cls.SILU, "swish": cls.SILU, "swiglu": cls.SILU, "relu": cls.RELU, "reglu": cls.RELU,
                   "gelu": cls.GELU_TANH, "gelu_tanh": cls.GELU_TANH, "gelu_pytorch_tanh": cls.GELU_TANH,
                   "geglu": cls.GELU_TANH, "relu2": cls.RELU2, "relu_squared": cls.RELU2, "drelu": cls.DRELU}
        if key not in aliases:
            raise ValueError(f"unknown FFN activation {name!r} (known: {', '.join(sorted(aliases))})")
        return aliases[key]


# Activations whose |act(gate)| a gate-first (CATS) active set can cut on, as the engine's GateFn values
# (graph/op_params.h): both have one negative lobe, which the engine's cut-offs assume.
GATE_FIRST = {Activation.SILU: 1, Activation.GELU_TANH: 2}


# Model families whose GGUFs say "llama" but whose FFN is ReLU-gated; recognised by general.name /
# general.basename, since llama.cpp's converters write no activation key for them.
_RELU_FAMILY = re.compile(r"(?<![a-z])relu|prosparse|bamboo", re.IGNORECASE)  # not "Prelude"
_DRELU_FAMILY = re.compile(r"turbosparse", re.IGNORECASE)


def detect_activation(arch: str, metadata: dict, powerinfer: bool = False,
                      base: Activation | None = None) -> Activation:
    """From the architecture (`base`: its file's activation, SiLU if not given; model/arch/), then an explicit key (`{arch}.ffn_activation` or `pyinfer.ffn_activation`, which
    pyinfer's own exports write), then the ReLU families' names; a PowerInfer file (its converter takes
    ReLU-gated models only) is ReLU unless its name says dReLU. A ReLU-family file must never run as SiLU."""
    for key in (f"{arch}.ffn_activation", "pyinfer.ffn_activation"):
        if metadata.get(key):
            return Activation.parse(str(metadata[key]))
    if base is None:
        base = Activation.SILU
    if powerinfer and base == Activation.SILU:
        base = Activation.RELU
    names = " ".join(str(metadata.get(k) or "") for k in ("general.name", "general.basename", "general.finetune"))
    if base not in (Activation.SILU, Activation.RELU):
        return base
    if _DRELU_FAMILY.search(names):
        return Activation.DRELU
    if _RELU_FAMILY.search(names):
        return Activation.RELU
    return base


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int          # embedding width
    d_ff: int             # FFN hidden width (neurons per layer)
    n_heads: int
    n_kv_heads: int       # < n_heads: grouped-query attention
    head_dim: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    train_ctx: int        # context length the model was trained for
    tied_output: bool     # output head reuses token_embd
    activation: Activation = Activation.SILU
    arch: str = "llama"
    # Gemma 3 (all off for llama): embeddings times sqrt(d_model), RMS norm of each q/k head, norms after
    # attention and after the FFN, NEOX RoPE, local layers with a sliding window and their own RoPE base
    # (every `global_every`-th layer is global), and the attention scale when it is not 1/sqrt(head_dim).
    embed_scale: float = 0.0
    qk_norm: bool = False
    post_norms: bool = False
    rope_neox: bool = False
    sliding_window: int = 0
    global_every: int = 0
    rope_base_local: float = 0.0
    attn_scale: float | None = None
    # Linear RoPE scaling (1 / rope.scaling.factor; 1: none; Gemma 3: global layers only) and LongRoPE's cos/sin
    # factor and original context (Phi-3 128k: its long factors apply to sequences longer than that).
    rope_freq_scale: float = 1.0
    rope_attn_factor: float = 1.0
    rope_orig_ctx: int = 0
    # Per layer, whether it is a sliding-window layer, when the file lists them (Gemma 3's
    # attention.sliding_window_pattern); else `global_every` decides.
    local_layers: tuple[bool, ...] = ()
    # Mixture of Experts (n_expert 0: a dense FFN of d_ff neurons). Each token runs n_expert_used of n_expert
    # experts of d_ff_expert neurons, chosen by softmax (or sigmoid, `expert_gating` 1) of the router's logits,
    # their weights divided by their sum when `expert_norm` (Mixtral, Qwen3-MoE; not Qwen2-MoE); plus a
    # shared expert of d_ff_shared neurons that every token runs, gated by a sigmoid (Qwen2-MoE).
    n_expert: int = 0
    n_expert_used: int = 0
    d_ff_expert: int = 0
    expert_norm: bool = True
    expert_gating: int = 0
    d_ff_shared: int = 0
    # Granite MoE's shared expert is added ungated (Qwen2-MoE's is gated by ffn_gate_inp_shexp).
    shared_expert_gated: bool = True
    # GLM-4.5 / DeepSeek-V3: experts chosen by probability plus blk.N.exp_probs_b.bias (weights unbiased); the
    # weights times expert_scale (0: 1); the first `dense_lead` layers run a dense FFN of d_ff neurons instead.
    expert_bias: bool = False
    expert_scale: float = 0.0
    # gpt-oss: the router and every expert's gate, up and down carry biases (ffn_*_exps.bias, ffn_gate_inp.bias).
    expert_biases: bool = False
    dense_lead: int = 0
    # Partial RoPE: only the first rope_dims values of each head rotate (0: all).
    rope_dims: int = 0
    # YaRN (gpt-oss): the unscaled angle's share and the pairs its ramp spans (op_params.h RopeParams); 0: off.
    rope_ext_factor: float = 0.0
    rope_yarn_low: float = 0.0
    rope_yarn_high: float = 0.0
    # The norm before each layer's FFN (GLM-4.5 calls it post_attention_norm): expert read-ahead applies it.
    ffn_norm: str = "ffn_norm"
    # Granite: each residual branch times residual_scale before its add, the logits divided by logit_scale (0: off).
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    # DeepSeek-V2's multi-head latent attention (kv_lora_rank 0: none): each token caches one row of kv_lora_rank
    # latent values plus rope_dims rotary ones, shared by every head, read whole as the key and its latent part as
    # the value; head_dim is a query head's size (nope + rope) and mla_v_dim a value head's after its projection
    # back. q_lora_rank > 0: q goes through a low-rank projection with its own norm first (V2, V3; not V2-Lite).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    mla_v_dim: int = 0
    # DeepSeek-V3's grouped routing: (n_group, group_used); (0, 0): none.
    expert_groups: tuple[int, int] = (0, 0)
    # SmallThinker: the router reads the layer's input before attention, so a streamed layer's experts can be read
    # while its attention runs; and the layers that rotate no position (NoPE; SmallThinker's global layers).
    router_before_attention: bool = False
    nope_layers: tuple[bool, ...] = ()
    # Qwen3.5's linear-attention layers (gated DeltaNet): per layer, whether it is one (its state is a fixed size per
    # sequence, no KV cache); the conv's taps, the heads' size and the k and v head counts. And its full-attention
    # layers' output gate (sigmoid of a second half of q's projection times the attention's output).
    recurrent_layers: tuple[bool, ...] = ()
    ssm_conv_kernel: int = 0
    ssm_head_dim: int = 0
    ssm_k_heads: int = 0
    ssm_v_heads: int = 0
    attn_output_gate: bool = False
    ssm_grouped_heads: bool = False  # v head h reads k head h / (v / k) (Qwen3-Next); else h % k (Qwen 3.5)
    # Gemma 4: the sliding-window layers' own head size and rotated values (0: head_dim, rope_dims); each layer's KV
    # heads where they differ (its global layers have fewer); the layers from `kv_shared_from` on (0: none) read the
    # cache of the last layer of their kind before it instead of keeping one (llama.cpp's layer reuse); per-layer
    # token embeddings of `per_layer_embd` values per layer (0: none); each layer's FFN width where they differ (its
    # double-wide MLP); the final logits' soft cap (0: none).
    head_dim_local: int = 0
    rope_dims_local: int = 0
    kv_heads_per_layer: tuple[int, ...] = ()
    kv_shared_from: int = 0
    per_layer_embd: int = 0
    ffn_widths: tuple[int, ...] = ()
    logit_softcap: float = 0.0
    # Gemma 4's MoE form: each expert's output times its own value (blk.N.ffn_down_exps.scale), folded into the
    # route's weights.
    expert_output_scale: bool = False
    # Its experts' gate and up stored fused (blk.N.ffn_gate_up_exps: per expert, gate rows then up rows).
    fused_gate_up: bool = False

    def is_recurrent(self, layer: int) -> bool:
        """A linear-attention layer with a recurrent state instead of a KV cache (Qwen3.5's gated DeltaNet)."""
        return bool(self.recurrent_layers) and self.recurrent_layers[layer]

    @property
    def ssm_conv_channels(self) -> int:
        """The conv's channels: q and k heads, then v heads."""
        return (2 * self.ssm_k_heads + self.ssm_v_heads) * self.ssm_head_dim

    @property
    def state_floats_per_sequence(self) -> int:
        """F32 values of recurrent state one sequence holds across its layers (0: none), whatever its length."""
        per_layer = (self.ssm_conv_kernel - 1) * self.ssm_conv_channels + self.ssm_v_heads * self.ssm_head_dim ** 2
        return per_layer * sum(self.recurrent_layers)

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dim_local if self.head_dim_local and self.is_local(layer) else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        return self.kv_heads_per_layer[layer] if self.kv_heads_per_layer else self.n_kv_heads

    def layer_rope_dims(self, layer: int) -> int:
        """Values of each head that rotate (0: all)."""
        return self.rope_dims_local if self.head_dim_local and self.is_local(layer) else self.rope_dims

    def layer_kv_width(self, layer: int) -> int:
        """Values of one cache row of layer `layer` (K, and V unless MLA)."""
        return self.kv_width if self.kv_lora_rank else self.layer_kv_heads(layer) * self.layer_head_dim(layer)

    def kv_owner(self, layer: int) -> int:
        """The layer whose KV cache `layer` attends over: itself, or from kv_shared_from on the last sliding-window
        (or global) layer before it, as llama.cpp's layer reuse picks (kv_shared_from - 2 or - 1; the architecture
        checks that those are of the right kinds)."""
        if self.kv_shared_from and layer >= self.kv_shared_from:
            return self.kv_shared_from - (2 if self.is_local(layer) else 1)
        return layer

    def owns_cache(self, layer: int) -> bool:
        return not self.is_recurrent(layer) and self.kv_owner(layer) == layer

    @property
    def cached_values_per_token(self) -> int:
        """Values one token adds to the KV cache across the layers that keep one (K and V; MLA: its one row)."""
        per_layer = (lambda il: self.kv_width) if self.kv_lora_rank else (lambda il: 2 * self.layer_kv_width(il))
        return sum(per_layer(il) for il in range(self.n_layers) if self.owns_cache(il))

    def layer_ffn_width(self, layer: int) -> int:
        return self.ffn_widths[layer] if self.ffn_widths else self.d_ff

    @property
    def uniform_ffn(self) -> bool:
        """Every layer's FFN has d_ff neurons (what neuron-level plans assume)."""
        return not self.ffn_widths or all(w == self.d_ff for w in self.ffn_widths)

    @property
    def attention_layers(self) -> int:
        """Layers that keep a KV cache (all but the recurrent ones)."""
        return self.n_layers - sum(self.recurrent_layers)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def moe_layer(self, il: int) -> bool:
        """Whether layer il runs experts (a MoE model's first `dense_lead` layers run a dense FFN)."""
        return self.n_expert > 0 and il >= self.dense_lead

    @property
    def moe_layers(self) -> range:
        """The layers that run experts, in order (an expert store's layer i is model layer dense_lead + i)."""
        return range(self.dense_lead, self.n_layers) if self.n_expert > 0 else range(0)

    @property
    def ffn_relu(self) -> bool:
        return self.activation == Activation.RELU

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Values of one cache row (one layer, one token) of K, and of V unless the layer is MLA's."""
        return self.kv_lora_rank + self.rope_dims if self.kv_lora_rank else self.n_kv_heads * self.head_dim

    @property
    def kv_values_per_token(self) -> int:
        """Cached values per token and layer, K and V together (MLA: one latent row serves as both)."""
        return self.kv_width if self.kv_lora_rank else 2 * self.kv_width

    def is_local(self, layer: int) -> bool:
        """A sliding-window layer (Gemma 3: five local layers, then one global)."""
        if self.sliding_window <= 0:
            return False
        if self.local_layers:
            return self.local_layers[layer]
        return self.global_every == 0 or (layer + 1) % self.global_every != 0

    def layer_freq_scale(self, layer: int) -> float:
        """Linear RoPE scaling applies to global layers only (llama.cpp: rope_freq_scale_train_swa is 1)."""
        return 1.0 if self.is_local(layer) else self.rope_freq_scale

    def window(self, layer: int) -> int:
        return self.sliding_window if self.is_local(layer) else 0

    def rotates(self, layer: int) -> bool:
        """Whether the layer's attention applies RoPE (SmallThinker's NoPE layers do not)."""
        return not (self.nope_layers and self.nope_layers[layer])

    def layer_rope_base(self, layer: int) -> float:
        return self.rope_base_local if self.is_local(layer) and self.rope_base_local > 0 else self.rope_base
