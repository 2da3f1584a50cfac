"""`pyinfer plan`: measure this machine and plan decode under a RAM budget or memory limit."""
from __future__ import annotations

import argparse
import json

from ..errors import PyinferError
from .common import load_model, model_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    op = sub.add_parser("plan", help="measure this machine and plan decode under a RAM budget (offload)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="example: pyinfer plan --ram-budget 80M -o smollm2.offload.json\n"
                               "         pyinfer bench --ram-budget smollm2.offload.json   # predicted vs measured\n\n"
                               "Measures read bandwidth by chunk size and queue depth on the bundle file (O_DIRECT), "
                               "and the compute time of a\nshort decode; predicts tok/s at this budget and a sweep "
                               "of others, and picks the I/O threads. With a predictor plan it\nalso replays a short "
                               "decode's active unions through each neuron-cache and read-ahead-window split, decodes "
                               "with\nthe best three (--verify) and keeps the fastest measured.")
    model_args(op)
    sparsity_args(op)
    op.set_defaults(sparsity="auto")
    op.add_argument("-o", "--output", required=True, help="plan file to write (JSON); pass it as --ram-budget")
    op.add_argument("--tokens", type=int, default=16, help="decode tokens of the compute calibration (default 16)")
    op.add_argument("--verify", type=int, default=3, metavar="N",
                    help="decode with each of the N best predicted read splits (neuron cache, read-ahead window) "
                         "and keep the fastest measured one (default 3; 0: trust the prediction)")
    op.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    op.add_argument("--read-seconds", type=float, default=0.25, help=argparse.SUPPRESS)  # per measured cell

    return {"plan": cmd_plan}


def verify_read_split(args, plan: dict, model) -> None:
    """Decodes with the best predicted read splits and keeps the fastest measured one: the cost model does not
    know how window and on-demand reads slow each other down."""
    import os

    from ..offload.planner import READ_KEYS as keys
    from ..offload.planner import measure_decode

    rows = sorted(plan["read_sweep"], key=lambda r: -r["tok_s"])[:args.verify]
    candidate = args.output + ".verify.json"  # each candidate loads as a plan file would
    try:
        for row in rows:
            with open(candidate, "w") as f:
                json.dump({**plan, **{k: row[k] for k in keys}}, f)
            m = load_model(args, ram_budget=candidate, neuron_cache=row["cache_share"], neuron_window=row["window_share"])
            row["measured_tok_s"] = measure_decode(m, args.tokens)
            del m
    except OSError as e:
        raise PyinferError(f"cannot write {candidate}: {e.strerror}") from None
    finally:
        if os.path.exists(candidate):
            os.unlink(candidate)
    best = max(rows, key=lambda r: r["measured_tok_s"])
    plan.update({k: best[k] for k in keys}, predicted_tok_s=best["tok_s"], measured_tok_s=best["measured_tok_s"])


def cmd_plan(args) -> int:
    from ..offload.planner import calibrate_compute, make_plan, measure_reads
    from ..offload.trace_replay import decode_trace

    if args.ram_budget is None and args.mem_limit is None:
        raise PyinferError("pyinfer plan needs --mem-limit SIZE (the whole process) or --ram-budget SIZE (weights)")
    if args.tokens < 1:
        raise PyinferError("--tokens must be at least 1")
    model = load_model(args)
    off = model.offload
    if off is None:
        raise PyinferError("pyinfer plan plans streaming FFN neurons: under --mem-limit that takes a predictor plan "
                           "(`pyinfer train-predictors`; a plan without predictors stays mapped), with --ram-budget any "
                           "sparsity plan (--sparsity auto or a file)")
    reads = measure_reads(str(off.layout.path), seconds=args.read_seconds)
    compute = calibrate_compute(model, args.tokens)
    low, ffn = off.plan.fixed_bytes, off.plan.ffn_bytes
    selective = any(off.selective(il) for il in range(model.config.n_layers))
    trace = decode_trace(model, args.tokens) if selective else None  # for the neuron cache's share
    plan = make_plan(model, reads, compute, [int(low + share * ffn) for share in (0.0, 0.25, 0.5, 0.75, 1.0)], trace)
    if model.session.memory is not None:  # the limit it was planned under, and how it was split
        plan.update(mem_limit=model.session.memory.limit, memory=model.session.memory.summary())
    if args.verify > 0 and len(plan["read_sweep"]) > 1:
        verify_read_split(args, plan, model)
    from ..tools.json_file import write_json

    write_json(args.output, plan)
    if args.json:
        print(json.dumps(plan))
        return 0
    mb = 2 ** 20
    print(f"reads      {'O_DIRECT' if reads['direct'] else 'buffered'}; MB/s by chunk (rows) and queue depth:")
    for chunk, row in reads["table"].items():
        print(f"  {int(chunk) // 1024:>6} KiB  " + "  ".join(f"qd{d} {v:7.0f}" for d, v in row.items()))
    print(f"compute    {compute * 1e3:.2f} ms per token (a decode without its read waits)")
    print(f"choice     {plan['io_threads']} I/O threads, {plan['ring_slots']} read-ahead slots, "
          f"neuron cache {plan['cache_share']:.0%} of the budget above the minimum, "
          f"read-ahead window {plan['window_share']:.0%} of each predictor layer, "
          f"listed reads cut at {plan['max_range'] // 1024} KiB, merged across gaps under "
          f"{plan['merge_gap'] // 1024} KiB")
    for row in plan["read_sweep"]:
        measured = f", measured {row['measured_tok_s']:7.1f}" if "measured_tok_s" in row else ""
        print(f"  cache {row['cache_share']:4.0%} window {row['window_share']:4.0%} "
              f"cut {row['max_range'] // 1024:5d} KiB gap {row['merge_gap'] // 1024:3d} KiB: "
              f"{row['cold_reads_per_token']:7.1f} cold neurons read on demand per token (cache hits "
              f"{row['cache_hit_rate']:4.0%}, window {row['window_hit_rate']:4.0%}), predicted {row['tok_s']:7.1f} "
              f"tok/s{measured}")
    print(f"{'budget MiB':>12} {'tok/s':>8} {'compute ms':>11} {'stream ms':>10} {'demand ms':>10}")
    for row in plan["sweep"]:
        if "error" in row:
            print(f"{row['budget'] / mb:12.1f}   {row['error']}")
        else:
            print(f"{row['budget'] / mb:12.1f} {row['tok_s']:8.1f} {row['compute_s'] * 1e3:11.2f} "
                  f"{row['stream_s'] * 1e3:10.2f} {row['demand_s'] * 1e3:10.2f}")
    if "mem_limit" in plan:
        print(f"memory     limit {plan['mem_limit'] / mb:.1f} MiB: {model.session.memory.parts()}, weights "
              f"{plan['budget'] / mb:.1f} MiB")
    print(f"plan       {args.output}: budget {plan['budget'] / mb:.1f} MiB, "
          f"predicted {plan['predicted_tok_s']:.1f} tok/s")
    return 0
