"""pyinfer against llama.cpp on models past the caches, in separate processes that alternate (which engine runs
first flips every round): prefill of P pseudo-random tokens from an empty cache, then G greedy decode steps
after it, the same threads and the same file. Per model and test: each engine's median tok/s, the median of the
per-round ratios (pyinfer / llama.cpp) and the lowest round's ratio. Each engine also reports how many GB/s of
weights its decode streams (file bytes times decode tok/s).

  python bench/real_shapes.py --shape qwen2.5-1.5b --out /tmp/q15.gguf     # a real-shaped file
  python bench/roof_vs_llamacpp.py -m /tmp/q15.gguf -p 256 2048 --rounds 3 --tag roof_vs_llamacpp
      # writes bench/results/<tag>.{json,md}; -m takes several files, and pyinfer's model names
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "roof"

# One llama.cpp run: the file, threads, prompt tokens, decode steps; prints {"prefill_tok_s", "decode_tok_s"}.
LLAMACPP = r"""
import json, sys, time
import numpy as np
from llama_cpp import Llama
path, threads, p, g = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=p + g + 16, n_batch=512, n_threads=threads, n_threads_batch=threads,
            verbose=False)
ids = list(np.random.default_rng(0).integers(100, min(llm.n_vocab(), 30000), size=p).tolist())
llm.eval(ids[:8]); llm.reset()  # first touch of the mapped weights is not timed (pyinfer bench warms up too)
t0 = time.perf_counter(); llm.eval(ids); t1 = time.perf_counter()
for _ in range(g):
    tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
    llm.eval([tok])
t2 = time.perf_counter()
print(json.dumps({"prefill_tok_s": p / (t1 - t0), "decode_tok_s": g / (t2 - t1)}))
"""


def run_llamacpp(path: str, threads: int, p: int, g: int) -> dict:
    r = subprocess.run([sys.executable, "-c", LLAMACPP, path, str(threads), str(p), str(g)], capture_output=True,
                       text=True, timeout=3600, cwd=tempfile.gettempdir())
    if r.returncode:
        raise SystemExit(f"llama.cpp failed on {path}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_pyinfer(build: str, path: str, threads: int, p: int, g: int) -> dict:
    from ab_versions import bench
    return bench(build, path, threads, p, g)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", nargs="+", required=True)
    ap.add_argument("-p", "--prompt-tokens", nargs="+", type=int, default=[256])
    ap.add_argument("-g", "--gen-tokens", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--build", default="site", help="PYTHONPATH of the pyinfer build (default: the installed one)")
    ap.add_argument("--tag", default="roof_vs_llamacpp")
    args = ap.parse_args()
    out = {"threads": args.threads, "rounds": args.rounds, "gen_tokens": args.gen_tokens, "cpu": cpu_name(),
           "runs": []}
    for model in args.models:
        size = os.path.getsize(model) if os.path.exists(model) else None
        for p in args.prompt_tokens:
            rows = []
            for r in range(args.rounds):
                order = ["pyinfer", "llama.cpp"] if r % 2 == 0 else ["llama.cpp", "pyinfer"]
                got = {}
                for eng in order:
                    got[eng] = (run_pyinfer(args.build, model, args.threads, p, args.gen_tokens) if eng == "pyinfer"
                                else run_llamacpp(model, args.threads, p, args.gen_tokens))
                rows.append({e: {"prefill": v["prefill_tok_s"], "decode": v["decode_tok_s"]} for e, v in got.items()})
                print(Path(model).name, p, r, json.dumps(rows[-1]), file=sys.stderr)
            summary = {}
            for test in ("prefill", "decode"):
                ratios = [x["pyinfer"][test] / x["llama.cpp"][test] for x in rows]
                s = {"median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)}
                for e in ("pyinfer", "llama.cpp"):
                    s[e] = statistics.median(x[e][test] for x in rows)
                    if test == "decode" and size:
                        s[e + "_gbps"] = s[e] * size / 1e9
                summary[test] = s
            out["runs"].append({"model": Path(model).name, "bytes": size, "prompt_tokens": p, "rounds": rows,
                                "summary": summary})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=1))
    md = [f"# pyinfer against llama.cpp, alternating processes ({out['cpu']})", "",
          f"{args.threads} threads, {args.rounds} rounds; prefill of P tokens from an empty cache, then "
          f"{args.gen_tokens} greedy decode steps after it. Ratio: pyinfer / llama.cpp, median of the rounds "
          "(lowest round). GB/s: file bytes times decode tok/s.", "",
          "| model | P | prefill pyinfer / llama.cpp tok/s | prefill ratio | decode pyinfer / llama.cpp tok/s | "
          "decode ratio | decode GB/s pyinfer / llama.cpp |", "|---|---|---|---|---|---|---|"]
    for run in out["runs"]:
        pf, dc = run["summary"]["prefill"], run["summary"]["decode"]
        gb = (f"{dc['pyinfer_gbps']:.1f} / {dc['llama.cpp_gbps']:.1f}" if "pyinfer_gbps" in dc else "")
        md.append(f"| {run['model']} | {run['prompt_tokens']} | {pf['pyinfer']:.1f} / {pf['llama.cpp']:.1f} | "
                  f"**{pf['median_ratio']:.2f}x** ({pf['min_ratio']:.2f}) | {dc['pyinfer']:.2f} / {dc['llama.cpp']:.2f} | "
                  f"**{dc['median_ratio']:.2f}x** ({dc['min_ratio']:.2f}) | {gb} |")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main())
