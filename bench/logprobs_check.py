"""Issue 54's check of log-probabilities: `echo` + `logprobs` on /v1/completions against the per-token
log-probabilities of `pyinfer perplexity`'s path (tools/perplexity.py: model.forward over the window, then
log_softmax_at), on the same tokens of WikiText-2, through a real server (in this process, the official API shape).

  python bench/logprobs_check.py -m qwen2.5-coder-0.5b --tokens 512     # -> bench/results/serving/logprobs_check.*
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results" / "serving"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2-raw-test.txt"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=512, help="prompt tokens scored (default 512)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="logprobs_check")
    args = ap.parse_args()

    import httpx

    import pyinfer
    from pyinfer.model.pull import resolve_model
    from pyinfer.tools.perplexity import log_softmax_at
    from support.serve_helpers import start_server, stop_server

    path = str(resolve_model(args.model))
    model = pyinfer.load(path, n_threads=args.threads, n_ctx=args.tokens + 64, progress=False)
    text = DATA.read_text(encoding="utf-8")[:20000]
    ids = model.tokenize(text, add_bos=False)[:args.tokens]
    prompt = model.detokenize(ids)
    ids = model.tokenize(prompt)  # what the server will score: the prompt as it tokenizes it
    assert len(ids) >= args.tokens - 2, "the prompt did not tokenize back to its tokens"
    rows = np.arange(len(ids) - 1)
    want = log_softmax_at(model.forward(ids, 0, rows), np.asarray(ids, np.int64)[rows + 1])

    base, loop, _, srv, t = start_server(path, "k", kv_budget=4 * (args.tokens + 64), n_threads=args.threads)
    try:
        t0 = time.perf_counter()
        r = httpx.post(base + "/v1/completions", headers={"Authorization": "Bearer k"}, timeout=600,
                       json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 5})
        seconds = time.perf_counter() - t0
        r.raise_for_status()
    finally:
        stop_server(srv, t, loop)
    lp = r.json()["choices"][0]["logprobs"]
    got = np.array(lp["token_logprobs"][1:len(ids)], np.float64)
    diff = np.abs(got - want)
    out = {"model": Path(path).name, "tokens_scored": int(len(got)), "max_abs_diff": float(diff.max()),
           "mean_abs_diff": float(diff.mean()), "perplexity_of_these_tokens": float(np.exp(-want.mean())),
           "echo_request_seconds": seconds, "first_token_has_none": lp["token_logprobs"][0] is None}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps(out, indent=1) + "\n")
    md = [f"# echo + logprobs against the perplexity path: {out['model']}", "",
          f"`python bench/logprobs_check.py -m {args.model} --tokens {args.tokens}`: the first {args.tokens} tokens of "
          "WikiText-2's test file, scored by `/v1/completions` with `echo` and `logprobs` (the server's batched "
          "engine, paged KV) and by tools/perplexity.py's path (the single-sequence model).", "",
          "| tokens scored | max abs difference | mean abs difference | perplexity of these tokens |", "|---|---|---|---|",
          f"| {out['tokens_scored']} | {out['max_abs_diff']:.2e} | {out['mean_abs_diff']:.2e} | "
          f"{out['perplexity_of_these_tokens']:.4f} |"]
    (RESULTS / f"{args.tag}.md").write_text("\n".join(md) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
