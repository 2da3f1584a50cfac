"""What every architecture file shares: reading the hyper-parameters all of them have, the check that refuses
tensors no graph reads, and the fused-QKV split any architecture may use.

An architecture is one small file (llama.py, gemma3.py, ...) with a subclass of `Architecture`: its own keys
(`config`), the tensors it reads (`tensor_patterns`), any re-presentation of fused tensors (`present`) and its
layer (`build_layer`), built from the shared pieces of runtime/blocks.py, as llama.cpp's src/models/*.cpp build
from build_attn / build_ffn. Nothing in an architecture file knows about devices, sparsity or offload."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import Activation, LlamaConfig, detect_activation

if TYPE_CHECKING:
    from ...runtime.blocks import ModelGraph
    from ...runtime.graph_builder import T
    from ..gguf_file import GGUFModelFile, GGUFTensor

# Tensors every llama-family file has (blk.N. is any layer), and the ones any may have.
# Attention biases and a fused QKV are optional in every architecture, as in llama.cpp's build_qkv.
COMMON_TENSORS = (r"token_embd\.weight", r"output_norm\.weight", r"output\.weight",
                  r"blk\.N\.attn_norm\.weight", r"blk\.N\.attn_(q|k|v|output)\.weight", r"blk\.N\.ffn_norm\.weight",
                  r"blk\.N\.ffn_(gate|up|down)\.weight", r"blk\.N\.attn_(q|k|v|output)\.bias",
                  r"blk\.N\.attn_qkv\.(weight|bias)")
QK_NORMS = (r"blk\.N\.attn_(q|k)_norm\.weight",)
# A Mixture of Experts: the router and the merged experts (GGUF's *_exps: [n_expert * rows, cols]), and
# Qwen2-MoE's shared expert with its one-row gate.
MOE_TENSORS = (r"blk\.N\.ffn_gate_inp\.weight", r"blk\.N\.ffn_(gate|up|down)_exps\.weight")
SHARED_EXPERT_TENSORS = (r"blk\.N\.ffn_gate_inp_shexp\.weight", r"blk\.N\.ffn_(gate|up|down)_shexp\.weight")


class Architecture:
    """One GGUF `general.architecture`. Subclasses set `name` and override what differs."""
    name = "?"
    # Extra tensor-name patterns (regular expressions; blk.N. stands for any layer) this graph reads.
    tensor_patterns: tuple[str, ...] = ()
    rope_neox = False  # llama.cpp's rope type for the architecture: NEOX pairs i with i + head_dim / 2
    activation = Activation.SILU  # the gated FFN's, unless the file or the model family says otherwise
    # Multi-head latent attention (DeepSeek-V2): key and value heads of different sizes are the architecture's own
    # (its config checks them), and its YaRN magnitude (rope.scaling.yarn_log_multiplier) is folded into the scale.
    latent_attention = False

    # ---- hyper-parameters ------------------------------------------------------------------------------
    def config(self, f: GGUFModelFile) -> LlamaConfig:
        """The model's hyper-parameters: the common keys, then what the architecture adds."""
        return LlamaConfig(**self.common_hparams(f))

    def head_shape(self, f: GGUFModelFile) -> tuple[int, int, int, int]:
        """(d_model, heads, KV heads, head size) from the metadata."""
        p = self.name + "."
        n_heads = int(f.require(p + "attention.head_count"))
        d_model = int(f.require(p + "embedding_length"))
        if n_heads < 1 or d_model < 1:
            raise ModelFormatError(f"{f.path.name}: head_count and embedding_length must be positive")
        # Gemma's and Qwen 3's heads are wider than d_model / n_heads: the head size is its own key there.
        head_dim = int(f.get(p + "attention.key_length", d_model // n_heads))
        return d_model, n_heads, int(f.get(p + "attention.head_count_kv", n_heads)), head_dim

    def common_hparams(self, f: GGUFModelFile) -> dict:
        p = self.name + "."
        self.check_keys(f)
        d_model, n_heads, n_kv_heads, head_dim = self.head_shape(f)
        if int(f.get(p + "attention.value_length", head_dim)) != head_dim and not self.latent_attention:
            raise UnsupportedModelError("key and value heads of different sizes are not supported")
        rope_dims = int(f.get(p + "rope.dimension_count", head_dim))
        if head_dim >= 2 and (not 2 <= rope_dims <= head_dim or rope_dims % 2):  # (a bad head size: check_config)
            raise ModelFormatError(f"{f.path.name}: {p}rope.dimension_count {rope_dims} must be even and in "
                                   f"[2, {head_dim}] (the head size)")
        vocab = f.get("tokenizer.ggml.tokens")
        emb = f.tensor("token_embd.weight")
        return dict(
            n_layers=self.trunk_layers(f),
            d_model=d_model,
            d_ff=self.ffn_width(f),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            vocab_size=len(vocab) if isinstance(vocab, list) else emb.rows,
            rope_base=float(f.get(p + "rope.freq_base", 10000.0)),
            norm_eps=float(f.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
            train_ctx=int(f.get(p + "context_length", 2048)),
            tied_output="output.weight" not in f.tensors,
            activation=detect_activation(self.name, f.metadata, powerinfer=f.powerinfer, base=self.activation),
            arch=self.name,
            rope_neox=self.rope_neox,
            rope_freq_scale=self.rope_scaling(f),
            rope_attn_factor=float(f.get(p + "rope.scaling.attn_factor", 1.0) or 1.0),
            rope_dims=0 if rope_dims == head_dim else rope_dims,
            **self.yarn_hparams(f, rope_dims, float(f.get(p + "rope.freq_base", 10000.0))),
        )

    def ffn_width(self, f: GGUFModelFile) -> int:
        """A dense FFN's neurons (feed_forward_length)."""
        return int(f.require(self.name + ".feed_forward_length"))

    def moe_hparams(self, f: GGUFModelFile, norm: bool = True, shared: bool = False,
                    width_key: str = "expert_feed_forward_length", shared_gated: bool = True,
                    layers: range | None = None) -> dict:
        """The experts of a Mixture-of-Experts file ({} for a dense one), checked against every layer's tensors:
        `norm`, whether the chosen weights are divided by their sum (llama.cpp's norm_w for the architecture);
        `shared`, whether the architecture has a shared expert (`shared_gated`: behind a sigmoid of its own one-row
        router, Qwen2-MoE; or added as it is, Granite MoE); `width_key`, the key llama.cpp reads an expert's width
        from (Mixtral's is feed_forward_length); `layers`: the layers that hold experts (default: all; GLM-4.5's
        first layers are dense)."""
        p = self.name + "."
        n = int(_one_value(f, p + "expert_count", 0))
        has_experts = any(name.endswith("_exps.weight") for name in f.tensors)
        if n == 0:
            if has_experts:
                raise ModelFormatError(f"{f.path.name}: expert tensors without {p}expert_count")
            return {}
        used = int(_one_value(f, p + "expert_used_count", 0))
        if not 1 <= used <= n:
            raise ModelFormatError(f"{f.path.name}: {p}expert_used_count {used} must be in [1, {n}]")
        d = int(f.require(p + "embedding_length"))
        layers = range(self.trunk_layers(f)) if layers is None else layers
        first = f.tensors.get(f"blk.{layers[0]}.ffn_gate_exps.weight")
        if first is None or first.rows % n:
            raise ModelFormatError(f"{f.path.name}: blk.{layers[0]}.ffn_gate_exps.weight must hold {n} experts")
        ff = first.rows // n
        if int(f.get(p + width_key, ff) or ff) != ff:
            raise ModelFormatError(f"{f.path.name}: {p}{width_key} disagrees with the expert tensors")
        ff_shared = 0
        if shared and f"blk.{layers[0]}.ffn_gate_shexp.weight" in f.tensors:
            ff_shared = f.tensors[f"blk.{layers[0]}.ffn_gate_shexp.weight"].rows
        want = {"ffn_gate_inp": (d, n), "ffn_gate_exps": (d, n * ff), "ffn_up_exps": (d, n * ff),
                "ffn_down_exps": (ff, n * d)}
        if ff_shared:
            want.update({"ffn_gate_shexp": (d, ff_shared), "ffn_up_shexp": (d, ff_shared),
                         "ffn_down_shexp": (ff_shared, d)})
            if shared_gated:
                want["ffn_gate_inp_shexp"] = (d, 1)
        for il in layers:
            for part, (cols, rows) in want.items():
                t = f.tensors.get(f"blk.{il}.{part}.weight")
                if t is None or (t.cols, t.rows) != (cols, rows):
                    got = "missing" if t is None else f"{t.rows} x {t.cols}"
                    raise ModelFormatError(f"{f.path.name}: blk.{il}.{part}.weight is {got}; "
                                           f"{n} experts of {ff} neurons need {rows} x {cols}")
        return dict(n_expert=n, n_expert_used=used, d_ff_expert=ff, expert_norm=norm, d_ff_shared=ff_shared,
                    shared_expert_gated=shared_gated)

    def expert_gating(self, f: GGUFModelFile, unset: int) -> int:
        """MoeRoute's gating from llama.cpp's expert_gating_func (1 softmax, 2 sigmoid; `unset`: what the
        architecture means by none), refused by name otherwise."""
        p = self.name + "."
        gating = int(f.get(p + "expert_gating_func", 0) or unset)
        if gating not in (1, 2):
            raise UnsupportedModelError(f"{p}expert_gating_func {gating} is not supported (1 softmax, 2 sigmoid)")
        return gating - 1

    def rope_scaling(self, f: GGUFModelFile) -> float:
        """freq_scale as llama.cpp reads it: the type defaults to linear; the factor is rope.scaling.factor or
        the older rope.scale_linear; type none never scales. YaRN (and LongRoPE with a factor) are refused,
        never ignored: the model would load and answer wrongly without a word."""
        p = self.name + "."
        kind = str(f.get(p + "rope.scaling.type", "linear"))
        factor = float(f.get(p + "rope.scaling.factor", 0.0) or f.get(p + "rope.scale_linear", 0.0) or 0.0)
        if not np.isfinite(factor) or factor < 0:
            raise ModelFormatError(f"{f.path.name}: {p}rope.scaling.factor {factor} is out of range")
        if kind == "none" or factor in (0.0, 1.0) and kind in ("linear", "longrope"):
            return 1.0
        if kind in ("linear", "yarn"):
            return 1.0 / factor
        raise UnsupportedModelError(f"RoPE scaling '{kind}' ({p}rope.scaling.*) is not supported yet; "
                                    "supported: none, linear, yarn")

    def yarn_hparams(self, f: GGUFModelFile, rope_dims: int, base: float) -> dict:
        """YaRN's rope parameters as llama.cpp sets them (llama-context.cpp, ggml's rope_yarn_corr_dims): the
        share of the unscaled angle (yarn_ext_factor, 1 by default), the pairs where the ramp between the two
        angles starts and ends (from the original context and beta_fast / beta_slow, 32 and 1 by default), and the
        magnitude: rope.scaling.attn_factor times (1 + 0.1 ln factor), the kernel's part of it. {} without YaRN."""
        p = self.name + "."
        if str(f.get(p + "rope.scaling.type", "linear")) != "yarn":
            return {}
        factor = float(f.get(p + "rope.scaling.factor", 0.0) or 0.0)
        if factor in (0.0, 1.0):
            return {}
        if float(f.get(p + "rope.scaling.yarn_log_multiplier", 0.0) or 0.0) != 0.0 and not self.latent_attention:
            raise UnsupportedModelError(f"{p}rope.scaling.yarn_log_multiplier (DeepSeek's YaRN magnitude) is not "
                                        "supported yet")
        ext = float(f.get(p + "rope.scaling.yarn_ext_factor", 1.0))
        orig = int(f.get(p + "rope.scaling.original_context_length", f.get(p + "context_length", 2048)))
        fast = float(f.get(p + "rope.scaling.yarn_beta_fast", 32.0))
        slow = float(f.get(p + "rope.scaling.yarn_beta_slow", 1.0))
        if orig < 1 or not all(np.isfinite([ext, fast, slow])) or fast <= 0 or slow <= 0:
            raise ModelFormatError(f"{f.path.name}: {p}rope.scaling.* holds YaRN values out of range")
        f32 = np.float32

        def corr_dim(n_rot: float) -> np.float32:  # in float32, as ggml computes it
            return f32(rope_dims) * np.log(f32(orig) / (f32(n_rot) * f32(2) * f32(np.pi))) / (f32(2) * np.log(f32(base)))

        low = max(0.0, float(np.floor(corr_dim(fast))))
        high = min(float(rope_dims - 1), float(np.ceil(corr_dim(slow))))
        return dict(rope_ext_factor=ext, rope_yarn_low=low, rope_yarn_high=high)

    def check_keys(self, f: GGUFModelFile) -> None:
        """Keys whose effect the graph does not compute: refused by name."""
        p = self.name + "."
        if float(f.get(p + "attention.clamp_kqv", 0.0) or 0.0) != 0.0:
            raise UnsupportedModelError(f"{p}attention.clamp_kqv is not supported yet; the model would run wrongly")

    def trunk_layers(self, f: GGUFModelFile) -> int:
        """The layers the graph runs: block_count less the multi-token-prediction layers stored after the trunk
        (nextn_predict_layers: GLM-4.5, GLM-4.7-Flash), which llama.cpp runs only for speculative decoding."""
        p = self.name + "."
        blocks, nextn = int(f.require(p + "block_count")), int(f.get(p + "nextn_predict_layers", 0) or 0)
        if not 0 <= nextn < blocks:
            raise ModelFormatError(f"{f.path.name}: {p}nextn_predict_layers {nextn} must be below block_count {blocks}")
        return blocks - nextn

    # ---- tensors ---------------------------------------------------------------------------------------
    def check_tensors(self, f: GGUFModelFile) -> None:
        """Every tensor of the file is one this graph reads: a tensor the graph would skip (a bias, RoPE
        factors, a norm it does not apply) means wrong answers, so it is refused by name. The multi-token-prediction
        layers' tensors (after the trunk) are read by no graph here and refused by none."""
        trunk = self.trunk_layers(f)
        names = [n for n in f.tensors if not ((m := re.match(r"^blk\.(\d+)\.", n)) and int(m.group(1)) >= trunk)]
        allowed = re.compile("|".join(f"(?:{p})" for p in COMMON_TENSORS + self.tensor_patterns))
        if any(re.fullmatch(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight", name) for name in f.tensors):
            raise UnsupportedModelError(f"{f.path.name} stores each expert in tensors of its own (an old Mixtral "
                                        "layout); convert it again with a current llama.cpp (merged *_exps tensors)")
        for name in names:
            if not allowed.fullmatch(re.sub(r"^blk\.\d+\.", "blk.N.", name)):
                raise UnsupportedModelError(
                    f"tensor {name} is not read by pyinfer's '{self.name}' graph; the model would run, but wrongly")

    def present(self, f: GGUFModelFile) -> None:
        """Re-presents fused tensors as the separate ones the shared pieces read (views, no copies)."""
        split_fused_qkv(f, self)

    def config_shape(self, f: GGUFModelFile) -> tuple[int, int]:
        """(q width, k/v width) from the metadata, before the config exists."""
        _, n_heads, n_kv_heads, head_dim = self.head_shape(f)
        return n_heads * head_dim, n_kv_heads * head_dim

    # ---- graph ------------------------------------------------------------------------------------------
    def prepare(self, m: ModelGraph, x: T) -> None:
        """What the graph computes from the embedding (x, F32 [T, d_model]) before the first layer (Gemma 4's
        per-layer inputs); nothing by default."""

    def build_layer(self, m: ModelGraph, il: int, x: T) -> T:
        """Layer `il` on the residual stream x (F32 [T, d_model]); returns the stream after it. The default is
        the pre-norm llama layer: x += attn(norm(x)); x += ffn(norm(x))."""
        p = f"blk.{il}."
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        x = m.residual(x, m.attention(h, il, **self.attention_options(m, il)))
        h = m.norm(x, p + "ffn_norm.weight", "ffn_in")           # F32 [T, d_model]
        return m.residual(x, m.ffn(h, il))

    def attention_options(self, m: ModelGraph, il: int) -> dict:
        """Keywords of ModelGraph.attention for layer `il` (QK-norm, RoPE factors, window, scale)."""
        return {}


def _one_value(f: GGUFModelFile, key: str, default):
    """A key llama.cpp reads as a value or a per-layer array: one value, or one the array repeats."""
    v = f.get(key, default)
    if isinstance(v, list):
        if not v or any(x != v[0] for x in v):
            raise UnsupportedModelError(f"{f.path.name}: {key} differs between layers, which is not supported")
        v = v[0]
    return v or default


def row_slice(t: GGUFTensor, name: str, start: int, rows: int) -> GGUFTensor:
    """Rows [start, start + rows) of a matrix, as a tensor of its own sharing the file's memory map."""
    from ..gguf_file import GGUFTensor

    if start + rows > t.rows:
        raise ModelFormatError(f"tensor {t.name} has {t.rows} rows, {start + rows} are needed")
    return GGUFTensor(name, t.type_name, t.cols, rows, np.asarray(t.data)[start:start + rows])


def split_fused_qkv(f: GGUFModelFile, arch: Architecture) -> None:
    """blk.N.attn_qkv (rows q, then k, then v: llama.cpp's build_qkv) as attn_q, attn_k and attn_v."""
    fused = [n for n in f.tensors if n.endswith(".attn_qkv.weight") or n.endswith(".attn_qkv.bias")]
    if not fused:
        return
    q, kv = arch.config_shape(f)
    for name in fused:
        t = f.tensors.pop(name)
        bias = name.endswith(".bias")
        total = t.cols if bias else t.rows
        if total != q + 2 * kv:
            raise ModelFormatError(f"{f.path.name}: {name} has {total} rows, q + k + v need {q + 2 * kv}")
        for part, start, n in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
            new = name.replace(".attn_qkv.", f".attn_{part}.")
            if new in f.tensors:  # which of the two would the graph read? neither silently
                raise ModelFormatError(f"{f.path.name}: both {name} and {new} are present")
            f.tensors[new] = row_slice(t, new, start, n) if not bias else _bias_slice(t, new, start, n)


def _bias_slice(t: GGUFTensor, name: str, start: int, n: int) -> GGUFTensor:
    from ..gguf_file import GGUFTensor

    return GGUFTensor(name, t.type_name, n, 1, np.asarray(t.data).reshape(-1)[start:start + n])
