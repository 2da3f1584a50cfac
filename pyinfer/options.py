"""LoadOptions: every option of a load, in one frozen object built once (by `load()`, the command line or the
server's options) and passed whole to the Session, the server and its Ray replicas. A new option is a field here,
its check in `__post_init__`, a flag in `from_args`, and its one reader (mostly session.py)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .errors import PyinferError
from .runtime.model_graph import CACHE_TYPES
from .runtime.sparse_ffn import NEURON_DOWN_CHOICES

Size = str | int | None  # bytes, or a size such as "300M" / "1.5GiB" (tools/sizes.py)


@dataclass(frozen=True)
class LoadOptions:
    """`n_threads`: CPU threads (None: the machine's default). `sparsity`: "off", "auto" (calibrate on first use,
    then cached), a sparsity file from `pyinfer train-predictors`, or a SparsityPlan; `target`: FFN sparsity for
    "auto" (default 0.4; a Mixture of Experts: the share of each chosen expert's neurons decode skips).
    sparsity "input": the input-sparse plan (TEAL and CATS cuts) with the most skipping within `sparsity_quality`
    percent of the dense model's perplexity on held-out calibration text (sparsity/input_choice.py).
    `neuron_down`: the neuron-major down's type for sparse decode. `cache_type`: the KV cache's element type, "f16"
    or "q8_0" (half the memory and bytes per decode step, llama.cpp's -ctk/-ctv q8_0).
    `ram_budget` (a size, or a plan file from `pyinfer plan`): the most bytes of weights kept in RAM; the FFN neurons
    that do not fit stream from a bundle file (needs a sparsity plan), bit for bit the in-RAM result.
    `neuron_cache`: the share of the budget above the minimum kept as an LRU cache of cold neurons; `neuron_window`:
    the share of each predictor layer's neurons after its resident ones read ahead every token.
    `device`: "cpu", "cuda"/"cuda:N" (hot neurons and, if it fits, the head on the GPU, the rest on the CPU, both
    at once) or "standin" (a second CPU backend standing in for the GPU); `vram_budget`: GPU bytes (a size, or a
    file from `pyinfer place`; default: free memory less 512 MiB).
    `mmap` None: the weights are read into memory on 2 MiB pages where the model runs whole in RAM on the CPU and
    the file takes at most half the available memory, else mapped; True: always mapped (llama.cpp's default);
    False: always read (--no-mmap). `mem_limit`: the whole process stays under it (runtime, KV cache, buffers,
    weights kept in RAM, the page cache it uses), streaming FFN neurons or experts from disk where it must.
    `progress`: progress bars and notes on stderr. `isa`: the kernel table ("auto", or one the CPU has)."""
    n_threads: int | None = None
    sparsity: Any = "off"
    target: float | None = None
    sparsity_quality: float = 3.0
    neuron_down: str = "auto"
    cache_type: str = "f16"
    ram_budget: Size | os.PathLike = None
    neuron_cache: float | None = None
    neuron_window: float | None = None
    device: str = "cpu"
    vram_budget: Size | os.PathLike = None
    mmap: bool | None = None
    mem_limit: Size = None
    progress: bool = True
    isa: str = "auto"

    def __post_init__(self):
        if self.n_threads is not None and (not isinstance(self.n_threads, int) or self.n_threads < 1):
            raise PyinferError(f"n_threads must be a positive integer, got {self.n_threads!r}")
        if self.cache_type not in CACHE_TYPES:
            raise PyinferError(f"cache_type must be one of {', '.join(CACHE_TYPES)}, got {self.cache_type!r}")
        if self.neuron_down not in NEURON_DOWN_CHOICES:
            raise PyinferError(f"neuron_down must be one of {', '.join(NEURON_DOWN_CHOICES)}, got "
                               f"{self.neuron_down!r}")

    @classmethod
    def of(cls, options: LoadOptions | None = None, **changes) -> LoadOptions:
        """`options` (default: every default) with `changes`: load()'s keywords. An unknown keyword is one line."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unknown load option(s): {', '.join(unknown)} (see pyinfer.LoadOptions)")
        return dataclasses.replace(options or cls(), **changes)

    def but(self, **changes) -> LoadOptions:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_args(cls, args, **changes) -> LoadOptions:
        """The command line's options (each command has the flags it shows; the others keep their defaults), with
        `changes` over them (a command's own choices, e.g. `plan --verify`'s candidate budgets)."""
        if getattr(args, "threads", None) is not None and args.threads < 1:
            raise PyinferError("--threads must be at least 1")
        target = getattr(args, "target", None)
        if target is not None and not 0.0 <= target < 1.0:
            raise PyinferError("--target must be in [0, 1)")
        budget, limit = getattr(args, "ram_budget", None), getattr(args, "mem_limit", None)
        for flag, key in (("--neuron-cache", "neuron_cache"), ("--neuron-window", "neuron_window")):
            if getattr(args, key, None) is not None and budget is None and limit is None:
                raise PyinferError(f"{flag} needs --ram-budget or --mem-limit")
        mmap = True if getattr(args, "mmap", False) else False if getattr(args, "no_mmap", False) else None
        quality = getattr(args, "sparsity_quality", None)
        if quality is not None and not 0.0 < quality <= 100.0:
            raise PyinferError("--sparsity-quality must be a perplexity increase in percent in (0, 100]")
        read = cls(n_threads=getattr(args, "threads", None), sparsity=getattr(args, "sparsity", "off"), target=target,
                   sparsity_quality=3.0 if quality is None else quality,
                   cache_type=getattr(args, "cache_type", "f16"), ram_budget=budget,
                   neuron_cache=getattr(args, "neuron_cache", None), neuron_window=getattr(args, "neuron_window", None),
                   device=getattr(args, "device", "cpu"), vram_budget=getattr(args, "vram_budget", None), mmap=mmap,
                   mem_limit=limit)
        return cls.of(read, **changes)
