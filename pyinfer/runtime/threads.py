"""Default thread count: physical cores available to this process (as llama.cpp chooses)."""
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
