"""The Mixture-of-Experts FFN (llama.cpp's build_moe_ffn): the router's logits, each token's top k experts and
their weights, the chosen experts' gate, up and down (only theirs: the merged *_exps tensors are read by
expert), and the weighted sum; plus Qwen2-MoE's shared expert, which every token runs."""
from __future__ import annotations

from ..model.config import LlamaConfig
from .graph_builder import GraphBuilder, T


def moe_ffn(b: GraphBuilder, w, h: T, il: int, cfg: LlamaConfig, experts=None, record: bool = False) -> T:
    """h: F32 [T, d_model], the FFN's input; returns F32 [T, d_model]. `experts`: an offload.ExpertOffload whose
    store holds the experts (fetched right after the router); `record`: the route stays readable after a run
    (b.records[layer] = route id: the routing profile's view)."""
    p, n, k = f"blk.{il}.", cfg.n_expert, cfg.n_expert_used
    logits = b.matmul(w(p + "ffn_gate_inp.weight"), h, "router")          # F32 [T, n_expert]
    route = b.moe_route(logits, k, norm=cfg.expert_norm, gating=cfg.expert_gating)  # F32 [T, 2k]
    if record:
        b.graph.pin(route.id)
        b.records.append(route.id)
    if experts is not None:
        b.expert_fetch(route, il)
        weight = lambda part: experts.weight(b, il, part)  # noqa: E731
    else:
        weight = lambda part: w(p + f"ffn_{part}_exps.weight")  # noqa: E731
    gate = b.moe_matmul(weight("gate"), h, route, n, k, "gate_exps")      # F32 [T, k * d_ff_expert]
    up = b.moe_matmul(weight("up"), h, route, n, k, "up_exps")
    act = b.gated_mul(gate, up, out=gate, act=cfg.activation)
    out = b.moe_matmul(weight("down"), act, route, n, k, "down_exps")     # F32 [T, k * d_model]
    shared = shared_gate = None
    if cfg.d_ff_shared:
        sg = b.matmul(w(p + "ffn_gate_shexp.weight"), h, "shexp_gate")    # F32 [T, d_ff_shared]
        su = b.matmul(w(p + "ffn_up_shexp.weight"), h, "shexp_up")
        sa = b.gated_mul(sg, su, out=sg, act=cfg.activation)
        shared = b.matmul(w(p + "ffn_down_shexp.weight"), sa, "shexp")     # F32 [T, d_model]
        shared_gate = b.matmul(w(p + "ffn_gate_inp_shexp.weight"), h, "shexp_gate_logit")  # F32 [T, 1]
    return b.moe_combine(out, route, k, shared=shared, shared_gate=shared_gate)
