"""`pyinfer info`: the model, the kernels in use and CUDA devices."""
from __future__ import annotations

from .common import load_model, model_args, sparsity_args


def add_parsers(sub) -> dict:
    """This module's subcommands: name -> handler."""
    i = sub.add_parser("info", help="model metadata, kernel ISA and CUDA devices")
    model_args(i)
    sparsity_args(i)

    return {"info": cmd_info}


def cmd_info(args) -> int:
    from collections import Counter

    from .. import _core

    model = load_model(args)
    c = model.config
    print(f"model      {model.path}")
    print(f"arch       {model.gguf.architecture}  layers={c.n_layers} d_model={c.d_model} d_ff={c.d_ff} "
          f"heads={c.n_heads}/{c.n_kv_heads} vocab={c.vocab_size}")
    if c.is_moe:
        print(f"experts    {c.n_expert} of {c.d_ff_expert} neurons, {c.n_expert_used} per token"
              + (f", a shared expert of {c.d_ff_shared}" if c.d_ff_shared else "")
              + ("" if c.expert_norm else ", weights not renormalized"))
    print(f"activation {c.activation.name.lower()}  weights: " + ", ".join(
        f"{k} {v}" for k, v in sorted(Counter(t.type_name for t in model.gguf.tensors.values()).items())))
    if model.gguf.powerinfer:
        from ..sparsity.powerinfer import THRESHOLD_KEY, gpu_index, has_predictors

        gi = gpu_index(model.path, c.n_layers)
        print(f"powerinfer predictors={'yes' if has_predictors(model.gguf) else 'no'} "
              f"sparse_threshold={model.gguf.get(THRESHOLD_KEY, 0.0)} gpu index="
              f"{gi['file'] + ' ' + str(gi['gpu_neurons_per_layer']) if gi else 'none'}")
    if model.session.auto_choice is not None:  # sparsity auto: timed against dense on this machine
        from ..sparsity.auto_choice import describe

        print(f"sparsity   {describe(model.session.auto_choice)}")
    if model.sparsity is not None and model.sparsity.mode == "input":
        from ..sparsity.calibrate import bundled_calibration_text
        from ..sparsity.input_bytes import bytes_per_token, describe_input_plan, measure_densities

        plan = model.sparsity
        dens = measure_densities(model.gguf, c, plan, model.tokenize(bundled_calibration_text()), model.n_threads)
        b = bytes_per_token(model.gguf, c, plan, dens)
        print(f"sparsity   {describe_input_plan(plan)}; weights read per token {b['sparse'] / 2**20:.1f} MiB of "
              f"{b['dense'] / 2**20:.1f} ({b['sparse'] / max(b['dense'], 1):.2f}x)")
        print("           kept per layer (attn_in attn_out ffn_in up ffn_mid): " + "  ".join(
            "/".join(f"{d[k]:.2f}" for k in ("attn_in", "attn_out", "ffn_in", "up", "ffn_mid")) for d in dens))
    print(f"kernels    {model.isa} (available: {_core.available_isas()})  threads={model.n_threads}")
    from ..place.device import cuda_devices

    devs = [f"{d['name']} ({d['free'] / 2**30:.1f} of {d['total'] / 2**30:.1f} GiB free)" if d["free"] is not None
            else d["name"] for d in cuda_devices()]
    cublas = ""
    if _core.cuda_built():  # prefill's dense matmuls use cuBLAS where libcublas loads (opened at run time)
        why = _core.cublas_error()
        cublas = " cublas=" + ("yes" if not why else f"no ({why})")
    print(f"cuda       built={_core.cuda_built()} devices={devs or 'none'}{cublas}")
    return 0
