"""Gemma 4 (dense: E2B, E4B, 31B): Gemma 3's layer (embeddings times sqrt(d_model), per-head RMS norm of q and k,
NEOX RoPE, sliding-window and global layers, norms after attention and after the FFN, a GELU(tanh)-gated FFN) with
what llama.cpp's src/models/gemma4.cpp adds:
- global layers with wider heads (512 against 256) and fewer KV heads, their RoPE "proportional": rope_freqs.weight
  leaves three quarters of each head's pairs unrotated; q.k unscaled (attention scale 1);
- each value head RMS-normed (no weight), and without attn_v (attention_k_eq_v) the value is k's projection;
- the last `shared_kv_layers` layers keep no cache: each attends over the last earlier layer's of its kind;
- per-layer token embeddings (E2B, E4B): per token, a row of per_layer_token_embd (n_layers x 256 values) plus a
  projection of the embedding, normed, which each layer gates and projects into its output;
- each layer's output times layer_output_scale, and the final logits soft-capped (cap * tanh(x / cap)).
The MoE form (26B-A4B): every layer runs its dense FFN and its experts side by side on inputs normed apart, each
output normed, their sum normed again; the router reads the un-normed stream RMS-normed times a per-channel scale
over sqrt(d_model), softmax top k renormalized, each expert's output times its own scale (folded into the route).
Experts stored fused (ffn_gate_up_exps: each expert's gate rows, then its up rows) are presented as the two merged
tensors the expert store and the GPU split read, as strided views of the file; in RAM the expert writer reads the
fused tensor itself, as 2n experts (runtime/moe_ffn.py)."""
from __future__ import annotations

import numpy as np

from ...errors import ModelFormatError, UnsupportedModelError
from ..config import Activation, LlamaConfig
from .base import MOE_TENSORS, QK_NORMS, Architecture, _one_value


# llama.cpp caps the final logits at 30 when the file has no final_logit_softcapping (its hparams default).
LLAMACPP_SOFTCAP = 30.0


class Gemma4(Architecture):
    name = "gemma4"
    rope_neox = True
    activation = Activation.GELU_TANH
    tensor_patterns = QK_NORMS + (
        r"blk\.N\.post_(attention|ffw)_norm\.weight", r"rope_freqs\.weight", r"blk\.N\.layer_output_scale\.weight",
        r"per_layer_token_embd\.weight", r"per_layer_model_proj\.weight", r"per_layer_proj_norm\.weight",
        r"blk\.N\.(inp_gate|proj|post_norm)\.weight") + MOE_TENSORS + (
        r"blk\.N\.ffn_gate_inp\.scale", r"blk\.N\.ffn_down_exps\.scale",
        r"blk\.N\.(pre_ffw_norm_2|post_ffw_norm_1|post_ffw_norm_2)\.weight")

    def head_shape(self, f) -> tuple[int, int, int, int]:
        """(d_model, heads, the sliding layers' KV heads, the global layers' head size): head_count_kv may list each
        layer's (config() keeps the list)."""
        p = self.name + "."
        n_heads = int(_one_value(f, p + "attention.head_count", 0))
        d_model = int(f.require(p + "embedding_length"))
        if n_heads < 1 or d_model < 1:
            raise ModelFormatError(f"{f.path.name}: head_count and embedding_length must be positive")
        kv = layer_values(f, p + "attention.head_count_kv", n_heads)
        return d_model, n_heads, kv[0], int(f.get(p + "attention.key_length", d_model // n_heads))

    def ffn_width(self, f) -> int:
        return max(layer_values(f, self.name + ".feed_forward_length"))

    def config(self, f) -> LlamaConfig:
        p = self.name + "."
        hp = self.common_hparams(f)
        n = hp["n_layers"]
        local = f.get(p + "attention.sliding_window_pattern", None)
        if not isinstance(local, (list, tuple, np.ndarray)) or len(local) != n:
            raise ModelFormatError(f"{f.path.name}: {p}attention.sliding_window_pattern must list all {n} layers")
        local = tuple(bool(v) for v in local)
        head_local = int(f.get(p + "attention.key_length_swa", hp["head_dim"]))
        if (int(f.get(p + "attention.value_length_swa", head_local)) != head_local or head_local < 2 or head_local % 2
                or head_local > 1 << 16):
            raise ModelFormatError(f"{f.path.name}: sliding layers' key and value heads must be one even size")
        rot_local = int(f.get(p + "rope.dimension_count_swa", hp["rope_dims"] or hp["head_dim"]))
        if not 2 <= rot_local <= head_local or rot_local % 2:
            raise ModelFormatError(f"{f.path.name}: {p}rope.dimension_count_swa {rot_local} must be even and in "
                                   f"[2, {head_local}]")
        kv_heads = layer_values(f, p + "attention.head_count_kv", hp["n_heads"])
        if len(kv_heads) != n or any(not 1 <= k <= hp["n_heads"] or hp["n_heads"] % k for k in kv_heads):
            raise ModelFormatError(f"{f.path.name}: {p}attention.head_count_kv must give each of {n} layers a "
                                   f"divisor of {hp['n_heads']} heads")
        shared = int(f.get(p + "attention.shared_kv_layers", 0) or 0)
        kv_from = n - shared if shared else 0
        if shared and not (2 <= kv_from and local[kv_from - 2] and not local[kv_from - 1]):
            # llama.cpp's reuse: sliding layers read layer kv_from - 2, global ones kv_from - 1
            raise UnsupportedModelError(f"{p}attention.shared_kv_layers {shared}: the two layers before the shared "
                                        "ones must be a sliding-window layer, then a global one")
        widths = layer_values(f, p + "feed_forward_length")
        if len(widths) != n:
            raise ModelFormatError(f"{f.path.name}: {p}feed_forward_length lists {len(widths)} layers, not {n}")
        per_layer = int(f.get(p + "embedding_length_per_layer_input", 0) or 0)
        if per_layer:
            table = f.tensors.get("per_layer_token_embd.weight")
            if table is None or table.cols != n * per_layer:
                raise ModelFormatError(f"{f.path.name}: per_layer_token_embd.weight must hold {n} x {per_layer} values "
                                       "per token")
        if not any(not x for x in local):
            raise ModelFormatError(f"{f.path.name}: Gemma 4 needs a global layer (sliding_window_pattern all true)")
        cap = float(f.get(p + "final_logit_softcapping", LLAMACPP_SOFTCAP))  # 0: none
        if not np.isfinite(cap) or cap < 0:
            raise ModelFormatError(f"{f.path.name}: {p}final_logit_softcapping {cap} must be positive")
        hp.update(d_ff=widths[0], n_kv_heads=kv_heads[0])
        moe = self.moe_hparams(f, norm=True)
        if moe:
            n_e = moe["n_expert"]
            for il in range(n):
                for name, size in (("ffn_gate_inp.scale", hp["d_model"]), ("ffn_down_exps.scale", n_e)):
                    t = f.tensors.get(f"blk.{il}.{name}")
                    if t is None or t.cols * t.rows != size:
                        raise ModelFormatError(f"{f.path.name}: blk.{il}.{name} must hold {size} values")
            moe.update(expert_gating=0, expert_output_scale=True, ffn_norm="pre_ffw_norm_2",
                       fused_gate_up=any(k.endswith(".ffn_gate_up_exps.weight") for k in f.fused))
        return LlamaConfig(**moe,
            **hp, embed_scale=float(np.sqrt(hp["d_model"])), qk_norm=True, post_norms=True,
            sliding_window=int(f.require(p + "attention.sliding_window")), local_layers=local,
            rope_base_local=float(f.get(p + "rope.freq_base_swa", hp["rope_base"])), attn_scale=1.0,
            head_dim_local=head_local, rope_dims_local=0 if rot_local == head_local else rot_local,
            kv_heads_per_layer=kv_heads if len(set(kv_heads)) > 1 else (), kv_shared_from=kv_from,
            per_layer_embd=per_layer, ffn_widths=widths if len(set(widths)) > 1 else (), logit_softcap=cap)

    def present(self, f) -> None:
        if any(".attn_qkv." in name for name in f.tensors):
            raise UnsupportedModelError("a fused attn_qkv in a Gemma 4 file is not supported (its layers' widths "
                                        "differ); convert it again with llama.cpp's convert_hf_to_gguf.py")
        n = int(_one_value(f, self.name + ".expert_count", 0) or 0)
        for name in [k for k in f.tensors if k.endswith(".ffn_gate_up_exps.weight")]:
            split_gate_up_experts(f, name, n)

    # ---- graph ------------------------------------------------------------------------------------------
    def prepare(self, m, x):
        """Each token's per-layer inputs (F32 [T, n_layers * n]; llama.cpp's project_per_layer_inputs): its row of
        per_layer_token_embd times sqrt(n), plus the scaled embedding's projection times 1 / sqrt(d_model), each
        layer's n values RMS-normed, the sum times 1 / sqrt(2)."""
        c, b = m.cfg, m.b
        n = c.per_layer_embd
        if not n:
            return
        rows = m.embed_rows("per_layer_token_embd.weight", "ple_rows", scale=float(np.sqrt(np.float32(n))))
        proj = m.scaled(m.linear(x, "per_layer_model_proj.weight", "ple_proj"),
                        float(np.float32(1.0) / np.sqrt(np.float32(c.d_model))))
        m.norm(proj, "per_layer_proj_norm.weight", "ple_proj", out=proj, segment=n)
        m.per_layer_inputs = b.add(proj, rows, out=proj, post=float(np.float32(1.0) / np.sqrt(np.float32(2.0))))

    def build_layer(self, m, il: int, x):
        p, cfg = f"blk.{il}.", m.cfg
        h = m.norm(x, p + "attn_norm.weight", "attn_in")
        local = cfg.is_local(il)
        o = m.attention(h, il, qk_norm=True, window=cfg.window(il), rope_base=cfg.layer_rope_base(il),
                        freq_scale=cfg.layer_freq_scale(il), scale=cfg.attn_scale, v_norm=True,
                        factors=None if local else m.optional("rope_freqs.weight"))
        o = m.norm(o, p + "post_attention_norm.weight", "attn_out_normed", out=o)
        x = m.residual(x, o)
        f = moe_block(m, il, x) if cfg.moe_layer(il) else m.ffn(m.norm(x, p + "ffn_norm.weight", "ffn_in"), il)
        f = m.norm(f, p + "post_ffw_norm.weight", "ffn_out_normed", out=f)
        scale = layer_output_scale(m, il)
        if m.per_layer_inputs is None:
            return m.residual(x, f, post=scale)
        x = m.residual(x, f)
        n = cfg.per_layer_embd
        g = m.linear(x, p + "inp_gate.weight", "ple_gate")                      # F32 [T, n]
        mine = m.b.view(m.per_layer_inputs, "ple_in", cols=n, col_offset=il * n)
        g = m.b.gated_mul(g, mine, out=g, act=Activation.GELU_TANH)
        e = m.linear(g, p + "proj.weight", "ple_out")                            # F32 [T, d_model]
        e = m.norm(e, p + "post_norm.weight", "ple_out_normed", out=e)
        return m.residual(x, e, post=scale)


def moe_block(m, il: int, x):
    """A MoE layer's FFN (llama.cpp's gemma4 graph): its dense FFN on ffn_norm(x), normed by post_ffw_norm_1, plus
    its experts on pre_ffw_norm_2(x), normed by post_ffw_norm_2; routed from x RMS-normed times
    ffn_gate_inp.scale / sqrt(d_model) (one norm weight, the two factors folded)."""
    p, c = f"blk.{il}.", m.cfg
    scale = np.asarray(m.gguf.tensor(p + "ffn_gate_inp.scale").data, np.float32).reshape(-1)
    folded = scale * (np.float32(1.0) / np.sqrt(np.float32(c.d_model)))
    router_norm = m.constant(p + "ffn_gate_inp.scale.folded", folded)
    route = m.route(m.b.rms_norm(x, router_norm, c.norm_eps, "router_in"), il)
    dense = m.ffn(m.norm(x, p + "ffn_norm.weight", "ffn_in"), il, dense=True)
    dense = m.norm(dense, p + "post_ffw_norm_1.weight", "ffn_dense_normed", out=dense)
    experts = m.ffn(m.norm(x, p + "pre_ffw_norm_2.weight", "moe_in"), il, route=route)
    experts = m.norm(experts, p + "post_ffw_norm_2.weight", "moe_out_normed", out=experts)
    return m.b.add(dense, experts, out=dense)


def split_gate_up_experts(f, name: str, n: int) -> None:
    """blk.N.ffn_gate_up_exps ([n experts x (gate rows, then up rows), cols]) as ffn_gate_exps and ffn_up_exps:
    strided views of its bytes (no copy), and for the expert store where each expert's part starts in the file."""
    from ..gguf_file import GGUFTensor

    t = f.tensors.pop(name)
    f.fused[name] = t
    if n < 1 or t.rows % (2 * n):
        raise ModelFormatError(f"{f.path.name}: {name} has {t.rows} rows, not {n} experts of gate and up rows")
    ff = t.rows // (2 * n)
    data = np.asarray(t.data).reshape(n, 2 * ff, -1)
    start = f._ranges[name][0] if name in f._ranges else None
    for part, half in (("gate", 0), ("up", 1)):
        new = name.replace(".ffn_gate_up_exps.", f".ffn_{part}_exps.")
        if new in f.tensors:
            raise ModelFormatError(f"{f.path.name}: both {name} and {new} are present")
        view = data[:, half * ff:(half + 1) * ff]
        f.tensors[new] = GGUFTensor(new, t.type_name, t.cols, n * ff, view)
        if start is not None:
            f.expert_spans[new] = (start + half * ff * view.shape[-1] * view.itemsize, 2 * ff * view.shape[-1] *
                                   view.itemsize)


def layer_values(f, key: str, default: int | None = None) -> tuple[int, ...]:
    """A key llama.cpp reads as one value or one per layer, as one per layer (block_count of them; a list is kept as
    it is, its length checked by the caller). `default`: when the key is absent (None: required)."""
    v = f.require(key) if default is None else f.get(key, default)
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(int(x) for x in v)
    return (int(v),) * int(f.require(f.architecture + ".block_count"))


def layer_output_scale(m, il: int) -> float:
    """The layer's layer_output_scale (one value; 0: none)."""
    name = f"blk.{il}.layer_output_scale.weight"
    if name not in m.gguf.tensors:
        return 0.0
    v = np.asarray(m.gguf.tensor(name).data, np.float32).reshape(-1)
    if v.size != 1 or not np.isfinite(v[0]) or v[0] == 0:
        raise ModelFormatError(f"{name} must hold one finite, nonzero value")
    return float(v[0])


ARCH = Gemma4()
