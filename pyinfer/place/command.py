"""`pyinfer place`: measure what the placement weighs on this machine, solve it under a VRAM budget, write the
placement file and print where each layer's neurons go."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import PyinferError

EPILOG = """examples:
  pyinfer place --vram-budget 2G -o smollm2.placement.json
  pyinfer place --vram-budget 150M --sparsity smollm2.sparse.npz --group 64 -o p.json --json

What must be on the GPU comes first (attention and norms of every block, the fp16 KV cache for --ctx
positions, the predictors, a 64 MiB scratch reserve); below that the budget is refused with the minimum.
The rest holds each layer's hottest FFN neurons in groups of --group and, if it pays, the output head,
chosen by a mixed-integer program (HiGHS) that maximizes the CPU time per token the GPU takes over: the
profile's firing frequencies weighted by the CPU's measured seconds per weight byte. A layer split between
GPU and CPU must save more than one synchronization (--sync-us; measured when a GPU is present), else it goes
wholly to one side: the communication constraint PowerInfer's released solver drops. The greedy fill it is
compared with is printed beside it.

A Mixture-of-Experts model is placed by whole experts: what every token reads (attention, routers, shared
experts) comes first, then each layer's most-chosen experts from its routing profile (measured once and
cached, or `pyinfer profile`), the program maximizing the CPU time moved net of a synchronization for every
layer not placed whole. Such a placement runs with --device cuda (kernels/moe.cu) or --device standin."""


def add_parser(sub, model_args, sparsity_args) -> None:
    p = sub.add_parser("place", help="place hot FFN neurons on the GPU under a VRAM budget (HiGHS)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    model_args(p)
    sparsity_args(p)
    p.set_defaults(sparsity="auto")
    p.add_argument("--vram-budget", required=True, metavar="SIZE",
                   help="bytes of GPU memory pyinfer may use, e.g. 2G or 150M")
    p.add_argument("--group", type=int, default=32, help="neurons per placement group (default 32; PowerInfer: 256)")
    p.add_argument("--sync-us", type=float, default=None,
                   help="one split layer's synchronization and transfer, microseconds (default: measured on the "
                        "GPU, or 30 without one)")
    p.add_argument("--tokens", type=int, default=16, help="decode tokens of the CPU cost measurement (default 16)")
    p.add_argument("-o", "--output", required=True, help="placement file to write (JSON)")
    p.add_argument("--json", action="store_true", help="print the placement as one JSON object")


def cmd_place(args, load) -> int:
    from ..tools.sizes import parse_size
    from ..sparsity.calibrate import bundled_calibration_text
    from .gpu_placement import GpuCosts, fixed_bytes, place, save_placement
    from .measure import firing_frequencies, measure_costs

    if args.ram_budget is not None:
        raise PyinferError("pyinfer place plans the GPU; --ram-budget is for `pyinfer plan`")
    if args.tokens < 1:
        raise PyinferError("--tokens must be at least 1")
    if args.sync_us is not None and args.sync_us < 0:
        raise PyinferError("--sync-us must not be negative")
    if args.group < 1:
        raise PyinferError(f"--group must be at least 1, got {args.group}")
    budget = parse_size(args.vram_budget)
    if args.sparsity == "auto" and args.target is None:  # the plan a device load of `auto` keeps (untimed there)
        from ..sparsity.resolve import AUTO_TARGET

        args.target = AUTO_TARGET
    model = load(args, device="cpu", vram_budget=None)  # --vram-budget is the placement's, not this load's
    if model.config.is_moe:
        return _place_experts(args, model, budget)
    plan = model.sparsity
    minimum = sum(fixed_bytes(model.gguf, model.config, plan, args.ctx, args.cache_type).values())
    if budget < minimum:  # before the measurements, which take a while
        place(model.gguf, model.config, plan, budget, args.ctx, GpuCosts(1.0, 0.0), cache_type=args.cache_type)
    dense = load(args, sparsity="off", device="cpu", vram_budget=None)
    costs = measure_costs(dense, args.tokens, None if args.sync_us is None else args.sync_us * 1e-6)
    del dense
    freq = None
    if plan is not None and not all(lp.freq is not None for lp in plan.layers):
        freq = firing_frequencies(model, bundled_calibration_text())  # the plan predates recorded frequencies
    placement = place(model.gguf, model.config, plan, budget, args.ctx, costs, freq, args.group,
                      cache_type=args.cache_type)
    save_placement(placement, args.output)
    if args.json:
        print(json.dumps(placement.summary()))
        return 0
    _print(placement, args.output)
    return 0


def _print_layers(p, what: str, per_layer) -> None:
    """Budget, costs, each layer's (placed, of, greedy's) `what` on the GPU and the head: both placements'."""
    mb, out = 2 ** 20, sys.stdout
    fixed = ", ".join(f"{k} {v / mb:.1f}" for k, v in p.fixed.items())
    print(f"budget     {p.vram_budget / mb:.1f} MiB; fixed {p.minimum / mb:.1f} MiB ({fixed})", file=out)
    print(f"costs      CPU {p.costs['cpu_seconds_per_byte'] * 1e12:.1f} ps per weight byte; split sync "
          f"{p.costs['sync_seconds'] * 1e6:.1f} us ({p.costs['source'].get('sync_seconds', '')})", file=out)
    print(f"{'layer':>5} {'GPU ' + what:>12} {'greedy':>8}", file=out)
    for il, (k, n, g) in enumerate(per_layer):
        mark = " split" if 0 < k < n else ""
        lose = " (greedy split loses time)" if il in p.greedy["split_layers_losing_time"] else ""
        print(f"{il:5d} {k:7d}/{n:<4d} {g:8d}{mark}{lose}", file=out)
    print(f"head       {'GPU' if p.head_on_gpu else 'CPU'} ({p.head_bytes / mb:.1f} MiB)", file=out)


def _print(p, output: str) -> None:
    mb, out = 2 ** 20, sys.stdout
    _print_layers(p, "neurons", zip(p.gpu_neurons, p.n_ff, p.greedy["gpu_neurons"]))
    print(f"result     FFN on GPU {p.ffn_bytes_on_gpu / mb:.1f} of {p.ffn_bytes / mb:.1f} MiB, "
          f"{p.mass_on_gpu:.0%} of the activation mass; CPU time moved {p.cpu_seconds_moved * 1e3:.2f} of "
          f"{p.cpu_seconds_total * 1e3:.2f} ms per token; {p.solver} in {p.solve_seconds * 1e3:.0f} ms "
          f"({'differs from' if p.greedy['differs'] else 'same as'} greedy)", file=out)
    print(f"placement  {output}", file=out)


def _place_experts(args, model, budget: int) -> int:
    """A Mixture of Experts: whole experts by routing frequency (place/expert_placement.py)."""
    from ..sparsity.expert_profile import cached_profile
    from ..tools.json_file import write_json
    from .expert_placement import fixed_bytes, place_experts
    from .gpu_placement import GpuCosts
    from .measure import measure_costs

    if sum(fixed_bytes(model.gguf, model.config, args.ctx, args.cache_type).values()) > budget:
        place_experts(model.gguf, model.config, budget, args.ctx, GpuCosts(1.0, 0.0), cache_type=args.cache_type)
    costs = measure_costs(model, args.tokens, None if args.sync_us is None else args.sync_us * 1e-6)
    counts = cached_profile(model.session, progress=not args.json)["counts"]
    p = place_experts(model.gguf, model.config, budget, args.ctx, costs, counts, cache_type=args.cache_type)
    write_json(args.output, p.summary())
    if args.json:
        print(json.dumps(p.summary()))
        return 0
    mb, out = 2 ** 20, sys.stdout
    _print_layers(p, "experts", ((len(g), p.n_expert, k) for g, k in zip(p.gpu_experts, p.greedy["gpu_experts"])))
    print(f"result     experts on GPU {p.expert_bytes_on_gpu / mb:.1f} of {p.expert_bytes / mb:.1f} MiB, "
          f"{p.mass_on_gpu:.0%} of the routes; CPU time moved {p.cpu_seconds_moved * 1e3:.2f} of "
          f"{p.cpu_seconds_total * 1e3:.2f} ms per token, net of syncs {p.net_seconds * 1e3:.2f} (greedy "
          f"{p.greedy['net_seconds'] * 1e3:.2f}); {p.solver} in {p.solve_seconds * 1e3:.0f} ms", file=out)
    print(f"placement  {args.output}", file=out)
    return 0
