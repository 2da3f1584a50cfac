"""A numpy reference of Gemma 4's forward pass (llama.cpp's src/models/gemma4.cpp), read from the file's own keys and
tensors: fp32 weights and activations, an fp32 KV cache (or fp16-rounded with cache_fp16)."""
from __future__ import annotations

import numpy as np

from .reference_llama import Weights, attention, gelu_tanh, head_norm, rms_norm, rope


def experts(W, p: str, x, h, k: int, d: int, eps: float) -> np.ndarray:
    """The MoE half of a layer: routed from x (RMS-normed, over sqrt(d), times the router's scale), softmax top k
    renormalized, each chosen expert's GELU FFN on h times its output scale, weighted and summed."""
    router_in = rms_norm(x, 1.0, eps) / np.float32(np.sqrt(d)) * W[p + "ffn_gate_inp.scale"]
    logits = router_in @ W[p + "ffn_gate_inp.weight"].T
    n = logits.shape[1]
    if p + "ffn_gate_up_exps.weight" in W:
        fused = W[p + "ffn_gate_up_exps.weight"].reshape(n, 2, -1, h.shape[1])
        gate, up = fused[:, 0], fused[:, 1]
    else:
        gate = W[p + "ffn_gate_exps.weight"].reshape(n, -1, h.shape[1])
        up = W[p + "ffn_up_exps.weight"].reshape(n, -1, h.shape[1])
    down = W[p + "ffn_down_exps.weight"].reshape(n, d, -1)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        prob = np.exp(logits[t] - logits[t].max())
        prob /= prob.sum()
        chosen = np.argsort(-prob, kind="stable")[:k]
        weights = prob[chosen] / prob[chosen].sum()
        for e, wgt in zip(chosen, weights):
            y = down[e] @ (gelu_tanh(gate[e] @ h[t]) * (up[e] @ h[t]))
            out[t] += wgt * W[p + "ffn_down_exps.scale"][e] * y
    return out


def gemma4_logits(f, tokens: list[int], cache_fp16: bool = False) -> np.ndarray:
    """Logits of every position, F32 [T, vocab]; `f` a GGUFModelFile."""
    meta, W = f.metadata, Weights(f.path)
    g = "gemma4."
    L, d = int(meta[g + "block_count"]), int(meta[g + "embedding_length"])
    heads, eps = int(meta[g + "attention.head_count"]), float(meta[g + "attention.layer_norm_rms_epsilon"])
    kv_heads = [int(v) for v in meta[g + "attention.head_count_kv"]]
    local = [bool(v) for v in meta[g + "attention.sliding_window_pattern"]]
    hd_full, hd_local = int(meta[g + "attention.key_length"]), int(meta[g + "attention.key_length_swa"])
    rot_full, rot_local = int(meta[g + "rope.dimension_count"]), int(meta[g + "rope.dimension_count_swa"])
    base, base_local = float(meta[g + "rope.freq_base"]), float(meta[g + "rope.freq_base_swa"])
    window, shared = int(meta[g + "attention.sliding_window"]), int(meta.get(g + "attention.shared_kv_layers", 0))
    n_pl, cap = int(meta.get(g + "embedding_length_per_layer_input", 0)), float(meta.get(g + "final_logit_softcapping",
                                                                                          30.0))
    kv_from = L - shared
    k_used = int(meta.get(g + "expert_used_count", 0))
    T, pos = len(tokens), np.arange(len(tokens))
    x = W["token_embd.weight"][tokens] * np.float32(np.sqrt(d))
    if n_pl:
        rows = W["per_layer_token_embd.weight"][tokens] * np.float32(np.sqrt(n_pl))
        proj = (x @ W["per_layer_model_proj.weight"].T) / np.float32(np.sqrt(d))
        proj = rms_norm(proj.reshape(T, L, n_pl), W["per_layer_proj_norm.weight"], eps).reshape(T, L * n_pl)
        per_layer = (proj + rows) / np.float32(np.sqrt(2.0))

    def cache(a):
        return a.astype(np.float16).astype(np.float32) if cache_fp16 else a

    kv = {}
    for il in range(L):
        p = f"blk.{il}."
        hd = hd_local if local[il] else hd_full
        rot = rot_local if local[il] else rot_full
        b = base_local if local[il] else base
        factors = None if local[il] else W["rope_freqs.weight"]
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)
        q = rope(head_norm(h @ W[p + "attn_q.weight"].T, W[p + "attn_q_norm.weight"], heads, eps), pos, heads, hd, b,
                 neox=True, factors=factors, n_rot=rot)
        if il < kv_from:
            k_raw = h @ W[p + "attn_k.weight"].T
            v = k_raw if p + "attn_v.weight" not in W else h @ W[p + "attn_v.weight"].T
            v = head_norm(v, np.ones(hd, np.float32), kv_heads[il], eps)
            k = rope(head_norm(k_raw, W[p + "attn_k_norm.weight"], kv_heads[il], eps), pos, kv_heads[il], hd, b,
                     neox=True, factors=factors, n_rot=rot)
            kv[il] = (cache(k), cache(v))
        k, v = kv[il if il < kv_from else kv_from - (2 if local[il] else 1)]
        o = attention(q, k, v, heads, kv_heads[il], hd, window if local[il] else 0, scale=1.0)
        x = x + rms_norm(o @ W[p + "attn_output.weight"].T, W[p + "post_attention_norm.weight"], eps)
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        f_ = (gelu_tanh(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        if p + "ffn_gate_inp.weight" in W:
            f_ = rms_norm(f_, W[p + "post_ffw_norm_1.weight"], eps) + rms_norm(
                experts(W, p, x, rms_norm(x, W[p + "pre_ffw_norm_2.weight"], eps), k_used, d, eps),
                W[p + "post_ffw_norm_2.weight"], eps)
        x = x + rms_norm(f_, W[p + "post_ffw_norm.weight"], eps)
        if n_pl:
            e = gelu_tanh(x @ W[p + "inp_gate.weight"].T) * per_layer[:, il * n_pl:(il + 1) * n_pl]
            x = x + rms_norm(e @ W[p + "proj.weight"].T, W[p + "post_norm.weight"], eps)
        if p + "layer_output_scale.weight" in W:
            x = x * W[p + "layer_output_scale.weight"][0]
    head = W["output.weight"] if "output.weight" in W else W["token_embd.weight"]
    logits = rms_norm(x, W["output_norm.weight"], eps) @ head.T
    return np.tanh(logits / cap) * cap if cap else logits
