"""Input-sparse plans (TEAL's cuts on projection inputs, CATS's gate cut; runtime/input_sparse.py) against dense:
quality and speed per method and level, and the bytes one decode step reads.

Per model: thresholds calibrated on a calibration text (never the evaluation text), then for each config
(levels per site: attn_in, attn_out, ffn_in, ffn_mid = down's input, gate = CATS's cut on |act(gate)|)
  - perplexity on WikiText-2 (--windows windows of 512, every token computed as sparse decode computes it;
    skipped with --no-ppl, e.g. for random-weight models of a real shape, whose perplexity means nothing),
  - decode speed against dense: each config against dense alone (two engines loaded: with six alive at once the
    same config measured 0.91-0.97x where alone it measured 1.05x), alternating within each round (order flipped
    every round), --tokens one-token steps over held-out calibration text (teacher-forced) after a 16-token
    prompt; an engine's speed in a round is read from the 20th percentile of its step times (what a noisy
    neighbour does only adds time: sparsity/auto_choice.py); the median of per-round ratios and the lowest
    round, and the share of down's inputs the last step kept,
  - weights read per decode step with the plan and without (sparsity/input_bytes.py).

  python bench/input_sparsity.py -m ~/.cache/pyinfer/Qwen2.5-Coder-0.5B-Instruct.gguf --tag qwen05
  python bench/input_sparsity.py -m /work/models/qwen2.5-1.5b-q4_k_m.gguf --no-ppl --fixed-density --tag shaped_1p5b
  python bench/input_sparsity.py -m ... --fixed-density --configs "down 90%" --save-plans DIR   (plan files only)
  -> bench/results/sparsity/input_<tag>.{json,md,png}
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import pyinfer  # noqa: E402
from pyinfer.sparsity.input_bytes import bytes_per_token, measure_densities  # noqa: E402
from pyinfer.sparsity.input_calibrate import profile_inputs  # noqa: E402
from pyinfer.tools.perplexity import perplexity  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "sparsity"
DATA = Path(__file__).parent.parent.parent / "shared" / "data"
# name -> levels per site; "method" groups a curve
CONFIGS = {
    "down 50%": ("TEAL down", {"ffn_mid": 0.5}),
    "down 70%": ("TEAL down", {"ffn_mid": 0.7}),
    "down 80%": ("TEAL down", {"ffn_mid": 0.8}),
    "down 90%": ("TEAL down", {"ffn_mid": 0.9}),
    "gate 20%": ("CATS", {"gate": 0.2}),
    "gate 30%": ("CATS", {"gate": 0.3}),
    "gate 50%": ("CATS", {"gate": 0.5}),
    "attn_out 50%": ("TEAL attention", {"attn_out": 0.5}),
    "attn_in 20%": ("TEAL attention", {"attn_in": 0.2}),
    "ffn_in 20%": ("TEAL FFN input", {"ffn_in": 0.2}),
    "down 70 attn_out 50": ("mix", {"ffn_mid": 0.7, "attn_out": 0.5}),
    "down 80 attn_out 50": ("mix", {"ffn_mid": 0.8, "attn_out": 0.5}),
    "down 70 gate 30": ("mix", {"ffn_mid": 0.7, "gate": 0.3}),
}
SPEED_SET = ["down 70%", "down 80%", "down 90%", "gate 30%", "attn_out 50%", "down 80 attn_out 50"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="GGUF file")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--configs", nargs="*", default=None,
                    help="config names (default: all; with --no-ppl the speed set: " + ", ".join(SPEED_SET).replace("%", "%%") + ")")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--no-ppl", action="store_true", help="speed and bytes only (random-weight models)")
    ap.add_argument("--fixed-density", action="store_true",
                    help="each cut keeps, per token, the share 1 - level of its inputs with the largest |x| (top-k) "
                         "instead of |x| above the calibrated threshold: speed at a known density, which a "
                         "random-weight model's thresholds cannot give (its layers keep all or none at decode)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calibration", default=str(DATA / "pride-and-prejudice.txt"))
    ap.add_argument("--mmap", action="store_true",
                    help="every engine maps the file (one copy in the page cache) instead of reading its own: "
                         "for models whose copies would not fit in RAM side by side")
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot from the tag's JSON")
    ap.add_argument("--save-plans", metavar="DIR", default=None,
                    help="write each config's plan to DIR/<config>.npz and stop (for `--sparsity FILE`, e.g. "
                         "bench/offload.py under a memory limit)")
    args = ap.parse_args()
    if args.plot_only:
        _plot(json.loads((RESULTS / f"input_{args.tag}.json").read_text()), RESULTS / f"input_{args.tag}.png")
        return 0
    if not args.model:
        ap.error("--model is required (except with --plot-only)")
    names = args.configs or (SPEED_SET if args.no_ppl else list(CONFIGS))

    mmap = True if args.mmap else None
    dense = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, progress=False, mmap=mmap)
    cfg, gguf = dense.config, dense.gguf
    cal_ids = dense.tokenize(Path(args.calibration).read_text(encoding="utf-8", errors="replace")[:400_000])
    t0 = time.time()
    prof = profile_inputs(gguf, cfg, cal_ids[:4096], 4096, args.threads, progress=False)
    profile_s = time.time() - t0
    def make_plan(levels: dict):
        plan = prof.plan(levels, cfg.d_ff)
        if args.fixed_density:
            plan.info["fixed_density"] = {s: round(1.0 - v, 4) for s, v in levels.items() if s != "gate"}
        return plan

    plans = {n: make_plan(CONFIGS[n][1]) for n in names}
    if args.save_plans:
        for n, plan in plans.items():
            print(plan.save(Path(args.save_plans) / (n.replace(" ", "_").replace("%", "") + ".npz")))
        return 0
    held = cal_ids[-1024:]  # densities measured on calibration text the thresholds never saw

    rows = {n: {"method": CONFIGS[n][0], "levels": CONFIGS[n][1]} for n in names}
    for n in names:
        dens = measure_densities(gguf, cfg, plans[n], held, args.threads)
        b = bytes_per_token(gguf, cfg, plans[n], dens)
        rows[n].update(bytes_dense=b["dense"], bytes_sparse=b["sparse"], bytes_ratio=b["sparse"] / b["dense"],
                       densities=dens)

    # Check once before timing: each plan loads and decodes the same first token as the dense model after the
    # prompt (prefill is dense in both).
    prompt = dense.tokenize("The history of the city begins")
    want = int(np.argmax(dense.forward(prompt, 0, np.array([len(prompt) - 1]))[0]))
    dense_tok_s = []
    text_ids = held[:16 + args.tokens]  # teacher-forced: every engine decodes the same text tokens
    for n in names:
        sparse = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, sparsity=plans[n], progress=False,
                              mmap=mmap)
        got = int(np.argmax(sparse.forward(prompt, 0, np.array([len(prompt) - 1]))[0]))
        assert got == want, f"{n}: prefill is dense, so its first token must be dense's"
        pair = {"dense": dense, n: sparse}
        ratios = []
        for r in range(args.rounds):
            order = list(pair) if r % 2 == 0 else list(pair)[::-1]
            step = {k: step_seconds(pair[k], text_ids, 16) for k in order}
            dense_tok_s.append(1.0 / step["dense"])
            ratios.append(step["dense"] / step[n])
        print(f"{n}: " + ", ".join(f"{x:.3f}" for x in ratios), flush=True)
        rows[n].update(speed_ratio=statistics.median(ratios), speed_lowest=min(ratios))
        # The share of down's inputs the last timed decode step kept (its unions of one token), beside the share
        # on held-out calibration text that the bytes column is computed from: on random weights they differ.
        mids = [int(u[0]) / cfg.d_ff for u in sparse.layer_unions() if len(u) == cfg.d_ff + 1 and u[0] >= 0]
        dens = [d["ffn_mid"] for d in rows[n]["densities"]]
        rows[n].update(down_kept_decode=float(np.mean(mids)) if mids else None,
                       down_kept_calibration=float(np.mean(dens)))
        del sparse, pair

    base_ppl = None
    if not args.no_ppl:
        text = (DATA / "wikitext-2-raw-test.txt").read_text(encoding="utf-8")
        base_ppl = perplexity(dense, text, ctx=512, windows=args.windows, progress=False).perplexity
        for n in names:
            m = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, sparsity=plans[n], emulate_prefill=True,
                             progress=False)
            p = perplexity(m, text, ctx=512, windows=args.windows, progress=False).perplexity
            rows[n].update(ppl=p, ppl_change=p / base_ppl - 1.0)
            print(f"{n}: ppl {p:.4f} ({(p / base_ppl - 1) * 100:+.2f}%)", flush=True)

    out = {"model": Path(args.model).name, "machine": platform.processor() or platform.machine(),
           "isa": dense.isa, "threads": args.threads, "rounds": args.rounds, "tokens": args.tokens,
           "windows": None if args.no_ppl else args.windows, "dense_ppl": base_ppl,
           "fixed_density": args.fixed_density,
           "dense_tok_s": statistics.median(dense_tok_s), "profile_seconds": round(profile_s, 1),
           "configs": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    def path(ext: str) -> Path:  # (a tag may hold dots: "qwen2.5-1.5b")
        return RESULTS / f"input_{args.tag}.{ext}"

    path("json").write_text(json.dumps(out, indent=1))
    lines = [f"# Input sparsity on {out['model']} ({out['isa']}, {args.threads} threads)", "",
             f"Dense decode {out['dense_tok_s']:.1f} tok/s (median over every round of the 20th percentile of "
             f"{args.tokens} teacher-forced steps on held-out calibration text; each config against dense alone, "
             f"{args.rounds} alternating rounds)"
             + ("; **fixed densities**: each cut keeps its share of inputs per token (top-k by |x|)"
                if args.fixed_density else "")
             + (f"; dense perplexity {base_ppl:.4f} (WikiText-2, {args.windows} windows of 512)" if base_ppl else
                "; random weights: speed and bytes only"), "",
             "| config | method | decode / dense (lowest round) | weights read / token (MiB) | bytes / dense "
             "| down's inputs kept: calibration / decode |" + (" ΔPPL |" if base_ppl else ""),
             "|---|---|---|---|---|---|" + ("---|" if base_ppl else "")]
    for n, r in rows.items():
        dec = f"{r['down_kept_decode']:.2f}" if r.get("down_kept_decode") is not None else "-"
        lines.append(f"| {n} | {r['method']} | {r['speed_ratio']:.3f}x ({r['speed_lowest']:.3f}) | "
                     f"{r['bytes_sparse'] / 2**20:.1f} of {r['bytes_dense'] / 2**20:.1f} | {r['bytes_ratio']:.2f} | "
                     f"{r['down_kept_calibration']:.2f} / {dec} |" + (f" {r['ppl_change'] * 100:+.2f}% |" if base_ppl else ""))
    path("md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(out, path("png"))
    return 0


def step_seconds(model, ids: list[int], prompt: int) -> float:
    """The 20th percentile of one-token step times over ids[prompt:] after a prefill of ids[:prompt] (the text's own
    tokens fed in, as auto's timing does: a random-weight model's greedy output repeats one token, whose
    activations say nothing of a text's)."""
    model.forward(ids[:prompt], 0, np.array([prompt - 1]))
    times = []
    for i in range(prompt, len(ids)):
        t0 = time.perf_counter()
        model.forward([ids[i]], i, np.array([0]))
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 20))


def _plot(out: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = out["configs"]
    has_ppl = out["dense_ppl"] is not None
    fig, axes = plt.subplots(1, 2 if has_ppl else 1, figsize=(11 if has_ppl else 6, 4), squeeze=False)
    ax = axes[0][0]
    for method in dict.fromkeys(r["method"] for r in rows.values()):
        pts = [(r["bytes_ratio"], r["speed_ratio"]) for r in rows.values() if r["method"] == method]
        ax.scatter(*zip(*pts), label=method)
    ax.plot([0.4, 1.1], [1 / 0.4, 1 / 1.1], "k:", label="time follows bytes")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("weights read per token / dense")
    ax.set_ylabel("decode speed / dense")
    ax.set_ylim(0.4, 1.6)
    ax.legend(fontsize=7)
    ax.set_title(out["model"], fontsize=9)
    if has_ppl:
        ax = axes[0][1]
        for method in dict.fromkeys(r["method"] for r in rows.values()):
            pts = sorted((r["bytes_ratio"], r["ppl_change"] * 100) for r in rows.values() if r["method"] == method)
            ax.plot(*zip(*pts), "o-", label=method)
        ax.axhline(3.0, color="red", lw=0.5, ls="--", label="+3% bound")
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_xlabel("weights read per token / dense")
        ax.set_ylabel("perplexity change (%)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
