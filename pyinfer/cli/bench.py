"""`pyinfer bench`: llama-bench's tests, and what a run put where (device, memory, offload, sparsity)."""
from __future__ import annotations

import json

from ..errors import PyinferError
from .common import describe_cuts, device_args, load_model, model_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    b = sub.add_parser("bench", help="prefill/decode tokens per second and peak RSS",
                       description="llama-bench's tests: pp (prefill --prompt-tokens pseudo-random tokens) and tg "
                                   "(--gen-tokens greedy decode steps). With --depth D both start with D tokens "
                                   "already in the KV cache (llama-bench -d): decode speed at long context.",
                       epilog="example: pyinfer bench -p 512 -g 64 --depth 4096 --cache-type q8_0 --json")
    model_args(b, ctx_default=0)
    b.add_argument("-p", "--prompt-tokens", type=int, default=256, help="prefill length (default 256)")
    b.add_argument("-g", "--gen-tokens", type=int, default=128, help="decode steps (default 128)")
    b.add_argument("-d", "--depth", type=int, default=0, help="tokens in the KV cache before each test (default 0)")
    b.add_argument("-r", "--repetitions", type=int, default=3, help="runs per test; median is reported")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    sparsity_args(b)
    device_args(b)

    return {"bench": cmd_bench}


def _device_summary(model) -> dict | None:
    """Where a hybrid run put things (None on the CPU alone)."""
    if model.placement is None:
        return None
    p = model.placement.report
    if "gpu_experts" in p:  # a Mixture of Experts, placed by whole experts
        n = sum(map(len, p["gpu_experts"]))
        return {"device": model.device, "vram_budget": p["vram_budget"], "gpu_experts": n,
                "expert_share_on_gpu": n / max(p["n_expert"] * len(p["gpu_experts"]), 1),
                "mass_on_gpu": p["mass_on_gpu"], "expert_bytes_on_gpu": p["expert_bytes_on_gpu"],
                "split_layers": len(p.get("split_layers", [])), "head_on_gpu": p["head_on_gpu"],
                "copies_per_run": model.n_copies}
    return {"device": model.device, "vram_budget": p["vram_budget"], "gpu_neurons": sum(p["gpu_neurons"]),
            # neurons, not bytes: a sparse layer's device side holds a Q8_0 copy of its down (more than the file's)
            "ffn_share_on_gpu": sum(p["gpu_neurons"]) / max(sum(p["n_ff"]), 1), "mass_on_gpu": p["mass_on_gpu"],
            "ffn_bytes_on_gpu": p["ffn_bytes_on_gpu"],
            "split_layers": len(p.get("split_layers", [])), "head_on_gpu": p["head_on_gpu"],
            "copies_per_run": model.n_copies}


def cmd_bench(args) -> int:
    from ..tools.bench import run_bench

    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.repetitions < 1:
        raise PyinferError("--prompt-tokens, --gen-tokens and --repetitions must be at least 1")
    if args.depth < 0:
        raise PyinferError("--depth must be >= 0")
    need = args.depth + max(args.prompt_tokens, args.gen_tokens + 32)  # tg at depth 0 starts after a short prompt
    if not args.ctx:
        args.ctx = need
    if need > args.ctx:
        raise PyinferError(f"--ctx {args.ctx} is too small: depth + test need {need} tokens (omit --ctx to size it)")
    model = load_model(args)
    r = run_bench(model, args.prompt_tokens, args.gen_tokens, args.repetitions, depth=args.depth)
    memory = model.memory()  # before the sparsity measurement below, which runs the model in RAM beside it
    # Under a memory limit that measurement would break the limit: it is left to a run without one.
    limited = model.session.memory is not None
    sparsity = _measure_sparsity(model) if model.sparsity is not None and not limited else None
    device = _device_summary(model)
    if args.json:  # one object, whatever the options
        cuts = model.session.expert_cuts
        print(json.dumps(dict(r.as_dict(), sparsity=sparsity, device=device, memory=memory,
                              auto_choice=model.session.auto_choice,
                              expert_cuts=cuts.summary() if cuts is not None else None)))
        return 0
    print(f"model    {model.path}")
    if device is not None:
        what = (f"{device['expert_share_on_gpu']:.0%} of the experts and {device['mass_on_gpu']:.0%} of the routes"
                if "gpu_experts" in device else
                f"FFN {device['ffn_share_on_gpu']:.0%} of neurons and {device['mass_on_gpu']:.0%} of the activation mass")
        print(f"device   {device['device']}: VRAM budget {device['vram_budget'] / 2**20:.1f} MiB, {what} "
              f"there, {device['split_layers']} layers split, head on the "
              f"{'device' if device['head_on_gpu'] else 'CPU'}")
    print(f"threads  {r.threads} ({r.isa})")
    at = f" at depth {r.depth}" if r.depth else ""
    print(f"cache    {r.cache_type}")
    print(f"prefill  {r.prefill_tok_s:8.1f} tok/s  ({r.prompt_tokens} tokens{at})")
    print(f"decode   {r.decode_tok_s:8.1f} tok/s  ({r.gen_tokens} tokens{at})")
    print(f"peak RSS {r.peak_rss_mb:8.1f} MB")
    print(memory_line(memory))
    if model.session.expert_cuts is not None:
        print(f"cuts     {describe_cuts(model.session.expert_cuts)}")
    if r.experts is not None:
        e = r.experts
        print(f"experts  {e['resident_experts']} resident, cache of {e['cache_slots']}: {e['hit_rate']:.0%} of chosen "
              f"experts in RAM ({e['resident_hit_rate']:.0%} resident), {e['bytes_read_per_token'] / 1e6:.1f} MB "
              f"read per token from the {'expert bundle file' if e['source'] == 'bundle' else 'model file'} "
              f"({e['io_engine']}{', O_DIRECT' if e['direct_io'] else ''})")
        if e.get("prediction_accuracy") is not None:
            print(f"prefetch the next layer's router picked {e['prediction_accuracy']:.0%} of the chosen experts; "
                  f"{e['prefetch_used_share'] or 0:.0%} of what it read ahead was used; decode waited "
                  f"{e['read_seconds'] + e['prefetch_wait_seconds']:.2f} s on reads")
    if r.offload is not None:
        o = r.offload
        if o.get("predicted_tok_s"):
            print(f"planned  {o['predicted_tok_s']:8.1f} tok/s  (the plan's prediction for decode)")
        print(f"offload  budget {o['ram_budget'] / 2**20:.1f} MiB: FFN {o['ram_hit_rate']:.0%} in RAM, "
              f"{o['bytes_read_per_token'] / 2**20:.2f} MiB read per token "
              f"({o['read_bandwidth_mb_s'] or 0:.0f} MB/s, {'O_DIRECT' if o['direct_io'] else 'buffered'}), "
              f"{o['io_hidden_share']:.0%} of read time hidden behind compute")
        if o.get("window_hit_rate") is not None:
            print(f"         read-ahead window: {o['window_hit_rate']:.0%} of listed neurons found there")
        if o.get("cache_hit_rate") is not None:
            print(f"         neuron cache {o['cache_bytes'] / 2**20:.1f} MiB: {o['cache_hit_rate']:.0%} of listed cold "
                  f"neurons found there; listed reads through {o['io_engine']}")
    if sparsity is not None and sparsity["mode"] == "input":
        from ..sparsity.input_bytes import describe_input_plan

        b = sparsity["bytes_per_token"]
        print(f"sparsity {describe_input_plan(model.sparsity)}")
        print(f"         weights read per token {b['sparse'] / 2**20:.1f} MiB against {b['dense'] / 2**20:.1f} dense "
              f"({b['sparse'] / max(b['dense'], 1):.2f}x; site densities per layer with --json)")
    elif sparsity is not None:
        mean = {k: sum(row[k] for row in sparsity["layers"]) / len(sparsity["layers"])
                for k in ("computed_density", "true_density", "recall")}
        plan = model.sparsity
        print(f"sparsity {plan.mode}, target {plan.target:.0%}, predictors "
              f"{'yes (%.1f KB)' % (plan.predictor_bytes() / 1024) if plan.has_predictors else 'no'}")
        print(f"         gate/up rows computed {mean['computed_density']:.3f}, truly active {mean['true_density']:.3f}, "
              f"recall {mean['recall']:.3f} (mean of layers; per layer with --json)")
    return 0


def memory_line(m: dict) -> str:
    """bench's memory line: the measured peak beside the limit, and the parts."""
    mib = 2 ** 20
    cg = m.get("cgroup") or {}
    peak = f"peak {m['peak_rss'] / mib:.1f} MiB resident" + (
        f", its memory cgroup's peak {cg['peak'] / mib:.1f} of {cg['limit'] / mib:.1f} MiB"
        if cg.get("peak") and cg.get("limit") else "")
    limit = f" under a limit of {m['mem_limit'] / mib:.1f} MiB" if m.get("mem_limit") else ""
    return (f"memory   {peak}{limit}: KV {m['kv_bytes'] / mib:.1f}, buffers {m['buffer_bytes'] / mib:.1f}, "
            f"weights in RAM {m['resident_weight_bytes'] / mib:.1f}, read buffers {m['read_buffer_bytes'] / mib:.1f} "
            f"MiB")


def _measure_sparsity(model) -> dict:
    from ..sparsity.calibrate import bundled_calibration_text
    from ..sparsity.measure import measure_plan

    plan = model.sparsity
    ids = model.tokenize(bundled_calibration_text())
    if plan.mode == "input":
        from ..sparsity.input_bytes import bytes_per_token, measure_densities

        dens = measure_densities(model.gguf, model.config, plan, ids, model.n_threads)
        return {"mode": plan.mode, "levels": plan.info.get("levels", {}), "quality": plan.info.get("quality"),
                "layers": dens, "bytes_per_token": bytes_per_token(model.gguf, model.config, plan, dens)}
    rows = measure_plan(model, plan, ids, 1024)
    return {"mode": plan.mode, "target": plan.target, "layers": rows}
