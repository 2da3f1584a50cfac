"""Where a predictor layer's cold neurons come from, under one RAM budget: read on demand (the default), an
LRU cache of recently read ones (how much of the budget above the minimum should hold it rather than more
resident hot neurons?), or a read-ahead window (the likeliest cold neurons after the resident ones, read every
token in large reads while earlier layers compute). A predictor plan is needed.

Every share is loaded in one process; rounds alternate the shares, and each decode's tokens are checked equal
to the in-RAM run of the same plan before anything is timed. Bundle reads use O_DIRECT, so the page cache
does not serve them. Figures: decode tok/s, bytes read per token, cache hit rate; ratios against share 0.

  pyinfer profile -f ../shared/data/pride-and-prejudice.txt -o smol.profile.npz
  pyinfer train-predictors --profile smol.profile.npz -f ../shared/data/tinyshakespeare.txt -o smol.pred.npz
  python bench/neuron_cache.py --sparsity smol.pred.npz --ffn-share 0.5 --shares 0 0.1 0.25 0.5 --windows 0.25 1
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pyinfer
from pyinfer.offload.offloaded_ffn import minimum_budget

RESULTS = Path(__file__).parent / "results" / "offload"
PROMPT = "It is a truth universally acknowledged, that a single man in possession of a good fortune"


def decode(model, tokens: int) -> tuple[str, float]:
    """Greedy text (the prompt is prefilled first) and the seconds of the whole call."""
    if model.offload:
        model.offload.store.reset_stats()
    t0 = time.perf_counter()
    out = model.generate(PROMPT, max_tokens=tokens, temperature=0)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--sparsity", required=True, help="a predictor sparsity file (pyinfer train-predictors)")
    ap.add_argument("--ffn-share", type=float, default=0.5, help="budget = minimum + this share of the FFN bytes")
    ap.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.1, 0.25, 0.5], help="cache shares")
    ap.add_argument("--windows", type=float, nargs="*", default=[], help="read-ahead window shares (cache off)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="smollm2")
    args = ap.parse_args()

    ram = pyinfer.load(args.model, n_threads=args.threads, sparsity=args.sparsity, progress=False)
    want, _ = decode(ram, args.tokens)
    probe = pyinfer.load(args.model, n_threads=args.threads, sparsity=args.sparsity, ram_budget="8G",
                         progress=False)
    layout = probe.offload.layout
    ffn = sum(e["n_ff"] * e["bundle_bytes"] for e in layout.layers)
    budget = minimum_budget(probe.gguf, probe.sparsity, layout) + int(args.ffn_share * ffn)
    del probe
    configs = [(s, 0.0) for s in args.shares] + [(0.0, w) for w in args.windows if w > 0]
    models = {c: pyinfer.load(args.model, n_threads=args.threads, sparsity=args.sparsity, ram_budget=budget,
                              neuron_cache=c[0], neuron_window=c[1], progress=False) for c in configs}
    for c, m in models.items():  # the reference check, once, before timing
        assert decode(m, args.tokens)[0] == want, f"{c}: tokens differ from the in-RAM run"
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs if r % 2 == 0 else list(reversed(configs))
        for s in order:
            m = models[s]
            _, sec = decode(m, args.tokens)
            st = m.offload.stats()
            cold = st["cache_hits"] + st["listed_neurons"]
            listed = cold + st["window_hits"]
            runs[s].append({"tok_s": args.tokens / sec, "mb_read_per_token": st["bytes_read"] / args.tokens / 1e6,
                            "cache_hit_rate": st["cache_hits"] / cold if cold else 0.0,
                            "window_hit_rate": st["window_hits"] / listed if listed else 0.0})
    base = runs[configs[0]]
    rows = []
    for s in configs:
        ratio = statistics.median(a["tok_s"] / b["tok_s"] for a, b in zip(runs[s], base))
        plan = models[s].offload.plan
        rows.append({"cache_share": s[0], "window_share": s[1], "cache_mib": plan.cache_bytes / 2**20,
                     "resident_mib": plan.resident_bytes / 2**20,
                     "tok_s": statistics.median(x["tok_s"] for x in runs[s]), "x_share_0": ratio,
                     "mb_read_per_token": statistics.median(x["mb_read_per_token"] for x in runs[s]),
                     "cache_hit_rate": statistics.median(x["cache_hit_rate"] for x in runs[s]),
                     "window_hit_rate": statistics.median(x["window_hit_rate"] for x in runs[s])})
    out = {"model": Path(ram.path).name, "sparsity": Path(args.sparsity).name, "budget": budget,
           "ffn_share": args.ffn_share, "tokens": args.tokens, "rounds": args.rounds, "threads": args.threads,
           "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"neuron_cache_{args.tag}.json").write_text(json.dumps(out, indent=1))
    lines = [f"# Cold neurons of predictor layers under one budget (cache or read-ahead window): {out['model']}, {out['sparsity']}, budget "
             f"{budget / 2**20:.1f} MiB (minimum + {args.ffn_share:.0%} of the FFN), {args.threads} threads, "
             f"{args.tokens} tokens, median of {args.rounds} alternating rounds", "",
             "| cache share | window share | cache MiB | resident MiB | tok/s | x first row | MB read/token "
             "| cache hit rate | window hit rate |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['cache_share']:.2f} | {r['window_share']:.2f} | {r['cache_mib']:.1f} | "
                     f"{r['resident_mib']:.1f} | {r['tok_s']:.1f} | {r['x_share_0']:.3f} | {r['mb_read_per_token']:.2f} "
                     f"| {r['cache_hit_rate']:.1%} | {r['window_hit_rate']:.1%} |")
    (RESULTS / f"neuron_cache_{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
