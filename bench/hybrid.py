"""Hybrid CPU/GPU decode (issue 12): decode tok/s on the CPU alone, on the GPU alone (a budget that holds
everything) and split at VRAM budgets that hold 25%, 50% and 75% of the FFN bytes beyond what must be on the
GPU, against a PyTorch peer with the same share of its blocks on the GPU (bench/peer_torch.py: accelerate's
offload, and -ngl-style layers on the CPU), side by side in one process, alternating, median ratio against
CPU-only per round. Per split layer, how much of the CPU's and the device's halves overlapped (one decode step's
timeline; plotted for the 50% split).

Before timing, each configuration is checked against the CPU once: its greedy tokens (the peer: its logits and
top token after the prompt), and with --ppl-windows its WikiText-2 perplexity (512-token windows).

    python bench/hybrid.py --device cuda --threads 8 --rounds 5 --ppl-windows 40     # SmolLM2 on a GPU machine
    python bench/hybrid.py --device cuda --threads 8 --synthetic-7b /tmp/s7b --shares 0.5 --tokens 16
    python bench/hybrid.py --device standin --rounds 1 --tokens 16 --peer none       # the CPU half: runs anywhere

--synthetic-7b DIR writes (once) bench/offload_synthetic.py's LLaMA-7B-shaped Q4_0 model with ReLU-like firing
and its oracle predictors to DIR, and runs every pyinfer configuration sparse with them.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
RESULTS = Path(__file__).parent / "results" / "gpu"
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PROMPT = "Once upon a time"


def configs(model, device: str, shares: list[float]) -> list[tuple[str, dict]]:
    from pyinfer.place.gpu_placement import ffn_tensors, fixed_bytes, head_bytes

    fixed = sum(fixed_bytes(model.gguf, model.config, model.sparsity, model.n_ctx).values())
    ffn = sum(ffn_tensors(model.gguf, model.config))
    out = [("cpu", {})]
    # Twice the FFN's file bytes: a sparse layer's device side also holds a neuron-major Q8_0 down
    out.append(("gpu alone", {"device": device, "vram_budget": fixed + 2 * ffn + head_bytes(model.gguf) + (64 << 20)}))
    out += [(f"hybrid {s:.0%}", {"device": device, "vram_budget": int(fixed + s * ffn)}) for s in shares]
    return out


def variants(configs_: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The CUDA backend's choices, each against its default: decode graphs off on the GPU alone, and
    PowerInfer's atomic-add down axpy (the default gives each thread its own columns) at the middle split."""
    by_name = dict(configs_)
    hybrid = [n for n in by_name if n.startswith("hybrid")]
    out = [("gpu alone, no CUDA graphs", dict(by_name["gpu alone"], env={"PYINFER_CUDA_GRAPHS": "0"}))]
    if hybrid:
        mid = hybrid[len(hybrid) // 2]
        out.append((f"{mid}, atomic axpy", dict(by_name[mid], env={"PYINFER_CUDA_AXPY": "atomics"})))
    return out


def load_with_env(pyinfer, model: str, load: dict, kw: dict):
    """pyinfer.load with kw["env"] set while the backends are made (they read it then)."""
    import os

    env = kw.pop("env", {})
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return pyinfer.load(model, **load, **kw)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def synthetic_model(folder: str, n_layers: int | None) -> tuple[str, str]:
    """(model, oracle sparsity plan) of the LLaMA-7B-shaped synthetic model, written once into `folder`."""
    import offload_synthetic as syn

    if n_layers:  # a shorter model of the same width, to try the path on a small machine
        syn.SHAPE = dict(syn.SHAPE, n_layers=n_layers)
    work = Path(folder)
    work.mkdir(parents=True, exist_ok=True)
    stem = f"llama7b-shape-{syn.SHAPE['n_layers']}l"
    model, plan = work / f"{stem}-q4_0.gguf", work / f"{stem}.sparse.npz"
    if not model.exists():
        print(f"writing {model} ...", file=sys.stderr)
        syn.write_model(model.with_suffix(".tmp"))
        model.with_suffix(".tmp").replace(model)
        plan.unlink(missing_ok=True)
    if not plan.exists():
        syn.write_plan(model, plan)
    return str(model), str(plan)


def peers(args, model, prompt: list[int], want) -> list[tuple[str, object, dict]]:
    """(name, peer, row) per peer configuration: every mode at every share, and all blocks on the GPU."""
    if args.peer == ["none"]:
        return []
    from peer_torch import Peer, check

    modes = list(args.peer)
    if "accelerate" in modes:
        try:
            import accelerate  # noqa: F401
        except Exception as e:  # missing, or one of its own imports is
            modes.remove("accelerate")
            print(f"no accelerate peer ({e}): pip install accelerate, or carry its wheels (bench/gpu/README.md)",
                  file=sys.stderr)
    torch_device = "cuda" if args.device.startswith("cuda") else "cpu"
    n = model.config.n_layers
    out = []
    for mode in modes:
        for s in [1.0] + args.shares:
            if s == 1.0 and mode != modes[0]:
                continue  # one all-on-GPU peer serves every mode
            t0 = time.perf_counter()
            p = Peer(model.path, torch_device, args.ctx, round(s * n), mode)
            name = "peer gpu alone" if s == 1.0 else f"peer {mode} {s:.0%}"
            row = {"config": name, "peer": mode, "gpu_blocks": p.gpu_blocks, "setup_s": time.perf_counter() - t0,
                   **check(p, want, prompt)}
            out.append((name, p, row))
            print(f"{name}: ready in {row['setup_s']:.1f} s", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None, help="GGUF file or named model (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--synthetic-7b", metavar="DIR", help="the LLaMA-7B-shaped synthetic model (written into DIR)")
    ap.add_argument("--synthetic-layers", type=int, default=None, help="fewer layers for it (a small machine)")
    ap.add_argument("--sparsity", default="off", help="a sparsity plan every pyinfer configuration runs (default off)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or standin (default cuda)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per timing (default 64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--peer", nargs="+", default=["layers", "accelerate"],
                    help="torch peer modes: layers, accelerate, or none (default: both)")
    ap.add_argument("--variants", action="store_true",
                    help="on cuda, also time decode graphs off and the atomic-add down axpy")
    ap.add_argument("--ppl-windows", type=int, default=0, help="WikiText-2 windows for the perplexity check")
    ap.add_argument("--out", default=str(RESULTS), help="folder for TAG.json, TAG.md and TAG_timeline.png")
    ap.add_argument("--tag", default="hybrid")
    args = ap.parse_args()
    import pyinfer
    import timeline
    from pyinfer.offload.planner import timed_decode

    sparsity = args.sparsity
    if args.synthetic_7b:
        args.model, sparsity = synthetic_model(args.synthetic_7b, args.synthetic_layers)
    load = dict(n_threads=args.threads, n_ctx=args.ctx, progress=False, sparsity=sparsity)
    base = pyinfer.load(args.model, **load)
    models, rows, layers, extra = {}, [], {}, {}
    plotted = f"hybrid {0.5 if 0.5 in args.shares else args.shares[0]:.0%}"
    want = base.generate(PROMPT, max_tokens=16, temperature=0)
    prompt = base.tokenize(PROMPT)
    text = (DATA / "wikitext-2-raw-test.txt").read_text() if args.ppl_windows else ""
    todo = configs(base, args.device, args.shares)
    if args.variants and args.device.startswith("cuda"):
        todo += variants(todo)
    for name, kw in todo:
        t0 = time.perf_counter()
        m = base if not kw else load_with_env(pyinfer, args.model, load, dict(kw))
        row = {"config": name, "vram_budget": kw.get("vram_budget"), "setup_s": time.perf_counter() - t0,
               "same_greedy_tokens": m.generate(PROMPT, max_tokens=16, temperature=0) == want}
        if m.placement:
            p = m.placement.report
            row.update(gpu_neurons=sum(p["gpu_neurons"]), ffn_share_on_gpu=sum(p["gpu_neurons"]) / sum(p["n_ff"]),
                       ffn_bytes_on_gpu=p["ffn_bytes_on_gpu"],
                       head_on_gpu=p["head_on_gpu"], split_layers=len(p.get("split_layers", [])))
            spans = timeline.step_timeline(m)
            split = set(p.get("split_layers", []))  # whole layers on one side have nothing to overlap
            per_layer = [r for r in timeline.layer_overlap(m, spans) if r["layer"] in split and r["overlap_share"]
                         is not None]
            layers[name] = per_layer
            if per_layer:
                row["overlap_median"] = statistics.median(r["overlap_share"] for r in per_layer)
            if name == plotted:
                png = Path(args.out) / f"{args.tag}_timeline.png"
                png.parent.mkdir(parents=True, exist_ok=True)
                if timeline.plot(spans, str(png), f"{Path(m.path).name}, {name}: one decode step"):
                    extra["timeline_png"] = png.name
        if args.ppl_windows:
            from pyinfer.tools.perplexity import perplexity

            row["perplexity"] = perplexity(m, text, 512, args.ppl_windows, progress=False).perplexity
        models[name], _ = m, rows.append(row)
    peer_list = peers(args, base, prompt, base.eval(prompt))
    if peer_list:  # torch only when a peer runs: the stand-in check works without it
        from peer_torch import timed as peer_timed
    rows += [row for _, _, row in peer_list]
    rates: dict[str, list[float]] = {name: [] for name in list(models) + [n for n, _, _ in peer_list]}
    for _ in range(args.rounds):  # alternating: every configuration once per round
        for name, m in models.items():
            seconds, _wait = timed_decode(m, args.tokens, warmup=4)
            rates[name].append(args.tokens / seconds)
        for name, p, _ in peer_list:
            rates[name].append(args.tokens / peer_timed(p, prompt, args.tokens))
    for row in rows:
        r = rates[row["config"]]
        row["tok_s"] = statistics.median(r)
        row["x_cpu"] = statistics.median(a / c for a, c in zip(r, rates["cpu"]))
        if "perplexity" in row:
            row["ppl_vs_cpu"] = row["perplexity"] / rows[0]["perplexity"]
    meta = {"model": Path(base.path).name, "sparsity": "oracle predictors" if args.synthetic_7b else args.sparsity,
            "device": args.device, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
            "machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"), **extra}
    if args.device.startswith("cuda"):
        from pyinfer.place.device import cuda_devices

        meta["gpu"] = [d["name"] for d in cuda_devices()]
    lines = [f"# Hybrid decode: {meta['model']}, device {args.device}, {args.threads} CPU threads, {args.tokens} "
             f"tokens, median of {args.rounds} alternating rounds", "",
             "| config | VRAM budget MiB | FFN neurons on GPU | head on GPU | tok/s | x CPU-only | checked | "
             "overlap (median per split layer) | perplexity (x CPU) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        budget = f"{r['vram_budget'] / 2**20:.0f}" if r.get("vram_budget") else "-"
        ppl = f"{r['perplexity']:.4f} ({r['ppl_vs_cpu']:.4f})" if "perplexity" in r else "-"
        if "peer" in r:
            on_gpu, checked = f"{r['gpu_blocks']} blocks", f"top-1 {r['same_top1']}, {r['max_abs_diff_over_scale']:.3f}"
        else:
            on_gpu, checked = f"{r.get('ffn_share_on_gpu', 0):.0%}", f"tokens {r['same_greedy_tokens']}"
        ov = f"{r['overlap_median']:.0%}" if "overlap_median" in r else "-"
        lines.append(f"| {r['config']} | {budget} | {on_gpu} | {r.get('head_on_gpu', '-')} | {r['tok_s']:.1f} | "
                     f"{r['x_cpu']:.3f} | {checked} | {ov} | {ppl} |")
    lines += ["", "checked: pyinfer's greedy tokens against the CPU's; the peer's top token and largest logit "
              "difference (over the logits' scale) after the prompt against pyinfer's CPU logits. A peer at share s "
              "holds round(s x layers) blocks on the GPU in fp16 (not the same bytes: its weights are not quantized). "
              "On a random-weight model greedy tokens part at near-ties for any change of summation order (the "
              "SmolLM2-shaped one moves its logits by 14% of their scale for a 1e-6 change to one norm weight); "
              "bench/gpu/parity.py compares position by position."]
    if args.device == "standin":
        lines += ["", "The stand-in is a second CPU backend: these rates check the path, not a GPU's speed."]
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows, "overlap_per_layer": layers},
                                                     indent=1))
    (out / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())
