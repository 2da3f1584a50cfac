"""Sizes as people write them ('300M', '1.5GiB', '2G', '123456') and as the memory reports print them: read by
offload budgets, memory limits and the GPU placement alike, so it sits below all of them."""
from __future__ import annotations

import re

import numpy as np

from ..errors import PyinferError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KIB": 1 << 10, "M": 1 << 20, "MB": 1000 ** 2, "MIB": 1 << 20,
          "G": 1 << 30, "GB": 1000 ** 3, "GIB": 1 << 30}


def parse_size(text: str | int) -> int:
    """'300M', '1.5GiB', '2G', '123456' -> bytes (K/M/G are binary, KB/MB/GB decimal)."""
    if isinstance(text, (int, np.integer)):
        n = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _UNITS:
            raise PyinferError(f"not a size: {text!r} (examples: 300M, 1.5G, 2GiB, 123456)")
        n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if n <= 0:
        raise PyinferError(f"a size must be positive, got {text!r}")
    return n


def fmt_size(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"
