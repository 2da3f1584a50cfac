"""`mem_limit`: one total for the whole process, the memory a user has free and what a memory cgroup enforces.
It holds the runtime (interpreter, libraries, the model's metadata, tokenizer and sparsity plan), the KV cache,
the engine's buffers, the weights kept in RAM and the page cache the process keeps in use; the weights get what
the rest leaves, and `ram_budget` is derived from it.

Measured, not guessed: the runtime is this process's resident memory once metadata, tokenizer and plan are
loaded (less any pages of the model file itself, which are weights), the KV cache and buffers are the sizes an
engine of the same shape allocates (a probe engine, built over the mapped weights and never run). A margin covers
what is still to come (code pages of kernels not yet run, a generation loop's Python objects)."""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from ..errors import PyinferError
from ..tools.sizes import fmt_size

MARGIN_BYTES = 8 << 20    # plus MARGIN_SHARE of the limit: code pages and Python objects still to come
MARGIN_SHARE = 1 / 64
BUFFER_SHARE = 1 / 16     # the engine's buffers (a prefill micro-batch's activations and logits) get at most this
BATCHES = (512, 256, 128, 64, 32, 16)  # prefill micro-batch sizes tried, largest first


def trim_heap() -> None:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim): loading frees tens of MiB of
    parsing and tokenizer-building transients that would otherwise stay resident and count against a limit."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def reset_peak() -> None:
    """Starts this process's peak resident set (VmHWM) afresh, so the peak read later is this load's own
    (Linux: clear_refs 5; elsewhere nothing happens)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# ---- what this process holds now ------------------------------------------------------------------------------
def _status() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def mapped_bytes(path: str | os.PathLike) -> int:
    """Bytes of `path` resident in this process's mappings (/proc/self/smaps; 0 where it cannot be read)."""
    target = os.path.realpath(path)
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                    parts = line.split(maxsplit=5)
                    inside = len(parts) > 5 and os.path.realpath(parts[5].strip()) == target
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def cgroup_memory() -> dict | None:
    """This process's memory cgroup: usage, peak and limit in bytes (v1 or v2), or None outside one or where
    it cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            names = ("memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.limit_in_bytes")
            break
    else:
        v2 = [ln for ln in lines if ln.startswith("0::")]
        if not v2:
            return None
        base = Path("/sys/fs/cgroup") / v2[0][3:].lstrip("/")
        names = ("memory.current", "memory.peak", "memory.max")
    got = {}
    for key, name in zip(("usage", "peak", "limit"), names):
        try:
            text = (base / name).read_text().strip()
        except OSError:
            continue
        got[key] = None if text == "max" or int(text) >= 1 << 60 else int(text)
    return got if "usage" in got else None


@dataclass
class ProcessMemory:
    """This process now: anonymous and file-backed resident bytes, the model file's share of the latter, its
    peak resident set, and its memory cgroup (usage, peak, limit) where it is in one."""
    anon: int
    file: int
    model_file: int
    peak_rss: int
    cgroup: dict | None

    @property
    def runtime(self) -> int:
        """Everything resident but the model's own pages."""
        return self.anon + self.file - self.model_file

    def as_dict(self) -> dict:
        return asdict(self)


def process_memory(model_path: str | os.PathLike | None = None) -> ProcessMemory:
    s = _status()
    return ProcessMemory(s.get("RssAnon", 0) + s.get("RssShmem", 0), s.get("RssFile", 0),
                         mapped_bytes(model_path) if model_path else 0, s.get("VmHWM", 0), cgroup_memory())


# ---- the split of one limit ------------------------------------------------------------------------------------
@dataclass
class MemoryPlan:
    """How one total limit is spent. `weights` is what is left for weights (and offload's read buffers)."""
    limit: int
    runtime: int        # measured: interpreter, libraries, metadata, tokenizer, sparsity plan
    kv: int             # the KV cache (the engine's state)
    buffers: int        # the engine's scratch at `max_batch` tokens (activations, logits of a prefill)
    margin: int
    weights: int
    model_weights: int  # bytes of every tensor in the model file
    max_batch: int      # prefill micro-batch that keeps `buffers` within its share
    offload: bool       # weights stream from disk (sparsity plan) rather than all being mapped
    load_peak: int = 0  # the resident peak of this load so far (parsing and tokenizer transients included)

    @property
    def overhead(self) -> int:
        return self.runtime + self.kv + self.buffers + self.margin

    def summary(self) -> dict:
        return {"mem_limit": self.limit, "runtime_bytes": self.runtime, "kv_bytes": self.kv,
                "buffer_bytes": self.buffers, "margin_bytes": self.margin, "weight_budget": self.weights,
                "model_weight_bytes": self.model_weights, "max_batch": self.max_batch, "offload": self.offload,
                "load_peak_bytes": self.load_peak}

    def parts(self) -> str:
        return (f"runtime {fmt_size(self.runtime)}, KV cache {fmt_size(self.kv)}, buffers {fmt_size(self.buffers)}, "
                f"margin {fmt_size(self.margin)}")

    def below_minimum(self, weights_minimum: int) -> PyinferError:
        """The error for a limit that leaves less than `weights_minimum` for weights."""
        must = f", weights that must stay {fmt_size(weights_minimum)}" if weights_minimum else ""
        return PyinferError(f"a memory limit of {fmt_size(self.limit)} is below this model's minimum of "
                            f"{fmt_size(self.minimum(weights_minimum))} ({self.parts()}{must}; loading peaked at "
                            f"{fmt_size(self.load_peak)})")

    def minimum(self, weights_minimum: int) -> int:
        """The smallest limit: the parts with `weights_minimum` of weights, and never below the load's own peak
        (its parsing and tokenizer transients) plus the fixed margin."""
        return max(self.overhead + weights_minimum, self.load_peak + MARGIN_BYTES)


def plan_memory(limit: int, model_path: str | os.PathLike, model_weights: int, sparse: bool,
                engine_bytes: Callable[[int], tuple[int, int]], max_batch: int = BATCHES[0]) -> MemoryPlan:
    """Splits `limit`: the runtime is measured now (call once metadata, tokenizer and plan are loaded), KV and
    buffers come from `engine_bytes(max_batch) -> (state, scratch)`. The prefill micro-batch is the largest of
    BATCHES (up to `max_batch`) whose buffers fit BUFFER_SHARE of the limit. With a sparsity plan the FFN neurons that do
    not fit stream from disk; without one the weights stay mapped (see mapped_note)."""
    now = process_memory(model_path)  # the peak first: trimming does not lower it
    load_peak = now.peak_rss - now.model_file
    trim_heap()
    runtime = process_memory(model_path).runtime
    margin = MARGIN_BYTES + int(limit * MARGIN_SHARE)
    sizes = [b for b in BATCHES if b <= max_batch] or [max_batch]
    for batch in sizes:
        kv, scratch = engine_bytes(batch)
        if scratch <= limit * BUFFER_SHARE:
            break
    plan = MemoryPlan(limit, runtime, kv, scratch, margin, limit - runtime - kv - scratch - margin, model_weights,
                      batch, sparse, load_peak)
    if not sparse and limit < plan.minimum(0):  # with a plan, offload names what must stay (its own minimum)
        raise plan.below_minimum(0)
    return plan


def mapped_note(plan: MemoryPlan) -> str | None:
    """Without a sparsity plan nothing streams: the weights stay mapped and, where the limit leaves less than the
    model, the kernel re-reads the pages it evicted (as llama.cpp's mmap does). What a user is told then."""
    if plan.offload or plan.weights >= plan.model_weights:
        return None
    return (f"pyinfer: the memory limit leaves {fmt_size(plan.weights)} for weights ({plan.parts()}); the model's "
            f"{fmt_size(plan.model_weights)} stay mapped and the kernel re-reads what it evicts (it fits whole in "
            f"{fmt_size(plan.overhead + plan.model_weights)}; a predictor plan from `pyinfer train-predictors` "
            f"streams only the neurons that fire)")


def memory_report(model_path: str | os.PathLike, plan: MemoryPlan | None, engine, offload, experts=None,
                  read_weight_bytes: int = 0) -> dict:
    """Where this process's memory is now, by part: the limit's split where there is one, the sizes the engine
    allocated (KV cache, buffers), the weights kept in RAM (offload: copies of what must stay, resident neurons,
    read buffers; otherwise the model file's mapped pages, plus `read_weight_bytes` read into memory instead of
    mapped) and what /proc and the memory cgroup measure."""
    now = process_memory(model_path)
    out = {"mem_limit": plan.limit if plan else None, "plan": plan.summary() if plan else None,
           "kv_bytes": int(engine.state_bytes), "buffer_bytes": int(engine.scratch_bytes),
           "rss_anon": now.anon, "rss_file": now.file, "model_file_pages": now.model_file,
           "peak_rss": now.peak_rss, "cgroup": now.cgroup}
    if offload is not None:
        st, p = offload.store.stats(), offload.plan
        out.update(resident_weight_bytes=int(p.fixed_bytes - p.ring_bytes + st["resident_bytes"]),
                   read_buffer_bytes=int(st["ring_bytes"]), neuron_cache_bytes=int(p.cache_bytes))
    else:
        out.update(resident_weight_bytes=now.model_file + read_weight_bytes, read_buffer_bytes=0, neuron_cache_bytes=0)
    if experts is not None:  # a Mixture of Experts streaming its experts: resident experts and the cache
        st = experts.store.stats()
        out.update(resident_weight_bytes=now.model_file + int(st["resident_bytes"]),
                   expert_cache_bytes=int(st["cache_bytes"]))
    return out
