"""Long context, pyinfer vs llama.cpp (llama-cpp-python), side by side in one process.

For each prompt length P: one prefill of P pseudo-random tokens from an empty cache, then --gen-tokens
greedy decode steps at that depth (the same host loop for both engines). Configurations:
  f16 cache:  pyinfer vs llama.cpp without flash attention (llama-cpp-python's default) and with it
  q8_0 cache: pyinfer --cache-type q8_0 vs llama.cpp type_k = type_v = q8_0 (which needs flash attention)
Every round runs every configuration at every P; the order of the engines flips each round, and the median
of the per-round ratios is quoted. Before timing, both engines score the same real text and their
logits are compared (the check against the reference).

  python bench/long_context.py --threads 2 --rounds 3              # speed, ~40 min on 2 cores
  python bench/long_context.py --ppl-only --ppl-windows 8,2         # q8_0 cache's perplexity cost
Writes bench/results/long_context/long_context.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from compare_llamacpp import LlamaCpp

import pyinfer
from pyinfer.model.pull import resolve_model
from pyinfer.tools.perplexity import perplexity

RESULTS = Path(__file__).parent / "results" / "long_context"
DATA = Path(__file__).resolve().parents[2] / "shared/data"
GGML_TYPE_Q8_0 = 8
# name -> (pyinfer cache type, llama.cpp options)
PEERS = {"f16": {"flash_attn": False}, "f16-fa": {"flash_attn": True},
         "q8_0-fa": {"flash_attn": True, "type_k": GGML_TYPE_Q8_0, "type_v": GGML_TYPE_Q8_0}}
OURS_FOR = {"f16": "f16", "f16-fa": "f16", "q8_0-fa": "q8_0"}


def run_pyinfer(m, ids: list[int], gen: int) -> tuple[float, float, list[int]]:
    t0 = time.perf_counter()
    logits = m.forward(ids, 0, np.array([len(ids) - 1]))[0]
    t1 = time.perf_counter()
    out = []
    for i in range(gen):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = m.forward([tok], len(ids) + i, np.array([0]))[0]
    return len(ids) / (t1 - t0), gen / (time.perf_counter() - t1), out


def run_llamacpp(peer: LlamaCpp, ids: list[int], gen: int) -> tuple[float, float, list[int]]:
    llm = peer.llm
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    out = []
    for _ in range(gen):
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
        out.append(tok)
        llm.eval([tok])
    return len(ids) / (t1 - t0), gen / (time.perf_counter() - t1), out


def check_against_peer(ours: dict, peers: dict, text_ids: list[int]) -> dict:
    """Last-position logits of a real text (up to 2048 tokens), both engines, per configuration."""
    res = {}
    for name, peer in peers.items():
        m = ours[OURS_FOR[name]]
        a = m.forward(text_ids, 0, np.array([len(text_ids) - 1]))[0]
        peer.llm.reset()
        peer.llm.eval(text_ids)
        b = np.ctypeslib.as_array(peer.llm._ctx.get_logits(), shape=(peer.llm.n_vocab(),)).copy()
        rel = float(np.abs(a - b).max() / np.abs(b).max())
        res[name] = {"tokens": len(text_ids), "max_abs_diff_over_max": rel, "same_argmax": int(a.argmax()) == int(b.argmax())}
        print(f"check {name}: {len(text_ids)} tokens, max |diff| / max |logit| = {rel:.4f}, same argmax "
              f"{res[name]['same_argmax']}", file=sys.stderr)
        assert res[name]["same_argmax"] and rel < 0.1, f"{name}: pyinfer and llama.cpp disagree at depth"
    return res


def speed(args, path: str) -> dict:
    lengths = [int(x) for x in args.lengths.split(",")]
    n_ctx = max(lengths) + args.gen_tokens + 8
    ours = {ct: pyinfer.load(path, n_threads=args.threads, n_ctx=n_ctx, cache_type=ct)
            for ct in sorted({OURS_FOR[p] for p in args.peers})}
    peers = {p: LlamaCpp(path, args.threads, n_ctx, **PEERS[p]) for p in args.peers}
    text = (DATA / "pride-and-prejudice.txt").read_text(encoding="utf-8")
    text_ids = next(iter(ours.values())).tokenize(text)[:min(2048, max(lengths))]
    check = check_against_peer(ours, peers, text_ids)
    rng = np.random.default_rng(0)
    vocab = next(iter(ours.values())).config.vocab_size
    rows = []
    for r in range(args.rounds):
        for P in lengths:
            ids = rng.integers(0, vocab, P).tolist()
            for name in args.peers:
                order = ("pyinfer", "llama.cpp") if (r + lengths.index(P)) % 2 == 0 else ("llama.cpp", "pyinfer")
                res = {}
                for eng in order:
                    res[eng] = (run_pyinfer(ours[OURS_FOR[name]], ids, args.gen_tokens) if eng == "pyinfer"
                                else run_llamacpp(peers[name], ids, args.gen_tokens))
                row = {"round": r, "P": P, "config": name, "order": order,
                       "pyinfer_prefill": res["pyinfer"][0], "llamacpp_prefill": res["llama.cpp"][0],
                       "pyinfer_decode": res["pyinfer"][1], "llamacpp_decode": res["llama.cpp"][1],
                       "same_greedy": sum(a == b for a, b in zip(res["pyinfer"][2], res["llama.cpp"][2]))}
                row["prefill_ratio"] = row["pyinfer_prefill"] / row["llamacpp_prefill"]
                row["decode_ratio"] = row["pyinfer_decode"] / row["llamacpp_decode"]
                rows.append(row)
                print(f"round {r} P={P} {name}: prefill {row['pyinfer_prefill']:.1f} vs {row['llamacpp_prefill']:.1f} "
                      f"({row['prefill_ratio']:.3f}x), decode {row['pyinfer_decode']:.1f} vs "
                      f"{row['llamacpp_decode']:.1f} ({row['decode_ratio']:.3f}x)", file=sys.stderr, flush=True)
    summary = []
    for name in args.peers:
        for P in lengths:
            rs = [x for x in rows if x["config"] == name and x["P"] == P]
            summary.append({"config": name, "P": P, **{k: statistics.median(x[k] for x in rs) for k in (
                "pyinfer_prefill", "llamacpp_prefill", "pyinfer_decode", "llamacpp_decode", "prefill_ratio",
                "decode_ratio")}, "rounds": len(rs)})
    return {"check": check, "rounds": rows, "summary": summary, "isa": next(iter(ours.values())).isa}


def cache_perplexity(args, path: str) -> list[dict]:
    """The q8_0 cache's cost: perplexity with each cache type at each context, the same windows."""
    text = (DATA / "wikitext-2-raw-test.txt").read_text(encoding="utf-8")
    out = []
    for ctx, windows in zip([int(x) for x in args.ppl_ctx.split(",")], [int(x) for x in args.ppl_windows.split(",")]):
        row = {"ctx": ctx, "windows": windows}
        for ct in ("f16", "q8_0"):
            m = pyinfer.load(path, n_threads=args.threads, n_ctx=ctx, cache_type=ct)
            row[ct] = perplexity(m, text, ctx, windows).perplexity
            del m
        row["q8_0_over_f16"] = row["q8_0"] / row["f16"]
        print(f"perplexity ctx {ctx} x {windows}: f16 {row['f16']:.4f}, q8_0 {row['q8_0']:.4f} "
              f"({row['q8_0_over_f16']:.4f}x)", file=sys.stderr)
        out.append(row)
    return out


def plot(summary: list[dict], path: Path) -> None:
    """Top: tok/s against P (medians; absolute speed drifts between rounds on a shared VM). Bottom: the
    per-round ratios' medians, the figure to read."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    configs = list(dict.fromkeys(s["config"] for s in summary))
    for col, what in enumerate(("prefill", "decode")):
        ax, rx = axes[0][col], axes[1][col]
        for name in configs:
            rs = [s for s in summary if s["config"] == name]
            P = [s["P"] for s in rs]
            if name != "f16-fa":  # pyinfer's f16 line once
                ax.plot(P, [s[f"pyinfer_{what}"] for s in rs], "o-", label=f"pyinfer {OURS_FOR[name]}")
            ax.plot(P, [s[f"llamacpp_{what}"] for s in rs], "s--", label=f"llama.cpp {name}")
            rx.plot(P, [s[f"{what}_ratio"] for s in rs], "o-", label=f"vs llama.cpp {name}")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{what} (median of rounds)")
        rx.axhline(1.0, color="gray", lw=1)
        rx.set_ylabel("pyinfer / llama.cpp")
        rx.set_xlabel("prompt tokens P (decode: depth)")
        rx.set_ylim(bottom=0)
        for a in (ax, rx):
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="512,2048,6144,8192", help="prompt lengths P")
    ap.add_argument("--gen-tokens", type=int, default=64, help="decode steps at depth P")
    ap.add_argument("--peers", default="f16,f16-fa,q8_0-fa", help=f"configurations, of {','.join(PEERS)}")
    ap.add_argument("--ppl-ctx", default="2048,8192")
    ap.add_argument("--ppl-windows", default="0", help="windows per --ppl-ctx (0: skip perplexity)")
    ap.add_argument("--ppl-only", action="store_true")
    ap.add_argument("--tag", default="long_context")
    args = ap.parse_args()
    args.peers = args.peers.split(",")
    if unknown := [p for p in args.peers if p not in PEERS]:
        ap.error(f"unknown --peers {unknown}")

    path = str(resolve_model(args.model))
    out_json = RESULTS / f"{args.tag}.json"
    out = json.loads(out_json.read_text()) if args.ppl_only and out_json.exists() else {}
    out.update({"model": os.path.basename(path), "threads": args.threads,
                "machine": f"{platform.machine()} {os.cpu_count()} cpus", "gen_tokens": args.gen_tokens})
    if not args.ppl_only:
        out.update(speed(args, path))
    if args.ppl_windows != "0":
        out["perplexity"] = cache_perplexity(args, path)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(out, indent=1))
    md = [f"# Long context: pyinfer vs llama.cpp, {out['model']}, {out['threads']} threads, {out['machine']}", ""]
    if "summary" in out:
        md += [(f"Prefill of P tokens from an empty cache, then {out['gen_tokens']} decode steps at depth P; medians "
                f"of {out['summary'][0]['rounds']} alternating rounds (tok/s; ratio = pyinfer / llama.cpp, median of "
                "per-round ratios)."), "",
               ("| cache (llama.cpp config) | P | pyinfer prefill | llama.cpp prefill | ratio | pyinfer decode | "
                "llama.cpp decode | ratio |"), "|---|---|---|---|---|---|---|---|"]
        for s in out["summary"]:
            md.append(f"| {s['config']} | {s['P']} | {s['pyinfer_prefill']:.1f} | {s['llamacpp_prefill']:.1f} | "
                      f"{s['prefill_ratio']:.3f} | {s['pyinfer_decode']:.1f} | {s['llamacpp_decode']:.1f} | "
                      f"{s['decode_ratio']:.3f} |")
        md += ["", ("f16: llama.cpp without flash attention (llama-cpp-python's default); f16-fa: with it; q8_0-fa: "
                    "both caches q8_0 (llama.cpp needs flash attention for a quantized V cache)."), ""]
        plot(out["summary"], RESULTS / f"{args.tag}.png")
        md.append(f"![scaling]({args.tag}.png)")
    if "perplexity" in out:
        md += ["", "| context | windows | perplexity f16 cache | q8_0 cache | q8_0 / f16 |", "|---|---|---|---|---|"]
        for p in out["perplexity"]:
            md.append(f"| {p['ctx']} | {p['windows']} | {p['f16']:.4f} | {p['q8_0']:.4f} | {p['q8_0_over_f16']:.4f} |")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
