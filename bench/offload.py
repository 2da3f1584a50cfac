"""Decode under a RAM budget: pyinfer's neuron streaming against llama.cpp's mmap, each in its own memory
cgroup, caches dropped before every run.

Each engine's cgroup limit is its own runtime memory (peak RSS of an unlimited in-RAM run minus the model
file it mapped) plus the same weight budget plus 16 MiB, so neither engine is charged for
the other's overhead (cgroup v1 counts page cache, which is where llama.cpp's mmap'd weights live). The
budget is every non-FFN weight plus a share of the FFN's bytes. pyinfer runs `--sparsity auto` with
`--ram-budget`; its tokens must equal its in-RAM run's (checked every run). Rounds alternate the engines
and flip their order; ratios are medians of per-round ratios.

Needs root (cgroup v1 memory controller at /sys/fs/cgroup/memory, /proc/sys/vm/drop_caches) and the
bench extra (llama-cpp-python).

  python bench/offload.py --threads 2 --rounds 3 --shares 0.75 0.5 0.25
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
MARGIN = 16 << 20
PROTOCOLS = {"peak": "the cgroup's high-water mark (page cache of imports and metadata included)",
             "rss": "peak RSS (the issue's protocol)", "steady": "RSS at the end of decode"}
PROMPT = "Once upon a time"
_FFN = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.weight$")


# ---- child: one engine, one decode, one JSON line ------------------------------------------------------
def io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


def mapped_rss(path: str) -> int:
    """Bytes of `path` resident in this process's mappings (the weights an mmap engine holds)."""
    total, inside = 0, False
    target = os.path.realpath(path)
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                parts = line.split()
                inside = len(parts) > 5 and os.path.realpath(parts[5]) == target
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def rss_now() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024


def child(args) -> None:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from compare_llamacpp import LlamaCpp

    out: dict = {"engine": args.engine, "budget": args.budget}
    # Both engines: prefill the prompt, decode 4 warm-up tokens, prefill again, then count the bytes read and
    # the time of `tokens` greedy decode steps only (the prompt's prefill is dense and read whole).
    if args.engine == "llamacpp":
        if not args.repack:  # llama.cpp's CPU repacking copies Q4_0 weights into anonymous memory, which
            import llama_cpp.llama_cpp as low  # no budget can page; off, its weights stay in the mmap

            default = low.llama_model_default_params

            def no_repack():
                p = default()
                p.use_extra_bufts = False
                return p

            low.llama_model_default_params = no_repack
        eng = LlamaCpp(args.model, args.threads, 512)
        llm = eng.llm
        ids = eng.tokenize(PROMPT)

        def prefill():
            llm.reset()
            llm.eval(ids)
            return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

        def step(tok, pos):
            llm.eval([tok])
            return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    else:
        import pyinfer

        kw = {"ram_budget": args.budget} if args.budget else {}
        m = pyinfer.load(args.model, n_threads=args.threads, n_ctx=512, sparsity=args.sparsity, progress=False, **kw)
        ids = m.tokenize(PROMPT)

        def prefill():
            return m.forward(ids, 0, np.array([len(ids) - 1]))[0]

        def step(tok, pos):
            return m.forward([tok], pos, np.array([0]))[0]

    def decode(n):
        logits, toks = prefill(), []
        r0, t0 = io_read_bytes(), time.perf_counter()
        if args.engine == "pyinfer" and m.offload is not None:
            m.offload.store.reset_stats()
        for i in range(n):
            toks.append(int(np.argmax(logits)))
            logits = step(toks[-1], len(ids) + i)
        return time.perf_counter() - t0, io_read_bytes() - r0, toks

    decode(4)
    seconds, read, toks = decode(args.tokens)
    if args.engine == "pyinfer" and m.offload is not None:
        from pyinfer.tools.bench import offload_stats

        out["offload"] = offload_stats(m, m.offload.store.stats(), args.tokens, seconds)
    from pyinfer.tools.bench import peak_rss_mb

    # Weights this process holds: its mapping of the model file (llama.cpp: all of it; pyinfer under a budget:
    # the FFN pages a dense prefill touched)...
    held = mapped_rss(args.model)
    if args.engine == "pyinfer" and m.offload is not None:  # + its RAM copies of the weights that stay
        st, p = m.offload.store.stats(), m.offload.plan   # (non-FFN, predictors, scales) and the store's
        held += (p.fixed_bytes - p.ring_bytes) + st["resident_bytes"] + st["ring_bytes"]
    out.update(tok_s=args.tokens / seconds, read_bytes_per_token=read / args.tokens,
               tokens=[int(t) for t in toks], peak_rss_bytes=int(peak_rss_mb() * 2**20), rss_bytes=rss_now(),
               weights_held_bytes=held)
    print(json.dumps(out))


# ---- parent: cgroups, rounds, table ---------------------------------------------------------------------
def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_in_cgroup(cmd: list[str], limit: int | None, name: str) -> tuple[dict, int]:
    """Runs cmd in a fresh memory cgroup (limit None: unlimited); returns (its JSON, the cgroup's peak usage)."""
    cg = CGROUP_ROOT / f"pyinfer_bench_{name}_{os.getpid()}"
    cg.mkdir()
    try:
        if limit is not None:
            (cg / "memory.limit_in_bytes").write_text(str(limit))
        procs = str(cg / "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        drop_caches()
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, preexec_fn=enter, timeout=3600)
        peak = int((cg / "memory.max_usage_in_bytes").read_text())
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            oom = "killed by the kernel (cgroup OOM)" if r.returncode in (-9, 137) else tail
            return {"error": oom, "returncode": r.returncode}, peak
        return json.loads(r.stdout.strip().splitlines()[-1]), peak
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def child_cmd(engine: str, path: str, args, budget: int = 0, sparsity: str = "off") -> list[str]:
    return [sys.executable, __file__, "--child", "--engine", engine, "-m", path, "--threads", str(args.threads),
            "--tokens", str(args.tokens), "--budget", str(budget), "--sparsity", sparsity,
            *(["--repack"] if args.repack else [])]


def calibrate(engine: str, path: str, args, budget: int) -> tuple[int | None, str | None]:
    """Non-weight memory of one configuration: RSS of an unlimited run (its peak, or with --runtime steady
    its RSS at the end of decode, without load-time transients) minus the weights it held; or the error."""
    got, peak = run_in_cgroup(child_cmd(engine, path, args, budget, args.sparsity if budget else "off"), None, "cal")
    if "error" in got:
        print(f"{engine} (budget {budget / 2**20:.1f} MiB): {got['error']}", file=sys.stderr)
        return None, got["error"]
    # peak: the cgroup's own high-water mark, which also counts the page cache a process fills with read()
    # (imports, metadata) that RSS misses and the limit charges.
    rss = {"peak": max(peak, got["peak_rss_bytes"]), "rss": got["peak_rss_bytes"], "steady": got["rss_bytes"]}[
        args.runtime]
    over = rss - got["weights_held_bytes"]
    print(f"{engine} (budget {budget / 2**20:.1f} MiB): runtime memory {over / 2**20:.1f} MiB = {args.runtime} "
          f"RSS {rss / 2**20:.1f} - weights held {got['weights_held_bytes'] / 2**20:.1f}", file=sys.stderr)
    return over, None


def predictions(path: str, budgets: list[tuple[str, int]], args) -> dict:
    """`pyinfer plan`'s cost model, calibrated once (reads measured on the bundle file, compute from a short
    decode at the first budget pyinfer accepts, no memory limit), then predicted at every budget."""
    import pyinfer
    from pyinfer.errors import PyinferError
    from pyinfer.offload.offloaded_ffn import plan_offload
    from pyinfer.offload.planner import calibrate_compute, measure_reads, predict

    model = None
    for _, b in budgets:
        try:
            model = pyinfer.load(path, n_threads=args.threads, n_ctx=512, sparsity=args.sparsity, ram_budget=b,
                                 progress=False)
            break
        except PyinferError:
            continue
    if model is None:
        return {}
    off = model.offload
    reads = measure_reads(str(off.layout.path))
    compute = calibrate_compute(model, 8)
    out = {}
    for label, b in budgets:
        try:
            p = plan_offload(model.gguf, model.sparsity, off.layout, b, off.ring_slots)
        except PyinferError:
            continue
        out[label] = predict(p, model.sparsity, off.layout, compute, reads, off.io_threads).tok_s
    return out


def compare(path: str, budgets: list[tuple[str, int]], args) -> list[dict]:
    """Per budget: each engine's runtime memory, then `args.rounds` alternating rounds of pyinfer under its
    limit, llama.cpp under its limit and pyinfer in RAM (unlimited); and the planner's prediction."""
    predicted = predictions(path, budgets, args)
    rows = []
    for label, budget in budgets:
        over_ll, _ = calibrate("llamacpp", path, args, 0)
        over_py, py_error = calibrate("pyinfer", path, args, budget)
        per_round = []
        for r in range(args.rounds):
            order = ["pyinfer", "llamacpp", "inram"]
            if r % 2:
                order.reverse()
            got = {}
            for engine in order:
                if engine == "inram":  # pyinfer's own in-RAM sparse speed, unlimited
                    got[engine], _ = run_in_cgroup(child_cmd("pyinfer", path, args, 0, args.sparsity), None, "inram")
                elif engine == "pyinfer":
                    got[engine] = {"error": py_error} if py_error else run_in_cgroup(
                        child_cmd("pyinfer", path, args, budget, args.sparsity), over_py + budget + MARGIN, "py")[0]
                else:
                    got[engine], _ = run_in_cgroup(child_cmd("llamacpp", path, args), over_ll + budget + MARGIN, "ll")
            exact = "tok_s" in got["pyinfer"] and "tok_s" in got["inram"] and \
                got["pyinfer"]["tokens"] == got["inram"]["tokens"]
            per_round.append({**got, "exact": exact})
            print(f"{label} round {r + 1}: " + ", ".join(
                f"{k} {v['tok_s']:.2f} tok/s" if "tok_s" in v else f"{k}: {v['error']}" for k, v in got.items())
                + f", tokens equal to in-RAM: {exact}", file=sys.stderr)

        def med(f, need=("pyinfer", "llamacpp", "inram"), per_round=per_round):
            vals = [f(p) for p in per_round if all("tok_s" in p[k] for k in need)]
            return statistics.median(vals) if vals else None

        rows.append({
            "label": label, "budget_bytes": budget, "runtime_bytes": {"pyinfer": over_py, "llamacpp": over_ll},
            "limit_pyinfer": over_py + budget + MARGIN if over_py is not None else None,
            "limit_llamacpp": over_ll + budget + MARGIN,
            "pyinfer_error": py_error,
            "pyinfer_tok_s": med(lambda p: p["pyinfer"]["tok_s"], ("pyinfer",)),
            "llamacpp_tok_s": med(lambda p: p["llamacpp"]["tok_s"], ("llamacpp",)),
            "inram_tok_s": med(lambda p: p["inram"]["tok_s"], ("inram",)),
            "vs_llamacpp": med(lambda p: p["pyinfer"]["tok_s"] / p["llamacpp"]["tok_s"], ("pyinfer", "llamacpp")),
            "vs_inram": med(lambda p: p["pyinfer"]["tok_s"] / p["inram"]["tok_s"], ("pyinfer", "inram")),
            "pyinfer_read_mb_per_token": med(lambda p: p["pyinfer"]["read_bytes_per_token"] / 1e6, ("pyinfer",)),
            "llamacpp_read_mb_per_token": med(lambda p: p["llamacpp"]["read_bytes_per_token"] / 1e6, ("llamacpp",)),
            "io_hidden_share": med(lambda p: p["pyinfer"]["offload"]["io_hidden_share"], ("pyinfer",)),
            "predicted_tok_s": predicted.get(label),
            "exact_every_round": all(p["exact"] for p in per_round),
            "rounds": per_round,
        })
    return rows


def write_results(tag: str, title: str, notes: list[str], meta: dict, rows: list[dict]) -> str:
    RESULTS.mkdir(exist_ok=True)
    meta = {**meta, "title": title, "notes": notes}
    (RESULTS / f"offload_{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def f(x, spec=".2f"):
        return format(x, spec) if x is not None else "-"

    header = ("| budget | MiB | limit MiB pyinfer / llama.cpp | pyinfer tok/s | llama.cpp tok/s | x llama.cpp | "
              "pyinfer in RAM tok/s | x in-RAM | MB read/token pyinfer | llama.cpp | I/O hidden | tokens = in-RAM | "
              "planned tok/s | measured / planned |")
    lines = [f"# {title}", "", *notes, "", header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        lim = f"{r['limit_pyinfer'] / 2**20:.0f}" if r["limit_pyinfer"] else "-"
        py = f(r["pyinfer_tok_s"]) if not r["pyinfer_error"] else "refused: " + r["pyinfer_error"][:90]
        lines.append(f"| {r['label']} | {r['budget_bytes'] / 2**20:.0f} | {lim} / {r['limit_llamacpp'] / 2**20:.0f} | "
                     f"{py} | {f(r['llamacpp_tok_s'])} | {f(r['vs_llamacpp'])} | {f(r['inram_tok_s'])} | "
                     f"{f(r['vs_inram'])} | {f(r['pyinfer_read_mb_per_token'], '.1f')} | "
                     f"{f(r['llamacpp_read_mb_per_token'], '.1f')} | {f(r['io_hidden_share'], '.0%')} | "
                     f"{r['exact_every_round']} | {f(r['predicted_tok_s'])} | "
                     f"{f(r['pyinfer_tok_s'] / r['predicted_tok_s'] if r['pyinfer_tok_s'] and r['predicted_tok_s'] else None)} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"offload_{tag}.md").write_text(text)
    return text


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repack", action="store_true",
                    help="let llama.cpp repack weights for its CPU kernels (its default; the repacked copy is "
                         "anonymous memory, so it cannot run below the model's size); off by default here")
    ap.add_argument("--runtime", choices=["peak", "rss", "steady"], default="peak",
                    help="runtime memory from the cgroup's high-water mark (peak: it also counts the page cache of "
                         "imported code and metadata, which RSS misses and the limit charges), from peak RSS (rss: "
                         "strict, no page cache), or from RSS at the end of decode (steady)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--shares", type=float, nargs="+", default=[0.75, 0.5, 0.25],
                    help="shares of the FFN's bytes in the budget")
    ap.add_argument("--sparsity", default="auto")
    ap.add_argument("--tag", default="smollm2")
    add_common_args(ap)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="pyinfer", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if os.geteuid() != 0 or not CGROUP_ROOT.is_dir():
        print("bench/offload.py needs root and the cgroup v1 memory controller", file=sys.stderr)
        return 2

    import pyinfer
    from pyinfer.model.gguf_file import GGUFModelFile
    from pyinfer.model.pull import resolve_model

    path = str(resolve_model(args.model))
    gguf = GGUFModelFile(path)
    file_bytes = Path(path).stat().st_size
    ffn = sum(t.data.nbytes for n, t in gguf.tensors.items() if _FFN.match(n))
    non_ffn = sum(t.data.nbytes for n, t in gguf.tensors.items() if not _FFN.match(n))
    # Write the plan and the bundle file now, outside any limit and any timing.
    pyinfer.load(path, n_threads=args.threads, n_ctx=64, sparsity=args.sparsity, ram_budget=file_bytes * 2)
    budgets = [(f"{share:.0%} of FFN", int(non_ffn + share * ffn)) for share in args.shares]
    rows = compare(path, budgets, args)
    meta = {"model": Path(path).name, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
            "sparsity": args.sparsity, "runtime_protocol": args.runtime, "llamacpp_repack": args.repack,
            "ffn_bytes": ffn, "non_ffn_bytes": non_ffn,
            "margin": MARGIN}
    print(write_results(args.tag, f"Decode under a RAM budget: {Path(path).name}, {args.threads} threads, "
                        f"{args.tokens} tokens, median of {args.rounds} rounds",
                        [(f"Budget = non-FFN weights ({non_ffn / 2**20:.1f} MiB) + a share of the FFN "
                         f"({ffn / 2**20:.1f} MiB). Each engine's limit = its runtime memory ({args.runtime} RSS of an "
                         f"unlimited run at that budget minus the weights it held) + budget + {MARGIN >> 20} MiB. "
                         "Caches dropped before every run.")], meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
