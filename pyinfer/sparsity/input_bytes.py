"""What an input-sparse plan reads: each site's measured density on calibration text, and the weight bytes one
decode step reads with the plan against without it (the copies' own format: Q8_0 rows, or F32 for float
weights). `bench --json` and `pyinfer info` show both."""
from __future__ import annotations

import numpy as np

from ..model.config import GATE_FIRST
from ..runtime.input_major import copy_layout
from ..runtime.input_sparse import SITE_OF_PART, site_threshold
from .input_calibrate import SITES
from .plan import INPUT_SITES, SparsityPlan
from .recorder import Recorder

MEASURE_TOKENS = 512


def measure_densities(gguf, cfg, plan: SparsityPlan, ids: list[int], n_threads: int) -> list[dict[str, float]]:
    """Per layer: the share of each site's inputs kept (1.0 where the site is dense); with a gate cut, `up` is
    the share of neurons whose up row is read and ffn_mid the share of down rows read (both cuts passed)."""
    sums = [dict.fromkeys(SITES + ("up",), 0.0) for _ in plan.layers]
    seen = [0]

    def on_layer(il: int, x: dict) -> None:
        lp = plan.layers[il]
        thr = dict(zip(INPUT_SITES, lp.inputs or (0.0, 0.0, 0.0)), ffn_mid=lp.threshold)
        for s in INPUT_SITES:
            sums[il][s] += float((np.abs(x[s]) > thr[s]).mean()) if thr[s] > 0 else 1.0
        up = x["gate"] > lp.gate_threshold if lp.gate_threshold > 0 and cfg.activation in GATE_FIRST else \
            np.ones(x["gate"].shape, bool)
        mid = up & (np.abs(x["ffn_mid"]) > lp.threshold) if lp.threshold > 0 else up
        sums[il]["up"] += float(up.mean())
        sums[il]["ffn_mid"] += float(mid.mean())
        if il == 0:
            seen[0] += 1

    Recorder(gguf, cfg, n_threads).run_sites(ids, MEASURE_TOKENS, on_layer, "measuring", progress=False)
    out = [{s: round(v / max(seen[0], 1), 4) for s, v in d.items() if s != "gate"} for d in sums]
    fixed = plan.info.get("fixed_density") or {}
    for d in out:  # a fixed density is what each token keeps, whatever the text (where the site is cut at all)
        for s, v in fixed.items():
            if s in d and d[s] < 1.0:
                d[s] = round(float(v), 4)
    return out


def bytes_per_token(gguf, cfg, plan: SparsityPlan, densities: list[dict[str, float]]) -> dict[str, int]:
    """Weight bytes one decode step reads: dense (every layer matrix and the head) and with the plan."""
    dense = sparse = 0
    for name, t in gguf.tensors.items():
        if t.rows == 1 or name == "token_embd.weight" and not cfg.tied_output:
            continue  # norms, biases; the embedding lookup reads one row
        nbytes = int(np.asarray(t.data).nbytes)
        dense += nbytes
        parts = name.split(".")
        if len(parts) < 4 or parts[0] != "blk" or parts[2] not in SITE_OF_PART:
            sparse += nbytes
            continue
        il, part = int(parts[1]), parts[2]
        d = densities[il]
        lp = plan.layers[il]
        if lp.gate_threshold > 0 and not lp.dense and part.startswith("ffn_"):  # gate dense, then the cuts
            sparse += {"ffn_gate": nbytes, "ffn_up": int(nbytes * d["up"]),
                       "ffn_down": int(copy_bytes(t) * d["ffn_mid"])}[part]
        elif site_threshold(plan, name) is not None:
            sparse += int(copy_bytes(t) * d[SITE_OF_PART[part]])
        else:
            sparse += nbytes
    return {"dense": dense, "sparse": sparse}


def copy_bytes(t) -> int:
    """Bytes of the input-major copy's rows (runtime/input_major.copy_layout)."""
    _, (rows, width), np_type = copy_layout(t)
    return rows * width * np.dtype(np_type).itemsize


def describe_input_plan(plan: SparsityPlan) -> str:
    lv = plan.info.get("levels", {})
    q = plan.info.get("quality", {})
    cut = ", ".join(f"{k} {v:.0%}" for k, v in lv.items() if v > 0) or "nothing"
    rung = next((r for r in q.get("rungs", []) if r.get("levels") == {k: v for k, v in lv.items() if v > 0}), None)
    qual = f"; {rung['change'] * 100:+.2f}% perplexity on held-out calibration text (bound +{q['bound_pct']:g}%)" \
        if rung else ""
    return f"input-sparse: cuts {cut}{qual}"
