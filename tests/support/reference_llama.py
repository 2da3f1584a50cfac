"""A numpy reference forward pass of the llama-family GGUF architectures pyinfer runs (llama incl. Llama 3.x
RoPE factors, gemma3, qwen2, qwen3, phi3): dequantized fp32 weights, fp32 activations and KV. The C++ engine
(Q8 activations, fp16 KV) must agree with it to quantization noise. Written from the architectures'
definitions (llama.cpp's src/models/*.cpp), independently of pyinfer's graph code: tensors are read with
gguf's own reader, fused tensors split here."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants

from pyinfer.model.arch import model_config
from pyinfer.model.gguf_file import GGUFModelFile

NEOX_ARCHS = {"gemma3", "qwen2", "qwen3", "phi3", "qwen2moe", "qwen3moe", "olmoe", "glm4moe", "gpt-oss", "smallthinker"}


def dequant(f: GGUFModelFile, name: str) -> np.ndarray:
    """A tensor as F32 (matrices [rows, cols], vectors flat), through pyinfer's reader (kept for other tests)."""
    t = f.tensor(name)
    a = quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name])
    return a.reshape(t.rows, t.cols).astype(np.float32) if t.rows > 1 else a.reshape(-1).astype(np.float32)


class Weights:
    """Every tensor of a file, dequantized on first use, read with gguf.GGUFReader."""

    def __init__(self, path):
        with open(path, "rb") as f:
            powerinfer = f.read(4) == b"PWRI"
        if powerinfer:  # PowerInfer's converter overwrites the magic; the layout is GGUF's: read a copy
            import tempfile

            data = bytearray(open(path, "rb").read())
            data[:4] = b"GGUF"
            tmp = tempfile.NamedTemporaryFile(suffix=".gguf", delete=False)
            tmp.write(data)
            tmp.close()
            path = tmp.name
        self._t = {t.name: t for t in GGUFReader(str(path)).tensors}
        self._cache: dict[str, np.ndarray] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._t

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._cache:
            t = self._t[name]
            a = quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
            shape = [int(n) for n in t.shape]  # ne[0] first
            self._cache[name] = a.reshape(shape[::-1]) if len(shape) > 1 else a.reshape(-1)
        return self._cache[name]


def rms_norm(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def rope(x, pos, heads, hd, base, neox=False, factors=None, freq_scale=1.0, attn_factor=1.0, n_rot=0, yarn=None):
    """Adjacent-pair rotation (GGML 'normal' mode), or halves (NEOX: i with i + hd/2). x: [T, heads*hd].
    Pair i turns by pos * base^(-2i/hd) * freq_scale / factors[i]; cos and sin are times attn_factor. `n_rot`:
    only each head's first n_rot values rotate (as a head of n_rot), the rest pass through. `yarn` (ext_factor,
    low, high): pair i turns by the unscaled angle's share ext * ramp(i) and the scaled one's rest, cos and sin
    times 1 + 0.1 ln(1 / freq_scale) too (ggml's rope_yarn)."""
    if n_rot and n_rot < hd:
        x3 = x.reshape(len(pos), heads, hd)
        r = rope(np.ascontiguousarray(x3[..., :n_rot]).reshape(len(pos), -1), pos, heads, n_rot, base, neox, factors,
                 freq_scale, attn_factor, yarn=yarn)
        return np.concatenate([r.reshape(len(pos), heads, n_rot), x3[..., n_rot:]], -1).reshape(len(pos), -1)
    if neox:  # the same rotation after moving element i + hd/2 next to element i
        xi = x.reshape(len(pos), heads, 2, hd // 2).transpose(0, 1, 3, 2).reshape(len(pos), heads * hd)
        r = rope(xi, pos, heads, hd, base, False, factors, freq_scale, attn_factor, yarn=yarn).reshape(
            len(pos), heads, hd // 2, 2)
        return r.transpose(0, 1, 3, 2).reshape(len(pos), heads * hd)
    x = x.reshape(len(pos), heads, hd // 2, 2)
    inv = base ** (-2.0 * np.arange(hd // 2) / hd)
    if factors is not None:
        inv = inv / np.asarray(factors, np.float64)
    if yarn is not None:
        ext, low, high = yarn
        ramp = 1 - np.clip((np.arange(hd // 2) - low) / max(0.001, high - low), 0, 1)
        inv = inv * freq_scale * (1 - ramp * ext) + inv * ramp * ext
        attn_factor = attn_factor * (1 + 0.1 * np.log(1 / freq_scale))
    else:
        inv = inv * freq_scale
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    cos = (np.cos(ang) * attn_factor)[:, None, :].astype(np.float32)
    sin = (np.sin(ang) * attn_factor)[:, None, :].astype(np.float32)
    x0, x1 = x[..., 0], x[..., 1]
    out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(len(pos), heads * hd)


def attention(q, k, v, heads, kv_heads, hd, window=0, scale=None, sinks=None):
    """Causal attention of T queries over T keys; a value head may be shorter than a key head (MLA)."""
    T = q.shape[0]
    vd = v.shape[1] // kv_heads
    q = q.reshape(T, heads, hd)
    k = k.reshape(T, kv_heads, hd)
    v = v.reshape(T, kv_heads, vd)
    group = heads // kv_heads
    out = np.zeros((T, heads, vd), np.float32)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    if window:  # query i sees keys i - window + 1 .. i
        mask = mask + np.tril(np.full((T, T), -np.inf, dtype=np.float32), -window)
    for h in range(heads):
        s = q[:, h] @ k[:, h // group].T * (hd ** -0.5 if scale is None else scale) + mask
        if sinks is not None:  # gpt-oss: one more logit per head in the softmax, with no value
            s = np.concatenate([s, np.full((T, 1), sinks[h], np.float32)], 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (p / p.sum(-1, keepdims=True))[:, :T] @ v[:, h // group]
    return out.reshape(T, heads * vd)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gated_act(act, g):
    """The gate's activation, from the model's Activation (SiLU, ReLU or GELU-tanh)."""
    from pyinfer.model.config import Activation

    if act == Activation.GELU_TANH:
        return gelu_tanh(g)
    if act == Activation.RELU:
        return np.maximum(g, 0)
    assert act == Activation.SILU, act
    return g / (1 + np.exp(-g))


def swiglu_oai(g, u):
    """gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7)."""
    x = np.minimum(g, 7.0)
    return x / (1 + np.exp(-1.702 * x)) * (np.clip(u, -7.0, 7.0) + 1)


def head_norm(x, w, heads, eps):
    """RMS norm of each head on its own (Gemma 3's and Qwen 3's QK-norm). x: [T, heads*hd]."""
    T = x.shape[0]
    return rms_norm(x.reshape(T, heads, -1), w, eps).reshape(T, -1)


def latent_attention(h, W, p, c, meta, pos, eps, cache=lambda a: a):
    """DeepSeek-V2's multi-head latent attention in its textbook form (the paper's, and Hugging Face's): q (direct or
    through q_a, its norm and q_b), each head's [nope | rope]; the token's latent (normed) and one shared rotary key;
    each head's key [latent @ k_b | rotary key] and value latent @ v_b; softmax scale (1 + 0.1 mscale_all_dim
    ln factor)^2 / sqrt(head), the rotation's own magnitude 1 (DeepSeek-V2's mscale equals its mscale_all_dim)."""
    T, H, hd, r, rank = h.shape[0], c.n_heads, c.head_dim, c.rope_dims, c.kv_lora_rank
    nope = hd - r
    if p + "attn_q_a.weight" in W:
        q = rms_norm(h @ W[p + "attn_q_a.weight"].T, W[p + "attn_q_a_norm.weight"], eps) @ W[p + "attn_q_b.weight"].T
    else:
        q = h @ W[p + "attn_q.weight"].T
    q = q.reshape(T, H, hd)
    kv = h @ W[p + "attn_kv_a_mqa.weight"].T
    latent = cache(rms_norm(kv[:, :rank], W[p + "attn_kv_a_norm.weight"], eps))
    factor = float(meta.get("deepseek2.rope.scaling.factor", 0.0) or 0.0)
    yarn, fs, af, scale = None, 1.0, 1.0, hd ** -0.5
    if meta.get("deepseek2.rope.scaling.type") == "yarn" and factor > 1:
        fs = 1.0 / factor
        af = 1.0 / (1 + 0.1 * np.log(factor))  # cancels rope()'s YaRN magnitude: cos and sin stay unit
        yarn = (c.rope_ext_factor, c.rope_yarn_low, c.rope_yarn_high)
        m_all = float(meta.get("deepseek2.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        scale = scale * (1 + 0.1 * m_all * np.log(factor)) ** 2
    q_pe = rope(np.ascontiguousarray(q[..., nope:]).reshape(T, -1), pos, H, r, c.rope_base, False, None, fs, af,
                yarn=yarn).reshape(T, H, r)
    k_pe = cache(rope(kv[:, rank:], pos, 1, r, c.rope_base, False, None, fs, af, yarn=yarn))
    kb, vb = W[p + "attn_k_b.weight"], W[p + "attn_v_b.weight"]          # [H, rank, nope], [H, v, rank]
    k = np.concatenate([np.einsum("tr,hrn->thn", latent, kb), np.broadcast_to(k_pe[:, None, :], (T, H, r))], -1)
    v = np.einsum("tr,hvr->thv", latent, vb)
    q = np.concatenate([q[..., :nope], q_pe], -1)
    o = attention(q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1), H, H, hd, scale=scale)
    return o @ W[p + "attn_output.weight"].T


def moe(h, W, p, act, k, norm, margins=None, cuts=None, kept=None, sigmoid=False, scale=0.0, oai=False,
        groups=(0, 0), router_in=None):
    """A Mixture-of-Experts FFN (llama.cpp's build_moe_ffn with softmax gating): each token's top k experts by
    softmax probability, their probabilities as weights (divided by their sum with `norm`); Qwen2-MoE's shared
    expert times the sigmoid of its gate. W's merged experts are [n_expert, rows, cols]. `cuts` ([n_expert]):
    CATS inside the experts, a neuron of expert e counts only where |act(gate)| > cuts[e] (`kept`, a list,
    gets the share that did, per token and slot)."""
    logits = (h if router_in is None else router_in) @ W[p + "ffn_gate_inp.weight"].T  # [T, n_expert]
    if oai:  # gpt-oss: a biased router, the top k logits softmaxed among themselves, biased experts
        logits = logits + W[p + "ffn_gate_inp.bias"]
        chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        top = np.take_along_axis(logits, chosen, -1)
        if margins is not None and k < logits.shape[1]:
            ranked = -np.sort(-logits, -1)
            margins.append(ranked[:, k - 1] - ranked[:, k])  # a near tie of logits: noise may choose either
        weights = np.exp(top - top[:, :1])
        weights /= weights.sum(-1, keepdims=True)
        B = {part: W[p + f"ffn_{part}_exps.bias"] for part in ("gate", "up", "down")}
        G, U, D = W[p + "ffn_gate_exps.weight"], W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
        y = np.zeros_like(h)
        for t in range(h.shape[0]):
            for s in range(k):
                e = chosen[t, s]
                a = swiglu_oai(G[e] @ h[t] + B["gate"][e], U[e] @ h[t] + B["up"][e])
                y[t] += weights[t, s] * (D[e] @ a + B["down"][e])
        return y
    if sigmoid:
        probs = 1 / (1 + np.exp(-logits))
    else:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
    select = probs + W[p + "exp_probs_b.bias"] if p + "exp_probs_b.bias" in W else probs  # GLM: bias picks only
    if groups[0] > 1:  # DeepSeek-V3: only the experts of the groups whose two best selections sum highest
        g = select.reshape(len(h), groups[0], -1)
        best = np.argsort(-np.sort(g, -1)[..., -2:].sum(-1), -1, kind="stable")[:, :groups[1]]
        keep = np.zeros(g.shape[:2], bool)
        np.put_along_axis(keep, best, True, 1)
        select = np.where(keep[..., None], g, -np.inf).reshape(len(h), -1)
    order = np.argsort(-select, axis=-1, kind="stable")
    chosen = order[:, :k]                                                   # [T, k]
    if margins is not None and k < probs.shape[1]:  # how near each token's routing came to another choice
        ranked = np.take_along_axis(select, order, -1)
        margins.append(ranked[:, k - 1] - ranked[:, k])
    weights = np.take_along_axis(probs, chosen, -1)
    if norm:
        weights = weights / np.maximum(weights.sum(-1, keepdims=True), 6.103515625e-5)
    if scale:
        weights = weights * scale
    G, U, D = W[p + "ffn_gate_exps.weight"], W[p + "ffn_up_exps.weight"], W[p + "ffn_down_exps.weight"]
    y = np.zeros_like(h)
    for t in range(h.shape[0]):
        for s in range(k):
            e = chosen[t, s]
            a = gated_act(act, G[e] @ h[t])
            if cuts is not None:
                on = np.abs(a) > cuts[e]
                a = np.where(on, a, 0)
                if kept is not None:
                    kept.append(on.mean())
            y[t] += weights[t, s] * ((a * (U[e] @ h[t])) @ D[e].T)
    if p + "ffn_gate_shexp.weight" in W:
        shared = (gated_act(act, h @ W[p + "ffn_gate_shexp.weight"].T) * (h @ W[p + "ffn_up_shexp.weight"].T))
        gate = 1.0
        if p + "ffn_gate_inp_shexp.weight" in W:  # Qwen2-MoE's sigmoid gate; Granite's shared expert has none
            gate = (1 / (1 + np.exp(-(h @ W[p + "ffn_gate_inp_shexp.weight"]))))[:, None]
        y += gate * (shared @ W[p + "ffn_down_shexp.weight"].T)
    return y


def reference_logits(f: GGUFModelFile, tokens: list[int], n_ctx: int = 0, margins: list | None = None,
                     expert_cuts: np.ndarray | None = None, kept: list | None = None, input_cut=None,
                     cache_fp16: bool = False) -> np.ndarray:
    """F32 [len(tokens), vocab]. Per architecture:
      gemma3: embeddings times sqrt(d_model), QK-norm, five sliding-window layers (RoPE base 10000) per global
        one, norms after attention and after the FFN, GELU(tanh) gating;
      qwen2: q/k/v biases; qwen3: QK-norm; phi3: fused qkv and gate-up, LongRoPE factors (short below the
        original context, `n_ctx` deciding), cos/sin times rope.scaling.attn_factor;
      llama: rope_freqs.weight divides each pair's frequency when present;
      qwen3moe: qwen3's attention; qwen2moe: qwen2's, and the shared expert; Mixtral (llama with experts),
        qwen3moe and qwen2moe: a Mixture of Experts FFN, weights renormalized except qwen2moe's;
      glm4moe: q/k/v biases, per-head QK-norm, partial NEOX RoPE, post_attention_norm before the FFN, leading
        dense layers, sigmoid routing chosen with exp_probs_b, renormalized and scaled, an ungated shared expert;
      olmoe: q and k RMS-normed as whole rows, experts not renormalized; granitemoe: embeddings times
        embedding_scale, q.k times attention.scale, each residual branch times residual_scale, logits divided by
        logit_scale, experts renormalized, an ungated shared expert;
      all but llama rotate NEOX pairs.
    `margins` (a list): each MoE layer appends, per token, the gap between its k-th and (k+1)-th expert
    probability (a routing so near a tie that noise may choose the other expert). `expert_cuts` ([n_layers,
    n_expert]): each MoE layer cuts its experts' neurons as moe() says (`kept` collects the shares kept).
    `input_cut(layer, site, x, gate=None) -> x`: an input-sparse plan's view of each projection input (attn_in,
    attn_out, ffn_in, ffn_mid; the last also given the gate's pre-activation). `cache_fp16`: keys and values rounded
    to fp16 as the engine's KV cache holds them (models whose un-normed router amplifies that rounding:
    SmallThinker's)."""
    if f.architecture in ("qwen35", "qwen35moe", "qwen3next"):  # linear-attention layers: their own reference
        from .reference_recurrent import qwen35_logits

        return qwen35_logits(f, tokens, margins)
    if input_cut is None:
        def input_cut(il, site, x, gate=None):
            return x
    c = model_config(f)
    arch = f.architecture
    W = Weights(f.path)
    gemma = arch == "gemma3"
    neox = arch in NEOX_ARCHS
    meta = f.metadata
    factors = None
    if "rope_freqs.weight" in W:
        factors = W["rope_freqs.weight"]
    if arch == "phi3":
        orig = int(meta.get("phi3.rope.scaling.original_context_length", c.train_ctx))
        name = "rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight"
        factors = W[name] if name in W else None
    attn_factor = float(meta.get(f"{arch}.rope.scaling.attn_factor", 1.0))
    # Linear scaling (llama.cpp: the type defaults to linear); Gemma 3 scales its global layers only.
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0)
    scaled = meta.get(f"{arch}.rope.scaling.type", "linear") == "linear" and factor > 0
    freq_scale = 1.0 / factor if scaled else 1.0
    embed = W["token_embd.weight"]
    pos = np.arange(len(tokens))
    x = embed[tokens] * (np.float32(np.sqrt(c.d_model)) if gemma else 1)
    granite = arch == "granitemoe"
    if granite:
        x = x * float(meta.get("granitemoe.embedding_scale", 1.0))
    rs = float(meta.get("granitemoe.residual_scale", 1.0)) if granite else 1.0
    attn_scale = float(meta["granitemoe.attention.scale"]) if granite and "granitemoe.attention.scale" in meta else None
    qw, kvw = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

    def lin(h, p, name):
        y = h @ W[p + name + ".weight"].T
        return y + W[p + name + ".bias"] if p + name + ".bias" in W else y

    oss = arch == "gpt-oss"
    deepseek = arch == "deepseek2"

    def cache(a):
        return a.astype(np.float16).astype(np.float32) if cache_fp16 else a

    yarn = None
    if meta.get(f"{arch}.rope.scaling.type") == "yarn":
        freq_scale = 1.0 / float(meta[f"{arch}.rope.scaling.factor"])
        yarn = (c.rope_ext_factor, c.rope_yarn_low, c.rope_yarn_high)
    small = arch == "smallthinker"
    small_swa = small and int(meta.get("smallthinker.attention.sliding_window", 0)) > 0
    for il in range(c.n_layers):
        p = f"blk.{il}."
        layer_in = x  # SmallThinker routes the layer's input, before attention
        local = gemma and (il + 1) % 6 != 0
        base = 10000.0 if local else c.rope_base
        h = input_cut(il, "attn_in", rms_norm(x, W[p + "attn_norm.weight"], c.norm_eps))
        if deepseek:  # its own attention below
            q = k = v = None
        elif p + "attn_qkv.weight" in W:
            qkv = lin(h, p, "attn_qkv")
            q, k, v = qkv[:, :qw], qkv[:, qw:qw + kvw], qkv[:, qw + kvw:]
        else:
            q, k, v = lin(h, p, "attn_q"), lin(h, p, "attn_k"), lin(h, p, "attn_v")
        if gemma or arch in ("qwen3", "qwen3moe") or (arch == "glm4moe" and p + "attn_q_norm.weight" in W):
            q = head_norm(q, W[p + "attn_q_norm.weight"], c.n_heads, c.norm_eps)
            k = head_norm(k, W[p + "attn_k_norm.weight"], c.n_kv_heads, c.norm_eps)
        if arch == "olmoe":
            q = rms_norm(q, W[p + "attn_q_norm.weight"], c.norm_eps)
            k = rms_norm(k, W[p + "attn_k_norm.weight"], c.norm_eps)
        fs = 1.0 if local else freq_scale
        n_rot = int(meta.get(f"{arch}.rope.dimension_count", c.head_dim))
        if not deepseek and not (small_swa and il % 4 == 0 and c.n_layers != 4):  # SmallThinker's global: NoPE
            q = rope(q, pos, c.n_heads, c.head_dim, base, neox, factors, fs, attn_factor, n_rot, yarn)
            k = rope(k, pos, c.n_kv_heads, c.head_dim, base, neox, factors, fs, attn_factor, n_rot, yarn)
        window = int(meta.get("gemma3.attention.sliding_window", 0)) if local else 0
        if oss and il % 2 == 0:  # gpt-oss: the even layers slide
            window = int(meta["gpt-oss.attention.sliding_window"])
        if cache_fp16 and not deepseek:
            k, v = cache(k), cache(v)
        o = lin(input_cut(il, "attn_out", attention(q, k, v, c.n_heads, c.n_kv_heads, c.head_dim, window,
                                                     attn_scale, W[p + "attn_sinks.weight"] if oss else None)),
                p, "attn_output") if not deepseek else latent_attention(h, W, p, c, meta, pos, c.norm_eps, cache)
        if gemma:
            o = rms_norm(o, W[p + "post_attention_norm.weight"], c.norm_eps)
        x = x + rs * o
        ffn_norm = "post_attention_norm" if arch in ("glm4moe", "gpt-oss") else "ffn_norm"  # their FFN norm's name
        h = input_cut(il, "ffn_in", rms_norm(x, W[p + ffn_norm + ".weight"], c.norm_eps))
        if p + "ffn_gate_inp.weight" in W:
            k = int(meta[f"{arch}.expert_used_count"])
            glm = arch in ("glm4moe", "deepseek2")  # the keys llama.cpp reads for both
            norm = bool(meta.get(f"{arch}.expert_weights_norm", False)) if glm else arch not in ("qwen2moe", "olmoe")
            sigmoid = (glm or small) and int(meta.get(f"{arch}.expert_gating_func", 2)) == 2
            groups = (int(meta.get(f"{arch}.expert_group_count", 0)), int(meta.get(f"{arch}.expert_group_used_count", 0)))
            x = x + rs * moe(h, W, p, c.activation, k, norm=norm, margins=margins,
                             cuts=None if expert_cuts is None else expert_cuts[il], kept=kept, sigmoid=sigmoid,
                             scale=float(meta.get(f"{arch}.expert_weights_scale", 0.0)) if glm else 0.0, oai=oss,
                             groups=groups, router_in=layer_in if small else None)
            continue
        if arch == "phi3" and p + "ffn_gate.weight" not in W:  # gate rows first, then up
            gu = h @ W[p + "ffn_up.weight"].T
            g, u = gu[:, :c.d_ff], gu[:, c.d_ff:]
        else:
            g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        down = W[p + "ffn_down.weight"] if p + "ffn_down.weight" in W else W[p + "ffn_down_t.weight"].T  # PowerInfer
        y = input_cut(il, "ffn_mid", gated_act(c.activation, g) * u, g) @ down.T
        if gemma:
            y = rms_norm(y, W[p + "post_ffw_norm.weight"], c.norm_eps)
        x = x + y
    h = rms_norm(x, W["output_norm.weight"], c.norm_eps)
    head = embed if c.tied_output else W["output.weight"]
    return (h @ head.T) / (float(meta["granitemoe.logit_scale"]) if granite else 1.0)
