"""The Mixture-of-Experts FFN writer (llama.cpp's build_moe_ffn; runtime/sparse_ffn.py holds the dense and
neuron-aware ones): the router's logits, each token's top k experts and
their weights, the chosen experts' gate, up and down (only theirs: the merged *_exps tensors are read by
expert), and the weighted sum; plus Qwen2-MoE's shared expert, which every token runs.

Split by an expert placement (place/expert_placement.py), the layer's experts run on two backends at once:
each side computes the chosen experts it holds (the route cut to its share: others' slots weigh 0 and stay 0),
and the two weighted sums meet in one add on the device, where the residual stream lives."""
from __future__ import annotations

import numpy as np

from .._core import DType
from ..model.config import LlamaConfig
from .graph_builder import GraphBuilder, T
from .sparse_ffn import dense_ffn


def moe_ffn(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig, experts=None, record: bool = False,
            stream: T | None = None, cuts=None, route: T | None = None) -> T:
    """h: F32 [T, d_model], the FFN's input; returns F32 [T, d_model]. `experts`: an offload.ExpertOffload whose
    store holds the experts (fetched right after the router; with its `prefetch`, the next layer's are read
    ahead from `stream`, the residual stream h was normalized from); `record`: the route and the chosen
    experts' gate stay readable after a run (b.records[layer] = route id: the routing profile's view;
    b.expert_gates[layer] = gate id, before its activation: what sparsity/expert_cuts.py calibrates on).
    `cuts`: a sparsity.expert_cuts.ExpertCuts: decode reads up only for the neurons whose gate passes their
    expert's cut (CATS inside the experts). `route`: the layer's choice made before the FFN (early_route), else
    h is routed here."""
    p, n, k = f"blk.{il}.", cfg.n_expert, cfg.n_expert_used
    early = route is not None
    route = route if early else _route(b, w, h, il, cfg)                  # F32 [T, 2k]
    if record:
        b.graph.pin(route.id)
        b.records.append(route.id)
    if experts is not None:
        b.expert_fetch(route, experts.store_layer(il))
        # Read-ahead: the next layer's experts as its router guesses them from this stream, unless each layer's
        # route comes before its attention (its reads then start there, on the exact choice).
        if experts.prefetch and il + 1 < cfg.n_layers and not cfg.router_before_attention:
            predict_next(b, w, h if stream is None else stream, il + 1, cfg, stream is not None, experts)
        weight = lambda part: experts.weight(b, il, part)  # noqa: E731
    else:
        weight = lambda part: w(p + f"ffn_{part}_exps.weight")  # noqa: E731
    cut = None
    if cuts is not None:
        cut = b.weight(p + "ffn_exps.gate_cut", int(DType.F32), 3, n, cuts.bounds(il))   # F32 [n_expert, 3]
    fused = w(p + "ffn_gate_up_exps.weight") if cfg.fused_gate_up and experts is None and cut is None else None
    return _experts(b, w, h, il, cfg, route, weight, n, "", cut=cut, cut_fn=cuts.gate_fn if cuts else 0,
                    record=record, fused=fused)


def early_route(b: GraphBuilder, w, x: T, il: int, cfg: LlamaConfig, experts=None) -> T:
    """Layer il's route from x, made before its FFN (SmallThinker's router reads the layer's input ahead of
    attention). With streamed experts and read-ahead on, their reads start now (a prefetch of the exact choice) and
    run while attention computes; the FFN's fetch then waits only for what is still in flight."""
    route = _route(b, w, x, il, cfg)
    if experts is not None and experts.prefetch:
        b.expert_fetch(route, experts.store_layer(il), prefetch=True)
    return route


def _route(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig, name: str = "route") -> T:
    """Each token's top k experts and their weights, F32 [T, 2k]."""
    logits = b.matmul(w(f"blk.{il}.ffn_gate_inp.weight"), h, "router" if name == "route" else name + ".router")
    if cfg.expert_biases:  # gpt-oss: the router's bias
        b.add(logits, w(f"blk.{il}.ffn_gate_inp.bias"), out=logits)
    bias = w(f"blk.{il}.exp_probs_b.bias") if cfg.expert_bias else None    # F32 [1, n_expert]: for choosing only
    out_scale = w(f"blk.{il}.ffn_down_exps.scale") if cfg.expert_output_scale else None  # F32 [1, n_expert]
    return b.moe_route(logits, cfg.n_expert_used, name, norm=cfg.expert_norm, gating=cfg.expert_gating,
                       scale=cfg.expert_scale, bias=bias, groups=cfg.expert_groups, expert_scale=out_scale)


def _experts(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig, route: T, weight, n: int, tag: str,
             shared: bool = True, cut: T | None = None, cut_fn: int = 0, record: bool = False, bias=None,
             fused: T | None = None) -> T:
    """The one expert writer: the route's experts among the `n` that weight(part) holds (the side: the model's
    merged tensors, an expert store, a device's share), weighted and summed (with the shared expert when the model
    has one and `shared`): F32 [T, d_model]. `cut` (F32 [n, 3]): up only where the gate passes. `bias(part)`: the
    side's expert biases (gpt-oss; default: the model's, by global expert id). `fused`: gate and up in one tensor
    (Gemma 4's ffn_gate_up_exps), read as 2n experts: the gate of expert e is expert 2e, its up 2e + 1, chosen by
    the route with its ids mapped (MoeRouteSplit keeps the weights)."""
    p, k = f"blk.{il}.", cfg.n_expert_used
    if bias is None:
        bias = (lambda part: w(p + f"ffn_{part}_exps.bias")) if cfg.expert_biases else (lambda part: None)
    if fused is not None:
        ids = np.arange(n, dtype=np.int32)[None, :]
        routes = [b.moe_route_split(route, b.weight(p + f"ffn_gate_up_exps.{part}_map", int(DType.I32), n, 1,
                                                    2 * ids + half), 2 * n, k, f"route.{part}" + tag)
                  for half, part in enumerate(("gate", "up"))]
        gate = b.moe_matmul(fused, h, routes[0], 2 * n, k, "gate_exps" + tag)  # F32 [T, k * d_ff_e]
        up = b.moe_matmul(fused, h, routes[1], 2 * n, k, "up_exps" + tag)
    else:
        gate = b.moe_matmul(weight("gate"), h, route, n, k, "gate_exps" + tag, bias=bias("gate"))  # [T, k * d_ff_e]
        up = b.moe_matmul(weight("up"), h, route, n, k, "up_exps" + tag, gate=gate if cut is not None else None,
                          cut=cut, gate_fn=cut_fn, bias=bias("up"))              # 0 where the gate's cut says so
    if record:
        b.graph.pin(gate.id)
        b.expert_gates.append(gate.id)
    act = b.gated_mul(gate, up, out=None if record else gate, act=cfg.activation)
    out = b.moe_matmul(weight("down"), act, route, n, k, "down_exps" + tag, bias=bias("down"))  # F32 [T, k * d]
    sh = shared_gate = None
    if cfg.d_ff_shared and shared:  # the shared expert: the dense writer on its tensors, F32 [T, d_model]
        sh = dense_ffn(b, w, h, il, cfg, tag=".shexp", parts=("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"))
        if not cfg.shared_expert_gated:  # Granite: the experts' sum plus the shared expert's output, as it is
            out = b.moe_combine(out, route, k, "moe_out" + tag)
            return b.add(out, sh, out=out)
        shared_gate = b.matmul(w(p + "ffn_gate_inp_shexp.weight"), h, "shexp_gate_logit")  # F32 [T, 1]
    return b.moe_combine(out, route, k, "moe_out" + tag, shared=sh, shared_gate=shared_gate)


def split_moe_ffn(b: GraphBuilder, w, gguf, h: T, il: int, cfg: LlamaConfig, gpu_experts: list[int],
                  device: int, route: T | None = None) -> T:
    """The layer's experts split by a placement: `gpu_experts` on backend `device` (their rows copied into
    merged tensors of their own), the rest on the CPU from the model's merged tensors; router and shared
    expert on the device. h: F32 [T, d_model] on the device; returns F32 [T, d_model] there."""
    from .placement import CPU

    p, n, k = f"blk.{il}.", cfg.n_expert, cfg.n_expert_used
    gpu = sorted(set(int(e) for e in gpu_experts))
    if len(gpu) == n:  # wholly on the device: the plain layer, its weights made under the device's scope
        return moe_ffn(b, w, h, il, cfg, route=route)
    route = route if route is not None else _route(b, w, h, il, cfg)
    on_gpu = np.full(n, -1, np.int32)
    on_gpu[gpu] = np.arange(len(gpu), dtype=np.int32)
    # The CPU's nodes first (as runtime/hybrid_ffn.py orders them): the copy of the input they read closes the
    # device's segment there, so the device's experts are a segment of their own that runs beside the CPU's.
    with b.weights_on(CPU):
        cpu_route = route
        if gpu:
            cpu_map = np.where(on_gpu < 0, np.arange(n, dtype=np.int32), -1).astype(np.int32)[None, :]
            cpu_route = b.moe_route_split(route, b.weight(p + "ffn_exps.cpu_map", int(DType.I32), n, 1, cpu_map),
                                          n, k, "route.cpu")
        # With none of its experts on the device, the layer runs whole on the CPU, a shared expert too.
        cpu_out = _experts(b, w, h, il, cfg, cpu_route, lambda part: w(p + f"ffn_{part}_exps.weight"), n, ".cpu",
                           shared=not gpu)
    if not gpu:
        return cpu_out
    with b.weights_on(device):
        dev_route = b.moe_route_split(route, b.weight(p + "ffn_exps.gpu_map", int(DType.I32), n, 1, on_gpu[None, :]),
                                      len(gpu), k, "route.gpu")
        dev_bias = (lambda part: _gpu_expert_bias(b, gguf, il, part, gpu, n)) if cfg.expert_biases else None
        dev_out = _experts(b, w, h, il, cfg, dev_route, lambda part: _gpu_experts(b, gguf, il, part, gpu, n),
                           len(gpu), ".gpu", bias=dev_bias)
    return b.add(dev_out, cpu_out, out=dev_out)  # the merge, on the device's sum: the CPU's comes up


def _gpu_expert_bias(b: GraphBuilder, gguf, il: int, part: str, experts: list[int], n: int) -> T:
    """The listed experts' biases of one part (gpt-oss), in their order: F32 [len(experts), rows]."""
    full = np.asarray(gguf.tensor(f"blk.{il}.ffn_{part}_exps.bias").data, np.float32).reshape(n, -1)
    return b.weight(f"blk.{il}.ffn_{part}_exps.bias.gpu", int(DType.F32), full.shape[1], len(experts),
                    np.ascontiguousarray(full[experts]))


def _gpu_experts(b: GraphBuilder, gguf, il: int, part: str, experts: list[int], n: int) -> T:
    """The listed experts of one part (of n), merged in their order into a weight of their own (the stored
    bytes, copied)."""
    t = gguf.tensor(f"blk.{il}.ffn_{part}_exps.weight")
    rows_e = t.rows // n
    data = np.ascontiguousarray(np.asarray(t.data).reshape(n, -1)[experts]).reshape(len(experts) * rows_e, -1)
    return b.weight(f"blk.{il}.ffn_{part}_exps.gpu", t.dtype_id, t.cols, len(experts) * rows_e, data)


def predict_next(b: GraphBuilder, w, x: T, nl: int, cfg: LlamaConfig, normalize: bool, experts) -> T:
    """Layer nl's router applied to this layer's hidden state (pre-gated MoE, ProMoE): the residual stream
    changes little from one layer to the next, so the experts it picks are mostly the ones nl will choose.
    Their reads start now and run while this layer's experts compute. x: F32 [T, d_model], the stream
    (normalized with nl's own FFN norm when `normalize`, else already normalized)."""
    p = f"blk.{nl}."
    if normalize:
        x = b.rms_norm(x, w(p + cfg.ffn_norm + ".weight"), cfg.norm_eps, "next_ffn_in")   # F32 [T, d_model]
    guess = _route(b, w, x, nl, cfg, "next_route")
    return b.expert_fetch(guess, experts.store_layer(nl), prefetch=True)
