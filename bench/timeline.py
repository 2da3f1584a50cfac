"""Where a hybrid decode step spends its time, from the engine's per-segment timeline: per FFN layer, how long
the CPU and the device side were busy and how much of the shorter one ran at the same time as the other
(issue 12's overlap figure), and a plot of every segment of the step."""
from __future__ import annotations

import numpy as np


def _measure(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _intersection(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return _measure(xs) + _measure(ys) - _measure(xs + ys)


def step_timeline(model) -> list[tuple[int, int, float, float]]:
    """(segment, backend, start s, end s) of one greedy decode step of `model` (a pyinfer Model)."""
    ids = model.tokenize("Once upon a time")
    eng = model.running
    with model._lock:
        logits = model.forward(ids, 0, np.array([len(ids) - 1]))[0]
        for k in range(3):  # warm: staging sized, decode graphs captured
            logits = model.forward([int(np.argmax(logits))], len(ids) + k, np.array([0]))[0]
        eng.set_timeline(True)
        try:
            model.forward([int(np.argmax(logits))], len(ids) + 3, np.array([0]))
            return [s for s in eng.timeline() if s[2] >= 0]
        finally:
            eng.set_timeline(False)


def layer_overlap(model, spans) -> list[dict]:
    """Per layer: CPU and device busy ms in its FFN and the share of the shorter side overlapped. The FFN's
    nodes run from its "ffn_in" to the next layer's "attn_in" (the last one's to "x_out"); the CPU's segments
    starting there, and the device's lying wholly there (its segments that also merge and go on to the next
    attention are not the FFN's half), are the two halves."""
    names = model.running.node_names()
    starts = [i for i, n in enumerate(names) if n == "attn_in"] + [names.index("x_out")]  # x_out: after the last
    ffn_in = [i for i, n in enumerate(names) if n == "ffn_in"]
    segs = model.running.segments()
    rows = []
    for il, lo in enumerate(ffn_in):
        hi = starts[il + 1]
        side = {0: [], 1: []}
        for seg, backend, a, b in spans:
            nodes = segs[seg]["nodes"]
            if nodes and lo <= nodes[0] < hi and (backend == 0 or nodes[-1] < hi):
                side[min(backend, 1)].append((a, b))
        cpu, dev = _measure(side[0]), _measure(side[1])
        both = _intersection(side[0], side[1])
        rows.append({"layer": il, "cpu_ms": cpu * 1e3, "device_ms": dev * 1e3,
                     "overlap_share": both / min(cpu, dev) if min(cpu, dev) > 0 else None})
    return rows


def plot(spans, path: str, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(12, 2.6))
    for _, backend, a, b in spans:
        ax.broken_barh([(a * 1e3, (b - a) * 1e3)], (backend - 0.4, 0.8), color="tab:red" if backend else "tab:blue")
    ax.set_yticks([0, 1], ["CPU", "device"])
    ax.set_xlabel("ms from the start of the decode step")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
