"""A real `pyinfer serve` process on loopback for the load and soak scripts."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, startup_s: float = 120.0):
    """Yields (base URL, process) of `pyinfer serve ARGS --port P`, once /health answers; stops it after."""
    port = free_port()
    # From a neutral folder: `-m` puts the working directory first on sys.path, and a source checkout's
    # pyinfer/ (without its built _core) would shadow the installed package.
    proc = subprocess.Popen([sys.executable, "-m", "pyinfer.cli", "serve", "--port", str(port), *args],
                            env=dict(os.environ), stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"pyinfer serve exited with {proc.returncode}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("pyinfer serve did not start")
            time.sleep(0.2)
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0
