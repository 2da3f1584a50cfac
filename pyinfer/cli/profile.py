"""`pyinfer profile` (which neurons or experts fire) and `pyinfer train-predictors`."""
from __future__ import annotations

from ..errors import PyinferError
from .common import load_model, model_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    pr = sub.add_parser("profile", help="record how often each FFN neuron fires on calibration text",
                        description="Runs the model over calibration text (never evaluation text) and saves, per "
                                    "layer, the distribution of the activation criterion and each neuron's firing "
                                    "histogram. Thresholds for any target sparsity are read from it.")
    model_args(pr)
    pr.add_argument("-f", "--file", default=None, help="calibration text (default: the bundled public-domain excerpt)")
    pr.add_argument("--tokens", type=int, default=16384, help="calibration tokens (default 16384)")
    pr.add_argument("--mode", choices=["contrib", "gate", "relu"], default=None,
                    help="criterion: contrib |act(gate)*up| (SwiGLU/GeGLU default), gate |act(gate)| (CATS), "
                         "relu gate>0 (ReLU models' default)")
    pr.add_argument("-o", "--output", required=True, help="profile file to write (.npz)")
    pr.add_argument("--plot", default=None, help="also draw the power law to this PNG (needs matplotlib)")

    tp = sub.add_parser("train-predictors", help="calibrate thresholds and train per-layer activation predictors",
                        description="Reads a profile, sets per-layer thresholds for --target, orders neurons "
                                    "hot-first, trains one low-rank predictor per layer (numpy) and writes the "
                                    "sparsity file that --sparsity FILE and load(sparsity=FILE) read.")
    model_args(tp)
    tp.add_argument("--profile", required=True, help="profile from `pyinfer profile`")
    tp.add_argument("-f", "--file", default=None, help="calibration text (default: the bundled excerpt)")
    tp.add_argument("--target", type=float, default=0.5, help="FFN sparsity to calibrate (default 0.5)")
    tp.add_argument("--tokens", type=int, default=24576, help="training tokens (default 24576)")
    tp.add_argument("--recall", type=float, default=0.95, help="target recall of active neurons (default 0.95)")
    tp.add_argument("--rank", type=int, default=None, help="fixed predictor rank (default: sized per layer)")
    tp.add_argument("--no-predictors", action="store_true",
                    help="thresholds only (gate and up stay dense in decode, down is sparse)")
    tp.add_argument("--gate-recall", type=float, default=None,
                    help="without predictors: run up/down only where |act(gate)| keeps this share of active neurons")
    tp.add_argument("-o", "--output", required=True, help="sparsity file to write (.npz)")

    return {"profile": cmd_profile, "train-predictors": cmd_train_predictors}


def cmd_profile(args) -> int:
    from ..sparsity.calibrate import profile_model, read_calibration

    if args.tokens < 256:
        raise PyinferError("--tokens must be at least 256")
    text = read_calibration(args.file)
    model = load_model(args)
    if model.config.is_moe:  # a Mixture of Experts: which experts its routers choose (offload/experts.py)
        from pathlib import Path

        from ..sparsity.expert_profile import describe_profile, profile_path, profile_routing, save_profile

        prof = profile_routing(model.gguf, model.config, model.tokenize(text), model.n_threads, max_tokens=args.tokens)
        save_profile(prof, Path(args.output))
        save_profile(prof, profile_path(model.gguf.fingerprint()))  # what --mem-limit places resident experts by
        print(f"routing profile of {prof['tokens']} tokens -> {args.output}: {describe_profile(prof)}")
        return 0
    prof = profile_model(model.gguf, model.config, model.tokenize(text), args.tokens, model.n_threads, args.mode,
                         info={"calibration": args.file or "bundled"})
    prof.save(args.output)
    thr = prof.thresholds(0.5)
    share = prof.share_for_mass(thr)
    print(f"profiled {prof.tokens} tokens ({prof.mode}) -> {args.output}")
    print(f"at 50% sparsity, {share.mean():.0%} of neurons produce 80% of activations "
          f"(layers {share.min():.0%}..{share.max():.0%})")
    if args.plot:
        from ..sparsity.plots import plot_power_law

        plot_power_law(prof, args.plot)
        print(f"plot -> {args.plot}")
    return 0


def cmd_train_predictors(args) -> int:
    from ..sparsity.calibrate import build_plan, read_calibration
    from ..sparsity.predictor import TrainConfig
    from ..sparsity.profile import Profile

    if not 0.0 <= args.target < 1.0:
        raise PyinferError("--target must be in [0, 1)")
    if not 0.5 <= args.recall < 1.0:
        raise PyinferError("--recall must be in [0.5, 1)")
    if args.rank is not None and (args.rank < 32 or args.rank % 32):
        raise PyinferError("--rank must be a positive multiple of 32")
    text = read_calibration(args.file)
    model = load_model(args)
    prof = Profile.load(args.profile, model.gguf.fingerprint(), model.config.n_layers, model.config.d_ff)
    train = None if args.no_predictors else TrainConfig(recall=args.recall, fixed_rank=args.rank)
    plan = build_plan(model.gguf, model.config, prof, args.target, model.tokenize(text), args.tokens,
                      model.n_threads, train, gate_recall=args.gate_recall,
                      info={"calibration": args.file or "bundled"})
    plan.save(args.output)
    print(f"sparsity file -> {args.output}  (mode {plan.mode}, target {plan.target:.0%})")
    if plan.has_predictors:
        print("layer  rank  hot  recall  precision  predicted  true   bytes")
        for il, lp in enumerate(plan.layers):
            s = lp.predictor.stats
            print(f"{il:5d} {s['rank']:5d} {lp.hot:4d}  {s['recall']:.3f}   {s['precision']:.3f}      "
                  f"{s['predicted_density']:.3f}   {s['true_density_cold']:.3f}  {s['bytes']}")
        print(f"total predictor size: {plan.predictor_bytes() / 1024:.1f} KB")
    return 0
