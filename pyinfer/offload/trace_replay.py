"""A decode trace (each token's active union per layer) replayed through a resident set and a neuron cache:
how many cold neurons the neuron store would read, how many the cache would serve, and the page ranges it
would merge them into. `pyinfer plan` predicts listed reads from this instead of assuming one read per
neuron, and picks the cache's share of the budget with it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.running import last_unions


def decode_trace(model, tokens: int = 16, temperature: float = 0.8) -> list[list[np.ndarray]]:
    """Per decode token, per layer: the active union's neuron ids (hot-first order), from a sampled decode
    (seeded): a greedy one can loop on one token, whose repeated unions would flatter any cache."""
    ids = model.tokenize("It was the best of times, it was the worst of times")
    rng = np.random.default_rng(0)
    trace = []
    with model._lock:
        logits = model.forward(ids, 0, np.array([len(ids) - 1]))[0]
        for i in range(tokens):
            z = np.asarray(logits, np.float64) / temperature
            p = np.exp(z - z.max())
            token = int(rng.choice(len(p), p=p / p.sum()))
            logits = model.forward([token], len(ids) + i, np.array([0]))[0]
            trace.append(last_unions(model))
    return trace


# The neuron store's listed reads (offload/neuron_store.cpp): page ranges merged across gaps under GAP bytes,
# cut at MAX_RANGE bytes.
PAGE, GAP, MAX_RANGE = 4096, 8192, 256 * 1024


@dataclass
class Replay:
    """A decode trace replayed through one resident set and cache, per token after the first."""
    cold_reads: float = 0.0     # listed cold neurons read from disk
    cache_hits: float = 0.0     # listed cold neurons found in the cache
    window_hits: float = 0.0    # listed cold neurons found in the read-ahead window
    read_bytes: float = 0.0     # bytes of the page ranges the store would read
    requests: float = 0.0       # how many ranges


def merged_ranges(offsets: list[int], bundle: int, cap: int = MAX_RANGE, gap: int = GAP) -> tuple[int, int]:
    """(bytes, ranges) the store reads for bundles at these ascending file offsets: page ranges closer than
    `gap` bytes merged, ranges cut at `cap`."""
    total = count = 0
    cur0 = cur1 = -1
    for b0 in offsets:
        p0, p1 = b0 // PAGE * PAGE, -(-(b0 + bundle) // PAGE) * PAGE
        if cur1 >= 0 and p0 <= cur1 + gap and p1 - cur0 <= cap:
            cur1 = max(cur1, p1)
            continue
        if cur1 >= 0:
            total, count = total + cur1 - cur0, count + 1
        cur0, cur1 = (cur1 if 0 <= cur1 and b0 < cur1 else p0), p1
    if cur1 >= 0:
        total, count = total + cur1 - cur0, count + 1
    return total, count


def replay(trace, layout, resident: list[int], selective: list[bool], slots: int = 0,
           window: list[int] | None = None, cap: int = MAX_RANGE, gap: int = GAP) -> Replay:
    """What the store would read for the trace's unions: the resident prefixes, the read-ahead windows after
    them, an LRU cache of `slots` neurons, then merged page ranges of the rest. Counted from the second token
    on (the cache starts empty; a long decode runs warm)."""
    from collections import OrderedDict

    lru: OrderedDict = OrderedDict()
    out = Replay()
    for t, step in enumerate(trace):
        for il, ids in enumerate(step):
            if not selective[il]:
                continue
            e = layout.layers[il] if layout is not None else None
            used = set()  # this layer's fetch: its rows are not evicted by its own later misses
            missed = []
            ahead = resident[il] + (window[il] if window else 0)
            out.window_hits += (t > 0) * int(np.count_nonzero((ids >= resident[il]) & (ids < ahead)))
            cold = ids[ids >= ahead].tolist()
            if not slots:
                missed = cold
                cold = []
            for k in cold:
                key = (il, k)
                if key in lru:
                    lru.move_to_end(key)
                    out.cache_hits += t > 0
                else:
                    missed.append(k)
                    if slots and (len(lru) < slots or next(iter(lru)) not in used):
                        if len(lru) >= slots:
                            lru.popitem(last=False)
                        lru[key] = True
                used.add(key)
            if t > 0:
                out.cold_reads += len(missed)
                if e is not None and missed:
                    nbytes, nreq = merged_ranges([e["file_offset"] + k * e["bundle_bytes"] for k in missed],
                                                 e["bundle_bytes"], cap, gap)
                    out.read_bytes += nbytes
                    out.requests += nreq
    n = max(len(trace) - 1, 1)
    return Replay(out.cold_reads / n, out.cache_hits / n, out.window_hits / n, out.read_bytes / n, out.requests / n)
