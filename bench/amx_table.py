"""Tables for issue 28's AMX run (bench/gpu/amx.sh): prefill of avx512 against amx per (threads, prompt) from
prefill.jsonl (alternating rounds: median of per-round ratios, lowest and highest), the kernel benchmark from
pytest-benchmark's JSON, and whether the emulated and real tile builds gave the same bits.

    python bench/amx_table.py DIR [DIR ...] --tag amx_h200

Each DIR is one run's output folder; prefill rows from several runs are kept apart (a run is one machine).
Writes bench/results/TAG.json and TAG.md."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "kernels"
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def prefill_rows(run: Path) -> list[dict]:
    path = run / "prefill.jsonl"
    if not path.exists():
        return []
    by_key: dict = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        key = (r["threads"], r["result"]["prompt_tokens"])
        by_key.setdefault(key, {}).setdefault(r["round"], {})[r["isa"]] = r["result"]["prefill_tok_s"]
    rows = []
    for (threads, prompt), rounds in sorted(by_key.items()):
        pairs = [v for v in rounds.values() if "amx" in v and "avx512" in v]
        if not pairs:
            continue
        ratios = [v["amx"] / v["avx512"] for v in pairs]
        rows.append({"run": run.name, "threads": threads, "prompt_tokens": prompt, "rounds": len(pairs),
                     "avx512_tok_s": statistics.median(v["avx512"] for v in pairs),
                     "amx_tok_s": statistics.median(v["amx"] for v in pairs),
                     "ratio_median": statistics.median(ratios), "ratio_low": min(ratios), "ratio_high": max(ratios)})
    return rows


def kernel_rows(run: Path) -> list[dict]:
    path = run / "quant_kernels_amx.json"
    if not path.exists():
        return []
    med = {b["name"]: b["stats"]["median"] for b in json.loads(path.read_text())["benchmarks"]}
    rows = []
    for t in TYPES:
        for n in (1, 64, 256):
            a, v = med.get(f"test_matmul_type[{t}-{n}-amx]"), med.get(f"test_matmul_type[{t}-{n}-avx512]")
            if a and v:
                rows.append({"type": t, "n_tok": n, "avx512_ms": v * 1e3, "amx_ms": a * 1e3, "speedup": v / a})
    return rows


def bits(run: Path) -> str | None:
    emu, real = run / "amx_emulated.txt", run / "amx_real.txt"
    if not (emu.exists() and real.exists()):
        return None
    pick = lambda p: [ln for ln in p.read_text().splitlines() if " bits " in ln]  # noqa: E731
    return "equal" if pick(emu) and pick(emu) == pick(real) else "different"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--tag", default="amx")
    args = ap.parse_args()
    out = {"runs": []}
    md = [f"# AMX int8 prefill against the AVX-512 VNNI kernels ({args.tag})", ""]
    for run in args.runs:
        cpu = (run / "cpu.txt").read_text().strip() if (run / "cpu.txt").exists() else ""
        entry = {"run": run.name, "cpu": cpu, "prefill": prefill_rows(run), "kernels": kernel_rows(run),
                 "emulated_vs_real_bits": bits(run)}
        out["runs"].append(entry)
        md += [f"## run {run.name}", "", "```", cpu, "```", ""]
        if entry["emulated_vs_real_bits"]:
            md += [f"Emulated tiles against real ones (tests/cpp/amx_emulated.cpp, 8 types): bits "
                   f"**{entry['emulated_vs_real_bits']}**.", ""]
        if entry["prefill"]:
            md += ["| threads | prompt | rounds | avx512 tok/s | amx tok/s | amx / avx512 (median of rounds) | lowest-highest |",
                   "|---|---|---|---|---|---|---|"]
            md += [f"| {r['threads']} | {r['prompt_tokens']} | {r['rounds']} | {r['avx512_tok_s']:.0f} | "
                   f"{r['amx_tok_s']:.0f} | **{r['ratio_median']:.2f}x** | {r['ratio_low']:.2f}-{r['ratio_high']:.2f} |"
                   for r in entry["prefill"]]
            md.append("")
        if entry["kernels"]:
            md += ["| type | tokens | avx512 (ms) | amx (ms) | speedup |", "|---|---|---|---|---|"]
            md += [f"| {r['type']} | {r['n_tok']} | {r['avx512_ms']:.3f} | {r['amx_ms']:.3f} | {r['speedup']:.2f}x |"
                   for r in entry["kernels"]]
            md.append("")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
