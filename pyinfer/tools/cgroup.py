"""Runs a command inside a fresh memory cgroup of a given limit: how the tests and benchmarks check that a
`mem_limit` holds for the whole process (anonymous memory and page cache alike, as the kernel counts them).
Needs root and cgroup v1's memory controller, or v2 with the memory controller enabled for children."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


@dataclass
class CgroupRun:
    returncode: int
    stdout: str
    stderr: str
    peak: int        # the cgroup's peak usage, bytes
    failcnt: int     # times usage hit the limit (v1; v2: the 'max' events)

    @property
    def killed(self) -> bool:
        """Killed by the kernel (the cgroup's OOM killer sends SIGKILL)."""
        return self.returncode in (-9, 137)


def cgroup_root() -> tuple[Path, str] | None:
    """(parent folder, "v1" or "v2") where this process may make a memory cgroup, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    if (V1 / "memory.limit_in_bytes").exists() and os.access(V1, os.W_OK):
        return V1, "v1"
    with contextlib.suppress(OSError):
        if "memory" in (V2 / "cgroup.subtree_control").read_text().split():
            return V2, "v2"
    return None


def drop_caches() -> None:
    """Writes back and drops the page cache, so a run starts cold (root only)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_in_memory_cgroup(cmd: list[str], limit: int | None, env: dict | None = None, cold: bool = False,
                         timeout: float = 3600, cwd: str | None = None) -> CgroupRun:
    """Runs `cmd` in a new memory cgroup of `limit` bytes (None: no limit, for its peak), caches dropped first
    with `cold`, and removes the cgroup afterwards."""
    root = cgroup_root()
    if root is None:
        raise RuntimeError("a memory cgroup needs root and a memory controller (cgroup v1, or v2 delegated)")
    base, version = root
    cg = base / f"pyinfer_{uuid.uuid4().hex[:10]}"
    cg.mkdir()
    try:
        if limit is not None:
            (cg / ("memory.limit_in_bytes" if version == "v1" else "memory.max")).write_text(str(limit))
            if version == "v2":
                with contextlib.suppress(OSError):
                    (cg / "memory.swap.max").write_text("0")

        def enter():
            with open(cg / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

        if cold:
            drop_caches()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=enter, timeout=timeout, cwd=cwd)
        if version == "v1":
            peak = int((cg / "memory.max_usage_in_bytes").read_text())
            failcnt = int((cg / "memory.failcnt").read_text())
        else:
            peak = int((cg / "memory.peak").read_text()) if (cg / "memory.peak").exists() else 0
            events = dict(line.split() for line in (cg / "memory.events").read_text().splitlines())
            failcnt = int(events.get("max", 0))
        return CgroupRun(r.returncode, r.stdout, r.stderr, peak, failcnt)
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
