"""bench/results/ by experiment: which folder a result belongs to (by its name), and the folder's index.

  python bench/results_layout.py          # rewrites bench/results/README.md from what the folders hold

Each bench script writes into its experiment's folder (its RESULTS constant); this table is what put the earlier
flat files there and what the index describes."""
from __future__ import annotations

import re
from pathlib import Path

GROUPS = [  # (folder, what it holds, name patterns), first match wins
    ("roof", "decode and prefill at the memory roof: real-shaped 1.5B/3B/8B models, per-type GEMV against the read bandwidth",
     [r"^roof_"]),
    ("vs_llamacpp", "end to end beside llama.cpp on the real small models, kernel tables and machines",
     [r"_vs_llamacpp", r"^llamacpp_quantized$", r"^core_vs_llamacpp"]),
    ("moe", "Mixture of Experts: streamed experts, cache policies, prefetch, GPU placement, cuts inside experts",
     [r"^moe_(?!cut_kernels)", r"^offload_moe_synthetic"]),
    ("offload", "larger than RAM: neuron streaming, neuron cache, memory limits, where memory goes",
     [r"^offload_", r"^neuron_cache", r"^memory_breakdown$"]),
    ("gpu", "the hybrid CPU/GPU split on the stand-in and on CUDA",
     [r"^hybrid_", r"^gpu_check", r"^two_backends$"]),
    ("sparsity", "activation sparsity: decode speed, the auto choice, sparsity curves, predictors, ReLU-fication",
     [r"^sparse_decode", r"^auto_choice", r"^sparsity_curve", r"^smollm2_powerlaw$", r"^predictors_", r"^cluster_order$",
      r"^relufy_"]),
    ("serving", "the server: load, soak, hostile input, the scheduler simulation, batch decode, Ray replicas, the chat page",
     [r"^serve_", r"^batch_decode$", r"^chat_page$", r"^logprobs"]),
    ("robustness", "fuzzing, tokenizers against llama.cpp's cases, each architecture against llama.cpp",
     [r"^fuzz_", r"^tokenizer_", r"^arch_check$", r"^amx_perplexity"]),
    ("long_context", "decode at depth: attention kernels and KV cache types against llama.cpp",
     [r"^long_context"]),
    ("kernels", "kernel micro-benchmarks and A/B runs: GEMV/GEMM tiles, attention, sparse gather, AMX, thread pool",
     [r".*"]),
]

def group_of(name: str) -> str:
    stem = re.sub(r"\.[A-Za-z0-9]+$", "", name)
    for folder, _, pats in GROUPS:
        if any(re.search(p, stem) for p in pats):
            return folder
    raise KeyError(name)


def index(root: Path) -> str:
    """One section per experiment folder: what it holds, then each table (a .md) with its title and the other
    files (JSON, plots) of the same name."""
    out = ["# Benchmark results", "",
           "Grouped by experiment; each `.md` is a table a bench script wrote (the command is in it or in the",
           "script's docstring), beside its `.json` (the raw numbers) and plots. The docs link into these:",
           "[docs/](../../docs/README.md). Regenerate this index with `python bench/results_layout.py`.", ""]
    for folder, what, _ in GROUPS:
        d = root / folder
        if not d.is_dir():
            continue
        files = sorted(p.name for p in d.iterdir() if p.is_file())
        out += [f"## [{folder}/]({folder}/)", "", what[0].upper() + what[1:] + ".", ""]
        stems = sorted({f.rsplit(".", 1)[0] for f in files})
        for stem in stems:
            mates = [f for f in files if f.rsplit(".", 1)[0] == stem]
            md = f"{stem}.md"
            title = ""
            if md in mates:
                first = next((ln for ln in (d / md).read_text().splitlines() if ln.strip()), "")
                title = first.lstrip("# ").strip()
            links = ", ".join(f"[{f.rsplit('.', 1)[1]}]({folder}/{f})" for f in mates)
            out.append(f"- `{stem}` ({links})" + (f": {title}" if title else ""))
        out.append("")
    return "\n".join(out)


def main() -> None:
    root = Path(__file__).parent / "results"
    (root / "README.md").write_text(index(root))
    print(f"wrote {root / 'README.md'}")


if __name__ == "__main__":
    main()
