"""Where pyinfer and llama.cpp part, op by op: both engines run the same ids on the same file, llama.cpp's own
intermediate tensors are read through its graph callback (cb_eval) and pyinfer's by keeping every activation
of its graph readable; each pair of the same layer and meaning is compared (largest |difference| over the
largest |value|, and the share of values that are bit for bit equal).

On quantized files the two engines quantize activations alike (kernels/act_quant.h) but round their float sums
in their own orders, so most tensors agree to an ulp or two; where a value sits at an 8-bit rounding edge that
ulp flips it, and the flip, a step of 1/254 of its block's largest value, then grows layer by layer. This
tool shows the first tensor of each layer where that happens, and, on MoE files, every token and layer whose chosen
experts differ between the engines with llama.cpp's own gap between its k-th and next expert score there, over the
spread of its scores (a near tie that an ulp decides).

  python bench/trace_vs_llamacpp.py --kind deepseek2 --ftype Q8_0 --vendor DIR [--init fan-in]   # a tiny model
  python bench/trace_vs_llamacpp.py -m model.gguf [--json]
  python bench/hf_check.py --vendor V --only deepseek_v2 --keep D    # then:
  python bench/trace_vs_llamacpp.py -m D/deepseek_v2-Q8_0.gguf

Writes nothing; --json prints one JSON object.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "tests"))

# pyinfer's activation name -> llama.cpp's tensor name (llama.cpp appends "-<layer>"), for the tensors both hold
# in the same [tokens, values] layout.
PAIRS = [("attn_in", "attn_norm"), ("v", "Vcur"), ("attn", "kqv_out"), ("ffn_in", "ffn_norm"),
         ("ffn_in", "post_attn_norm"), ("router", "ffn_moe_logits"), ("gate_exps", "ffn_moe_reglu"),
         ("gate_exps", "ffn_moe_swiglu"), ("up_exps", "ffn_moe_up"), ("down_exps", "ffn_moe_down"),
         ("ffn_out", "ffn_out"), ("moe_out", "ffn_moe_out"), ("q_latent", "q_nope_absorbed_perm"),
         ("attn_v", "kqv_mla"), ("gate", "ffn_swiglu"), ("up", "ffn_up")]


GGML_I32 = 26  # ggml_type


class _GgmlTensor(ctypes.Structure):  # ggml.h's struct ggml_tensor (llama.cpp 0.3.36)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def llamacpp_tensors(path: str, ids: list[int]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every F32 tensor llama.cpp computes for `ids` in one batch (f32 KV cache), by name, in graph order."""
    import llama_cpp.llama as llama_py
    from llama_cpp import Llama, llama_cpp as api

    got: dict[str, np.ndarray] = {}
    order: list[str] = []

    @api.ggml_backend_sched_eval_callback
    def seen(t, ask, _user):
        g = ctypes.cast(t, ctypes.POINTER(_GgmlTensor)).contents
        name = g.name.decode()
        # ask: yes, every tensor; then keep the F32 ones and the experts each token chose (I32)
        if ask or not g.data or not (g.type == 0 or (g.type == GGML_I32 and name.startswith("ffn_moe_topk"))):
            return True
        ne, nb = list(g.ne), list(g.nb)
        n = sum((ne[i] - 1) * nb[i] for i in range(4)) + 4
        a = np.ndarray(shape=ne[::-1], dtype=np.float32 if g.type == 0 else np.int32,
                       buffer=ctypes.string_at(g.data, n), strides=nb[::-1])
        if name not in got:
            order.append(name)
        got[name] = a.copy()
        return True

    defaults = api.llama_context_default_params

    def with_callback():
        p = defaults()
        p.cb_eval = seen
        return p

    llama_py.llama_cpp.llama_context_default_params = with_callback  # Llama() reads its context defaults here
    try:
        llm = Llama(model_path=path, n_ctx=max(128, len(ids)), n_batch=512, n_threads=2, n_threads_batch=2,
                    verbose=False, type_k=0, type_v=0)
        llm.eval(ids)
    finally:
        llama_py.llama_cpp.llama_context_default_params = defaults
    return got, order


def pyinfer_tensors(path: str, ids: list[int]) -> dict[tuple[str, int], np.ndarray]:
    """Every activation of pyinfer's graph for `ids` in one run, by (name, layer): the builder is made to pin each
    activation (so none shares memory) and to note the layer of the last weight it was given. In-place ops leave a
    tensor's last value (the gate holds the activation product after it)."""
    import pyinfer
    from pyinfer.runtime import graph_builder as gb

    made: list[tuple[str, int, object]] = []
    layer = [-1]
    activation, weight = gb.GraphBuilder.activation, gb.GraphBuilder.weight

    def pinned_activation(self, name, cols, *a, **k):
        t = activation(self, name, cols, *a, **k)
        self.graph.pin(t.id)
        made.append((name, layer[0], t))
        return t

    def noted_weight(self, name, *a, **k):
        m = re.match(r"blk\.(\d+)\.", name)
        layer[0] = int(m.group(1)) if m else layer[0]
        return weight(self, name, *a, **k)

    gb.GraphBuilder.activation, gb.GraphBuilder.weight = pinned_activation, noted_weight
    try:
        m = pyinfer.load(path, n_threads=2, n_ctx=max(128, len(ids)), progress=False, cache_type="f32")
    finally:
        gb.GraphBuilder.activation, gb.GraphBuilder.weight = activation, weight
    m.eval(ids, all_logits=True)
    engine = m.running.engine
    return {(name, il): np.array(engine.tensor(t.id, len(ids))) for name, il, t in made}


def compare(ours: dict, theirs: dict, order: list[str], n_tokens: int) -> list[dict]:
    rows = []
    for lname in order:
        m = re.fullmatch(r"(.+)-(\d+)", lname)
        if not m:
            continue
        base, il = m.group(1), int(m.group(2))
        for pname, want in PAIRS:
            p = ours.get((pname, il))
            if want != base or p is None:
                continue
            t = theirs[lname]
            if base in ("kqv_mla",):  # [heads, tokens, v] -> [tokens, heads v]
                t = np.swapaxes(t.reshape(t.shape[-3:]), 0, 1)
            if t.size != p.size:
                continue
            t = t.reshape(n_tokens, -1)
            if t.shape != p.shape:
                continue
            scale = float(np.abs(t).max()) or 1.0
            rows.append({"layer": il, "llamacpp": lname, "pyinfer": pname,
                         "max_rel": float(np.abs(p - t).max() / scale), "bit_equal": float((p == t).mean())})
    return rows


def routing(ours: dict, theirs: dict, n_tokens: int) -> list[dict]:
    """Per MoE layer: the tokens whose chosen experts differ between the engines (as sets), and at each, llama.cpp's
    own gap between its k-th and (k+1)-th selection score over the spread of its scores for that token (a near tie:
    rounding may choose either)."""
    rows = []
    for (name, il), route in sorted(ours.items(), key=lambda kv: kv[0][1]):
        chosen = theirs.get(f"ffn_moe_topk-{il}")
        if name != "route" or chosen is None or chosen.size % n_tokens:  # the last layer: only the output token
            continue
        k = route.shape[1] // 2
        chosen = chosen.reshape(n_tokens, -1)[:, :k]
        # the scores llama.cpp chose by: grouped routing's masked ones, else with the selection bias, else plain
        score = next((theirs[n] for n in (f"ffn_moe_probs_masked-{il}", f"ffn_moe_probs_biased-{il}",
                                          f"ffn_moe_probs-{il}") if n in theirs), None)
        differ = [t for t in range(n_tokens)
                  if set(route[t, k:].astype(int)) != set(chosen[t].tolist())]
        gaps = []
        if score is not None and score.size % n_tokens == 0:
            s = np.sort(score.reshape(n_tokens, -1), axis=1)[:, ::-1]
            s = np.where(np.isfinite(s), s, np.nan)  # masked groups hold -inf
            spread = np.nanmax(s, axis=1) - np.nanmin(s, axis=1)  # logits (gpt-oss) may be negative
            gaps = [float((s[t, k - 1] - s[t, k]) / spread[t]) if spread[t] > 0 else 0.0 for t in differ]
        rows.append({"layer": il, "tokens_differ": differ, "llamacpp_kth_gap": gaps})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", help="a GGUF file both engines load")
    ap.add_argument("--kind", help="instead: a tiny random model of bench/arch_check.py's kind (its CASES)")
    ap.add_argument("--ftype", default="Q8_0", help="the tiny model quantized by llama.cpp: F32, Q8_0 or Q4_K_M")
    ap.add_argument("--init", default="plain", choices=["plain", "fan-in"], help="the tiny model's weights "
                    "(bench/arch_check.py --init)")
    ap.add_argument("--vendor", type=Path, help="vendor/llama.cpp/models of the sdist (the tiny model's vocabulary)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args()
    if not args.model and not (args.kind and args.vendor):
        ap.error("give -m MODEL, or --kind with --vendor")
    path = args.model
    if args.kind:
        import arch_check
        import llama_cpp

        vocabs = {c[1]: c[2] for c in arch_check.CASES}
        if args.kind not in vocabs:
            ap.error(f"unknown kind {args.kind!r}; kinds: {', '.join(vocabs)}")
        tmp = Path(tempfile.mkdtemp(prefix="pyinfer-trace-"))
        vocab = args.vendor / vocabs[args.kind] if vocabs[args.kind] else None
        path = str(arch_check.write(args.kind, tmp / "f32.gguf", vocab, args.init == "fan-in"))
        if args.ftype != "F32":
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = arch_check.FTYPES[args.ftype]
            out = str(tmp / f"{args.ftype}.gguf")
            from llama_cpp._utils import suppress_stdout_stderr

            with suppress_stdout_stderr(disable=False):
                rc = llama_cpp.llama_model_quantize(path.encode(), out.encode(), params)
            if rc != 0:
                raise SystemExit(f"llama_model_quantize to {args.ftype} failed")
            path = out
    import pyinfer

    try:
        n_vocab = pyinfer.load(path, n_threads=1, n_ctx=128, progress=False).config.vocab_size
    except pyinfer.PyinferError as e:
        raise SystemExit(f"trace_vs_llamacpp: {e}") from None
    ids = np.random.default_rng(0).integers(3, n_vocab, args.tokens).tolist()
    theirs, order = llamacpp_tensors(path, ids)
    ours = pyinfer_tensors(path, ids)
    rows, routes = compare(ours, theirs, order, args.tokens), routing(ours, theirs, args.tokens)
    first = next((r for r in rows if r["bit_equal"] < 1.0), None)
    if args.json:
        print(json.dumps({"model": path, "tokens": args.tokens, "rows": rows, "first_difference": first,
                          "routing": routes}))
        return 0
    print(f"{'layer':>5}  {'llama.cpp':24s} {'pyinfer':12s} {'max |diff| / max':>16s} {'bit-equal':>9s}")
    for r in rows:
        print(f"{r['layer']:>5}  {r['llamacpp']:24s} {r['pyinfer']:12s} {r['max_rel']:16.3e} {r['bit_equal']:9.1%}")
    differ = [r for r in routes if r["tokens_differ"]]
    if routes:
        print(f"routing: {sum(len(r['tokens_differ']) for r in routes)} of {len(routes) * args.tokens} choices "
              f"({len(routes)} MoE layers x {args.tokens} tokens) differ" + (
                  "; token (llama.cpp's gap between its k-th and next score, over the spread of its scores):" if differ
                  else ""))
    for r in differ:
        gaps = ", ".join(f"{t} ({g:.1e})" for t, g in zip(r["tokens_differ"], r["llamacpp_kth_gap"]))
        print(f"  layer {r['layer']}: {gaps or r['tokens_differ']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
