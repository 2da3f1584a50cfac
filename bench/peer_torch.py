"""The GPU peer when llama.cpp's CUDA build is not at hand: the same GGUF in PyTorch, decoding with a KV cache,
fp16 on the GPU, its blocks that do not go on the GPU either

  * "accelerate": offloaded by accelerate (`dispatch_model` with a device map: weights kept in CPU RAM and
    copied to the GPU for each use, Hugging Face's way of running a model larger than VRAM), or
  * "layers": computed on the CPU in fp32 (llama.cpp's -ngl: the first blocks on the GPU, the rest on the CPU).

The embeddings, the head and the KV cache stay on the GPU. Q4_0, Q4_1 and Q8_0 weights are dequantized by torch
where they will live (seconds for a 7B model on a GPU); other types through gguf's numpy code. Without a GPU
(device "cpu") every block runs on the CPU, which checks the math against pyinfer anywhere:

    python bench/peer_torch.py -m smollm2 --device cpu --tokens 8
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from torch import nn

BLOCK_PARTS = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
               "ffn_down")
# bytes per block of 32: (scale and offset fp16 halves, quant bytes)
_TORCH_BLOCKS = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


def dequant(t, device, dtype, rows_per_chunk: int = 4096) -> torch.Tensor:
    """`dtype` [rows, cols] (or [cols]) of GGUF tensor `t`, dequantized on `device`."""
    shape = (t.rows, t.cols) if t.rows > 1 else (t.cols,)
    if t.type_name in ("F32", "F16", "BF16"):
        return torch.from_numpy(np.array(t.data)).to(device, dtype).reshape(shape)
    if t.type_name not in _TORCH_BLOCKS:  # K-quants and the rest: gguf's numpy decoder
        from gguf import GGMLQuantizationType, quants

        w = quants.dequantize(np.asarray(t.data), GGMLQuantizationType[t.type_name])
        return torch.from_numpy(w.astype(np.float32)).to(device, dtype).reshape(shape)
    nb = _TORCH_BLOCKS[t.type_name]
    raw = np.asarray(t.data).reshape(t.rows, -1)
    out = torch.empty((t.rows, t.cols), dtype=dtype, device=device)
    for r0 in range(0, t.rows, rows_per_chunk):
        b = torch.from_numpy(np.array(raw[r0:r0 + rows_per_chunk])).to(device).view(-1, nb)
        d = b[:, :2].contiguous().view(torch.float16).float()                     # [blocks, 1]
        if t.type_name == "Q8_0":
            v = b[:, 2:].contiguous().view(torch.int8).float() * d
        else:
            q = b[:, nb - 16:]
            v = torch.cat((q & 15, q >> 4), dim=1).float()                         # [blocks, 32]
            v = (v - 8) * d if t.type_name == "Q4_0" else v * d + b[:, 2:4].contiguous().view(torch.float16).float()
        out[r0:r0 + rows_per_chunk] = v.reshape(-1, t.cols).to(dtype)
    return out.reshape(shape)


def rms(x, w, eps):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class Block(nn.Module):
    """One transformer layer; forward() is one token at position `pos`, its K/V written into the caches."""

    def __init__(self, gguf, il: int, device, dtype, activation: str):
        super().__init__()
        self.activation = activation
        for name in BLOCK_PARTS:
            w = dequant(gguf.tensor(f"blk.{il}.{name}.weight"), device, dtype)
            self.register_parameter(name, nn.Parameter(w, requires_grad=False))

    def forward(self, x, cos, sin, pos: torch.Tensor, k_cache, v_cache, cfg):
        # x: [1, d]; cos/sin: [1, hd / 2] of this position; caches: [n_ctx, kv_heads, hd]
        from pyinfer.train.torch_llama import rope

        dev, dt = self.attn_q.device, self.attn_q.dtype
        x, cos, sin = x.to(dev, dt), cos.to(dev, dt), sin.to(dev, dt)
        h = rms(x, self.attn_norm, cfg.norm_eps)
        q = rope((h @ self.attn_q.T).view(1, 1, cfg.n_heads, cfg.head_dim), cos, sin)[0, 0]  # [heads, hd]
        k = rope((h @ self.attn_k.T).view(1, 1, cfg.n_kv_heads, cfg.head_dim), cos, sin)[0, 0]
        v = (h @ self.attn_v.T).view(cfg.n_kv_heads, cfg.head_dim)
        n = int(pos) + 1
        k_cache[n - 1] = k.to(k_cache.device, k_cache.dtype)
        v_cache[n - 1] = v.to(v_cache.device, v_cache.dtype)
        rep = cfg.n_heads // cfg.n_kv_heads
        ks = k_cache[:n].to(dev, dt).repeat_interleave(rep, dim=1)                  # [n, heads, hd]
        vs = v_cache[:n].to(dev, dt).repeat_interleave(rep, dim=1)
        att = torch.softmax(torch.einsum("hd,nhd->hn", q, ks).float() / cfg.head_dim ** 0.5, dim=-1).to(dt)
        x = x + torch.einsum("hn,nhd->hd", att, vs).reshape(1, -1) @ self.attn_output.T
        h = rms(x, self.ffn_norm, cfg.norm_eps)
        g = h @ self.ffn_gate.T
        g = torch.relu(g) if self.activation == "relu" else nn.functional.silu(g)
        return x + (g * (h @ self.ffn_up.T)) @ self.ffn_down.T


class Peer:
    """A GGUF llama model in torch, the first `gpu_blocks` blocks on the GPU, the rest as `mode` says."""

    def __init__(self, path: str, device: str, n_ctx: int, gpu_blocks: int, mode: str):
        from pyinfer.model.arch import model_config, open_model

        self.gguf = gguf = open_model(path)
        cfg = self.cfg = model_config(gguf)
        if gguf.architecture != "llama" or cfg.post_norms or cfg.qk_norm:
            raise SystemExit(f"the torch peer runs llama models; this one is {gguf.architecture}")
        self.activation = gguf.get("pyinfer.ffn_activation") or "silu"
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.embed = dequant(gguf.tensor("token_embd.weight"), self.device, self.dtype)      # [vocab, d]
        self.head = self.embed if cfg.tied_output else dequant(gguf.tensor("output.weight"), self.device, self.dtype)
        self.out_norm = dequant(gguf.tensor("output_norm.weight"), self.device, self.dtype)
        inv = cfg.rope_base ** (-2.0 * np.arange(cfg.head_dim // 2) / cfg.head_dim)
        self.inv_freq = torch.tensor(inv, dtype=torch.float64)
        n = cfg.n_layers
        self.gpu_blocks = min(gpu_blocks, n) if self.device.type == "cuda" else 0
        self.mode = mode
        # Each block's KV cache where it computes: a CPU block of the layers mode keeps its own on the CPU
        # (as llama.cpp's -ngl), the others on the GPU.
        shape = (n_ctx, cfg.n_kv_heads, cfg.head_dim)
        on_cpu = [il >= self.gpu_blocks and mode == "layers" for il in range(n)]
        self.k = [torch.zeros(shape, dtype=torch.float32 if c else self.dtype, device="cpu" if c else self.device)
                  for c in on_cpu]
        self.v = [torch.zeros_like(k) for k in self.k]
        blocks = []
        for il in range(n):
            on_gpu = il < self.gpu_blocks
            dev = self.device if on_gpu else torch.device("cpu")
            dt = self.dtype if on_gpu or mode == "accelerate" else torch.float32
            blocks.append(Block(self.gguf, il, dev, dt, self.activation))
        self.blocks = nn.ModuleList(blocks)
        if mode == "accelerate" and self.device.type == "cuda" and self.gpu_blocks < n:
            from accelerate import dispatch_model

            gpu = self.device.index or 0
            dispatch_model(self.blocks, device_map={str(il): gpu if il < self.gpu_blocks else "cpu" for il in range(n)},
                           main_device=gpu)

    @torch.no_grad()
    def step(self, token: int, pos: int) -> torch.Tensor:
        """Logits F32 [vocab] after `token` at `pos`."""
        ang = (pos * self.inv_freq)[None, :]
        cos, sin = ang.cos().float(), ang.sin().float()
        x = self.embed[token][None, :] * (self.cfg.embed_scale or 1.0)
        p = torch.tensor(pos)
        for il, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, p, self.k[il], self.v[il], self.cfg)
        x = x.to(self.device, self.dtype)
        return (rms(x, self.out_norm, self.cfg.norm_eps) @ self.head.T)[0].float()


def timed(peer: Peer, prompt: list[int], tokens: int, warmup: int = 4) -> float:
    """Seconds for `tokens` greedy decode steps after the prompt and `warmup` untimed steps."""
    logits, pos = None, 0
    for t in prompt:
        logits, pos = peer.step(t, pos), pos + 1
    for i in range(warmup + tokens):
        if i == warmup:
            if peer.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        logits, pos = peer.step(int(torch.argmax(logits)), pos), pos + 1
    if peer.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def check(peer: Peer, want: np.ndarray, prompt: list[int]) -> dict:
    """The peer's logits after the prompt against pyinfer's CPU logits `want`, once before timing."""
    for pos, t in enumerate(prompt):
        got = peer.step(t, pos)
    got = got.cpu().numpy()
    return {"max_abs_diff_over_scale": float(np.abs(got - want).max() / np.abs(want).max()),
            "same_top1": bool(np.argmax(got) == np.argmax(want))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="GGUF file or named model (default: SmolLM2)")
    ap.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    ap.add_argument("--mode", choices=["accelerate", "layers"], default="layers")
    ap.add_argument("--gpu-share", type=float, default=0.5, help="share of the blocks on the GPU (default 0.5)")
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    import pyinfer

    model = pyinfer.load(args.model, n_threads=2, n_ctx=256, progress=False)
    prompt = model.tokenize("Once upon a time")
    peer = Peer(model.path, args.device, 256, round(args.gpu_share * model.config.n_layers), args.mode)
    print(check(peer, model.eval(prompt), prompt))
    print(f"{args.tokens / timed(peer, prompt, args.tokens):.1f} tok/s ({args.mode}, {peer.gpu_blocks}/"
          f"{model.config.n_layers} blocks on {args.device})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
