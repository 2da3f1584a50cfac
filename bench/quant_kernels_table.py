"""Markdown table from bench/test_bench_quant_types.py's JSON: per weight type and ISA, GEMV and GEMM medians
and their ratio to F16 and to Q4_0 in the same run (>1: faster than that type).

  python bench/quant_kernels_table.py bench/results/kernels/quant_kernels.json > bench/results/kernels/quant_kernels.md"""
import json
import re
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path))
    t = defaultdict(dict)  # (isa, n_tok) -> type -> (median us, bytes)
    for b in data["benchmarks"]:
        p = b["params"]
        t[(p["isa"], p["n_tok"])][p["qtype"]] = (b["stats"]["median"] * 1e6, b["extra_info"]["weight_bytes"])
    cpu = data["machine_info"].get("cpu", {}).get("brand_raw", "")
    print(f"Matmul of a 2048 x 2048 weight, 2 threads, {cpu}. Medians in microseconds; × F16 and × Q4_0 are "
          "those types' time over this one's in the same run. F16 weights take the float path (no integer dot).\n")
    for (isa, n_tok) in sorted(t):
        row = t[(isa, n_tok)]
        print(f"### {isa}, {'GEMV (1 token)' if n_tok == 1 else f'GEMM ({n_tok} tokens)'}\n")
        print("| type | bits/weight | median us | GB/s of weights | × F16 | × Q4_0 |")
        print("|---|---|---|---|---|---|")
        for name, (us, nbytes) in sorted(row.items(), key=lambda kv: re.sub(r"^F16$", "A", kv[0])):
            f16 = row.get("F16", (float("nan"),))[0] / us
            q40 = row.get("Q4_0", (float("nan"),))[0] / us
            print(f"| {name} | {nbytes * 8 / (2048 * 2048):.2f} | {us:.1f} | {nbytes / us / 1e3:.1f} | "
                  f"{f16:.2f} | {q40:.2f} |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
