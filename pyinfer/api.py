"""The Python API: `load()` and `Model` (generate, stream, chat, tokenize, eval)."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from . import _core
from .errors import ContextOverflowError, PyinferError
from .model.chat_template import chat_spans, render_chat
from .model.gguf_file import GGUFModelFile
from .model.pull import resolve_model
from .model.tokenizer import IncrementalDecoder, Tokenizer
from .place.device import check_cuda, engine_backends, parse_device, resolve_placement
from .runtime.llama_graph import CACHE_TYPES, build_llama_graph
from .runtime.sampling import Sampler, SamplingParams
from .runtime.sparse_ffn import NEURON_DOWN_CHOICES, SparseRuns
from .runtime.stops import apply_stops
from .runtime.threads import physical_cores
from .sparsity.resolve import resolve_sparsity

MAX_BATCH = 512  # tokens per engine run (prefill micro-batch)


def load(path_or_name: str | os.PathLike | None = None, n_threads: int | None = None, n_ctx: int = 2048,
         isa: str = "auto", sparsity="off", target: float | None = None, **kwargs) -> "Model":
    """Loads a GGUF model. `path_or_name`: a file, or None / "smollm2" for the default model.
    `sparsity`: "off", "auto" (calibrate on first use, then cached) or a sparsity file from
    `pyinfer train-predictors`; `target`: FFN sparsity for "auto" (default 0.5). Other keywords go to
    `Model` (cache_type="q8_0", neuron_down, ...)."""
    return Model(resolve_model(path_or_name), n_threads=n_threads, n_ctx=n_ctx, isa=isa, sparsity=sparsity,
                 target=target, **kwargs)


class Model:
    """One model and its single-sequence KV cache. Calls from several threads are safe: each prefill and each
    decode step holds the model's lock, never a `yield`, so streams on any threads interleave, and a stream that
    finds its sequence displaced from the cache by another caller prefills it again. A dense model's callers get
    exactly what they would have got alone; a sparse one's re-prefilled tokens run dense (as prompts do)."""

    def __init__(self, path: str | os.PathLike, n_threads: int | None = None, n_ctx: int = 2048, isa: str = "auto",
                 sparsity="off", target: float | None = None, emulate_prefill: bool = False, progress: bool = True,
                 neuron_down: str = "auto", cache_type: str = "f16", ram_budget: str | int | None = None,
                 neuron_cache: float | None = None, neuron_window: float | None = None, device: str = "cpu",
                 vram_budget: str | int | None = None):
        """`emulate_prefill`: many-token runs compute exactly what sparse decode would (for perplexity of
        the sparse path); by default prefill runs dense. `cache_type`: the KV cache's element type, "f16"
        (default) or "q8_0" (half the memory and bytes read per decode step, llama.cpp's -ctk/-ctv q8_0).
        `ram_budget` (bytes, a size such as "80M", or a plan file from `pyinfer plan`): the most bytes of
        weights kept in RAM; the FFN neurons
        that do not fit are streamed from a bundle file written next to the sparsity cache (needs a
        sparsity plan). Results equal the in-RAM run of the same plan bit for bit. `neuron_cache`: the share of
        the budget above the minimum kept as an LRU cache of cold neurons read for earlier tokens (predictor
        plans), instead of more resident hot neurons. `neuron_window`: the share of each predictor layer's
        neurons after its resident ones read ahead every token (hidden behind the compute of earlier layers)
        instead of on demand. `device`: "cpu" (default), "cuda"/"cuda:N" (hot FFN neurons and, if it fits,
        the output head on the GPU, the rest on the CPU, both at once), or "standin" (a second CPU backend
        standing in for the GPU). `vram_budget`: bytes of GPU memory (a size, or a file from `pyinfer place`;
        default: free memory less 512 MiB)."""
        if not isinstance(n_ctx, int) or n_ctx < 1:
            raise PyinferError(f"n_ctx must be a positive integer, got {n_ctx!r}")
        if cache_type not in CACHE_TYPES:
            raise PyinferError(f"cache_type must be one of {', '.join(CACHE_TYPES)}, got {cache_type!r}")
        if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
            raise PyinferError(f"n_threads must be a positive integer, got {n_threads!r}")
        self.path = str(path)
        self.gguf = GGUFModelFile(path)
        self.config = self.gguf.llama_config()
        self.tokenizer = Tokenizer(self.gguf.metadata)
        self.n_ctx = n_ctx
        self.cache_type = cache_type
        if cache_type == "q8_0" and self.config.head_dim % 32:
            raise PyinferError(f"a q8_0 KV cache needs a head size that is a multiple of 32; this model's is "
                               f"{self.config.head_dim} (use cache_type f16)")
        self.n_threads = n_threads or physical_cores()
        self.chat_template = self.gguf.get("tokenizer.chat_template")
        self.sparsity = resolve_sparsity(sparsity, self.gguf, self.config, self.tokenizer.encode, target,
                                         self.n_threads, progress)
        if neuron_down not in NEURON_DOWN_CHOICES:
            raise PyinferError(f"neuron_down must be one of {', '.join(NEURON_DOWN_CHOICES)}, got {neuron_down!r}")
        from .offload.setup import make_offload

        self.offload = make_offload(self.gguf, self.config, self.sparsity, neuron_down, ram_budget, neuron_cache,
                                    neuron_window, progress)
        self.placement = None
        kind, index = parse_device(device)
        self.device = str(device)
        if kind == "cpu" and vram_budget is not None:
            raise PyinferError("a VRAM budget needs device='cuda' (or 'standin')")
        if kind != "cpu":
            if kind == "cuda":
                check_cuda(index)
            if self.offload is not None:
                raise PyinferError("a device and a RAM budget together are not supported yet (the GPU split "
                                   "keeps the CPU's neurons in RAM)")
            self.placement = resolve_placement(kind, index, vram_budget, self.gguf, self.config, self.sparsity,
                                               n_ctx, cache_type)
        self._max_batch = min(MAX_BATCH, n_ctx)
        self.emulate_prefill = emulate_prefill and self.sparsity is not None
        # One sequence: decode sparse, every prompt dense, however short (PowerInfer-2's split).
        runs = SparseRuns.every_token(self._max_batch) if emulate_prefill else SparseRuns(max_tokens=1)
        try:  # a weight whose shape disagrees with the metadata is refused by the graph: one line, not a traceback
            builder = build_llama_graph(self.gguf, self.config, n_ctx, self.sparsity, runs, down_type=neuron_down,
                                        cache_type=cache_type, offload=self.offload,
                                        hybrid=dict(self.placement, device=1) if self.placement else None)
            graph = builder.graph
            self._union_ids = [t.id for t in builder.unions]  # per layer: the last run's active union
            self._engine = _core.Engine(graph, max_tokens=self._max_batch, max_outputs=self._max_batch,
                                        n_threads=self.n_threads, isa=isa, **engine_backends(kind, index,
                                                                                             self.n_threads,
                                                                                             builder.placement))
        except ValueError as e:
            raise PyinferError(f"{Path(self.path).name}: {e}") from None
        self._cached: list[int] = []  # tokens whose K/V are in the cache at positions 0..len-1
        self._runs = 0                # forward calls so far: a stream sees whether someone else ran between steps
        self._lock = threading.RLock()  # per forward call (see the class docstring)

    @property
    def isa(self) -> str:
        return self._engine.isa

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
            out = self._forward(list(tokens), 0, rows)
        return out if all_logits else out[0]

    def _check_tokens(self, tokens: Sequence[int]) -> np.ndarray:
        if len(tokens) == 0:
            raise PyinferError("no tokens to evaluate")
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.ndim != 1 or arr.min() < 0 or arr.max() >= self.config.vocab_size:
            raise PyinferError(f"token ids must be integers in [0, {self.config.vocab_size})")
        return arr.astype(np.int32)

    def _forward(self, tokens: list[int], start: int, out_rows: np.ndarray) -> np.ndarray:
        """Evaluates tokens at positions start.. and returns logits of `out_rows` (indices into
        tokens) as a new F32 array [len(out_rows), vocab]."""
        ids = self._check_tokens(tokens)
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(ids)} tokens do not fit the context of {self.n_ctx} tokens (raise n_ctx / --ctx)")
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
            try:
                self._engine.run(len(chunk), chunk, positions, rows)
            except ValueError as e:  # the engine refused the input (one line, as every user error)
                raise PyinferError(str(e)) from None
            if len(rows):
                result[done:done + len(rows)] = self._engine.logits()
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
        return self._forward(ids[common:], common, np.array([len(ids) - common - 1]))[0]

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
                    logits = self._forward([tok], len(self._cached), np.array([0]))[0]
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
        bos, eos = self._bos_eos_text()
        return render_chat(self.chat_template, messages, bos, eos, add_generation_prompt)

    def _bos_eos_text(self) -> tuple[str, str]:
        tk = self.tokenizer
        return (tk.token_text(tk.bos_id) if tk.bos_id is not None else "",
                tk.token_text(tk.eos_id) if tk.eos_id is not None else "")

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """The prompt ids of a chat: the model's template rendered, its own text tokenized with control tokens and
        the messages' content as plain text (see Tokenizer.encode_chat), BOS first where the model wants one.
        Roles must be ones the template knows (chat_template.template_roles)."""
        bos, eos = self._bos_eos_text()
        text, spans = chat_spans(self.chat_template, messages, bos, eos, add_generation_prompt)
        ids = self.tokenizer.encode_chat(text, spans, [m["content"] for m in messages])
        tk = self.tokenizer
        return [tk.bos_id] + ids if tk.add_bos and tk.bos_id is not None and ids[:1] != [tk.bos_id] else ids

    def chat(self, messages: list[dict], stream: bool = False, **kwargs):
        """Renders the model's chat template and generates the assistant's reply."""
        it = self.stream(self.chat_ids(messages), **kwargs)
        if stream:
            return it
        with self._lock:
            return "".join(it)
