"""Quality/speed curve of activation sparsity on the real model, with llama.cpp side by side.

For each FFN sparsity target: thresholds only, and thresholds plus trained predictors. Columns:
WikiText-2 perplexity (llama.cpp protocol, the sparse decode semantics computed for every token),
decode tok/s, ratio to our dense engine and to llama.cpp (all engines alternate in one process,
median of per-round ratios), bytes read per decoded token, measured density and predictor recall.
Calibration is on pride-and-prejudice.txt only; WikiText-2 is evaluation only.

  python bench/sparsity_curve.py --targets 0.3 0.4 0.5 0.6 0.7 --windows 16 --rounds 3
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
from compare_llamacpp import LlamaCpp, pyinfer_decode  # noqa: E402
from pyinfer.model.config import Activation  # noqa: E402
from pyinfer.model.pull import resolve_model  # noqa: E402
from pyinfer.sparsity.calibrate import build_plan, profile_model, read_calibration  # noqa: E402
from pyinfer.sparsity.measure import measure_plan  # noqa: E402
from pyinfer.sparsity.predictor import TrainConfig  # noqa: E402
from pyinfer.tools.perplexity import perplexity  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "sparsity"
RESULT_STEM = "sparsity_curve"
AUTO_CONFIG = "thr 40%"  # what sparsity="auto" calibrates for SwiGLU models (pyinfer/sparsity/resolve.py)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def bytes_per_token(model, plan=None, measured=None) -> float:
    """Weight bytes one decode step reads: every matrix (the tied output head in full, one embedding row)
    with the FFN replaced by what the sparse path touches."""
    g = model.gguf
    total = 0.0
    for name, t in g.tensors.items():
        nbytes = float(np.asarray(t.data).nbytes)
        if name == "token_embd.weight":
            total += nbytes / t.rows + (nbytes if model.config.tied_output else 0.0)
            continue
        if plan is not None and ".ffn_" in name and not name.endswith("norm.weight"):
            il = int(name.split(".")[1])
            m = measured[il]
            if "ffn_down" in name:
                if t.type_name in ("Q4_0", "Q4_1"):  # lossless neuron-major Q4T: active rows + group scales
                    total += nbytes * (0.8 * m["active_density"] + 0.2)
                else:  # re-quantized neuron-major Q8_0 rows of the active neurons
                    total += t.rows * t.cols * 34 / 32 * m["active_density"]
            elif "ffn_gate" in name and not plan.layers[il].predictor:
                total += nbytes  # without a predictor the gate is computed in full
            else:
                total += nbytes * m["computed_density"]
            continue
        total += nbytes
    if plan is not None:
        total += plan.predictor_bytes()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.6, 0.7])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=16, help="WikiText-2 windows of 512 for perplexity")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64, help="decode steps per timing")
    ap.add_argument("--profile-tokens", type=int, default=16384)
    ap.add_argument("--train-tokens", type=int, default=12288)
    ap.add_argument("--rank", type=int, default=64, help="predictor rank (0: sized per layer)")
    ap.add_argument("--gate-recall", type=float, default=0.95, help="gate-first: share of active neurons kept")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("-m", "--model", default=None, help="GGUF file or named model (default: SmolLM2)")
    ap.add_argument("--tag", default="", help="results go to sparsity_curve[_TAG].{json,md,png}")
    ap.add_argument("--no-predictors", action="store_true", help="thresholds only (no predictor training)")
    args = ap.parse_args()
    global RESULT_STEM
    RESULT_STEM = "sparsity_curve" + (f"_{args.tag}" if args.tag else "")

    path = str(resolve_model(args.model))
    wiki = (DATA / "wikitext-2-raw-test.txt").read_text()
    calib = read_calibration(DATA / "pride-and-prejudice.txt")
    dense = pyinfer.load(path, n_threads=args.threads, n_ctx=512)
    ids = dense.tokenize(calib)
    t0 = time.time()
    prof = profile_model(dense.gguf, dense.config, ids, args.profile_tokens, args.threads,
                         info={"calibration": "pride-and-prejudice.txt"})
    print(f"profile: {prof.tokens} tokens in {time.time() - t0:.0f}s", file=sys.stderr)

    configs = {"dense": dict(plan=None)}
    for target in args.targets:
        configs[f"thr {target:.0%}"] = dict(plan=build_plan(dense.gguf, dense.config, prof, target, None, 0,
                                                            args.threads, None, progress=False), target=target)
        if dense.config.activation == Activation.SILU:  # gate-first cuts are |SiLU(gate)| cuts
            configs[f"gate-first {target:.0%}"] = dict(
                plan=build_plan(dense.gguf, dense.config, prof, target, None, 0, args.threads, None, progress=False,
                                gate_recall=args.gate_recall), target=target)
        if args.no_predictors:
            continue
        train = TrainConfig(fixed_rank=args.rank or None)
        t0 = time.time()
        plan = build_plan(dense.gguf, dense.config, prof, target, ids, args.train_tokens, args.threads, train)
        print(f"predictors {target:.0%}: trained in {time.time() - t0:.0f}s", file=sys.stderr)
        configs[f"thr+pred {target:.0%}"] = dict(plan=plan, target=target)

    rows = {}
    for name, c in configs.items():
        plan = c["plan"]
        emu = pyinfer.load(path, n_threads=args.threads, n_ctx=512, sparsity=plan or "off", emulate_prefill=True,
                           progress=False)
        ppl = perplexity(emu, wiki, ctx=512, windows=args.windows, progress=False).perplexity
        del emu
        measured = measure_plan(dense, plan, ids[-8192:], 1024) if plan is not None else None
        family = "dense" if plan is None else name.rsplit(" ", 1)[0]
        rows[name] = dict(config=name, family=family, target=c.get("target", 0.0),
                          predictors=bool(plan and plan.has_predictors),
                          perplexity=ppl, bytes_per_token=bytes_per_token(dense, plan, measured),
                          predictor_bytes=plan.predictor_bytes() if plan else 0,
                          layers=measured, model=pyinfer.load(path, n_threads=args.threads, n_ctx=512,
                                                              sparsity=plan or "off", progress=False))
        print(f"{name}: ppl {ppl:.4f}", file=sys.stderr)

    llama = None if args.no_llamacpp else LlamaCpp(path, args.threads, 512)
    prompt = dense.tokenize("Once upon a time")
    speeds = {k: [] for k in rows}
    speeds["llama.cpp"] = []
    for r in range(args.rounds):
        order = list(rows) + (["llama.cpp"] if llama else [])
        if r % 2:
            order.reverse()
        for k in order:
            if k == "llama.cpp":
                sec, _ = llama.decode(prompt, args.gen)
            else:
                sec, _ = pyinfer_decode(rows[k]["model"], prompt, args.gen)
            speeds[k].append(args.gen / sec)
    out = []
    for k, row in rows.items():
        row.pop("model")
        row["decode_tok_s"] = statistics.median(speeds[k])
        row["vs_dense"] = statistics.median(a / b for a, b in zip(speeds[k], speeds["dense"]))
        row["vs_llamacpp"] = (statistics.median(a / b for a, b in zip(speeds[k], speeds["llama.cpp"]))
                              if llama else None)
        row["ppl_vs_dense"] = row["perplexity"] / rows["dense"]["perplexity"] - 1
        if row["layers"]:
            for key in ("computed_density", "active_density", "recall"):
                row["mean_" + key] = float(np.mean([m[key] for m in row["layers"]]))
        out.append(row)
    meta = dict(machine=platform.processor() or platform.machine(), threads=args.threads, windows=args.windows,
                rounds=args.rounds, gen=args.gen, profile_tokens=prof.tokens, train_tokens=args.train_tokens,
                rank=args.rank, llamacpp_tok_s=statistics.median(speeds["llama.cpp"]) if llama else None,
                date=time.strftime("%Y-%m-%d"), model=Path(path).name)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{RESULT_STEM}.json").write_text(json.dumps({"meta": meta, "rows": out}, indent=1))
    write_table(out, meta)
    plot(out, meta["model"])
    return 0


def write_table(rows, meta) -> None:
    lines = [f"# Activation sparsity on {meta['model']} ({meta['threads']} threads, {meta['date']})", "",
             f"Perplexity: WikiText-2 test, {meta['windows']} windows of 512, llama.cpp scoring, sparse decode "
             f"semantics for every token. Speed: greedy decode of {meta['gen']} tokens, {meta['rounds']} alternating "
             f"rounds, median of per-round ratios. Calibration: pride-and-prejudice.txt "
             f"({meta['profile_tokens']} profile tokens, {meta['train_tokens']} predictor tokens).", "",
             "| config | PPL | ΔPPL | decode tok/s | × dense | × llama.cpp | MB read/token | gate/up rows computed | "
             "recall | predictor KB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vl = f"{r['vs_llamacpp']:.3f}" if r["vs_llamacpp"] else "-"
        comp = f"{r.get('mean_computed_density', 1.0):.3f}"
        rec = f"{r['mean_recall']:.3f}" if "mean_recall" in r else "-"
        lines.append(f"| {r['config']} | {r['perplexity']:.3f} | {r['ppl_vs_dense']:+.2%} | {r['decode_tok_s']:.1f} | "
                     f"{r['vs_dense']:.3f} | {vl} | {r['bytes_per_token'] / 1e6:.1f} | {comp} | {rec} | "
                     f"{r['predictor_bytes'] / 1024:.0f} |")
    (RESULTS / f"{RESULT_STEM}.md").write_text("\n".join(lines) + "\n")


def plot(rows, model: str) -> None:
    from pyinfer.sparsity.plots import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = {"thr": "threshold only (dense gate/up, sparse down)", "gate-first": "gate first (sparse up/down)",
              "thr+pred": "threshold + predictor (sparse gate/up/down)"}
    for fam, style in (("thr", "o-"), ("gate-first", "^-"), ("thr+pred", "s--")):
        pts = [r for r in rows if r["family"] == fam]
        ax.plot([r["vs_dense"] for r in pts], [r["ppl_vs_dense"] * 100 for r in pts], style, label=labels[fam])
        for r in pts:
            ax.annotate(f"{r['target']:.0%}", (r["vs_dense"], r["ppl_vs_dense"] * 100), fontsize=8,
                        textcoords="offset points", xytext=(4, 4))
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.axvline(1.10, color="grey", lw=0.8, ls=":")
    ax.plot([1.0], [0.0], "k*", ms=10, label="dense")
    auto = next((r for r in rows if r["config"] == AUTO_CONFIG), None)
    if auto:
        ax.plot([auto["vs_dense"]], [auto["ppl_vs_dense"] * 100], "o", ms=14, mfc="none", mec="red", mew=2,
                label=f"auto default ({AUTO_CONFIG})")
    ax.set_ylim(-2, 30)
    ax.set_xlabel("decode speed vs our dense engine (×)")
    ax.set_ylabel("perplexity increase (%)")
    ax.set_title(f"{model}: FFN sparsity target (labels) vs quality and speed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{RESULT_STEM}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
