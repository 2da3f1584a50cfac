"""Input-sparse projections (TEAL): a projection y = W x skips the weight columns that the small entries of its
input would multiply, so their bytes are never fetched.

Decode reads an input-major copy of W made at load (runtime/input_major.py: row i = input i's column of W, so
one skipped input is one skipped row), kept beside the original, which prefill and batches denser than the
break-even read: a cut projection's bytes are held twice. The active list of an input is |x_i| > t, t per layer
and input site (sparsity/input_calibrate.py), shared by the projections reading that input (q, k, v; gate, up).

`ModelGraph.linear` and the FFN writer (`dense_ffn`) call a projection builder; this one builds the sparse
path (active list, union, axpy over the listed rows) and the dense matmul, each guarded by the union's choice.
"""
from __future__ import annotations

import re

from ..model.gguf_file import GGUFModelFile
from ..sparsity.plan import INPUT_SITES, SparsityPlan
from .graph_builder import GraphBuilder, Guard, T
from .input_major import by_input_weight
from .sparse_ffn import SparseRuns

# weight part -> its input site (ffn_down's input is act(gate) * up: the layer's own `threshold`)
SITE_OF_PART = {"attn_q": "attn_in", "attn_k": "attn_in", "attn_v": "attn_in", "attn_output": "attn_out",
                "ffn_gate": "ffn_in", "ffn_up": "ffn_in", "ffn_down": "ffn_mid"}
_LAYER_WEIGHT = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight$")


def site_threshold(plan: SparsityPlan, weight: str) -> tuple[int, str, float] | None:
    """(layer, site, |x| threshold) of a layer weight the plan makes input-sparse, else None."""
    hit = _LAYER_WEIGHT.match(weight)
    if hit is None or hit.group(2) not in SITE_OF_PART:
        return None
    il, site = int(hit.group(1)), SITE_OF_PART[hit.group(2)]
    lp = plan.layers[il]
    if lp.dense:
        return None
    thr = lp.threshold if site == "ffn_mid" else lp.inputs[INPUT_SITES.index(site)]
    return (il, site, float(thr)) if thr > 0 else None


class InputSparseProjections:
    """The projection builder of an input-sparse plan (mode "input"); weights it does not cover run dense."""

    def __init__(self, plan: SparsityPlan, runs: SparseRuns, gguf: GGUFModelFile):
        self.plan, self.runs, self.gguf = plan, runs, gguf
        self._lists: dict[tuple[int, float], tuple[T, T]] = {}  # (input id, threshold) -> (lists, union)

    def __call__(self, m, x: T, weight: str, name: str) -> T:
        b: GraphBuilder = m.b
        hit = site_threshold(self.plan, weight)
        t = self.gguf.tensor(weight)
        if hit is None or t.rows % 32:
            return b.matmul(m.w(weight), x, name)
        il, site, thr = hit
        lists, union = self._active(b, x, t.cols, f"blk.{il}.{site}", thr, self.plan.fixed_top_k(site, t.cols))
        w_t = by_input_weight(b, self.gguf, weight)
        y = b.activation(name, t.rows, rows=x.rows)
        b.down_axpy(w_t, x, lists, out=y, union=union, run_if=Guard(when=union))
        b.matmul(m.w(weight), x, name, out=y, run_if=Guard(when=union, sparse=False))
        return y

    def _active(self, b: GraphBuilder, x: T, n: int, prefix: str, thr: float, top_k: int) -> tuple[T, T]:
        """Each token's list of |x_i| > thr (or its top_k largest), and their union (which picks the path), once
        per input."""
        key = (x.id, thr, top_k)
        if key not in self._lists:
            runs = self.runs
            lists = b.active_set(x, n, prefix + ".active", threshold=thr, top_k=top_k,
                                 run_if=Guard(max_tokens=runs.max_tokens))
            union = b.active_union(lists, n, prefix + ".union", runs.max_tokens, *runs.threshold,
                                   max_single=runs.single)
            self._lists[key] = (lists, union)
        return self._lists[key]


class RecordedInputs:
    """The dense projections, keeping the input of each layer's q and output projections readable after a run
    (b.input_records[layer] = (attn_in, attn_out) ids): what input-sparse calibration reads."""

    def __call__(self, m, x: T, weight: str, name: str) -> T:
        hit = _LAYER_WEIGHT.match(weight)
        if hit is not None and hit.group(2) in ("attn_q", "attn_output"):
            il = int(hit.group(1))
            while len(m.b.input_records) <= il:
                m.b.input_records.append([None, None])
            m.b.graph.pin(x.id)
            m.b.input_records[il][0 if hit.group(2) == "attn_q" else 1] = x.id
        return m.b.matmul(m.w(weight), x, name)
