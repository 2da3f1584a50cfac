"""Stop strings over a stream of text pieces: text that might begin a stop string is held back
until it is known not to."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence


class StopMatcher:
    """Push-based: push(piece) -> (text safe to emit, stopped?); flush() -> the held-back rest."""

    def __init__(self, stop: Sequence[str]):
        self.stop = [s for s in stop if s]
        self.buf = ""

    def push(self, piece: str) -> tuple[str, bool]:
        if not self.stop:
            return piece, False
        self.buf += piece
        hits = [i for i in (self.buf.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self.buf = self.buf[:min(hits)], ""
            return out, True
        hold = max(_overlap(self.buf, s) for s in self.stop)
        out, self.buf = self.buf[:len(self.buf) - hold], self.buf[len(self.buf) - hold:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def apply_stops(pieces: Iterable[str], stop: Sequence[str]) -> Iterator[str]:
    m = StopMatcher(stop)
    for piece in pieces:
        text, stopped = m.push(piece)
        if text:
            yield text
        if stopped:
            return
    rest = m.flush()
    if rest:
        yield rest


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
