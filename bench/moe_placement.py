"""Expert placement (issue 26): which experts of a Mixture of Experts a GPU computes under a VRAM budget, the
program (HiGHS: time saved net of one synchronization per layer not placed whole, place/expert_placement.py) against
the greedy fill by value per byte (PowerInfer's released solver: no communication term), and the split run on
the stand-in device (a second CPU backend with memory of its own standing in for the GPU): its greedy tokens
against the CPU's, decode tok/s beside the CPU alone, and per split layer how much of the CPU's and the
device's experts ran at the same time (one decode step's timeline, plotted).

The default model is bench/moe_synthetic.py's Qwen3-30B-A3B shape (written once, ~17 GB) with its routing
profile; its figures are placements, speeds and overlap, never quality. The stand-in computes with CPU
threads, so its tok/s says nothing about a GPU's: the overlap and the tokens are the point.

    python bench/moe_placement.py --budgets 4G 8G 12G --sync-us 30 300 --standin-budget 4G
    python bench/moe_placement.py --model tiny-qwen3moe.gguf --budgets 1M --standin-budget 1M --tokens 8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
RESULTS = Path(__file__).parent / "results" / "moe"
PROMPT = "Once upon a time"


def program_rows(m, budgets: list[tuple[str, int]], syncs: list[float], n_ctx: int) -> list[dict]:
    """The program against the greedy fill at each budget and synchronization cost."""
    from pyinfer.sparsity.expert_profile import cached_profile
    from pyinfer.place.device import DEFAULT_CPU_SECONDS_PER_BYTE
    from pyinfer.place.expert_placement import place_experts
    from pyinfer.place.gpu_placement import GpuCosts

    counts = cached_profile(m.session, progress=True)["counts"]
    rows = []
    for label, budget in budgets:
        for sync in syncs:
            costs = GpuCosts(DEFAULT_CPU_SECONDS_PER_BYTE, sync, {"cpu_seconds_per_byte": "default",
                                                                  "sync_seconds": "given"})
            p = place_experts(m.gguf, m.config, budget, n_ctx, costs, counts)
            g = p.greedy
            rows.append({"budget": label, "budget_bytes": budget, "sync_us": sync * 1e6,
                         "experts_on_gpu": sum(map(len, p.gpu_experts)), "greedy_experts_on_gpu": g["gpu_experts_total"],
                         "mass_on_gpu": p.mass_on_gpu, "split_layers": len(p.split_layers),
                         "greedy_split_layers": len(g["split_layers"]),
                         "greedy_split_layers_losing_time": len(g["split_layers_losing_time"]),
                         "net_ms": p.net_seconds * 1e3, "greedy_net_ms": g["net_seconds"] * 1e3,
                         "moved_ms": p.cpu_seconds_moved * 1e3, "greedy_moved_ms": g["value"] * 1e3,
                         "total_ms": p.cpu_seconds_total * 1e3, "head_on_gpu": p.head_on_gpu,
                         "solver": p.solver, "solve_s": p.solve_seconds, "gap": p.info.get("gap")})
            r = rows[-1]
            print(f"{label} sync {sync * 1e6:.0f} us: program {r['experts_on_gpu']} experts, {r['split_layers']} split, "
                  f"net {r['net_ms']:.2f} ms/token; greedy {r['greedy_experts_on_gpu']}, {r['greedy_split_layers']} split, "
                  f"net {r['greedy_net_ms']:.2f} ({r['solver']} {r['solve_s']:.2f} s)", file=sys.stderr)
    return rows


def standin_rows(pyinfer, args, base) -> tuple[list[dict], list[dict], dict]:
    """CPU alone (args.threads and one thread) against the split: the CPU backend with args.threads - 1
    threads and the stand-in with one, so both fit the cores; tokens checked once, then alternating rounds."""
    import timeline
    from pyinfer.offload.planner import timed_decode

    want = base.generate(PROMPT, max_tokens=16, temperature=0)
    cpu_threads = max(1, args.threads - 1)
    t0 = time.perf_counter()
    split = pyinfer.load(args.model, n_threads=cpu_threads, n_ctx=args.ctx, device="standin",
                         vram_budget=args.standin_budget, progress=True)
    setup = time.perf_counter() - t0
    one = pyinfer.load(args.model, n_threads=1, n_ctx=args.ctx, progress=False) if args.threads > 1 else None
    p = split.session.placement.report
    same = split.generate(PROMPT, max_tokens=16, temperature=0) == want
    spans = timeline.step_timeline(split)
    per_layer = [r for r in timeline.layer_overlap(split, spans) if r["layer"] in set(p["split_layers"])
                 and r["overlap_share"] is not None]
    extra = {}
    png = RESULTS / f"{args.tag}_timeline.png"
    if timeline.plot(spans, str(png), f"{Path(args.model).name}: experts split, stand-in device, one decode step"):
        extra["timeline_png"] = png.name
    models = {f"CPU, {args.threads} threads": base, f"split: CPU {cpu_threads} + stand-in 1 thread": split}
    if one is not None:
        models["CPU, 1 thread"] = one
    rates: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(args.rounds):
        for name, m in models.items():
            seconds, _ = timed_decode(m, args.tokens, warmup=2)
            rates[name].append(args.tokens / seconds)
    first = next(iter(models))
    rows = [{"config": name, "tok_s": statistics.median(r), "low": min(r), "high": max(r),
             "x_cpu": statistics.median(a / c for a, c in zip(r, rates[first]))} for name, r in rates.items()]
    rows[1].update(same_greedy_tokens=same, setup_s=setup, experts_on_device=sum(map(len, p["gpu_experts"])),
                   split_layers=len(p["split_layers"]), mass_on_device=p["mass_on_gpu"],
                   overlap_median=statistics.median(r["overlap_share"] for r in per_layer) if per_layer else None)
    return rows, per_layer, extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a MoE GGUF (default: bench/moe_synthetic.py's, written once)")
    ap.add_argument("--workdir", default="/tmp/pyinfer-moe", help="where the synthetic model and its profile live")
    ap.add_argument("--budgets", nargs="+", default=["4G", "8G", "12G"], help="VRAM budgets for the program table")
    ap.add_argument("--sync-us", nargs="+", type=float, default=[30.0, 300.0],
                    help="a split layer's synchronization, microseconds (30: pyinfer's default without a GPU)")
    ap.add_argument("--standin-budget", default="4G", help="the stand-in device's budget ('none': skip the run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="moe_placement")
    args = ap.parse_args()
    os.environ.setdefault("PYINFER_CACHE", str(Path(args.workdir) / "cache"))  # the routing profile's cache
    import pyinfer
    from pyinfer.offload import parse_size

    if args.model is None:
        import moe_synthetic

        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        args.model = str(work / "qwen3moe-30b-a3b-shape-q4_0.gguf")
        if not Path(args.model).exists():
            moe_synthetic.write_model(Path(args.model + ".tmp"))
            Path(args.model + ".tmp").replace(args.model)
    base = pyinfer.load(args.model, n_threads=args.threads, n_ctx=args.ctx, progress=False)
    budgets = [(b, parse_size(b)) for b in args.budgets]
    program = program_rows(base, budgets, [s * 1e-6 for s in args.sync_us], args.ctx)
    runs, per_layer, extra = ([], [], {}) if args.standin_budget == "none" else standin_rows(pyinfer, args, base)
    meta = {"model": Path(args.model).name, "threads": args.threads, "tokens": args.tokens, "ctx": args.ctx,
            "rounds": args.rounds, "standin_budget": args.standin_budget, "date": time.strftime("%Y-%m-%d"),
            "cpu_seconds_per_byte": "pyinfer's default, 1e-10 (10 GB/s)", **extra}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "program": program, "standin": runs,
                                                          "overlap_per_layer": per_layer}, indent=1))
    lines = [f"# Expert placement: {meta['model']}", "",
             "The program (HiGHS, time saved net of one synchronization per layer not placed whole: attention "
             "and the stream live on the device) against the greedy fill by value per byte (no communication "
             "term), from the model's routing profile; CPU cost 1e-10 s per weight byte (pyinfer's default). `net` "
             "= CPU time per token the GPU takes over, less those synchronizations.", "",
             "| VRAM budget | sync us | experts on GPU (program / greedy) | split layers (program / greedy; greedy's "
             "whose missing experts are worth less than their sync) | routes on GPU | net ms/token (program / "
             "greedy) | solver, s |",
             "|---|---|---|---|---|---|---|"]
    for r in program:
        lines.append(f"| {r['budget']} | {r['sync_us']:.0f} | {r['experts_on_gpu']} / {r['greedy_experts_on_gpu']} | "
                     f"{r['split_layers']} / {r['greedy_split_layers']} ({r['greedy_split_layers_losing_time']}) | "
                     f"{r['mass_on_gpu']:.0%} | {r['net_ms']:.2f} / {r['greedy_net_ms']:.2f} | {r['solver']}"
                     + (f" (time limit, gap {r['gap']:.2%})" if r.get("gap") is not None else "") + f", {r['solve_s']:.2f} |")
    if runs:
        s = runs[1]
        lines += ["", f"On the stand-in device ({args.standin_budget}; {args.tokens} decode tokens, {args.rounds} "
                  "rounds alternating, medians; the stand-in computes with a CPU thread, so its speed is no GPU's): "
                  f"{s['experts_on_device']} experts on the device, {s['split_layers']} split layers, greedy tokens "
                  f"{'equal' if s['same_greedy_tokens'] else 'NOT equal'} to the CPU's; the CPU's and the device's "
                  f"experts overlapped {s['overlap_median']:.0%} (median per split layer) of the shorter side's time."
                  if s["overlap_median"] is not None else "", "",
                  "| configuration | tok/s (low-high) | x CPU |", "|---|---|---|"]
        lines += [f"| {r['config']} | {r['tok_s']:.2f} ({r['low']:.2f}-{r['high']:.2f}) | {r['x_cpu']:.2f} |" for r in runs]
        if "timeline_png" in extra:
            lines += ["", f"![one decode step]({extra['timeline_png']})"]
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
