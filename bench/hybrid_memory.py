"""Memory one sequence of a hybrid model holds at a given context (issue 53's figure 4): pyinfer's engine state (the
KV cache of the attention layers that keep one (Gemma 4's shared-KV layers keep none) plus the recurrent layers'
conv and delta-rule states) against llama.cpp's, as each
reports it: pyinfer's Engine.state_bytes after load, llama.cpp's own log lines of its KV cache and recurrent memory
(llama-cpp-python, verbose, in a subprocess so its log is read whole). No weights are read by either beyond load.

  python bench/hybrid_memory.py -m /work/models/qwen3.5-9b-q4_k_m.gguf --ctx 4096
Writes bench/results/long_context/hybrid_memory_<tag>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "long_context"
MIB = 1024 * 1024

LLAMACPP = """
import sys
from llama_cpp import Llama
Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_batch=512, n_threads=2, verbose=True)
"""


def llamacpp_memory(path: str, ctx: int) -> dict:
    """llama.cpp's sizes from its log: every 'size = X MiB' line of its memory modules."""
    r = subprocess.run([sys.executable, "-c", LLAMACPP, path, str(ctx)], capture_output=True, text=True, check=True)
    lines = [ln.strip() for ln in r.stderr.splitlines()
             if re.search(r"(kv_cache|memory_recurrent|memory_hybrid): size\s*=", ln)]
    total = sum(float(m.group(1)) for ln in lines for m in [re.search(r"size\s*=\s*([\d.]+) MiB", ln)] if m)
    return {"log": lines, "total_mib": total}


def pyinfer_memory(path: str, ctx: int, cache_type: str) -> dict:
    import pyinfer

    m = pyinfer.load(path, n_ctx=ctx, n_threads=2, progress=False, cache_type=cache_type)
    c = m.config
    elem = {"f16": 2, "f32": 4, "q8_0": 34 / 32}[cache_type]
    kv = c.cached_values_per_token * elem * ctx
    state = c.state_floats_per_sequence * 4
    return {"engine_state_mib": m.running.engine.state_bytes / MIB, "kv_mib": kv / MIB, "recurrent_state_mib": state / MIB,
            "attention_layers": sum(c.owns_cache(il) for il in range(c.n_layers)),
            "recurrent_layers": sum(c.recurrent_layers)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--cache-type", default="f16", choices=["f16", "f32", "q8_0"])
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()
    ours = pyinfer_memory(args.model, args.ctx, args.cache_type)
    peer = llamacpp_memory(args.model, args.ctx)
    out = {"model": Path(args.model).name, "ctx": args.ctx, "cache_type": args.cache_type, "pyinfer": ours,
           "llamacpp": peer}
    tag = args.tag or Path(args.model).stem
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"hybrid_memory_{tag}.json").write_text(json.dumps(out, indent=1))
    md = [f"# Memory of one sequence at {args.ctx} tokens: {out['model']}", "",
          f"{args.cache_type} KV cache on both sides; llama.cpp 0.3.36's own log lines, pyinfer's Engine.state_bytes.", "",
          "| engine | KV cache (attention layers) | recurrent state | total |", "|---|---|---|---|",
          f"| pyinfer | {ours['kv_mib']:.1f} MiB ({ours['attention_layers']} layers) | {ours['recurrent_state_mib']:.1f} MiB "
          f"({ours['recurrent_layers']} layers) | {ours['engine_state_mib']:.1f} MiB |",
          f"| llama.cpp | see its lines below | | {peer['total_mib']:.1f} MiB |", "", "llama.cpp's lines:", ""]
    md += [f"    {ln}" for ln in peer["log"]]
    (RESULTS / f"hybrid_memory_{tag}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
