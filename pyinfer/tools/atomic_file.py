"""Files written whole or not at all, by any number of processes at once, and a lock around work that makes one.

A writer writes a temporary file of its own (a unique name in the same directory), flushes it to the disk and
renames it over the target: a reader sees the old file or the new one, never half of one, and two writers never
write into each other's temporary file. The lock keeps two processes from both spending a minute calibrating the
same cache file; the second finds the first one's result."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Calls write(f) on a fresh temporary file beside `path`, then fsyncs it and renames it to `path`. On any
    failure the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):  # mkstemp makes 0600; the file gets what open() would have given it
                with contextlib.suppress(OSError):  # best effort (some network file systems refuse)
                    os.fchmod(f.fileno(), 0o666 & ~_umask())
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself, on file systems that need the directory synced
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def _umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock on `path`.lock for the block (blocking). Where locks are unavailable (no fcntl,
    a read-only directory) the block runs unlocked: the atomic write still keeps the file whole."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    lock = Path(str(path) + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
