"""Default thread count: physical cores available to this process (as llama.cpp chooses), one fewer with a device."""
from __future__ import annotations

import os
from pathlib import Path


def physical_cores() -> int:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def default_threads(device: str = "cpu") -> int:
    """CPU threads when none are asked for: the physical cores, and one fewer with a device (cuda, standin),
    whose executor thread needs a core of its own. The CPU pool's threads spin between nodes, so a pool of every
    core starves it: on the device tool's H200 machine (16 cores) a GPU-alone decode of the SmolLM2-shaped model
    ran at 315.6 tok/s with 4 CPU threads, 306.6 with 8 and 84.7 with 16 (`pyinfer bench --device cuda`)."""
    n = physical_cores()
    return max(1, n - 1) if str(device) != "cpu" else n
