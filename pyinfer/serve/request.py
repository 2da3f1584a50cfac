"""A request as the scheduler sees it: lengths and counters only."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    id: int
    prompt_len: int            # s_i
    lower: int                 # l_i: the predicted output-length interval [l_i, u_i]
    upper: int                 # u_i
    arrival: int = 0           # step at which the request becomes visible
    true_len: int | None = None  # o_i: known only to the simulator's engine and to the H-SF oracle
    generated: int = 0         # a_i: tokens produced since the last (re)start
    pseudo_lower: int = 0      # A_min's õ_i; starts at l_i, raised on eviction
    status: Status = Status.WAITING
    evictions: int = 0
    wasted_tokens: int = 0     # tokens generated and then thrown away by evictions
    finish_step: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.lower < 1 or self.upper < self.lower:
            raise ValueError(f"request {self.id}: need prompt_len >= 1 and 1 <= lower <= upper")
        self.pseudo_lower = self.pseudo_lower or self.lower

    @property
    def kv_tokens(self) -> int:
        """KV-cache tokens held now: s_i + a_i."""
        return self.prompt_len + self.generated
