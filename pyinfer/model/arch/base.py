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


class Architecture:
    """One GGUF `general.architecture`. Subclasses set `name` and override what differs."""
    name = "?"
    # Extra tensor-name patterns (regular expressions; blk.N. stands for any layer) this graph reads.
    tensor_patterns: tuple[str, ...] = ()
    rope_neox = False  # llama.cpp's rope type for the architecture: NEOX pairs i with i + head_dim / 2
    activation = Activation.SILU  # the gated FFN's, unless the file or the model family says otherwise

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
        if int(f.get(p + "attention.value_length", head_dim)) != head_dim:
            raise UnsupportedModelError("key and value heads of different sizes are not supported")
        if int(f.get(p + "rope.dimension_count", head_dim)) != head_dim:
            raise UnsupportedModelError("partial rotary embeddings (rope.dimension_count < head size) are not supported")
        vocab = f.get("tokenizer.ggml.tokens")
        emb = f.tensor("token_embd.weight")
        return dict(
            n_layers=int(f.require(p + "block_count")),
            d_model=d_model,
            d_ff=int(f.require(p + "feed_forward_length")),
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
        )

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
        if kind == "linear":
            return 1.0 / factor
        raise UnsupportedModelError(f"RoPE scaling '{kind}' ({p}rope.scaling.*) is not supported yet; "
                                    "supported: none, linear")

    def check_keys(self, f: GGUFModelFile) -> None:
        """Keys whose effect the graph does not compute: refused by name."""
        p = self.name + "."
        if float(f.get(p + "attention.clamp_kqv", 0.0) or 0.0) != 0.0:
            raise UnsupportedModelError(f"{p}attention.clamp_kqv is not supported yet; the model would run wrongly")

    # ---- tensors ---------------------------------------------------------------------------------------
    def check_tensors(self, f: GGUFModelFile) -> None:
        """Every tensor of the file is one this graph reads: a tensor the graph would skip (a bias, RoPE
        factors, a norm it does not apply) means wrong answers, so it is refused by name."""
        allowed = re.compile("|".join(f"(?:{p})" for p in COMMON_TENSORS + self.tensor_patterns))
        for name in f.tensors:
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
