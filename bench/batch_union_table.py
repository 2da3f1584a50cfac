"""The batched sparse FFN against the dense FFN of the same batch (bench/test_bench_batch_union.py):
a markdown table of time ratios, the break-even densities per batch size, and a plot.

  python bench/batch_union_table.py bench/results/kernels/batch_union.json"""
import json
import sys
from pathlib import Path


def break_even(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """points: (mean density, union density, ratio) ascending in density. The (mean, union) densities
    where the ratio crosses 1, linearly interpolated; None when sparse never pays."""
    if not points or points[0][2] >= 1.0:
        return None
    for (d0, u0, r0), (d1, u1, r1) in zip(points, points[1:]):
        if r1 >= 1.0:
            f = (1.0 - r0) / (r1 - r0)
            return d0 + f * (d1 - d0), u0 + f * (u1 - u0)
    return points[-1][0], points[-1][1]  # still paying at the densest point measured


def main(path: str) -> None:
    data = json.load(open(path))
    for b in data["benchmarks"]:  # the per-round samples are not needed to read the medians
        b["stats"].pop("data", None)
    Path(path).write_text(json.dumps(data, indent=1))
    dense, union = {}, {}
    for b in data["benchmarks"]:
        e = b["extra_info"]
        key = (e["shape"], e["kind"], e["n_tok"])
        if e["path"] == "dense":
            dense[key] = b["stats"]["median"]
        else:
            union.setdefault(key, []).append((e["density"], e["union"], b["stats"]["median"], e["target_density"]))
    cpu = data["machine_info"].get("cpu", {}).get("brand_raw", "")
    out = [f"Batched sparse FFN / dense FFN of the same batch, median times, 2 threads, {cpu}.",
           "predicted: union gather of gate/up + per-token activation + per-token down rows, vs gate/up/down "
           "GEMMs; threshold: per-token down rows vs the down GEMM (gate/up dense on both paths).", "",
           "| shape | kind | tokens | target density | mean density | union density | dense us | ratio |",
           "|---|---|---|---|---|---|---|---|"]
    evens = ["", "Break-even (ratio 1, interpolated): the densities below which the batched sparse FFN is faster.", "",
             "| shape | kind | tokens | mean density | union density |", "|---|---|---|---|---|"]
    curves = {}
    for key in sorted(union):
        base = dense[key]
        pts = sorted((d, u, t / base) for d, u, t, _ in union[key])
        for d, u, t, target in sorted(union[key], key=lambda r: r[0]):
            out.append(f"| {key[0]} | {key[1]} | {key[2]} | {target} | {d:.3f} | {u:.3f} | {base * 1e6:.0f} | "
                       f"{t / base:.3f} |")
        be = break_even(pts)
        evens.append(f"| {key[0]} | {key[1]} | {key[2]} | " +
                     ("never pays | - |" if be is None else f"{be[0]:.2f} | {be[1]:.2f} |"))
        curves[key] = pts
    text = "\n".join(out + evens) + "\n"
    Path(path).with_suffix(".md").write_text(text)
    print(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shapes = sorted({k[0] for k in curves})
    kinds = sorted({k[1] for k in curves})
    fig, axes = plt.subplots(len(shapes), len(kinds), figsize=(5 * len(kinds), 4 * len(shapes)), squeeze=False)
    for i, shape in enumerate(shapes):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for key, pts in sorted(curves.items()):
                if key[0] == shape and key[1] == kind:
                    ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=f"B={key[2]}")
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
            ax.set(title=f"{shape}, {kind}", xlabel="union density of the batch", ylabel="sparse / dense time")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(path).with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/kernels/batch_union.json")
