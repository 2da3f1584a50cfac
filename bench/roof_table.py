"""Markdown table from bench/test_bench_roof.py's JSON: per weight type, the decode GEMV's GB/s of weights at
each real row length and its share of the read bandwidth measured in the same run, one and two threads; then
prefill's GEMM (256 tokens, 2 threads) as GMAC/s at the same shapes.
With `--before OLD.json` (the same benchmarks under an older build) each cell also gives the old share (of the
old run's own read bandwidth, or of this run's where the old build had no probe).

  python bench/roof_table.py bench/results/roof/roof_kernels.json [--before bench/results/roof/roof_kernels_before.json]"""
import argparse
import json
from collections import defaultdict


def load(path: str):
    data = json.load(open(path))
    cells, roofs, prefill = {}, {}, {}
    for b in data["benchmarks"]:
        p, e = b["params"], b["extra_info"]
        if b["name"].startswith("test_gemm_prefill"):
            prefill[(p["qtype"], p["matrix"])] = e["macs"] / b["stats"]["min"] / 1e9  # two threads: the least disturbed round
            continue
        gbps = e["weight_bytes"] / b["stats"]["median"] / 1e9
        cells[(p["qtype"], p["matrix"], p["threads"])] = gbps
        if e.get("read_gbps"):
            roofs[p["threads"]] = e["read_gbps"]
    return data, cells, roofs, prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("json")
    ap.add_argument("--before")
    args = ap.parse_args()
    data, cells, roofs, prefill = load(args.json)
    _, before, before_roofs, before_prefill = load(args.before) if args.before else (None, {}, {}, {})
    cpu = data["machine_info"].get("cpu", {}).get("brand_raw", "")
    isa = data["benchmarks"][0]["extra_info"]["isa"]
    print(f"Decode GEMV (1 token) streaming a 256 MB weight of each row length, {cpu}, kernel table {isa}. "
          "Each cell: GB/s of weights, and in brackets its share of the read bandwidth measured in the same run "
          f"({', '.join(f'{t} thread(s): {g:.1f} GB/s' for t, g in sorted(roofs.items()))})"
          + ("; after the arrow, the share before." if before else ".") + "\n")
    matrices = sorted({m for _, m, _ in cells}, key=lambda m: [k for k in dict.fromkeys(m for _, m, _ in cells)].index(m))
    by_type = defaultdict(dict)
    for (q, m, t), g in cells.items():
        by_type[(q, t)][m] = g
    for t in sorted(roofs):
        print(f"### {t} thread{'s' if t > 1 else ''}\n")
        print("| type | " + " | ".join(matrices) + " |")
        print("|---|" + "---|" * len(matrices))
        for (q, tt), row in by_type.items():
            if tt != t:
                continue
            out = []
            for m in matrices:
                g = row.get(m)
                if g is None:
                    out.append("")
                    continue
                cell = f"{g:.1f} ({g / roofs[t]:.0%})"
                if (q, m, t) in before:
                    cell += f" ← {before[(q, m, t)] / before_roofs.get(t, roofs[t]):.0%}"
                out.append(cell)
            print(f"| {q} | " + " | ".join(out) + " |")
        print()
    if prefill:
        print("### Prefill GEMM, 256 tokens, 2 threads: GMAC/s, fastest of 9 rounds" + (" (after the arrow, before)" if before_prefill else "")
              + "\n")
        print("| type | " + " | ".join(matrices) + " |")
        print("|---|" + "---|" * len(matrices))
        for q in dict.fromkeys(q for q, _ in prefill):
            out = []
            for m in matrices:
                g = prefill.get((q, m))
                cell = "" if g is None else f"{g:.0f}"
                if g is not None and (q, m) in before_prefill:
                    cell += f" ← {before_prefill[(q, m)]:.0f}"
                out.append(cell)
            print(f"| {q} | " + " | ".join(out) + " |")
        print()


if __name__ == "__main__":
    main()
