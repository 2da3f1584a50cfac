"""pyinfer vs llama.cpp (llama-cpp-python), side by side in one process.

Decode: greedy, 128 tokens after a short prompt, the same host loop for both engines (eval one
token, argmax, repeat). Prefill: 256 pseudo-random tokens from an empty cache. The engines
alternate, and which goes first flips every round; the median of the per-round ratios is quoted.
Perplexity: llama.cpp's protocol on WikiText-2 (see pyinfer.tools.perplexity), for both engines.
Peak RSS: `pyinfer bench` in a subprocess, so llama.cpp's memory is not counted.

  pip install ".[bench]"     # builds llama.cpp from source (minutes)
  python bench/compare_llamacpp.py --threads 2 --rounds 5 --ppl-windows 40
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import pyinfer
from pyinfer.model.pull import resolve_model
from pyinfer.tools.perplexity import log_softmax_at, perplexity

RESULTS = Path(__file__).parent / "results" / "vs_llamacpp"
PROMPT = "Once upon a time"


class LlamaCpp:
    def __init__(self, path: str, threads: int, n_ctx: int, logits_all: bool = False, **options):
        """`options` go to llama_cpp.Llama (flash_attn, type_k, type_v, ...)."""
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                         logits_all=logits_all, verbose=False, **options)

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=False)

    def decode(self, prompt_ids: list[int], n: int) -> tuple[float, list[int]]:
        llm = self.llm
        llm.reset()
        llm.eval(prompt_ids)
        out = []
        t0 = time.perf_counter()
        for _ in range(n):
            # llama-cpp-python keeps no scores without logits_all: read the context's last row.
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
            out.append(tok)
            llm.eval([tok])
        return time.perf_counter() - t0, out

    def prefill(self, ids: list[int]) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t0


def pyinfer_decode(m, prompt_ids: list[int], n: int) -> tuple[float, list[int]]:
    logits = m.forward(prompt_ids, 0, np.array([len(prompt_ids) - 1]))[0]
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = m.forward([tok], len(m._cached), np.array([0]))[0]
    return time.perf_counter() - t0, out


def pyinfer_prefill(m, ids: list[int]) -> float:
    t0 = time.perf_counter()
    m.eval(ids)
    return time.perf_counter() - t0


def llamacpp_perplexity(path: str, text_tokens: list[int], ctx: int, windows: int, threads: int,
                        bos: int | None = None) -> float:
    """llama.cpp's perplexity protocol; with `bos` (models that add one) each window's first token is
    replaced by it, as llama-perplexity does."""
    from tqdm import tqdm

    ll = LlamaCpp(path, threads, ctx, logits_all=True)
    first = ctx // 2
    rows = np.arange(first, ctx - 1)
    nll, count = 0.0, 0
    for w in tqdm(range(windows), desc="llama.cpp perplexity", file=sys.stderr):
        chunk = list(text_tokens[w * ctx:(w + 1) * ctx])
        if bos is not None:
            chunk[0] = bos
        ll.llm.reset()
        ll.llm.eval(chunk)
        logits = np.asarray(ll.llm.scores[:ctx], dtype=np.float32)[rows]
        lp = log_softmax_at(logits, np.asarray(chunk, dtype=np.int64)[rows + 1])
        nll -= lp.sum()
        count += len(lp)
    return float(np.exp(nll / count))


def peak_rss(path: str, threads: int) -> dict:
    r = subprocess.run([sys.executable, "-m", "pyinfer.cli", "bench", "-m", path, "-t", str(threads), "-p", "256",
                        "-g", "128", "-r", "1", "--json"], capture_output=True, text=True, check=True,
                       cwd=tempfile.gettempdir())
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--ppl-windows", type=int, default=40, help="0 skips perplexity")
    ap.add_argument("--ppl-file", default=str(Path(__file__).resolve().parents[2] / "shared/data/wikitext-2-raw-test.txt"))
    ap.add_argument("--tag", default="core")
    args = ap.parse_args()

    path = str(resolve_model(args.model))
    ours = pyinfer.load(path, n_threads=args.threads, n_ctx=2048)
    peer = LlamaCpp(path, args.threads, 2048)
    prompt_ids = ours.tokenize(PROMPT)
    assert prompt_ids == peer.tokenize(PROMPT, add_bos=ours.tokenizer.add_bos), "tokenizers disagree"
    rng = np.random.default_rng(0)
    rounds = []
    # warm-up: page in the weights, start threads
    pyinfer_decode(ours, prompt_ids, 8); peer.decode(prompt_ids, 8)
    for r in range(args.rounds):
        pp_ids = rng.integers(0, ours.config.vocab_size, args.prompt_tokens).tolist()
        res = {}
        order = ("pyinfer", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "pyinfer")
        for eng in order:
            if eng == "pyinfer":
                dt, toks = pyinfer_decode(ours, prompt_ids, args.gen_tokens)
                pt = pyinfer_prefill(ours, pp_ids)
            else:
                dt, toks = peer.decode(prompt_ids, args.gen_tokens)
                pt = peer.prefill(pp_ids)
            res[eng] = {"decode_tok_s": args.gen_tokens / dt, "prefill_tok_s": args.prompt_tokens / pt, "tokens": toks}
        same = sum(a == b for a, b in zip(res["pyinfer"]["tokens"], res["llama.cpp"]["tokens"]))
        row = {"round": r, "order": order, "same_greedy_tokens": same,
               **{f"{e}_{k}": res[e][k] for e in res for k in ("decode_tok_s", "prefill_tok_s")}}
        row["decode_ratio"] = row["pyinfer_decode_tok_s"] / row["llama.cpp_decode_tok_s"]
        row["prefill_ratio"] = row["pyinfer_prefill_tok_s"] / row["llama.cpp_prefill_tok_s"]
        rounds.append(row)
        print(f"round {r}: decode {row['pyinfer_decode_tok_s']:.1f} vs {row['llama.cpp_decode_tok_s']:.1f} tok/s "
              f"({row['decode_ratio']:.3f}x), prefill {row['pyinfer_prefill_tok_s']:.1f} vs "
              f"{row['llama.cpp_prefill_tok_s']:.1f} ({row['prefill_ratio']:.3f}x), same greedy tokens {same}/"
              f"{args.gen_tokens}", file=sys.stderr)
    del peer

    out = {
        "model": os.path.basename(path), "gguf_bytes": os.path.getsize(path), "threads": args.threads,
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cpus".strip(),
        "isa": ours.isa, "rounds": rounds,
        "median_decode_ratio": statistics.median(r["decode_ratio"] for r in rounds),
        "median_prefill_ratio": statistics.median(r["prefill_ratio"] for r in rounds),
    }
    if args.ppl_windows:
        text = Path(args.ppl_file).read_text(encoding="utf-8")
        ppl = perplexity(pyinfer.load(path, n_threads=args.threads, n_ctx=512), text, 512, args.ppl_windows)
        toks = ours.tokenize(text, add_bos=False)
        out["perplexity"] = {"windows": args.ppl_windows, "ctx": 512, "pyinfer": ppl.perplexity,
                             "llama.cpp": llamacpp_perplexity(path, toks, 512, args.ppl_windows, args.threads,
                                                              ours.tokenizer.bos_id if ours.tokenizer.add_bos else None)}
        out["perplexity"]["ratio"] = out["perplexity"]["pyinfer"] / out["perplexity"]["llama.cpp"]
    out["pyinfer_bench"] = peak_rss(path, args.threads)
    out["rss_over_gguf_mb"] = out["pyinfer_bench"]["peak_rss_mb"] - out["gguf_bytes"] / 2**20

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}_vs_llamacpp.json").write_text(json.dumps(out, indent=1))
    md = [f"# pyinfer vs llama.cpp ({args.tag}), {out['model']}, {args.threads} threads, {out['machine']}", "",
          "| round | pyinfer decode tok/s | llama.cpp decode tok/s | ratio | pyinfer prefill tok/s | "
          "llama.cpp prefill tok/s | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rounds:
        md.append(f"| {r['round']} | {r['pyinfer_decode_tok_s']:.1f} | {r['llama.cpp_decode_tok_s']:.1f} | "
                  f"{r['decode_ratio']:.3f} | {r['pyinfer_prefill_tok_s']:.1f} | {r['llama.cpp_prefill_tok_s']:.1f} | "
                  f"{r['prefill_ratio']:.3f} |")
    md += ["", f"**Median ratio (pyinfer / llama.cpp): decode {out['median_decode_ratio']:.3f}x, "
               f"prefill {out['median_prefill_ratio']:.3f}x**", ""]
    if "perplexity" in out:
        p = out["perplexity"]
        md.append(f"Perplexity (WikiText-2 test, {p['windows']} windows x 512): pyinfer {p['pyinfer']:.4f}, "
                  f"llama.cpp {p['llama.cpp']:.4f}, ratio {p['ratio']:.4f}")
    md.append(f"Peak RSS (pyinfer bench, own process): {out['pyinfer_bench']['peak_rss_mb']:.1f} MB; GGUF "
              f"{out['gguf_bytes'] / 2**20:.1f} MB; over GGUF {out['rss_over_gguf_mb']:.1f} MB")
    (RESULTS / f"{args.tag}_vs_llamacpp.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
