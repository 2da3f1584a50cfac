"""A model file and everything set up from it once: the one composition root of the Python API (api.Model, one
sequence) and the server (serve/batch_engine.py, many sequences over a paged KV cache). It holds the file, its
hyper-parameters, tokenizer and chat template, the sparsity plan, the offload weight source, the device and
its placement, and builds graphs and engines from them; callers run an engine through its RunningModel and
never reach into the engine itself."""
from __future__ import annotations

import dataclasses
import os
import sys

from .errors import PyinferError, UnsupportedModelError
from .model.arch import model_config, open_model
from .model.chat_template import chat_spans, render_chat
from .model.config import Activation
from .model.tokenizer import Tokenizer
from .options import LoadOptions
from .place.device import check_cuda, resolve_expert_placement, resolve_placement
from .runtime.running import ModelParts, RunningModel, build_running, parse_device
from .runtime.sparse_ffn import SparseRuns
from .runtime.threads import default_threads, physical_cores
from .sparsity.plan import selective_layers

MAX_BATCH = 512  # tokens per engine run (prefill micro-batch)


def reads_into_memory(path, mem_limit, ram_budget, device) -> bool:
    """load()'s default for `mmap`: read the weights into memory (2 MiB pages: decode's TLB misses go, about 10% of
    a DRAM-bound decode step) when the model runs whole in RAM on the CPU and its file takes at most half the
    available memory; map it otherwise (a limit or budget streams from the mapping, a device holds its own copy,
    and a model near the size of RAM would evict the page cache for a copy of itself)."""
    if mem_limit is not None or ram_budget is not None or str(device) != "cpu":
        return False
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        return os.path.getsize(path) * 2 <= available
    except (OSError, StopIteration, ValueError):  # not Linux, or no such line: keep the mapping
        return False


def check_input_sparsity_here(device, ram_budget) -> None:
    """An input-sparse plan runs on the CPU with its copies in RAM, or mapped from disk under a memory limit; its
    cuts have no GPU kernels and no neuron streaming (a RAM budget) yet."""
    if str(device) != "cpu" or ram_budget is not None:
        raise UnsupportedModelError("input sparsity runs on the CPU, in RAM or under --mem-limit (no --device or "
                                    "--ram-budget)")


class Session:
    """`path`: a GGUF file. `kv_rows`: the KV rows a placement must leave room for (a model's n_ctx, a server's
    KV budget). `options`: load()'s (options.py), read here and nowhere else."""

    def __init__(self, path: str | os.PathLike, kv_rows: int, options: LoadOptions = LoadOptions(),
                 max_batch: int = MAX_BATCH):
        from .sparsity.resolve import resolve_sparsity

        self.options = options
        o = options
        n_threads, sparsity, target, neuron_down, cache_type = o.n_threads, o.sparsity, o.target, o.neuron_down, \
            o.cache_type
        ram_budget, neuron_cache, neuron_window, mem_limit = o.ram_budget, o.neuron_cache, o.neuron_window, o.mem_limit
        device, vram_budget, progress, mmap = o.device, o.vram_budget, o.progress, o.mmap
        # what parts() reads before they are set
        self.offload = self.experts = self.expert_cuts = self.placement = self.sparsity = None
        self.input_copies = None  # an input-sparse plan's copies: made in RAM, or mapped from disk under a limit
        self.device, self.isa = str(device), o.isa
        self.path = str(path)
        if mem_limit is not None:
            import gc

            from .offload.memory import reset_peak

            gc.collect()  # a long-lived process's garbage (earlier models) is not this load's footprint
            reset_peak()  # the peak the limit's split reads is this load's own
        if mmap is None:
            mmap = not reads_into_memory(path, mem_limit, ram_budget, device)
        self.gguf = open_model(path, mmap=mmap)
        self.config = model_config(self.gguf)
        self.tokenizer = Tokenizer(self.gguf.metadata)
        self.chat_template = self.gguf.get("tokenizer.chat_template")
        self.cache_type, self.neuron_down = cache_type, neuron_down
        c = self.config  # MLA caches one latent row per token: its key is the row, its value the latent part
        cached = ((c.kv_width, c.kv_lora_rank) if c.kv_lora_rank else
                  sorted({c.layer_head_dim(il) for il in range(c.n_layers)}))
        if cache_type == "q8_0" and any(n % 32 for n in cached):
            raise PyinferError(f"a q8_0 KV cache needs cached heads of a multiple of 32 values; this model's are "
                               f"{' and '.join(map(str, cached))} (use cache_type f16)")
        self.n_threads = n_threads or default_threads(device)
        if n_threads and str(device) != "cpu" and n_threads >= physical_cores() and progress:
            print(f"pyinfer: {n_threads} CPU threads with a device on {physical_cores()} cores leave its executor "
                  f"thread no core of its own (on a 16-core H200 machine -t 16 decoded 3.6x slower than -t 8); "
                  f"the default is {default_threads(device)}", file=sys.stderr)
        if sparsity == "input" and not self.config.uniform_ffn:
            raise UnsupportedModelError("input sparsity needs FFNs of one width in every layer; this model's widths "
                                        f"are {sorted(set(self.config.ffn_widths))}")
        if mem_limit is not None:  # (written only if an input-sparse plan is used: offload/input_copies.py)
            from .model.pull import cache_dir
            from .offload.input_copies import MappedInputCopies

            self.input_copies = MappedInputCopies(cache_dir, self.gguf, progress)
        if sparsity == "input":  # chosen by quality on held-out text, with engines built as this session's
            from .sparsity.input_choice import input_plan

            check_input_sparsity_here(device, ram_budget)
            self.sparsity = input_plan(self, o.sparsity_quality, progress)
            if not any(v > 0 for v in self.sparsity.info.get("levels", {}).values()):
                self.sparsity = None  # every rung past the quality bound: nothing to cut, nothing to time
        else:
            self.sparsity = resolve_sparsity(sparsity, self.gguf, self.config, self.tokenizer.encode, target,
                                             self.n_threads, progress)
            if self.sparsity is not None and self.sparsity.mode == "input":  # an input plan's file
                check_input_sparsity_here(device, ram_budget)
        # self.expert_cuts: a Mixture of Experts given a target: CATS inside its experts in decode
        if self.config.is_moe and sparsity == "auto" and target:
            from .sparsity.expert_cuts import resolve_expert_cuts

            if str(device) != "cpu":
                raise UnsupportedModelError("cuts inside the experts (--target with a Mixture of Experts) run on "
                                            "the CPU only; an expert placement runs its experts whole")
            self.expert_cuts = resolve_expert_cuts(self.gguf, self.config, self.tokenizer.encode, target,
                                                   self.n_threads, progress)
        elif self.config.is_moe and self.config.activation == Activation.RELU and str(device) == "cpu":
            # ReGLU experts (SmallThinker): the exact cut at 0, always (a kernel's choice: it changes no number)
            from .sparsity.expert_cuts import exact_relu_cuts

            self.expert_cuts = exact_relu_cuts(self.gguf, self.config)
        if mem_limit is not None and ram_budget is None and self.sparsity is not None and \
                self.sparsity.mode != "input" and not any(selective_layers(self.sparsity)):
            # Gate and up run dense in a plan without predictors: a streamed layer reads its whole cold tail every
            # token, never fewer bytes than the mapped model, which the kernel's page cache serves from the rest.
            if progress:
                print("pyinfer: this sparsity plan has no predictors (gate and up run dense), so streaming its FFN "
                      "would read every cold neuron each token; under the memory limit the weights stay mapped and "
                      "decode runs dense (a predictor plan from `pyinfer train-predictors` streams only what fires)",
                      file=sys.stderr)
            self.sparsity = None
        self.memory = self._plan_memory(mem_limit, ram_budget, kv_rows, max_batch, device, mmap, progress)
        self.max_batch = self.memory.max_batch if self.memory else max_batch
        self.auto_choice = None  # sparsity="auto" or "input": decode timed with and without its plan here
        if sparsity == "input" and self.sparsity is not None:  # kept only where it decodes faster than dense
            from .sparsity.auto_choice import keep_if_faster
            from .sparsity.input_choice import input_plan_path

            self.sparsity, self.auto_choice = keep_if_faster(
                self, self.sparsity, input_plan_path(self.gguf.fingerprint(), o.sparsity_quality), progress)
        if sparsity == "auto" and target is None and self.sparsity is not None and self.sparsity.info.get("auto") \
                and ram_budget is None and self.memory is None and str(device) == "cpu":
            # (an explicit target, a plan file, offload and a device keep the plan: sparse saves reads there)
            from .sparsity.auto_choice import input_candidate, keep_if_faster
            from .sparsity.resolve import AUTO_TARGET, auto_plan_path

            self.sparsity, self.auto_choice = keep_if_faster(
                self, self.sparsity, auto_plan_path(self.gguf.fingerprint(), AUTO_TARGET), progress,
                input_plan=input_candidate(self, o.sparsity_quality, progress), quality=o.sparsity_quality)
        if self.memory is not None and self.memory.offload and ram_budget is None and not self.config.is_moe:
            ram_budget = max(self.memory.weights, 1)
        expert_budget = None  # a Mixture of Experts streams whole experts (offload/experts.py), not FFN neurons
        if self.config.is_moe and ram_budget is not None:
            if neuron_cache is not None or neuron_window is not None:
                raise PyinferError("neuron cache and read-ahead window shares split a neuron offload; a "
                                   "Mixture-of-Experts model's expert cache takes what its RAM budget leaves")
            expert_budget, ram_budget = ram_budget, None
        # self.offload: FFN neurons streamed under a RAM budget (offload/, entered only when one is asked for)
        if ram_budget is not None or neuron_cache is not None or neuron_window is not None:
            from .offload.setup import make_offload

            self.offload = make_offload(self.gguf, self.config, self.sparsity, neuron_down, ram_budget, neuron_cache,
                                        neuron_window, progress, self.memory)
        # self.experts: a Mixture of Experts whose experts do not fit the limit or budget: they stream
        if self.config.is_moe and (self.memory is not None or expert_budget is not None):
            from .offload.experts import make_expert_offload

            self.experts = make_expert_offload(self, expert_budget, progress)
        self.kind, self.index = parse_device(device)
        if self.kind == "cpu" and vram_budget is not None:
            raise PyinferError("a VRAM budget (--vram-budget) needs a device: cuda or standin (--device)")
        if self.kind != "cpu":
            if self.kind == "cuda":
                check_cuda(self.index)
            if self.offload is not None or self.experts is not None:
                raise PyinferError("a device and a RAM budget together are not supported yet (the GPU split "
                                   "keeps the CPU's neurons in RAM)")
            if self.config.is_moe:  # whole experts on each side (place/expert_placement.py)
                self.placement = resolve_expert_placement(self, vram_budget, kv_rows, cache_type, progress)
            else:
                self.placement = resolve_placement(self.kind, self.index, vram_budget, self.gguf, self.config,
                                                   self.sparsity, kv_rows, cache_type)

    def _plan_memory(self, mem_limit, ram_budget, kv_rows: int, max_batch: int, device: str, mmap: bool,
                     progress: bool):
        """The split of a total memory limit (offload/memory.py), measured now that metadata, tokenizer and
        sparsity plan are loaded; None without a limit."""
        if mem_limit is None:
            return None
        from .offload.memory import mapped_note, plan_memory
        from .tools.sizes import parse_size

        limit = parse_size(mem_limit)
        if ram_budget is not None and not str(ram_budget).endswith(".json"):
            raise PyinferError("give a memory limit (--mem-limit) or a weight budget (--ram-budget), not both; "
                               "a plan file from `pyinfer plan` may go with a limit")
        if str(device) != "cpu":
            raise PyinferError("a memory limit (--mem-limit) runs on the CPU; a device keeps its own budget "
                               "(--vram-budget)")
        weights = self.gguf.weight_bytes

        def engine_bytes(batch: int) -> tuple[int, int]:  # a probe engine over the mapped weights, never run
            r = build_running(ModelParts(self.gguf, self.config, 1, cache_type=self.cache_type), kv_rows,
                              min(batch, kv_rows), SparseRuns.never())
            return r.engine.state_bytes, r.engine.scratch_bytes

        self.gguf.advise_random(True)  # the probe's small reads (norms) fault in their own pages only
        # A Mixture of Experts streams its experts (offload/experts.py), as a sparsity plan streams neurons.
        # An input-sparse plan streams nothing of its own: the model and its copies stay mapped (input_copies).
        streams = (self.sparsity is not None and self.sparsity.mode != "input") or self.config.is_moe
        plan = plan_memory(limit, self.path, weights, streams, engine_bytes, max_batch)
        if self.config.is_moe and self.sparsity is None and plan.weights >= plan.model_weights:
            # The whole MoE fits: nothing streams, and its mapping must not stay advised random (a 10.7 GiB MoE
            # under a 20 GiB limit read its experts 4 KiB a fault, 0.86 tok/s where it ran 9 unlimited).
            plan = dataclasses.replace(plan, offload=False)
        if not plan.offload:
            self.gguf.advise_random(False)  # mapped weights: the first pass over them reads ahead again
        note = mapped_note(plan)
        if note and progress:
            print(note, file=sys.stderr)
        if plan.offload and not mmap:
            raise PyinferError("--no-mmap reads the whole model into memory; under a memory limit that streams "
                               "weights, leave the model mapped")
        return plan

    # ---- engines ----------------------------------------------------------------------------------------
    def parts(self, **changes) -> ModelParts:
        """What this session's graphs are built from (runtime/running.py), with `changes` (the auto choice's other
        plans)."""
        return dataclasses.replace(ModelParts(self.gguf, self.config, self.n_threads, self.sparsity, self.neuron_down,
                                              self.cache_type, self.offload, self.device, self.placement, self.isa,
                                              self.experts, self.expert_cuts, self.input_copies), **changes)

    def build(self, n_ctx: int, max_tokens: int, runs: SparseRuns,
              paged: tuple[int, int] | None = None) -> RunningModel:
        """The model's graph over a KV cache of n_ctx rows (paged: (block size, max blocks per sequence)) and
        an engine running up to max_tokens tokens per run."""
        return build_running(self.parts(), n_ctx, max_tokens, runs, paged)

    # ---- text -------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def _bos_eos_text(self) -> tuple[str, str]:
        tk = self.tokenizer
        return (tk.token_text(tk.bos_id) if tk.bos_id is not None else "",
                tk.token_text(tk.eos_id) if tk.eos_id is not None else "")

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        bos, eos = self._bos_eos_text()
        return render_chat(self.chat_template, messages, bos, eos, add_generation_prompt)

    def chat_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                 tools: list[dict] | None = None) -> list[int]:
        """The prompt ids of a chat: the model's template rendered, its own text tokenized with control tokens and
        the messages' content as plain text (see Tokenizer.encode_chat), BOS first where the model wants one.
        Roles must be ones the template knows (chat_template.template_roles). `tools`: OpenAI's tool list, for a
        template that renders it."""
        bos, eos = self._bos_eos_text()
        text, spans = chat_spans(self.chat_template, messages, bos, eos, add_generation_prompt, tools)
        ids = self.tokenizer.encode_chat(text, spans, [m["content"] for m in messages])
        tk = self.tokenizer
        return [tk.bos_id] + ids if tk.add_bos and tk.bos_id is not None and ids[:1] != [tk.bos_id] else ids
