"""Decode under one total memory limit: pyinfer (`mem_limit`, which derives its weight budget and streams FFN
neurons from disk where they do not fit) against llama.cpp (its weights in the mmap, repacking off), each run in
a fresh memory cgroup whose limit is that same total, caches dropped before every run.

The protocol of every offload figure: both engines under the same limit (cgroup v1 counts anonymous memory and
the page cache, which is where llama.cpp's mapped weights live), llama.cpp with `use_extra_bufts=False` (its CPU
repacking copies Q4_0 weights into anonymous memory that no limit can page, and it is killed), at least 3 rounds
alternating the engines and flipping their order, medians and spreads (lowest..highest). Each round also runs
pyinfer unlimited (in RAM, the same sparsity plan): its tokens must equal the limited run's, and its speed is
what the limit costs. A run the kernel kills is reported as such.

Needs root (cgroup v1 memory controller at /sys/fs/cgroup/memory, /proc/sys/vm/drop_caches) and the bench extra
(llama-cpp-python).

  python bench/offload.py --threads 2 --rounds 3 --limits 170M 200M 260M
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "offload"
PROMPT = "Once upon a time"


# ---- child: one engine, one decode, one JSON line ------------------------------------------------------
def io_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])


def rss_now() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024


def child(args) -> None:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from compare_llamacpp import LlamaCpp

    out: dict = {"engine": args.engine, "mem_limit": args.mem_limit or None}
    # Both engines: prefill the prompt, decode 4 warm-up tokens, prefill again, then count the bytes read and
    # the time of `tokens` greedy decode steps only (the prompt's prefill is dense and read whole).
    if args.engine == "llamacpp":
        if not args.repack:  # llama.cpp's CPU repacking copies Q4_0 weights into anonymous memory, which
            import llama_cpp.llama_cpp as low  # no limit can page; off, its weights stay in the mmap

            default = low.llama_model_default_params

            def no_repack():
                p = default()
                p.use_extra_bufts = False
                return p

            low.llama_model_default_params = no_repack
        eng = LlamaCpp(args.model, args.threads, args.ctx)
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
        from pyinfer.errors import PyinferError
        from pyinfer.offload import experts

        experts.POLICY = args.expert_policy  # a Mixture of Experts' cache policy (bench/moe_synthetic.py)
        experts.PREFETCH = args.expert_prefetch == "on"  # and its read-ahead of the next layer's experts
        experts.SOURCE = args.expert_source  # and where it reads them from (bundle file or model file)

        try:
            m = pyinfer.load(args.model, n_threads=args.threads, n_ctx=args.ctx, sparsity=args.sparsity,
                             progress=False, mem_limit=args.mem_limit or None)
        except PyinferError as e:  # a limit below the minimum: refused in one line
            print(json.dumps({**out, "error": f"refused: {e}"}))
            return
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
        if args.engine == "pyinfer" and m.session.experts is not None:  # a Mixture of Experts streaming experts
            m.session.experts.store.reset_stats()
        for i in range(n):
            toks.append(int(np.argmax(logits)))
            logits = step(toks[-1], len(ids) + i)
        return time.perf_counter() - t0, io_read_bytes() - r0, toks

    decode(4)
    seconds, read, toks = decode(args.tokens)
    if args.engine == "pyinfer":
        if m.offload is not None:
            from pyinfer.tools.bench import offload_stats

            out["offload"] = offload_stats(m, m.offload.store.stats(), args.tokens, seconds)
        if m.session.experts is not None:
            out["experts"] = m.session.experts.report(args.tokens)
        out["memory"] = m.memory()
    from pyinfer.offload.memory import mapped_bytes
    from pyinfer.tools.bench import peak_rss_mb

    out.update(tok_s=args.tokens / seconds, read_bytes_per_token=read / args.tokens,
               tokens=[int(t) for t in toks], peak_rss_bytes=int(peak_rss_mb() * 2**20), rss_bytes=rss_now(),
               model_pages_bytes=mapped_bytes(args.model))
    print(json.dumps(out))


# ---- parent: cgroups, rounds, table ---------------------------------------------------------------------
def run_in_cgroup(cmd: list[str], limit: int | None, name: str = "") -> tuple[dict, dict]:
    """Runs cmd in a fresh memory cgroup (limit None: unlimited), caches dropped first; returns (its JSON, the
    cgroup's peak usage and failure count)."""
    from pyinfer.tools.cgroup import run_in_memory_cgroup

    r = run_in_memory_cgroup(cmd, limit, cold=True)
    cgroup = {"peak_bytes": r.peak, "failcnt": r.failcnt}
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": "killed by the kernel (cgroup OOM)" if r.killed else tail, "returncode": r.returncode}, cgroup
    return json.loads(r.stdout.strip().splitlines()[-1]), cgroup


def child_cmd(engine: str, path: str, args, limit: int = 0) -> list[str]:
    return [sys.executable, __file__, "--child", "--engine", engine, "-m", path, "--threads", str(args.threads),
            "--tokens", str(args.tokens), "--ctx", str(args.ctx), "--mem-limit", str(limit),
            "--sparsity", args.sparsity, "--expert-policy", getattr(args, "expert_policy", "lru"),
            "--expert-prefetch", getattr(args, "expert_prefetch", "on"),
            "--expert-source", getattr(args, "expert_source", "bundle"),
            *(["--repack"] if args.repack else [])]


def spread(values: list[float]) -> dict | None:
    """Median, lowest and highest of a list (None when empty)."""
    return {"median": statistics.median(values), "low": min(values), "high": max(values)} if values else None


def compare(path: str, limits: list[tuple[str, int]], args) -> list[dict]:
    """Per limit, `args.rounds` rounds alternating pyinfer and llama.cpp in cgroups of that limit (order flipped
    every other round), plus pyinfer unlimited; medians and spreads, and ratios as medians of per-round ratios."""
    rows = []
    for label, limit in limits:
        per_round = []
        for r in range(args.rounds):
            order = ["pyinfer", "llamacpp", "unlimited"]
            if r % 2:
                order.reverse()
            got = {}
            for engine in order:
                if engine == "unlimited":  # pyinfer in RAM with the same plan, no limit
                    out, cg = run_in_cgroup(child_cmd("pyinfer", path, args), None, "free")
                else:
                    out, cg = run_in_cgroup(child_cmd(engine, path, args, limit), limit, engine[:2])
                got[engine] = {**out, "cgroup": cg}
            exact = all("tok_s" in got[k] for k in ("pyinfer", "unlimited")) and \
                got["pyinfer"]["tokens"] == got["unlimited"]["tokens"]
            per_round.append({**got, "exact": exact})
            print(f"{label} round {r + 1}: " + ", ".join(
                f"{k} {v['tok_s']:.2f} tok/s (peak {v['cgroup']['peak_bytes'] / 2**20:.0f} MiB)" if "tok_s" in v
                else f"{k}: {v['error']}" for k, v in got.items()) + f", tokens equal to unlimited: {exact}",
                file=sys.stderr)

        def vals(f, need, per_round=per_round):
            return [f(p) for p in per_round if all("tok_s" in p[k] for k in need)]

        def py(key, per_round=per_round):  # a pyinfer offload figure, median over rounds
            v = [p["pyinfer"]["offload"][key] for p in per_round if p["pyinfer"].get("offload")
                 and p["pyinfer"]["offload"].get(key) is not None]
            return statistics.median(v) if v else None

        def ex(key, per_round=per_round):  # an expert-streaming figure, median over rounds
            v = [p["pyinfer"]["experts"][key] for p in per_round if p["pyinfer"].get("experts")]
            return statistics.median(v) if v else None

        errors = {e: sorted({p[e]["error"] for p in per_round if "error" in p[e]}) for e in ("pyinfer", "llamacpp")}
        mem = next((p["pyinfer"]["memory"] for p in per_round if "memory" in p["pyinfer"]), None)
        rows.append({
            "label": label, "limit_bytes": limit,
            "pyinfer_tok_s": spread(vals(lambda p: p["pyinfer"]["tok_s"], ("pyinfer",))),
            "llamacpp_tok_s": spread(vals(lambda p: p["llamacpp"]["tok_s"], ("llamacpp",))),
            "unlimited_tok_s": spread(vals(lambda p: p["unlimited"]["tok_s"], ("unlimited",))),
            "vs_llamacpp": spread(vals(lambda p: p["pyinfer"]["tok_s"] / p["llamacpp"]["tok_s"],
                                       ("pyinfer", "llamacpp"))),
            "vs_unlimited": spread(vals(lambda p: p["pyinfer"]["tok_s"] / p["unlimited"]["tok_s"],
                                        ("pyinfer", "unlimited"))),
            "pyinfer_peak_bytes": spread([p["pyinfer"]["cgroup"]["peak_bytes"] for p in per_round]),
            "llamacpp_peak_bytes": spread([p["llamacpp"]["cgroup"]["peak_bytes"] for p in per_round]),
            "pyinfer_failcnt": spread([p["pyinfer"]["cgroup"]["failcnt"] for p in per_round]),
            "llamacpp_failcnt": spread([p["llamacpp"]["cgroup"]["failcnt"] for p in per_round]),
            "pyinfer_read_mb_per_token": spread(vals(lambda p: p["pyinfer"]["read_bytes_per_token"] / 1e6,
                                                     ("pyinfer",))),
            "llamacpp_read_mb_per_token": spread(vals(lambda p: p["llamacpp"]["read_bytes_per_token"] / 1e6,
                                                      ("llamacpp",))),
            "ram_hit_rate": py("ram_hit_rate"), "io_hidden_share": py("io_hidden_share"),
            "expert_hit_rate": ex("hit_rate"), "expert_resident_hit_rate": ex("resident_hit_rate"),
            "expert_read_seconds_per_token": (ex("read_seconds") or 0) / args.tokens if ex("read_seconds") else None,
            "pyinfer_memory": mem, "errors": errors,
            "exact_every_round": all(p["exact"] for p in per_round if "tok_s" in p["pyinfer"]),
            "rounds": per_round,
        })
    return rows


def write_results(tag: str, title: str, notes: list[str], meta: dict, rows: list[dict]) -> str:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "title": title, "notes": notes}
    (RESULTS / f"offload_{tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))

    def f(x, spec=".2f", scale=1.0):
        if x is None:
            return "-"
        if isinstance(x, dict):
            return (f"{format(x['median'] / scale, spec)} ({format(x['low'] / scale, spec)}-"
                    f"{format(x['high'] / scale, spec)})")
        return format(x / scale, spec)

    header = ("| limit | pyinfer tok/s | llama.cpp tok/s | x llama.cpp | pyinfer unlimited tok/s | x unlimited | "
              "peak MiB pyinfer | peak MiB llama.cpp | weight budget MiB | FFN in RAM | MB read/token pyinfer | "
              "llama.cpp | I/O hidden | tokens = unlimited |")
    lines = [f"# {title}", "", *notes, "", "Medians over rounds, (lowest-highest) in brackets.", "", header,
             "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        def run(engine, key):
            return f(r[key]) if r[key] else "; ".join(r["errors"][engine])[:80] or "-"
        plan = (r["pyinfer_memory"] or {}).get("plan") or {}
        lines.append(f"| {r['label']} | {run('pyinfer', 'pyinfer_tok_s')} | {run('llamacpp', 'llamacpp_tok_s')} | "
                     f"{f(r['vs_llamacpp'])} | {f(r['unlimited_tok_s'])} | {f(r['vs_unlimited'])} | "
                     f"{f(r['pyinfer_peak_bytes'], '.0f', 2**20)} | {f(r['llamacpp_peak_bytes'], '.0f', 2**20)} | "
                     f"{f(plan.get('weight_budget'), '.0f', 2**20)} | "
                     f"{f(r['ram_hit_rate'] if r['ram_hit_rate'] is not None else r.get('expert_hit_rate'), '.0%')} | "
                     f"{f(r['pyinfer_read_mb_per_token'], '.1f')} | {f(r['llamacpp_read_mb_per_token'], '.1f')} | "
                     f"{f(r['io_hidden_share'], '.0%')} | {r['exact_every_round']} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"offload_{tag}.md").write_text(text)
    return text


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens timed per run (default 64)")
    ap.add_argument("--ctx", type=int, default=512, help="context of both engines (their KV caches; default 512)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repack", action="store_true",
                    help="let llama.cpp repack weights for its CPU kernels (its default; the repacked copy is "
                         "anonymous memory, so it cannot run below the model's size); off by default here")


def input_plan_file(sparsity: str) -> bool:
    """Whether --sparsity names an input-sparse plan's file (bench/input_sparsity.py --save-plans writes them)."""
    from pyinfer.sparsity.plan import SparsityPlan

    from pyinfer.errors import PyinferError

    try:
        return Path(sparsity).is_file() and SparsityPlan.load(sparsity).mode == "input"
    except PyinferError:  # not a plan file: the load that follows says what is wrong, in one line
        return False


def parse_limits(texts: list[str]) -> list[tuple[str, int]]:
    from pyinfer.offload.offloaded_ffn import parse_size

    return [(t, parse_size(t)) for t in texts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--limits", nargs="+", default=["170M", "200M", "260M"],
                    help="total memory limits, one cgroup each (both engines)")
    ap.add_argument("--sparsity", default="auto")
    ap.add_argument("--tag", default="smollm2")
    add_common_args(ap)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="pyinfer", help=argparse.SUPPRESS)
    ap.add_argument("--expert-policy", default="lru", choices=["lru", "lfu"], help=argparse.SUPPRESS)
    ap.add_argument("--expert-prefetch", default="on", choices=["on", "off"], help=argparse.SUPPRESS)
    ap.add_argument("--expert-source", default="bundle", choices=["bundle", "gguf"], help=argparse.SUPPRESS)
    ap.add_argument("--mem-limit", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    from pyinfer.tools.cgroup import cgroup_root

    if cgroup_root() is None:
        print("bench/offload.py needs root and a memory cgroup controller", file=sys.stderr)
        return 2

    import pyinfer
    from pyinfer.model.pull import resolve_model

    path = str(resolve_model(args.model))
    if args.sparsity != "off":  # calibrate the plan and write its sidecar files now, outside any limit and timing:
        # a predictor plan's bundle file (a RAM budget), an input-sparse plan's input-major copies (a memory limit)
        budget = {"mem_limit": "64G"} if args.sparsity == "input" or input_plan_file(args.sparsity) else \
            {"ram_budget": "64G"}
        pyinfer.load(path, n_threads=args.threads, n_ctx=64, sparsity=args.sparsity, **budget)
    rows = compare(path, parse_limits(args.limits), args)
    meta = {"model": Path(path).name, "file_bytes": Path(path).stat().st_size, "threads": args.threads,
            "tokens": args.tokens, "ctx": args.ctx, "rounds": args.rounds, "sparsity": args.sparsity,
            "llamacpp_repack": args.repack}
    plan = "" if args.sparsity == "off" else f", sparsity {Path(args.sparsity).name}"
    print(write_results(args.tag, f"Decode under one memory limit: {Path(path).name}{plan}, {args.threads} threads, "
                        f"{args.tokens} tokens, {args.rounds} rounds",
                        [f"Both engines in a memory cgroup of the same total limit, caches dropped before every run; "
                         f"pyinfer with `mem_limit` = the limit and `--sparsity {args.sparsity}`, llama.cpp with its "
                         f"weight repacking {'on' if args.repack else 'off'}; context {args.ctx} for both."],
                        meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
