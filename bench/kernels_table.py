"""Turns pytest-benchmark JSON into a markdown table with each ISA's speedup over scalar (same run).

  python bench/kernels_table.py bench/results/kernels/kernels.json > bench/results/kernels/kernels.md"""
import json
import re
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path))
    rows = defaultdict(dict)
    for b in data["benchmarks"]:
        m = re.match(r"(.*)\[(.*)\]", b["name"])
        params = b["params"]
        isa = params.pop("isa")
        key = m.group(1) + "[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"
        rows[key][isa] = b["stats"]["median"] * 1e6
    isas = sorted({i for r in rows.values() for i in r}, key=lambda i: i == "scalar")
    print(f"Kernel medians in microseconds, {data['machine_info'].get('cpu', {}).get('brand_raw', '')}, "
          "2 threads; ratio = scalar / ISA in the same run.\n")
    print("| op | " + " | ".join(f"{i} us" for i in isas) + " | " +
          " | ".join(f"{i} speedup" for i in isas if i != "scalar") + " |")
    print("|---" * (1 + len(isas) + len(isas) - 1) + "|")
    for key, r in sorted(rows.items()):
        cells = [f"{r[i]:.1f}" if i in r else "-" for i in isas]
        ratios = [f"{r['scalar'] / r[i]:.1f}x" if i in r and "scalar" in r else "-" for i in isas if i != "scalar"]
        print(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
