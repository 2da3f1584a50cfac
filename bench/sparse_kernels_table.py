"""Sparse kernel times as a fraction of the dense GEMV of the same matrix (same run), as a markdown
table and a plot of time against density.

  python bench/sparse_kernels_table.py bench/results/kernels/sparse_kernels.json"""
import json
import sys
from pathlib import Path


def main(path: str) -> None:
    data = json.load(open(path))
    med = {}
    for b in data["benchmarks"]:
        e = b["extra_info"]
        med[(e["shape"], e["op"], e["density"])] = b["stats"]["median"] * 1e6
    shapes = sorted({k[0] for k in med})
    out = [f"Median microseconds, 2 threads, {data['machine_info'].get('cpu', {}).get('brand_raw', '')}; "
           "ratio = sparse time / dense GEMV of the same matrix in the same run (gather: gate [d_ff, d]; "
           "down axpy: down [d, d_ff]).", "",
           "| shape | op | density | us | vs dense GEMV |", "|---|---|---|---|---|"]
    curves = {}
    for shape in shapes:
        # (down_axpy_q8t: the input-sparse copy until it was dropped for Q8_0 rows; older result files hold it)
        for op, dense in (("gather_gemv", "gate_gemv"), ("down_axpy_q4t", "down_gemv"), ("down_axpy_q8_0", "down_gemv"),
                          ("down_axpy_q8t", "down_gemv")):
            if (shape, dense, 1.0) not in med or not any(k[0] == shape and k[1] == op for k in med):
                continue  # (a run of some of the entries: pytest -k)
            base = med[(shape, dense, 1.0)]
            if op not in ("down_axpy_q8_0", "down_axpy_q8t"):
                out.append(f"| {shape} | {dense} (dense) | 1.0 | {base:.1f} | 1.00 |")
            pts = sorted((k[2], v) for k, v in med.items() if k[0] == shape and k[1] == op)
            for dens, us in sorted(pts, reverse=True):
                out.append(f"| {shape} | {op} | {dens} | {us:.1f} | {us / base:.3f} |")
            curves[(shape, op)] = [(dens, us / base) for dens, us in pts]
    md = Path(path).with_suffix(".md")
    md.write_text("\n".join(out) + "\n")
    print("\n".join(out))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (shape, op), pts in sorted(curves.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{op} ({shape})")
    ax.plot([0, 1], [0, 1], "k:", lw=0.8, label="proportional")
    ax.axhline(0.2, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("density (share of neurons computed)")
    ax.set_ylabel("time / dense GEMV")
    ax.set_title("Neuron-aware kernels vs dense GEMV")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(path).with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main(sys.argv[1])
