"""Two builds of pyinfer side by side: `pyinfer bench --json` in separate processes, alternating which runs
first each round, the same model and threads; the median of the per-round ratios (B over A) for prefill and
decode. For a change that must not move speed (a refactor), A is the build before it.

  pip install --no-deps --target /tmp/old-pyinfer <checkout of the old commit>
  python bench/ab_versions.py --a /tmp/old-pyinfer --b site --models smollm2-135m gemma3-270m --rounds 5
      # writes bench/results/kernels/ab_versions.{json,md}; --b site: the installed pyinfer
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "kernels"


def runner(then: str) -> str:
    """Python source that puts the build at argv[1] first on sys.path ("site": the installed one), without an
    editable install's import redirect (which would otherwise win over any path, so both sides of an A/B would
    run the installed build), then runs `then` on argv[2:]."""
    return ("import sys\n"
            "path = sys.argv[1]\n"
            "if path != 'site':\n"
            "    sys.meta_path = [f for f in sys.meta_path if 'editable' not in type(f).__module__]\n"
            "    sys.path.insert(0, path)\n") + then


RUNNER = runner("from pyinfer.cli import main\nsys.exit(main(sys.argv[2:]))\n")  # pyinfer bench


def bench(path: str, model: str, threads: int, prompt: int, gen: int) -> dict:
    r = subprocess.run([sys.executable, "-c", RUNNER, path, "bench", "-m", model, "-t", str(threads), "-p",
                        str(prompt), "-g", str(gen), "--json"], capture_output=True, text=True,
                       cwd=tempfile.gettempdir(), timeout=1200)  # never the source tree
    if r.returncode:
        raise SystemExit(f"pyinfer bench failed under {path}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_args(doc: str) -> argparse.ArgumentParser:
    """The parser of an A/B script: the two builds and their labels (this one and ab_kernels.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="PYTHONPATH of build A (or 'site')")
    ap.add_argument("--b", required=True, help="PYTHONPATH of build B (or 'site')")
    ap.add_argument("--label-a", default="before")
    ap.add_argument("--label-b", default="after")
    return ap


def main() -> int:
    ap = build_args(__doc__)
    ap.add_argument("--models", nargs="+", default=["smollm2-135m"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tag", default="ab_versions")
    args = ap.parse_args()
    out = {"a": args.a, "b": args.b, "labels": [args.label_a, args.label_b], "threads": args.threads,
           "rounds": args.rounds, "models": {}}
    for model in args.models:
        rows = []
        for r in range(args.rounds):
            order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
            got = {k: bench(p, model, args.threads, args.prompt_tokens, args.gen_tokens) for k, p in order}
            rows.append({k: {"prefill": v["prefill_tok_s"], "decode": v["decode_tok_s"]} for k, v in got.items()})
            print(model, r, json.dumps(rows[-1]), file=sys.stderr)
        summary = {}
        for test in ("prefill", "decode"):
            ratios = [x["b"][test] / x["a"][test] for x in rows]
            summary[test] = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios),
                             "max_ratio": max(ratios),
                             "a_median": statistics.median(x["a"][test] for x in rows),
                             "b_median": statistics.median(x["b"][test] for x in rows)}
        out["models"][model] = {"rounds": rows, "summary": summary}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=1))
    md = [f"# {args.label_b} against {args.label_a}: `pyinfer bench`, alternating processes", "",
          f"{args.threads} threads, {args.prompt_tokens}-token prefill, {args.gen_tokens} decode steps, "
          f"{args.rounds} rounds (which build runs first flips every round). Ratio: {args.label_b} / {args.label_a}.",
          "", f"| model | test | {args.label_a} tok/s (median) | {args.label_b} tok/s (median) | median ratio | "
          "lowest | highest |", "|---|---|---|---|---|---|---|"]
    for model, v in out["models"].items():
        for test, s in v["summary"].items():
            md.append(f"| {model} | {test} | {s['a_median']:.1f} | {s['b_median']:.1f} | {s['median_ratio']:.3f} | "
                      f"{s['min_ratio']:.3f} | {s['max_ratio']:.3f} |")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
