"""`sparsity="auto"` never decodes slower than dense: the first time a calibrated plan loads on a machine, decode
is timed with it, with its gate-first candidate where the model has one, and without either (teacher-forced
decode steps, interleaved in alternating rounds; SETS independent measurements, each plan judged by its lowest
ratio to dense), and a plan is kept only where it is clearly faster: the threshold plan at KEEP_AT times dense,
the gate-first plan (which also skips up rows, at a little more perplexity) at GATE_KEEP_AT times the better of
the other two. One measurement was not enough: on Gemma 3 one timed the plan at 1.06x of dense where three
later comparisons found 0.97x (bench/results/sparsity/auto_choice_pure_cats.md). Each engine's speed is read from the
20th percentile of its step times: what another process or a noisy neighbour does to a step only adds time,
and on a shared 2-core machine whole-run totals of two identical engines differ by up to 28% where this
percentile stays within 3%. Where a whole model sits in the CPU's last-level cache, skipping a share of the FFN
bytes can save less than the sparse path's own work costs (issue 28: 0.93x of dense on
SmolLM2 on a 480 MB L3), and a user who asked for `auto` should not get a slower model without a word.

The choice, both speeds and the machine they were measured on are stored in the cached plan (measured again on
another machine or thread count), printed when measured, and shown by `pyinfer info` and `bench --json`. An
explicit target, a plan file, and offload (where sparse decode saves reads, not compute) keep the plan without
asking.

Where the whole plan loses, it may still pay in some layers (those whose FFN skips most, or whose rows miss the
cache): each layer's FFN is timed node by node, sparse and dense in alternating rounds (the same decode
steps), and the layers whose sparse FFN beats their dense one by LAYER_KEEP_AT make a mixed plan, the others
decoding dense. The mix is timed against dense like a whole plan and kept ("layers") only at KEEP_AT.

On SwiGLU and GeGLU models `auto` also weighs the input-sparse plan (sparsity/input_choice.py: the most skipping
of down's input within the quality bound) and holds every candidate to that bound: each plan's perplexity on the
held-out calibration windows against dense's (`sparsity_quality`, +3% by default); a plan past it is timed but
never kept. The input plan, which spends the bound where the threshold plan spends less, is kept only at
INPUT_KEEP_AT times the best of the others."""
from __future__ import annotations

import platform
import sys
import time

import numpy as np

from .plan import is_number

DECODE_TOKENS = 24
ROUNDS = 6
SETS = 2  # independent measurements; a plan must clear its bar in each
PERCENTILE = 20
KEEP_AT = 1.03  # sparse decode must beat dense by this much to be worth its approximation
GATE_KEEP_AT = 1.03  # gate-first must beat both others by this much to be worth its larger one
LAYER_KEEP_AT = 1.05  # a layer's sparse FFN must beat its dense FFN by this much to be tried sparse in a mix
LAYER_ROUNDS = 4  # alternating rounds of node-timed decode steps for the per-layer ratios
INPUT_KEEP_AT = 1.03  # the input-sparse plan must beat the best of the others by this much
# sparse: the threshold plan; layers: it in the layers where it pays, dense elsewhere; gate: its gate-first
# (CATS) candidate; input: the input-sparse plan
CHOICES = ("sparse", "layers", "gate", "input", "dense")


def machine_key(n_threads: int, mem_limit: int | None = None) -> str:
    """Where a choice holds: the CPU's model name, the kernel tables it offers, the thread count and the memory
    limit the session runs under, if any (an input plan that wins in RAM read its rows from disk at 0.35x dense
    under one: docs/results.md, issue 51)."""
    from .. import _core

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    limit = f" | mem_limit {mem_limit} bytes" if mem_limit is not None else ""
    return f"{name} | {_core.available_isas()} | {n_threads} threads{limit}"


def session_key(session) -> str:
    """machine_key of a session: its threads, and its memory limit where it has one."""
    memory = getattr(session, "memory", None)
    return machine_key(session.n_threads, memory.limit if memory is not None else None)


def _well_typed(c: dict) -> bool:
    """The fields stored_choice() and describe() read hold what measure_choice() writes (a damaged cached plan
    is measured again, never a TypeError)."""
    speeds = ("sparse_tok_s", "dense_tok_s", "ratio")
    optional = ("keep_at", "gate_tok_s", "gate_ratio", "layers_tok_s", "layers_ratio", "sets", "input_tok_s",
                "input_ratio")
    quality = c.get("quality", {})
    return (all(is_number(c.get(k)) for k in speeds) and all(is_number(c[k]) for k in optional if k in c)
            and isinstance(quality, dict) and isinstance(quality.get("changes", {}), dict)
            and all(is_number(v) for v in quality.get("changes", {}).values())
            and all(isinstance(c.get(k, []), list) for k in ("layer_ratios", "sparse_layers"))
            and all(is_number(r) for r in c.get("layer_ratios", [])))


def stored_choice(plan, key: str, gate_plan, input_plan=None, quality: float | None = None) -> dict | None:
    """The choice measured on this machine, if it weighed the candidates there are now under the same quality
    bound (a choice from before per-layer timing, which may have missed a mix that pays, is measured again)."""
    c = plan.info.get("auto_choice") if plan is not None else None
    if not isinstance(c, dict) or c.get("machine") != key or c.get("chose") not in CHOICES or not _well_typed(c):
        return None
    if (c.get("quality") or {}).get("bound_pct") != quality:  # weighed under another bound (or none)
        return None
    if "layer_ratios" not in c and not c.get("ratio", 0.0) >= c.get("keep_at", KEEP_AT):
        return None
    layers = c.get("sparse_layers")
    if c["chose"] == "layers" and not (isinstance(layers, list) and layers and all(
            isinstance(i, int) and 0 <= i < len(plan.layers) for i in layers)):
        return None
    same = ("gate_tok_s" in c) == (gate_plan is not None) and ("input_tok_s" in c) == (input_plan is not None)
    return c if same else None


def step_seconds(running, ids: np.ndarray, prompt: int, tokens: int) -> list[float]:
    """Seconds of each of `tokens` one-token runs after a `prompt`-token prefill (ids fed in: no sampling)."""
    running.run(prompt, ids[:prompt], np.arange(prompt, dtype=np.int32), np.array([prompt - 1], np.int32))
    out = []
    for i in range(prompt, prompt + tokens):
        t0 = time.perf_counter()
        running.run(1, ids[i:i + 1], np.array([i], np.int32), np.array([0], np.int32))
        out.append(time.perf_counter() - t0)
    return out


def decode_ffn_seconds(running, ids: np.ndarray, prompt: int, tokens: int) -> np.ndarray:
    """F64 [layers]: each layer's FFN seconds over `tokens` one-token runs after a `prompt`-token prefill (the
    prefill, dense in every engine, is not counted)."""
    running.run(prompt, ids[:prompt], np.arange(prompt, dtype=np.int32), np.array([prompt - 1], np.int32))
    running.set_op_timing(True)  # (resets)
    for i in range(prompt, prompt + tokens):
        running.run(1, ids[i:i + 1], np.array([i], np.int32), np.array([0], np.int32))
    seconds = running.ffn_seconds()
    running.set_op_timing(False)
    return seconds


def layer_ratios(dense, sparse, ids: np.ndarray, prompt: int, tokens: int, rounds: int = LAYER_ROUNDS) -> np.ndarray:
    """F64 [layers]: per layer, its dense FFN's time over its sparse FFN's on the same decode steps (above 1:
    sparse pays there), the median over `rounds` alternating rounds."""
    per_round = []
    for r in range(rounds):
        first, second = (dense, sparse) if r % 2 == 0 else (sparse, dense)
        a = decode_ffn_seconds(first, ids, prompt, tokens)
        b = decode_ffn_seconds(second, ids, prompt, tokens)
        d, s = (a, b) if first is dense else (b, a)
        per_round.append(d / np.maximum(s, 1e-12))
    return np.median(np.array(per_round), axis=0)


def interleaved_tok_s(engines: dict, ids: np.ndarray, prompt: int, tokens: int, rounds: int) -> dict[str, float]:
    """Decode tok/s of each engine: rounds of `tokens` steps, the engines in turn (order reversed every other
    round), from the PERCENTILE-th percentile of each one's step times."""
    names = list(engines)
    steps: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm: pages faulted in, caches filled
        step_seconds(engines[n], ids, prompt, min(4, tokens))
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            steps[n] += step_seconds(engines[n], ids, prompt, tokens)
    return {n: 1.0 / float(np.percentile(v, PERCENTILE)) for n, v in steps.items()}


def choose(ratio: dict[str, float], allowed: set[str] | None = None) -> str:
    """From each plan's decode speed as a multiple of dense: the faster of "sparse" and "layers" (the mix, where
    one was timed) at KEEP_AT or more; "gate" at KEEP_AT and at GATE_KEEP_AT times the best of the others; "input"
    at KEEP_AT and at INPUT_KEEP_AT times the best of the rest. `allowed`: the plans within the quality bound
    (None: all)."""
    ratio = {k: v for k, v in ratio.items() if allowed is None or k in allowed}
    kept = [k for k in ("sparse", "layers") if k in ratio and ratio[k] >= KEEP_AT]
    chose = max(kept, key=lambda k: ratio[k]) if kept else "dense"
    best = max([1.0] + [ratio[k] for k in ("sparse", "layers") if k in ratio])
    if "gate" in ratio and ratio["gate"] >= KEEP_AT and ratio["gate"] >= GATE_KEEP_AT * best:
        chose = "gate"
    best = max(best, ratio.get("gate", 0.0))
    if "input" in ratio and ratio["input"] >= KEEP_AT and ratio["input"] >= INPUT_KEEP_AT * best:
        chose = "input"
    return chose


def quality_changes(session, plans: dict, known: dict[str, float] | None = None) -> tuple[dict[str, float], float]:
    """({name: perplexity change against dense, as a fraction} for each plan of `plans` not None, dense's
    perplexity): on the held-out calibration windows, every token computed as decode computes it. `known`:
    changes already measured (the input plan's, from its choice), with "dense" its dense perplexity."""
    from .input_choice import heldout_ids, heldout_perplexity

    ids = heldout_ids(session)
    known = dict(known or {})
    dense = known.pop("dense", None) or heldout_perplexity(session, None, ids)
    changes = {k: heldout_perplexity(session, p, ids) / dense - 1.0 for k, p in plans.items() if p is not None}
    return dict(known, **changes), dense


def measure_choice(session, plan, gate_plan=None, tokens: int = DECODE_TOKENS, rounds: int = ROUNDS,
                   sets: int = SETS, input_plan=None, quality: float | None = None) -> dict:
    """Decode tok/s with `plan`, with `gate_plan` and `input_plan` (if any) and without any on this machine
    (engines built as the session builds its own), alternating rounds and flipping their order, `sets` times;
    where the whole plan does not clear KEEP_AT, its FFN is timed per layer and a mix of the layers where it pays
    is timed too; choose() picks from each plan's lowest ratio to dense, among those within `quality` (percent of
    held-out perplexity; None: no bound)."""
    from .calibrate import bundled_calibration_text

    allowed, out = None, {}
    if quality is not None:  # the input plan's change was measured when it was chosen (older caches: here)
        q = input_plan.info.get("quality", {}) if input_plan is not None else {}
        known = ({"input": float(q["change"]), "dense": float(q["dense_ppl"])}
                 if is_number(q.get("change")) and is_number(q.get("dense_ppl")) else {})
        changes, dense_ppl = quality_changes(session, {"sparse": plan, "gate": gate_plan,
                                                       "input": None if known else input_plan}, known)
        allowed = {k for k, v in changes.items() if v * 100.0 <= quality} | {"dense"}
        if "sparse" in allowed:
            allowed.add("layers")  # the threshold plan in fewer layers cuts less
        out["quality"] = {"bound_pct": quality, "dense_ppl": round(dense_ppl, 4),
                          "changes": {k: round(v, 5) for k, v in changes.items()}}

    prompt = 16
    ids = np.asarray(session.tokenizer.encode(bundled_calibration_text())[:prompt + tokens], np.int32)
    if len(ids) < prompt + tokens:
        ids = np.resize(ids, prompt + tokens)
    ids = np.clip(ids, 0, session.config.vocab_size - 1).astype(np.int32)
    plans = [("dense", None), ("sparse", plan), ("gate", gate_plan), ("input", input_plan)]
    engines = {name: _engine(session, p, prompt + tokens, prompt)
               for name, p in plans if name == "dense" or p is not None}
    measured = [interleaved_tok_s(engines, ids, prompt, tokens, rounds) for _ in range(sets)]
    rate = {k: float(np.median([m[k] for m in measured])) for k in engines}
    ratio = {k: min(m[k] / m["dense"] for m in measured) for k in engines if k != "dense"}
    if ratio["sparse"] < KEEP_AT and (allowed is None or "sparse" in allowed):  # does it pay in some layers?
        per_layer = layer_ratios(engines["dense"], engines["sparse"], ids, prompt, tokens)
        out["layer_ratios"] = [round(float(r), 3) for r in per_layer]
        pays = [il for il, r in enumerate(per_layer) if r >= LAYER_KEEP_AT]
        if pays and len(pays) < len(per_layer):
            pair = {"dense": engines["dense"],
                    "layers": _engine(session, plan.with_dense_layers(
                        [il for il in range(len(per_layer)) if il not in pays]), prompt + tokens, prompt)}
            mixed = [interleaved_tok_s(pair, ids, prompt, tokens, rounds) for _ in range(sets)]
            rate["layers"] = float(np.median([m["layers"] for m in mixed]))
            ratio["layers"] = min(m["layers"] / m["dense"] for m in mixed)
            out.update(sparse_layers=pays, layers_tok_s=rate["layers"], layers_ratio=ratio["layers"])
    out.update(chose=choose(ratio, allowed), sparse_tok_s=rate["sparse"], dense_tok_s=rate["dense"],
               ratio=ratio["sparse"])
    if plan.mode == "input":
        out["plan"] = "input-sparse plan"
    if "gate" in rate:
        out.update(gate_tok_s=rate["gate"], gate_ratio=ratio["gate"], gate_keep_at=GATE_KEEP_AT)
    if "input" in rate:
        out.update(input_tok_s=rate["input"], input_ratio=ratio["input"], input_keep_at=INPUT_KEEP_AT,
                   input_levels={k: v for k, v in input_plan.info.get("levels", {}).items() if v > 0})
    return dict(out, tokens=tokens, rounds=rounds, sets=sets, percentile=PERCENTILE, keep_at=KEEP_AT,
                machine=session_key(session), isa=engines["dense"].isa, measured=time.strftime("%Y-%m-%d"))


def input_candidate(session, quality: float, progress: bool = True):
    """The input-sparse plan `auto` weighs beside its threshold plan on a SwiGLU or GeGLU model (input_choice.py,
    cached per model and bound), or None: another activation (ReLU models keep exact sparsity and predictors),
    FFNs of several widths, or no rung within the bound (it would cut nothing)."""
    from ..model.config import GATE_FIRST
    from .input_choice import input_plan

    cfg = session.config
    if cfg.is_moe or not cfg.uniform_ffn or cfg.activation not in GATE_FIRST:
        return None
    plan = input_plan(session, quality, progress)
    return plan if any(v > 0 for v in plan.info.get("levels", {}).values()) else None


def _engine(session, plan, n_ctx: int, max_tokens: int):
    """An engine for `plan` (None: dense) built as the session builds its own (the auto choice runs only where
    nothing streams and no device is used: the session's other parts are their defaults)."""
    from ..runtime.running import build_running
    from ..runtime.sparse_ffn import SparseRuns

    return build_running(session.parts(sparsity=plan), n_ctx, max_tokens, SparseRuns())


def describe(choice: dict) -> str:
    n_layers = len(choice.get("layer_ratios", []))
    what = choice.get("plan", "threshold plan")
    kept = {"sparse": f"keeps the {what}", "gate": "keeps the gate-first plan", "dense": "decodes dense",
            "input": "keeps the input-sparse plan",
            "layers": f"keeps the {what} in {len(choice.get('sparse_layers', []))} of {n_layers} layers"
            }[choice["chose"]]
    gate = (f", gate-first {choice['gate_tok_s']:.1f} ({choice['gate_ratio']:.2f}x)" if "gate_tok_s" in choice
            else "")
    if "layers_tok_s" in choice:
        n = len(choice["sparse_layers"])
        gate += f", sparse in {n} layer{'s' if n != 1 else ''} {choice['layers_tok_s']:.1f} " \
                f"({choice['layers_ratio']:.2f}x)"
    elif "layer_ratios" in choice:
        gate += f", no layer {LAYER_KEEP_AT:.2f}x faster sparse" if not any(
            r >= LAYER_KEEP_AT for r in choice["layer_ratios"]) else ", sparse pays in every layer"
    if "input_tok_s" in choice:
        gate += f", input-sparse {choice['input_tok_s']:.1f} ({choice['input_ratio']:.2f}x)"
    q = choice.get("quality")
    past = [n for n, v in q.get("changes", {}).items() if v * 100.0 > q.get("bound_pct", 100.0)] if q else []
    names = {"sparse": "threshold plan", "gate": "gate-first", "input": "input-sparse"}
    bound = (f"; past the +{q['bound_pct']:g}% held-out perplexity bound: "
             + ", ".join(f"{names.get(n, n)} {q['changes'][n] * 100:+.1f}%" for n in past)) if past else ""
    return (f"sparse decode {choice['sparse_tok_s']:.1f} tok/s ({choice['ratio']:.2f}x){gate} against dense "
            f"{choice['dense_tok_s']:.1f} here (each plan's lowest of {choice.get('sets', 1)} measurements){bound}: "
            f"auto {kept}")


def keep_if_faster(session, plan, path, progress: bool = True, input_plan=None, quality: float | None = None):
    """(the plan kept, its gate-first candidate, the input-sparse plan `input_plan`, or None; the choice): the
    stored choice for this machine, or one measured now and stored in the cached plan at `path` (None: not cached,
    measured each load). `quality`: measure_choice's bound."""
    from ..tools.atomic_file import file_lock
    from .resolve import gate_candidate

    gate_plan = gate_candidate(path, plan.fingerprint, session.config) if path is not None else None
    choice = stored_choice(plan, session_key(session), gate_plan, input_plan, quality)
    if choice is None:
        choice = measure_choice(session, plan, gate_plan, input_plan=input_plan, quality=quality)
        if progress:
            print(f"pyinfer: {describe(choice)} (measured once, cached with the plan)", file=sys.stderr)
        if path is not None:
            plan.info["auto_choice"] = choice
            try:
                with file_lock(path):
                    plan.save(path)
            except OSError as e:
                print(f"pyinfer: warning: could not cache the sparsity choice at {path}: {e}", file=sys.stderr)
    if choice["chose"] == "layers":
        keep = set(choice["sparse_layers"])
        return plan.with_dense_layers([il for il in range(len(plan.layers)) if il not in keep]), choice
    return {"sparse": plan, "gate": gate_plan, "input": input_plan, "dense": None}[choice["chose"]], choice
