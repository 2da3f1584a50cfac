"""Where a process's memory goes under offload, by part and by stage, for two versions of pyinfer side by side
(this tree, and another tree's Python package on the same compiled core: `--before DIR`).

Each configuration runs in a fresh memory cgroup, caches dropped first: once without a limit (the parts and the
peak), once under the limit given (does it complete, its peak and the kernel's failure count). Stages: after the
imports, after load, after a prefill, after decode. Parts: runtime (what is resident but the model's pages and
what the engine and the offload store hold), KV cache and buffers (the engine's allocations; touched lazily),
weights in RAM (offload: the copies of what must stay and the resident neurons; otherwise the model's mapped
pages), the model file's pages still mapped, page cache (the cgroup's cache not mapped by the process), and the
load-time transient (the peak during load above what stays after it).

  git archive d0e1a9d pyinfer | tar -x -C /tmp/before && cp pyinfer/_core*.so /tmp/before/pyinfer/
  python bench/memory_breakdown.py --before /tmp/before --case smollm2
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from offload import RESULTS  # noqa: E402

CGROUP_V1 = Path("/sys/fs/cgroup/memory")

MIB = 2 ** 20


def stage_memory(model_path: str) -> dict:
    s = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                s[k] = int(v.split()[0]) * 1024
    from pyinfer.offload.memory import mapped_bytes

    s["model_pages"] = mapped_bytes(model_path)
    cg = [ln.split(":", 2)[2].strip() for ln in open("/proc/self/cgroup") if ":memory:" in ln]
    if cg:
        base = CGROUP_V1 / cg[0].lstrip("/")
        stat = dict(ln.split() for ln in (base / "memory.stat").read_text().splitlines())
        s["cgroup_usage"] = int((base / "memory.usage_in_bytes").read_text())
        s["cgroup_peak"] = int((base / "memory.max_usage_in_bytes").read_text())
        s["cgroup_cache"], s["cgroup_mapped"] = int(stat["cache"]), int(stat["mapped_file"])
    return s


def child(args) -> None:
    import numpy as np

    tree = os.environ.get("PYINFER_BENCH_TREE")
    if tree:  # another version's package: ahead of this tree's (an editable install's finder would win over
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]  # PYTHONPATH)
        sys.path.insert(0, tree)

    stages = {"start": stage_memory(args.model)}
    import pyinfer

    stages["imports"] = stage_memory(args.model)
    stages["package"] = pyinfer.__file__
    kw = {"mem_limit": args.mem_limit} if args.mem_limit else {"ram_budget": args.ram_budget}
    t0 = time.perf_counter()
    m = pyinfer.load(args.model, n_threads=2, n_ctx=args.ctx, sparsity=args.sparsity, progress=False, **kw)
    load_s = time.perf_counter() - t0
    stages["loaded"] = stage_memory(args.model)
    ids = m.tokenize("Once upon a time")
    logits = m.forward(ids, 0, np.array([len(ids) - 1]))[0]
    stages["prefill"] = stage_memory(args.model)
    t0 = time.perf_counter()
    for i in range(args.tokens):
        logits = m.forward([int(np.argmax(logits))], len(ids) + i, np.array([0]))[0]
    tok_s = args.tokens / (time.perf_counter() - t0)
    stages["decode"] = stage_memory(args.model)
    engine = m._run.engine
    parts = {"kv_bytes": engine.state_bytes, "buffer_bytes": engine.scratch_bytes}
    if m.offload is not None:
        st, p = m.offload.store.stats(), m.offload.plan
        parts.update(weights_kept=p.fixed_bytes - p.ring_bytes + st["resident_bytes"], read_buffers=st["ring_bytes"],
                     weight_budget=p.budget)
    plan = getattr(m.session, "memory", None)
    if plan is not None:
        parts["limit_split"] = plan.summary()
    print(json.dumps({"stages": stages, "parts": parts, "tok_s": tok_s, "load_seconds": load_s}))


def run(cmd: list[str], env: dict, limit: int | None) -> tuple[dict, dict]:
    from pyinfer.tools.cgroup import run_in_memory_cgroup

    r = run_in_memory_cgroup(cmd, limit, env=env, cold=True)
    cgroup = {"peak": r.peak, "failcnt": r.failcnt}
    if r.returncode != 0:
        why = "killed by the kernel (cgroup OOM)" if r.killed else (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": why}, cgroup
    return json.loads(r.stdout.strip().splitlines()[-1]), cgroup


def summarize(got: dict) -> dict:
    """The parts at the end of decode, and the load-time transient."""
    if "error" in got:
        return got
    s, p = got["stages"], got["parts"]
    end = s["decode"]
    engine_touched = 0  # the KV cache and buffers are touched lazily: count what decode's RSS shows of them
    held = p.get("weights_kept", end["model_pages"])
    runtime = end["RssAnon"] + end["RssFile"] - end["model_pages"] - p.get("weights_kept", 0) - p.get("read_buffers", 0)
    return {"peak_rss": end["VmHWM"], "rss_end": end["VmRSS"], "cgroup_peak": end.get("cgroup_peak"),
            "runtime_and_touched_buffers": runtime - engine_touched, "kv_allocated": p["kv_bytes"],
            "buffers_allocated": p["buffer_bytes"], "weights_in_ram": held, "read_buffers": p.get("read_buffers", 0),
            "model_pages_mapped": end["model_pages"],
            "page_cache_unmapped": (end.get("cgroup_cache", 0) - end.get("cgroup_mapped", 0)),
            "load_transient": s["loaded"]["VmHWM"] - s["loaded"]["VmRSS"],
            "imports_rss": s["imports"]["VmRSS"], "tok_s": got["tok_s"], "weight_budget": p.get("weight_budget"),
            "limit_split": p.get("limit_split"), "package": s.get("package")}


CASES = {
    # (sparsity, ctx, the old tree's --ram-budget, this tree's --mem-limit, the cgroup limit)
    "smollm2": ("auto", 512, 71693568, "260M", 260 * MIB),
    "smollm2-200": ("auto", 512, 71693568, "200M", 200 * MIB),
    "synthetic7b": (None, 256, 2 << 30, "2.5G", int(2.5 * 2**30)),
    "synthetic7b-2g": (None, 256, 2 << 30, "2G", 2 << 30),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=None, help="a folder holding another version's `pyinfer` package")
    ap.add_argument("--case", nargs="+", default=["smollm2"], choices=sorted(CASES))
    ap.add_argument("--workdir", default="/tmp/pyinfer-synthetic", help="bench/offload_synthetic.py's folder")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--tag", default="memory_breakdown")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-m", "--model", help=argparse.SUPPRESS)
    ap.add_argument("--sparsity", help=argparse.SUPPRESS)
    ap.add_argument("--ctx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ram-budget", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mem-limit", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    from pyinfer.model.pull import resolve_model

    rows = []
    for case in args.case:
        sparsity, ctx, budget, mem_limit, limit = CASES[case]
        env = dict(os.environ)
        if case.startswith("synthetic"):
            work = Path(args.workdir)
            model, sparsity = str(work / "llama7b-shape-q4_0.gguf"), str(work / "llama7b-shape.sparse.npz")
            env["PYINFER_CACHE"] = str(work / "cache")
        else:
            model = str(resolve_model(None))
        base = [sys.executable, __file__, "--child", "-m", model, "--sparsity", sparsity, "--ctx", str(ctx),
                "--tokens", str(args.tokens)]
        versions = [("after", base + ["--mem-limit", mem_limit], env)]
        if args.before:
            versions.insert(0, ("before", base + ["--ram-budget", str(budget)],
                                dict(env, PYINFER_BENCH_TREE=args.before)))
        for version, cmd, e in versions:
            free, free_cg = run(cmd, e, None)
            limited, limited_cg = run(cmd, e, limit)
            row = {"case": case, "version": version, "limit": limit,
                   "options": f"--ram-budget {budget}" if version == "before" else f"--mem-limit {mem_limit}",
                   "unlimited": {**summarize(free), "cgroup": free_cg},
                   "limited": {"completed": "error" not in limited, "error": limited.get("error"),
                               "tok_s": limited.get("tok_s"), **limited_cg}}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(rows, indent=1))
    header = ("| case | version | options | under the limit | peak MiB (cgroup) | unlimited: cgroup peak | peak RSS | "
              "runtime | KV alloc | buffers alloc | weights in RAM | read buffers | model pages mapped | "
              "page cache | load transient |")
    lines = ["# Where the memory goes: peak of the whole process by part", "",
             "Each run in a fresh memory cgroup, caches dropped; MiB. 'under the limit': the same run in a cgroup of "
             "the case's limit. The parts are at the end of decode in the unlimited run; KV and buffers are what the "
             "engine allocated (touched lazily, so partly inside 'runtime'); 'load transient': peak RSS during load "
             "above RSS after it.", "", header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        u, lim = r["unlimited"], r["limited"]

        def mb(x):
            return f"{x / MIB:.0f}" if isinstance(x, (int, float)) else "-"
        state = (f"ran, {lim['tok_s']:.2f} tok/s" if lim["completed"] else lim["error"]) + \
            f" (limit {r['limit'] / MIB:.0f}, failcnt {lim['failcnt']})"
        if "error" in u:
            lines.append(f"| {r['case']} | {r['version']} | {r['options']} | {state} | {mb(lim['peak'])} | "
                         f"{u['error']} |" + " - |" * 9)
            continue
        lines.append(f"| {r['case']} | {r['version']} | {r['options']} | {state} | {mb(lim['peak'])} | "
                     f"{mb(u['cgroup']['peak'])} | {mb(u['peak_rss'])} | {mb(u['runtime_and_touched_buffers'])} | "
                     f"{mb(u['kv_allocated'])} | {mb(u['buffers_allocated'])} | {mb(u['weights_in_ram'])} | "
                     f"{mb(u['read_buffers'])} | {mb(u['model_pages_mapped'])} | {mb(u['page_cache_unmapped'])} | "
                     f"{mb(u['load_transient'])} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.tag}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
