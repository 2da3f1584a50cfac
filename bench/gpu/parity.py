"""CPU against GPU on one model, position by position, and where a GPU decode step's time goes.

Teacher-forced: both engines see the CPU's greedy tokens, so one near-tie cannot send them down different
paths. Prefill (every logit of a prompt in one run) and decode (one token a run, the path decode graphs
replay) are compared separately: each position's largest |difference| over the CPU's largest |logit|, and
whether the top token agrees. Then the GPU's decode is timed with op timing on (each op waited for: a
breakdown, not a speed) and without (the speed). One JSON object on stdout.

    python -P bench/gpu/parity.py -m MODEL [--device cuda] [--vram-budget 4G] [--tokens 48]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

PROMPT = "Once upon a time there was a little girl who lived in a village near the forest."


def compare(want: np.ndarray, got: np.ndarray) -> dict:
    """want, got: F32 [positions, vocab]."""
    rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    top = got.argmax(axis=1) == want.argmax(axis=1)
    # how far apart the CPU's two best logits are, over the logits' scale: a flip there is a near-tie
    srt = np.sort(want, axis=1)
    margin = (srt[:, -1] - srt[:, -2]) / np.abs(want).max(axis=1)
    return {"max_rel": float(rel.max()), "median_rel": float(np.median(rel)), "top1_agree": float(top.mean()),
            "disagree_at": [int(i) for i in np.flatnonzero(~top)][:8],
            "margin_at_disagreements": [round(float(m), 5) for m in margin[~top][:8]]}


def decode_logits(m, ids: list[int]) -> np.ndarray:
    """Logits after each of ids[1:], fed one token a run after a one-token first run: F32 [len(ids), vocab]."""
    out = [m.forward(ids[:1], 0, np.array([0]))[0]]
    for i in range(1, len(ids)):
        out.append(m.forward(ids[i:i + 1], i, np.array([0]))[0])
    return np.stack(out)


def kernel_profile(fn, steps: int) -> dict:
    """The device's kernels while fn() runs `steps` decode steps, through torch's profiler (CUPTI sees every
    kernel of the process, ours and those a CUDA graph replays): per step, the busy time against the wall."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        return {"error": f"no torch profiler: {e}"}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wall, _ = fn()
    kernels = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    busy_us = sum(e.device_time_total for e in kernels)
    return {"wall_ms_per_step": 1e3 * wall, "busy_ms_per_step": busy_us / 1e3 / steps,
            "top": [{"name": e.key[:90], "calls_per_step": e.count / steps,
                     "ms_per_step": round(e.device_time_total / 1e3 / steps, 4)} for e in kernels[:15]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vram-budget", default="4G")
    ap.add_argument("--tokens", type=int, default=48, help="greedy tokens after the prompt (default 48)")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    import pyinfer

    cpu = pyinfer.load(args.model, n_threads=args.threads, n_ctx=256, progress=False)
    gpu = pyinfer.load(args.model, n_threads=args.threads, n_ctx=256, progress=False, device=args.device,
                       vram_budget=args.vram_budget)
    prompt = cpu.tokenize(PROMPT)
    ids = list(prompt)  # the CPU's greedy tokens
    logits = cpu.eval(ids)
    for _ in range(args.tokens):
        ids.append(int(np.argmax(logits)))
        logits = cpu.forward(ids[-1:], len(ids) - 1, np.array([0]))[0]
    out = {"model": args.model, "device": args.device, "positions": len(ids),
           "prefill": compare(cpu.eval(ids, all_logits=True), gpu.eval(ids, all_logits=True)),
           "decode": compare(decode_logits(cpu, ids), decode_logits(gpu, ids)),
           "greedy_same": cpu.generate(PROMPT, max_tokens=16, temperature=0)
           == gpu.generate(PROMPT, max_tokens=16, temperature=0)}

    def timed(m, n=32, op_timing=False):
        decode_logits(m, ids[:8])  # warm: decode graphs are captured on a segment's second one-token run
        m.set_op_timing(op_timing)
        t0 = time.perf_counter()
        for i in range(n):
            m.forward(ids[8 + i:9 + i], 8 + i, np.array([0]))
        dt = (time.perf_counter() - t0) / n
        timing = m.op_timing() if op_timing else None
        m.set_op_timing(False)
        return dt, timing
    out["step_ms"] = {"cpu": 1e3 * timed(cpu)[0], "gpu": 1e3 * timed(gpu)[0]}
    _, timing = timed(cpu, 16, op_timing=True)
    rows = sorted(((op, s, c) for op, (s, c) in timing.items()), key=lambda r: -r[1])
    out["cpu_op_ms_per_step"] = {op: round(1e3 * s / 16, 4) for op, s, _ in rows[:12]}
    out["gpu_kernels"] = kernel_profile(lambda: timed(gpu, 16), 16)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
