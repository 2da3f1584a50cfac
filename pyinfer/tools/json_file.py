"""Plan files (`pyinfer plan`, `pyinfer place`): JSON bound to one model by its fingerprint, written whole or
not at all."""
from __future__ import annotations

import json

from ..errors import PyinferError
from .atomic_file import atomic_write


def write_json(path: str, obj: dict, indent: int | None = 1) -> None:
    """Written whole or not at all (atomic_write): a failure leaves the old file (or none), never half a file."""
    data = json.dumps(obj, indent=indent).encode()
    try:
        atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise PyinferError(f"cannot write {path}: {e.strerror or e}") from None


def read_bound_json(path: str, fmt: str, fingerprint: str, what: str, command: str) -> dict:
    """The file's object, refused in one line when it is unreadable, another format or for another model.
    what: e.g. "offload plan"; command: the one that makes such files, e.g. "pyinfer plan"."""
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise PyinferError(f"cannot read the {what} {path}: {e}") from None
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise PyinferError(f"{path} is not a pyinfer {what} (make one with `{command}`)")
    if d.get("fingerprint") != fingerprint:
        raise PyinferError(f"{path} was made for another model; run `{command}` again for this one")
    return d
