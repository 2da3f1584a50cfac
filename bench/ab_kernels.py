"""Two builds of pyinfer on the same pytest-benchmark kernel entries: each round runs the selected entries of
`bench/test_bench_*.py` under build A, then B (the order flipped every other round), in separate processes; the
table gives each entry's median time per build (median over rounds of pytest-benchmark's median) and B / A.
For kernel changes whose end-to-end effect drowns in this VM's noise (ab_versions.py is the end-to-end twin).

  pip install --no-deps --target /tmp/old-pyinfer <checkout of the old commit>
  python bench/ab_kernels.py --a /tmp/old-pyinfer --b site -k "smollm2 and (dense or down_axpy)" --rounds 3
      # writes bench/results/kernels/ab_kernels.{json,md}; --b site: the installed pyinfer (an editable install too)
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab_versions import build_args, runner

BENCH = Path(__file__).parent
RESULTS = BENCH / "results" / "kernels"

RUNNER = runner("import pytest\nsys.exit(pytest.main(sys.argv[2:]))\n")  # pytest with the build first


def run(path: str, files: list[str], expr: str) -> dict[str, float]:
    """{"times": {benchmark name: median seconds}, "cpu": its name} of one run under the build at `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "b.json"
        r = subprocess.run([sys.executable, "-c", RUNNER, path, "-q", "-p", "no:cacheprovider", *files, "-k", expr,
                            f"--benchmark-json={out}", f"--rootdir={BENCH}"], capture_output=True, text=True,
                           cwd=BENCH)
        if r.returncode:
            raise SystemExit(f"the benchmarks failed under {path}:\n{r.stdout[-2000:]}{r.stderr[-1000:]}")
        data = json.loads(out.read_text())
        cpu = data.get("machine_info", {}).get("cpu", {}).get("brand_raw", "")
        return {"times": {b["name"]: b["stats"]["median"] for b in data["benchmarks"]}, "cpu": cpu}


def main() -> int:

    ap = build_args(__doc__)
    ap.add_argument("--files", nargs="+", default=["test_bench_sparse.py"], help="under bench/")
    ap.add_argument("-k", dest="expr", required=True, help="pytest -k expression selecting the entries")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="ab_kernels")
    args = ap.parse_args()
    builds = {"a": args.a, "b": args.b}
    times: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    cpu = ""
    for r in range(args.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            res = run(builds[side], args.files, args.expr)
            cpu = res["cpu"] or cpu
            for name, t in res["times"].items():
                times[side].setdefault(name, []).append(t)
            print(f"round {r + 1} {side}: {len(res['times'])} entries", file=sys.stderr)
    names = [n for n in times["a"] if n in times["b"]]
    rows = [{"name": n, "a_us": statistics.median(times["a"][n]) * 1e6, "b_us": statistics.median(times["b"][n]) * 1e6,
             "a_rounds_us": [t * 1e6 for t in times["a"][n]], "b_rounds_us": [t * 1e6 for t in times["b"][n]]}
            for n in names]
    for row in rows:
        row["ratio"] = row["b_us"] / row["a_us"]
    meta = {"a": args.a, "b": args.b, "label_a": args.label_a, "label_b": args.label_b, "rounds": args.rounds,
            "expr": args.expr, "files": args.files, "cpu": cpu, "date": time.strftime("%Y-%m-%d")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Kernel benchmarks, {args.label_a} against {args.label_b} ({cpu or 'this CPU'})", "",
             f"`python bench/ab_kernels.py -k \"{args.expr}\" --rounds {args.rounds}`: the two builds in turn, separate "
             "processes; each entry's median over rounds of pytest-benchmark's median time.", "",
             f"| entry | {args.label_a} us | {args.label_b} us | {args.label_b} / {args.label_a} |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['a_us']:.1f} | {r['b_us']:.1f} | {r['ratio']:.3f} |" for r in rows]
    (RESULTS / f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
