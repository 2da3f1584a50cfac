"""Stop strings over a stream of text pieces: text that might begin a stop string is held back
until it is known not to."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence


def apply_stops(pieces: Iterable[str], stop: Sequence[str]) -> Iterator[str]:
    stop = [s for s in stop if s]
    if not stop:
        yield from pieces
        return
    buf = ""
    for piece in pieces:
        buf += piece
        hits = [i for i in (buf.find(s) for s in stop) if i >= 0]
        if hits:
            if min(hits) > 0:
                yield buf[:min(hits)]
            return
        hold = max(_overlap(buf, s) for s in stop)
        if len(buf) > hold:
            yield buf[:len(buf) - hold]
            buf = buf[len(buf) - hold:]
    if buf:
        yield buf


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
