"""GGUF mutation fuzzing of the loader and engine: the tiny test model (whole file) and the real model's
header and tensor directory, bytes mutated in place and, structurally, metadata entries re-encoded (chat
templates of other types and hostile ones, duplicated or all-control vocabularies, huge unused arrays,
vocabulary arrays of the wrong type, special ids out of range). Every mutant must load and run one token,
render and run a chat, tokenize with special tokens and answer the server's requests, or fail with a one-line
PyinferError (an OpenAI-shaped error from the server); crashes, hangs, tracebacks and memory blow-ups are
findings.

  python bench/fuzz_gguf.py --cases 10000            # -> bench/results/robustness/fuzz_gguf.{json,md}
  python bench/fuzz_gguf.py --cases 300 --seed 1 --tiny tiny    # what CI runs (tests/test_fuzz_gguf.py)

The tiny targets are the plain llama ("tiny") and one model of each other architecture the loader knows
(qwen3moe, mixtral, qwen2moe, phi3, qwen3, qwen2, llama3, gemma3), taken in turn.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.gguf_fuzz import ALL_KINDS, ARCH_TARGETS, Fuzzer, make_cases, summarize, write_targets  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "robustness"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-share", type=float, default=0.1, help="share of cases on the real model's header")
    ap.add_argument("--tiny", nargs="+", default=["tiny", *ARCH_TARGETS], choices=["tiny", *ARCH_TARGETS],
                    help="tiny models to mutate, in turn (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    ap.add_argument("--no-save", action="store_true", help="do not write bench/results/robustness/fuzz_gguf.*")
    args = ap.parse_args()
    from tqdm import tqdm
    from pyinfer.model.pull import installed_default_model

    with tempfile.TemporaryDirectory() as tmp:
        sources = write_targets(Path(tmp), args.tiny)
        real = installed_default_model()
        if real is not None:
            sources["real"] = str(real)
        cases = make_cases(args.cases, args.seed, args.real_share, real is not None, args.tiny)
        bar = tqdm(total=len(cases), unit="case", file=sys.stderr)
        t0 = time.time()
        results = Fuzzer(sources, Path(tmp), args.workers, args.timeout).run(cases, lambda r: bar.update(1))
        bar.close()
        elapsed = time.time() - t0
    s = summarize(results)
    s.update(seed=args.seed, seconds=round(elapsed, 1), cases_per_s=round(len(results) / elapsed, 2),
             targets={t: sum(1 for c in cases if c.target == t) for t in sources})
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "fuzz_gguf.json").write_text(json.dumps(s, indent=1))
        lines = [f"# GGUF fuzzing: {s['cases']} cases (seed {args.seed}), {s['cases_per_s']} cases/s", "",
                 f"targets: {s['targets']}; outcomes: {s['outcomes']}", "",
                 "| kind | " + " | ".join(["ok", "error", "exception", "multiline", "memory", "crash", "hang"]) + " |",
                 "|---" * 8 + "|"]
        for k in ALL_KINDS:
            d = s["by_kind"].get(k, {})
            lines.append(f"| {k} | " + " | ".join(str(d.get(o, 0)) for o in
                                                 ["ok", "error", "exception", "multiline", "memory", "crash", "hang"]) + " |")
        (RESULTS / "fuzz_gguf.md").write_text("\n".join(lines) + "\n")
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{s['cases']} cases in {s['seconds']} s ({s['cases_per_s']} cases/s): {s['outcomes']}")
        for f in s["findings"][:20]:
            print(f"  {f['kind']:<15} {f['target']:<5} {f['outcome']:<10} {f['what']}: {f['detail']}")
    return 1 if s["findings"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
