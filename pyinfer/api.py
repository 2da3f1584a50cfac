"""The Python API: `load()` and `Model` (generate, stream, chat, tokenize, eval)."""
from __future__ import annotations

import os
import threading
from typing import Iterator, Sequence

import numpy as np

from .errors import ContextOverflowError, PyinferError
from .model.pull import resolve_model
from .model.tokenizer import IncrementalDecoder
from .runtime.sampling import Sampler, SamplingParams
from .runtime.sparse_ffn import SparseRuns
from .runtime.stops import apply_stops
from .options import LoadOptions
from .session import MAX_BATCH, Session


def load(path_or_name: str | os.PathLike | None = None, *, n_ctx: int = 2048, emulate_prefill: bool = False,
         options: LoadOptions | None = None, **load_options) -> "Model":
    """Loads a GGUF model. `path_or_name`: a file, or None / "smollm2" for the default model. `n_ctx`: the KV
    cache's rows. The load's options are `options` (a LoadOptions) and/or its fields as keywords:
    n_threads, sparsity ("off", "auto" or a file), target, cache_type, ram_budget, mem_limit, device, vram_budget,
    mmap, ... (see LoadOptions)."""
    return Model(resolve_model(path_or_name), n_ctx=n_ctx, emulate_prefill=emulate_prefill, options=options,
                 **load_options)


class Model:
    """One model and its single-sequence KV cache. Calls from several threads are safe: each prefill and each
    decode step holds the model's lock, never a `yield`, so streams on any threads interleave, and a stream that
    finds its sequence displaced from the cache by another caller prefills it again. A dense model's callers get
    exactly what they would have got alone; a sparse one's re-prefilled tokens run dense (as prompts do)."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048, emulate_prefill: bool = False,
                 options: LoadOptions | None = None, **load_options):
        """`n_ctx`: the KV cache's rows. `emulate_prefill`: many-token runs compute exactly what sparse decode would
        (for perplexity of the sparse path); by default prefill runs dense. The load's options: `options` and/or
        LoadOptions' fields as keywords (see LoadOptions). `memory()` reports where the memory went."""
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise PyinferError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        self.options = LoadOptions.of(options, **load_options)
        s = Session(path, n_ctx, self.options, min(MAX_BATCH, n_ctx))
        self.session = s
        self.path, self.gguf, self.config, self.tokenizer = s.path, s.gguf, s.config, s.tokenizer
        self.n_threads, self.cache_type = s.n_threads, s.cache_type
        self.sparsity, self.offload, self.placement, self.device = s.sparsity, s.offload, s.placement, s.device
        self.n_ctx = n_ctx
        self._max_batch = min(s.max_batch, n_ctx)
        self.emulate_prefill = emulate_prefill and self.sparsity is not None
        # One sequence: decode sparse, every prompt dense, however short (PowerInfer-2's split).
        runs = SparseRuns.every_token(self._max_batch) if emulate_prefill else SparseRuns(max_tokens=1)
        self._run = s.build(n_ctx, self._max_batch, runs)
        if s.memory is not None:
            from .offload.memory import trim_heap

            trim_heap()  # what building the graph freed (copies' transients) leaves the heap now
        self._cached: list[int] = []  # tokens whose K/V are in the cache at positions 0..len-1
        self._runs = 0                # forward calls so far: a stream sees whether someone else ran between steps
        self._lock = threading.RLock()  # per forward call (see the class docstring)

    @property
    def isa(self) -> str:
        return self._run.isa

    @property
    def chat_template(self) -> str | None:
        return self.session.chat_template

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:  # a caller's own template (jinja2 text)
        self.session.chat_template = template

    # ---- what tools may ask of the engine --------------------------------------------------------------
    def layer_unions(self) -> list[np.ndarray]:
        """Per FFN layer, the last run's active union: I32 [n_ff + 1], count (-1: the run went dense), ids."""
        return self._run.unions()

    def set_op_timing(self, on: bool) -> None:
        """Times every op of the following runs (op_timing() reads them), as llama.cpp's GGML_SCHED debug does."""
        self._run.set_op_timing(on)

    def op_timing(self):
        return self._run.op_timing()

    @property
    def n_copies(self) -> int:
        """Tensor copies between memory spaces per run (a CPU/GPU split's cost)."""
        return self._run.n_copies

    def memory(self) -> dict:
        """Where this process's memory is now, by part (offload/memory.py's memory_report): the split of
        `mem_limit` if one was given, KV cache, buffers, weights kept in RAM, and the process's measured resident
        bytes, peak and memory cgroup."""
        from .offload.memory import memory_report

        return memory_report(self.path, self.session.memory, self._run.engine, self.offload, self.session.experts,
                             self.session.gguf.read_bytes)

    @property
    def running(self):
        """The running engine's view for timelines and debugging (runtime/running.py RunningModel: node names, segments,
        the per-segment timeline)."""
        return self._run

    # ---- text <-> tokens ----------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    # ---- forward ------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Runs `tokens` as a fresh sequence. Returns F32 logits [vocab] for the last position,
        or [len(tokens), vocab] with all_logits."""
        n = len(tokens)
        rows = np.arange(n) if all_logits else np.array([n - 1])
        with self._lock:
            out = self.forward(list(tokens), 0, rows)
        return out if all_logits else out[0]

    def _check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        if len(tokens) == 0:
            raise PyinferError("no tokens to evaluate")
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.ndim != 1 or arr.min() < 0 or arr.max() >= self.config.vocab_size:
            raise PyinferError(f"token ids must be integers in [0, {self.config.vocab_size})")
        return arr.astype(np.int32)

    def forward(self, tokens: Sequence[int], start: int, out_rows: np.ndarray) -> np.ndarray:
        """Evaluates tokens at positions start.. (the cache holds this sequence's first `start` tokens) and
        returns logits of `out_rows` (indices into tokens) as a new F32 array [len(out_rows), vocab]. The
        low-level step under eval and generate: a tool's way to run exactly the tokens it chooses."""
        with self._lock:  # public: a tool's call takes its turn like eval and generate
            return self._forward_locked(tokens, start, out_rows)

    def _forward_locked(self, tokens: Sequence[int], start: int, out_rows) -> np.ndarray:
        ids = self._check_tokens(tokens)
        if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or not 0 <= start <= len(self._cached):
            raise PyinferError(f"start must be an integer in [0, {len(self._cached)}] (the tokens cached so far), "
                               f"got {start!r}")
        out_rows = np.asarray(out_rows, dtype=np.int64).reshape(-1)
        if out_rows.size and (out_rows.min() < 0 or out_rows.max() >= len(ids)):
            raise PyinferError(f"out_rows must index the {len(ids)} tokens given")
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(ids)} tokens do not fit the context of {self.n_ctx} tokens (raise n_ctx / --ctx)")
        if self.config.recurrent_layers and 0 < start < len(self._cached):
            # A recurrent state holds its whole sequence and cannot be rewound to a shorter prefix: the prefix is
            # run again from position 0 (its logits are not returned).
            ids = np.concatenate([np.asarray(self._cached[:start], np.int32), ids])
            out_rows, start = out_rows + start, 0
        result = np.empty((len(out_rows), self.config.vocab_size), dtype=np.float32)
        self._runs += 1
        self._cached = self._cached[:start]
        done = 0
        bounds = list(range(0, len(ids), self._max_batch)) + [len(ids)]
        if (self.sparsity is not None and not self.emulate_prefill and self._max_batch > 1 and len(bounds) > 2
                and bounds[-1] - bounds[-2] == 1):
            bounds[-2] -= 1  # a prompt's last token alone would run sparse; prompts run dense (see _prefill)
        for c0, c1 in zip(bounds, bounds[1:]):
            chunk = ids[c0:c1]
            sel = (out_rows >= c0) & (out_rows < c0 + len(chunk))
            rows = (out_rows[sel] - c0).astype(np.int32)
            positions = np.arange(start + c0, start + c0 + len(chunk), dtype=np.int32)
            self._run.run(len(chunk), chunk, positions, rows)
            if len(rows):
                result[done:done + len(rows)] = self._run.logits()
                done += len(rows)
            self._cached.extend(int(t) for t in chunk)
        return result

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Logits after `ids`, reusing the cached prefix shared with the previous call."""
        common = 0
        for a, b in zip(self._cached, ids[:-1]):
            if a != b:
                break
            common += 1
        if self.sparsity is not None and not self.emulate_prefill:
            # Prompts run dense, one token sparse: rerunning only the last prompt token would take it sparse,
            # and the same prompt twice would not give the same tokens. Two tokens run dense, as prefill did.
            common = min(common, max(len(ids) - 2, 0))
        return self.forward(ids[common:], common, np.array([len(ids) - common - 1]))[0]

    def _token_stream(self, prompt_ids: list[int], max_tokens: int, sampler: Sampler) -> Iterator[int]:
        if len(prompt_ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt is {len(prompt_ids)} tokens; the context holds {self.n_ctx} (raise n_ctx / --ctx)")
        history = list(prompt_ids)
        with self._lock:
            logits = self._prefill(history)
            seen = self._runs
        for i in range(max_tokens):
            tok = sampler(logits)
            if tok in self.tokenizer.end_of_generation:
                return
            yield tok  # the lock is free here: a stream left open blocks nobody
            history.append(tok)
            if i + 1 == max_tokens or len(history) > self.n_ctx:
                return
            with self._lock:
                if self._runs != seen:  # someone ran the model in between: its cache holds another sequence
                    logits = self._prefill(history)
                else:
                    logits = self.forward([tok], len(self._cached), np.array([0]))[0]
                seen = self._runs

    # ---- generation -----------------------------------------------------------------------
    def stream(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
               top_p: float = 0.95, top_k: int = 40, seed: int | None = None, stop: Sequence[str] = (),
               special: bool = False) -> Iterator[str]:
        """Yields text pieces as they are generated."""
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise PyinferError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        ids = list(prompt) if not isinstance(prompt, str) else self.tokenize(prompt, special=special)
        sampler = Sampler(SamplingParams(temperature, top_k, top_p, seed))
        decoder = IncrementalDecoder(self.tokenizer)
        pieces = (decoder.push(t) for t in self._token_stream(ids, max_tokens, sampler))
        return apply_stops((p for p in pieces if p), list(stop or ()))

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
                 top_p: float = 0.95, top_k: int = 40, seed: int | None = None, stop: Sequence[str] = (),
                 special: bool = False) -> str:
        with self._lock:  # whole: callers of generate take turns rather than re-prefill each other (see stream)
            return "".join(self.stream(prompt, max_tokens, temperature, top_p, top_k, seed, stop, special))

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self.session.render_chat(messages, add_generation_prompt)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a chat (Session.chat_ids): template text may become control tokens, content never."""
        return self.session.chat_ids(messages, add_generation_prompt)

    def chat(self, messages: list[dict], stream: bool = False, **kwargs):
        """Renders the model's chat template and generates the assistant's reply."""
        it = self.stream(self.chat_ids(messages), **kwargs)
        if stream:
            return it
        with self._lock:
            return "".join(it)
