"""Which FFN neurons the GPU computes under a VRAM budget (PowerInfer's placement, with its paper's
communication constraint that the released solver drops).

What must be on the GPU comes first: every non-FFN weight of the blocks (attention and norms), the fp16 KV
cache for the context, the predictors and a scratch reserve. What is left holds neuron groups (a prefix of
each layer's hot-first order) and, as one more item, the output head. The program (place/knapsack.py)
maximizes the CPU time per token the GPU takes over: a neuron's gate and up rows are computed every token
when its layer has no predictor and only when it fires when it has one, its down column only when it fires,
each at the CPU's measured seconds per weight byte. So the objective is the profile's activation mass weighted
by what computing each neuron costs. A layer split between the two sides must save more than one
synchronization and transfer of the hidden vector (measured on the GPU); otherwise it goes wholly to one side.

Groups are whole quantization blocks of the original down matrix (32 neurons for Q4_0/Q4_1/Q8_0, 256 for
K-quants), taken in each layer's order of value: the GPU's down is then those blocks of every row, byte for
byte, and its gate and up the matching rows, so neither side re-quantizes anything.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import PyinferError
from ..model.config import LlamaConfig
from ..model.gguf_file import GGUFModelFile
from ..runtime.hybrid_ffn import device_down
from ..sparsity.plan import SparsityPlan
from .knapsack import PrefixKnapsack, group_sizes, group_sums, solve_greedy, solve_highs

_FFN = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)(_t)?\.weight$")
_BLOCK = re.compile(r"^blk\.\d+\.")
FORMAT = "pyinfer-gpu-placement"
SCRATCH_BYTES = 64 << 20   # activations, logits of one batch and the CUDA context's own allocations
DEFAULT_SYNC_SECONDS = 30e-6  # without a GPU to measure: one event wait and two small copies over PCIe


@dataclass
class GpuCosts:
    """What the program weighs, in seconds per token."""
    cpu_seconds_per_byte: float   # decode matrix-vector time per weight byte on this CPU
    sync_seconds: float           # one split layer's synchronization and transfer of the hidden vector
    source: dict = field(default_factory=dict)  # how each was obtained


@dataclass
class Placement:
    fingerprint: str
    vram_budget: int
    fixed: dict                    # bytes that must be on the GPU: attention, kv_cache, predictors, scratch
    minimum: int                   # sum of fixed
    group: int
    gpu_neurons: list[int]         # per layer: how many neurons the GPU computes
    gpu_blocks: list[list[int]]    # per layer: which down blocks (original neuron order, `block` neurons each)
    block: int
    n_ff: list[int]
    head_on_gpu: bool
    ffn_bytes_on_gpu: int
    ffn_bytes: int
    head_bytes: int
    mass_on_gpu: float             # share of the profile's expected activation mass computed on the GPU
    cpu_seconds_moved: float       # expected CPU time per token the GPU takes over
    cpu_seconds_total: float       # the FFN and head's CPU time per token without a GPU
    solver: str
    solve_seconds: float
    costs: dict
    greedy: dict                   # PowerInfer's simplification: greedy fill, no communication constraint
    info: dict = field(default_factory=dict)

    @property
    def split_layers(self) -> list[int]:
        return [il for il, (k, n) in enumerate(zip(self.gpu_neurons, self.n_ff)) if 0 < k < n]

    def summary(self) -> dict:
        return {"format": FORMAT, "version": 1, **asdict(self), "split_layers": self.split_layers}


def ffn_tensors(gguf: GGUFModelFile, cfg: LlamaConfig) -> list[int]:
    """Per layer: bytes of its gate, up and down weights."""
    out = [0] * cfg.n_layers
    for name, t in gguf.tensors.items():
        m = _FFN.match(name)
        if m and not name.endswith("_t.weight"):
            out[int(m.group(1))] += int(t.data.nbytes)
    return out


def fixed_bytes(gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan | None, n_ctx: int,
                cache_type: str = "f16") -> dict:
    """What must be on the GPU before any neuron: attention and norms of every block, the KV cache of n_ctx
    positions (f16, or q8_0: 34 bytes per 32 elements), the predictors, a scratch reserve."""
    attention = sum(int(t.data.nbytes) for n, t in gguf.tensors.items() if _BLOCK.match(n) and not _FFN.match(n))
    return {"attention": attention, "kv_cache": kv_cache_bytes(cfg, n_ctx, cache_type), "predictors": plan.predictor_bytes() if plan else 0,
            "scratch": SCRATCH_BYTES}


def kv_cache_bytes(cfg: LlamaConfig, n_ctx: int, cache_type: str = "f16") -> int:
    """The KV cache of n_ctx positions: f16, q8_0 (34 bytes per 32 elements) or f32."""
    per_elem = {"q8_0": 34 / 32, "f32": 4}.get(cache_type, 2)
    return int(n_ctx * cfg.cached_values_per_token * per_elem)


def head_bytes(gguf: GGUFModelFile) -> int:
    """The output head (a GPU copy of token_embd when the model ties them)."""
    t = gguf.tensors.get("output.weight") or gguf.tensors["token_embd.weight"]
    return int(t.data.nbytes)


def down_block(gguf: GGUFModelFile) -> int:
    """Neurons per quantization block along the down matrix's rows (its columns are the neurons)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    t = gguf.tensors["blk.0.ffn_down.weight"]
    return int(GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]][0])


def neuron_seconds(gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan | None, costs: GpuCosts,
                   freq: list[np.ndarray] | None) -> list[np.ndarray]:
    """Per layer, per neuron in the model's own order: expected CPU seconds per token of computing it
    (F64 [n_ff]). freq is per hot-first neuron (the plan's order)."""
    per_layer = ffn_tensors(gguf, cfg)
    out = []
    for il, total in enumerate(per_layer):
        n_ff = cfg.layer_ffn_width(il)
        row = total / 3 / n_ff * costs.cpu_seconds_per_byte       # one gate row, up row or down column
        f = np.clip(model_order(cfg, plan, freq, il), 0, 1)
        lp = plan.layers[il] if plan is not None else None
        gate_up = np.full(n_ff, 2.0)                              # computed every token...
        if lp is not None and lp.predictor is not None:          # ...but for a predictor's cold neurons
            gate_up = 2 * f
            gate_up[lp.perm[:lp.hot]] = 2.0                      # (its hot prefix always runs)
        out.append(row * gate_up + row * f)
    return out


def neuron_bytes(gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan | None, block: int) -> list[float]:
    """Per layer: GPU bytes of one down block's neurons: their gate and up rows and down block, plus, in a
    predictor layer, their down rows neuron-major (device_down) for the sparse decode."""
    out = []
    nm_row = {"f32": 4 * cfg.d_model, "q8_0": 34 * cfg.d_model // 32, "q4t": cfg.d_model // 2 + cfg.d_model // 8}
    for il, total in enumerate(ffn_tensors(gguf, cfg)):
        b = total / cfg.layer_ffn_width(il) * block
        if plan is not None and plan.layers[il].predictor is not None:
            b += nm_row[device_down(gguf, cfg, il)] * block
        out.append(b)
    return out


def place(gguf: GGUFModelFile, cfg: LlamaConfig, plan: SparsityPlan | None, vram_budget: int, n_ctx: int,
          costs: GpuCosts, freq: list[np.ndarray] | None = None, group: int = 32,
          time_limit: float = 10.0, cache_type: str = "f16") -> Placement:
    """The placement under `vram_budget` bytes; refused (PyinferError, naming the minimum) below the minimum.
    freq: per layer the firing frequency of each hot-first neuron (None: the plan's, or every neuron fires).
    group: neurons per placement group, rounded up to whole down blocks."""
    if group < 1:
        raise PyinferError(f"the neuron group size must be at least 1, got {group}")
    fixed = fixed_bytes(gguf, cfg, plan, n_ctx, cache_type)
    minimum = sum(fixed.values())
    if vram_budget < minimum:
        raise PyinferError(f"a VRAM budget of {vram_budget / 2**20:.1f} MiB is below the minimum of "
                           f"{minimum / 2**20:.1f} MiB (attention {fixed['attention'] / 2**20:.1f}, KV cache "
                           f"{fixed['kv_cache'] / 2**20:.1f} for {n_ctx} positions, predictors "
                           f"{fixed['predictors'] / 2**20:.1f}, scratch {fixed['scratch'] / 2**20:.1f})")
    if freq is None and plan is not None and all(lp.freq is not None for lp in plan.layers):
        freq = [lp.freq for lp in plan.layers]
    block = down_block(gguf)
    widths = [cfg.layer_ffn_width(il) for il in range(cfg.n_layers)]
    if any(w % block for w in widths):
        raise PyinferError(f"FFN widths {sorted(set(widths))} are not whole numbers of down blocks of {block}")
    per_group = max(1, -(-group // block))                     # blocks per group
    seconds = neuron_seconds(gguf, cfg, plan, costs, freq)
    block_s = [v.reshape(-1, block).sum(1) for v in seconds]   # per layer, per down block
    order = [np.argsort(-v, kind="stable") for v in block_s]   # each layer's blocks, most valuable first
    sizes = [group_sizes(w // block, per_group) for w in widths]
    group_s = [group_sums(v[o], ss) for v, o, ss in zip(block_s, order, sizes)]
    per_block = neuron_bytes(gguf, cfg, plan, block)
    head = head_bytes(gguf)
    head_s = head * costs.cpu_seconds_per_byte
    # The head is one more "layer" of one group, never split.
    program = PrefixKnapsack(
        group_bytes=[[s * b for s in ss] for ss, b in zip(sizes, per_block)] + [[float(head)]],
        group_value=group_s + [[head_s]], capacity=float(vram_budget - minimum),
        split_saving=group_s + [[head_s]], split_cost=[costs.sync_seconds] * cfg.n_layers + [0.0])
    answer = solve_highs(program, time_limit)
    greedy = solve_greedy(PrefixKnapsack(program.group_bytes, program.group_value, program.capacity))
    blocks = [sorted(int(b) for b in o[:sum(ss[:k])]) for o, ss, k in zip(order, sizes, answer.kept)]
    greedy_blocks = [int(sum(ss[:k])) for ss, k in zip(sizes, greedy.kept)]
    mass = [model_order(cfg, plan, freq, il) for il in range(cfg.n_layers)]
    total_mass = float(sum(m.sum() for m in mass)) or 1.0
    # What the greedy answer leaves split without saving its synchronization: PowerInfer's issue #253.
    losing = [il for il, (k, ss) in enumerate(zip(greedy.kept, sizes)) if 0 < k < len(ss)
              and sum(program.split_saving[il][:k]) < costs.sync_seconds]
    return Placement(
        fingerprint=gguf.fingerprint(), vram_budget=int(vram_budget), fixed=fixed, minimum=int(minimum),
        group=per_group * block, gpu_neurons=[len(b) * block for b in blocks], gpu_blocks=blocks, block=block,
        n_ff=widths, head_on_gpu=bool(answer.kept[-1]),
        ffn_bytes_on_gpu=int(sum(len(b) * pb for b, pb in zip(blocks, per_block))),
        ffn_bytes=int(sum(ffn_tensors(gguf, cfg))), head_bytes=head,
        mass_on_gpu=float(sum(m.reshape(-1, block)[b].sum() for m, b in zip(mass, blocks))) / total_mass,
        cpu_seconds_moved=answer.value,
        cpu_seconds_total=float(sum(s.sum() for s in seconds)) + head_s,
        solver=answer.solver, solve_seconds=answer.seconds, costs=asdict(costs),
        greedy={"gpu_neurons": [n * block for n in greedy_blocks], "head_on_gpu": bool(greedy.kept[-1]),
                "value": greedy.value, "split_layers_losing_time": losing, "differs": greedy.kept != answer.kept},
        info=dict(answer.info, n_ctx=n_ctx, cache_type=cache_type, plan=plan_key(plan)))


def model_order(cfg: LlamaConfig, plan: SparsityPlan | None, freq, il: int) -> np.ndarray:
    """F64 [n_ff]: layer il's firing frequencies (given per hot-first neuron) in the model's neuron order;
    1 where unknown."""
    m = np.ones(cfg.layer_ffn_width(il))
    if freq is not None and freq[il] is not None:
        m[plan.layers[il].perm if plan is not None else np.arange(len(m))] = np.asarray(freq[il], np.float64)
    return m


def plan_key(plan: SparsityPlan | None) -> str | None:
    """What a placement depends on in the sparsity plan (its neuron orders and predictors), as a short hash."""
    if plan is None:
        return None
    import hashlib

    h = hashlib.sha256(plan.mode.encode())
    for lp in plan.layers:
        h.update(np.ascontiguousarray(lp.perm, dtype=np.int32).tobytes())
        h.update(b"p" if lp.predictor is not None else b"-")
    return h.hexdigest()[:16]


def check_placement(d: dict, cfg: LlamaConfig, plan: SparsityPlan | None, n_ctx: int, cache_type: str,
                    path: str) -> dict:
    """A placement file fits this load: same context, KV cache type and plan, block lists in range."""
    info = d.get("info", {})
    try:
        want = {"n_ctx": n_ctx, "cache_type": cache_type, "plan": plan_key(plan)}
        for k, v in want.items():
            if info.get(k) != v:
                raise PyinferError(f"{path} was placed for {k} {info.get(k)!r}, this load has {v!r}; run "
                                   f"`pyinfer place` again")
        block, blocks = int(d["block"]), d["gpu_blocks"]
        widths = [cfg.layer_ffn_width(il) for il in range(cfg.n_layers)]
        if len(blocks) != cfg.n_layers or block <= 0 or any(w % block for w in widths) or any(
                not 0 <= int(k) < w // block for bl, w in zip(blocks, widths) for k in bl):
            raise PyinferError(f"{path}: its block lists do not fit this model")
    except (KeyError, TypeError, ValueError) as e:
        raise PyinferError(f"{path} is not a valid placement ({e})") from None
    return d


def save_placement(p: Placement, path: str) -> None:
    from ..tools.json_file import write_json

    write_json(path, p.summary())


def read_placement(path: str, fingerprint: str) -> dict:
    from ..tools.json_file import read_bound_json

    return read_bound_json(path, FORMAT, fingerprint, "GPU placement", "pyinfer place")
