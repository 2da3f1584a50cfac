"""Hybrid CPU/GPU decode (issue 12): SmolLM2 decode tok/s on the CPU alone, on the GPU alone (a budget that
holds everything) and split at VRAM budgets that hold 25%, 50% and 75% of the FFN bytes beyond what must be on
the GPU, side by side in one process, alternating, median ratio against CPU-only per round.

Before timing, each configuration is checked against the CPU once: its greedy tokens, and with --ppl-windows
its WikiText-2 perplexity (llama.cpp's protocol, 512-token windows).

    python bench/hybrid.py --device cuda --threads 8 --rounds 5 --ppl-windows 40     # on a GPU machine
    python bench/hybrid.py --device standin --rounds 1 --tokens 16                   # the CPU half: runs anywhere
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PROMPT = "Once upon a time"


def configs(model, device: str, shares: list[float]) -> list[tuple[str, dict]]:
    from pyinfer.place.gpu_placement import ffn_tensors, fixed_bytes, head_bytes

    fixed = sum(fixed_bytes(model.gguf, model.config, None, model.n_ctx).values())
    ffn = sum(ffn_tensors(model.gguf, model.config))
    out = [("cpu", {})]
    out.append(("gpu alone", {"device": device, "vram_budget": fixed + ffn + head_bytes(model.gguf) + (64 << 20)}))
    out += [(f"hybrid {s:.0%}", {"device": device, "vram_budget": int(fixed + s * ffn)}) for s in shares]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None, help="GGUF file or named model (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or standin (default cuda)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per timing (default 64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--ppl-windows", type=int, default=0, help="WikiText-2 windows for the perplexity check")
    ap.add_argument("--out", default=str(RESULTS), help="folder for hybrid.json and hybrid.md")
    ap.add_argument("--tag", default="hybrid")
    args = ap.parse_args()
    import pyinfer
    from pyinfer.offload.planner import timed_decode

    base = pyinfer.load(args.model, n_threads=args.threads, n_ctx=args.ctx, progress=False)
    models, rows = {}, []
    want = base.generate(PROMPT, max_tokens=16, temperature=0)
    text = (DATA / "wikitext-2-raw-test.txt").read_text() if args.ppl_windows else ""
    for name, kw in configs(base, args.device, args.shares):
        m = base if not kw else pyinfer.load(args.model, n_threads=args.threads, n_ctx=args.ctx, progress=False, **kw)
        row = {"config": name, "vram_budget": kw.get("vram_budget"), "same_greedy_tokens":
               m.generate(PROMPT, max_tokens=16, temperature=0) == want}
        if m.placement:
            p = m.placement
            row.update(gpu_neurons=sum(p["gpu_neurons"]), ffn_share_on_gpu=p["ffn_bytes_on_gpu"] / p["ffn_bytes"],
                       head_on_gpu=p["head_on_gpu"], split_layers=len(p.get("split_layers", [])))
        if args.ppl_windows:
            from pyinfer.tools.perplexity import perplexity

            row["perplexity"] = perplexity(m, text, 512, args.ppl_windows, progress=False).perplexity
        models[name], _ = m, rows.append(row)
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):  # alternating: every configuration once per round
        for name, m in models.items():
            seconds, _wait = timed_decode(m, args.tokens, warmup=4)
            rates[name].append(args.tokens / seconds)
    for row in rows:
        r = rates[row["config"]]
        row["tok_s"] = statistics.median(r)
        row["x_cpu"] = statistics.median(a / c for a, c in zip(r, rates["cpu"]))
        if "perplexity" in row:
            row["ppl_vs_cpu"] = row["perplexity"] / rows[0]["perplexity"]
    meta = {"model": Path(base.path).name, "device": args.device, "threads": args.threads, "tokens": args.tokens,
            "rounds": args.rounds, "machine": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d")}
    if args.device.startswith("cuda"):
        from pyinfer.place.device import cuda_devices

        meta["gpu"] = [d["name"] for d in cuda_devices()]
    lines = [f"# Hybrid decode: {meta['model']}, device {args.device}, {args.threads} CPU threads, {args.tokens} "
             f"tokens, median of {args.rounds} alternating rounds", "",
             "| config | VRAM budget MiB | FFN on GPU | head on GPU | tok/s | x CPU-only | same greedy tokens | "
             "perplexity (x CPU) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        budget = f"{r['vram_budget'] / 2**20:.0f}" if r["vram_budget"] else "-"
        ppl = f"{r['perplexity']:.4f} ({r['ppl_vs_cpu']:.4f})" if "perplexity" in r else "-"
        lines.append(f"| {r['config']} | {budget} | {r.get('ffn_share_on_gpu', 0):.0%} | {r.get('head_on_gpu', '-')} | "
                     f"{r['tok_s']:.1f} | {r['x_cpu']:.3f} | {r['same_greedy_tokens']} | {ppl} |")
    if args.device == "standin":
        lines += ["", "The stand-in is a second CPU backend: these rates check the path, not a GPU's speed."]
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
