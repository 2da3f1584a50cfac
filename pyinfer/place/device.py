"""Which device a model runs on, asked of the GPU through cuda-python (without importing torch), and the GPU
placement a load uses: a file from `pyinfer place`, or one solved at load time under a VRAM budget.

Devices: "cpu" (the default), "cuda" or "cuda:N" (needs a CUDA build of pyinfer and a GPU), and "standin": a
second CPU backend with memory of its own standing in for the GPU. It runs the very graph a GPU would, copies
included, so a placement can be checked (and is tested) on a machine without one."""
from __future__ import annotations

from ..errors import PyinferError
from ..runtime.placement import Placement

MARGIN_BYTES = 512 << 20    # left free by the default budget: the CUDA context, cuBLAS, other processes
DEFAULT_CPU_SECONDS_PER_BYTE = 1e-10  # ~10 GB/s decode streaming, where `pyinfer place` did not measure


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older layout
        except ImportError:
            return None
    return cudart


def cuda_devices(free_of: int | None = None) -> list[dict]:
    """[{index, name, total, free}] of the visible GPUs: through cuda-python when installed, else the
    extension's own query (no free memory then). Free memory is read only for device `free_of` (None:
    every device; each read makes a CUDA context there). Empty without a driver or device; never raises."""
    cudart = _cudart()
    if cudart is None:
        from .. import _core

        return [{"index": d["index"], "name": d["name"], "total": d["total_memory"], "free": None}
                for d in _core.cuda_devices()]
    out = []
    try:
        err, n = cudart.cudaGetDeviceCount()
        if int(err) != 0:
            return []
        for i in range(n):
            err, props = cudart.cudaGetDeviceProperties(i)
            if int(err) != 0:
                continue
            err, free, total = 1, None, None
            if free_of is None or free_of == i:
                cudart.cudaSetDevice(i)
                err, free, total = cudart.cudaMemGetInfo()
            name = props.name
            name = name.decode(errors="replace").rstrip("\0") if isinstance(name, bytes) else str(name)
            out.append({"index": i, "name": name, "total": int(total) if int(err) == 0 else int(props.totalGlobalMem),
                        "free": int(free) if int(err) == 0 else None})
    except Exception:  # a broken driver install: no device, as without one
        return []
    return out


def check_cuda(index: int) -> dict:
    """The device, or a one-line PyinferError saying why it cannot be used (the CPU path still can)."""
    from .. import _core

    if not _core.cuda_built():
        raise PyinferError("this pyinfer was built without CUDA (no nvcc when it was installed); run on the CPU "
                           "(drop --device cuda) or reinstall on a machine with the CUDA toolkit")
    devices = cuda_devices(free_of=index)
    if not devices:
        raise PyinferError("no CUDA device found (no GPU, or no driver); run on the CPU (drop --device cuda)")
    if index >= len(devices):
        raise PyinferError(f"cuda:{index} does not exist; this machine has {len(devices)} CUDA device(s)")
    return devices[index]


def _default_budget(kind: str, index: int, vram_budget):
    """The budget as given, or on a GPU its free memory less a margin; the stand-in has none of its own."""
    if vram_budget is not None:
        return vram_budget
    if kind != "cuda":
        raise PyinferError("device='standin' needs a vram_budget (a size, or a file from `pyinfer place`)")
    free = check_cuda(index).get("free")
    if free is None:
        raise PyinferError("cannot read free GPU memory (install cuda-python); pass --vram-budget SIZE")
    return max(free - MARGIN_BYTES, 1)


def resolve_placement(kind: str, index: int, vram_budget, gguf, cfg, plan, n_ctx: int,
                      cache_type: str = "f16") -> Placement:
    """The placement for this load: a file from `pyinfer place` (checked against it), or solved now."""
    import os

    from ..tools.sizes import parse_size
    from .gpu_placement import GpuCosts, check_placement, place, read_placement

    if isinstance(vram_budget, (str, os.PathLike)) and os.path.isfile(vram_budget):
        return Placement.of(check_placement(read_placement(str(vram_budget), gguf.fingerprint()), cfg, plan, n_ctx,
                                            cache_type, str(vram_budget)))
    vram_budget = _default_budget(kind, index, vram_budget)
    from .measure import sync_seconds

    sync, how = sync_seconds(index, 4 * cfg.d_model) if kind == "cuda" else (0.0, "stand-in: no transfer cost")
    costs = GpuCosts(DEFAULT_CPU_SECONDS_PER_BYTE, sync,
                     {"cpu_seconds_per_byte": "default (pyinfer place measures it)", "sync_seconds": how})
    return Placement.of(place(gguf, cfg, plan, parse_size(vram_budget), n_ctx, costs, cache_type=cache_type).summary())


def resolve_expert_placement(session, vram_budget, n_ctx: int, cache_type: str = "f16",
                             progress: bool = True) -> Placement:
    """A Mixture of Experts' placement (as `pyinfer place` writes it) for this load: a file, or solved now from
    the model's routing profile (offload/experts.py, measured once and cached) under a VRAM budget."""
    import os

    from ..tools.sizes import parse_size
    from ..sparsity.expert_profile import cached_profile
    from ..tools.json_file import read_bound_json
    from .expert_placement import FORMAT, check_expert_placement, place_experts
    from .gpu_placement import GpuCosts
    from .measure import sync_seconds

    if isinstance(vram_budget, (str, os.PathLike)) and os.path.isfile(vram_budget):
        d = read_bound_json(str(vram_budget), FORMAT, session.gguf.fingerprint(), "expert placement", "pyinfer place")
        return Placement.of(check_expert_placement(d, session.config, n_ctx, cache_type, str(vram_budget)))
    kind, index = session.kind, session.index
    vram_budget = _default_budget(kind, index, vram_budget)
    sync, how = sync_seconds(index, 4 * session.config.d_model) if kind == "cuda" else (0.0, "stand-in: no transfer "
                                                                                           "cost")
    costs = GpuCosts(DEFAULT_CPU_SECONDS_PER_BYTE, sync, {"cpu_seconds_per_byte": "default (pyinfer place measures "
                                                          "it)", "sync_seconds": how})
    counts = cached_profile(session, progress)["counts"]
    return Placement.of(place_experts(session.gguf, session.config, parse_size(vram_budget), n_ctx, costs, counts,
                                      cache_type=cache_type).summary())
