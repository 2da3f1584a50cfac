"""Turns pytest-benchmark JSON into a markdown table with each ISA's speedup over scalar (same run), or along
another parameter against one of its values.

  python bench/kernels_table.py bench/results/kernels/kernels.json > bench/results/kernels/kernels.md
  python bench/kernels_table.py J.json --axis layout --base interleaved   # each layout against `interleaved`"""
import argparse
import json
import re
from collections import defaultdict


def main(path: str, axis: str = "isa", base: str = "scalar") -> None:
    data = json.load(open(path))
    rows = defaultdict(dict)
    for b in data["benchmarks"]:
        m = re.match(r"(.*)\[(.*)\]", b["name"])
        params = b["params"]
        isa = params.pop(axis)
        key = m.group(1) + "[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"
        rows[key][isa] = b["stats"]["median"] * 1e6
    isas = sorted({i for r in rows.values() for i in r}, key=lambda i: i == base)
    print(f"Kernel medians in microseconds, {data['machine_info'].get('cpu', {}).get('brand_raw', '')}, "
          f"2 threads; ratio = {base} / {axis} in the same run.\n")
    print("| op | " + " | ".join(f"{i} us" for i in isas) + " | " +
          " | ".join(f"{i} speedup" for i in isas if i != base) + " |")
    print("|---" * (1 + len(isas) + len(isas) - 1) + "|")
    for key, r in sorted(rows.items()):
        cells = [f"{r[i]:.1f}" if i in r else "-" for i in isas]
        ratios = [f"{r[base] / r[i]:.2f}x" if i in r and base in r else "-" for i in isas if i != base]
        print(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--axis", default="isa", help="the parameter compared along (default: isa)")
    ap.add_argument("--base", default="scalar", help="the value every other is compared against (default: scalar)")
    a = ap.parse_args()
    main(a.json, a.axis, a.base)
