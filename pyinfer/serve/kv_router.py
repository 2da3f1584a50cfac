"""Which replica gets a request: the one with the most free KV budget (integers only, tested without Ray).

Each replica reports, every `STATS_PERIOD_S`, its KV budget and the KV its requests in flight may still need at
most (`kv_committed_tokens`: prompt plus max_tokens of every waiting and running request). Between two reports
the router remembers what it sent each replica since that replica's last report, so a burst of requests spreads
instead of all going to the replica that looked freest a moment ago. A replica that refused the request (429,
503) or died with it is named in `avoid` and ranked last."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

STATS_PERIOD_S = 0.5


@dataclass
class ReplicaLoad:
    """What the router knows of one replica."""
    kv_budget: int = 0
    kv_committed: int = 0
    report: int = -1                 # the replica's report counter: a new value clears `sent_since`
    sent_since: int = 0              # tokens of requests sent to it since its last report
    alive: bool = True

    @property
    def free(self) -> int:
        return self.kv_budget - self.kv_committed - self.sent_since


@dataclass
class KvLedger:
    loads: dict[str, ReplicaLoad] = field(default_factory=dict)

    def observe(self, replica: str, stats: dict) -> None:
        """Folds in a replica's routing stats (as its record_routing_stats returned them)."""
        load = self.loads.setdefault(replica, ReplicaLoad())
        if not stats or stats.get("report", -1) == load.report:
            return
        load.kv_budget, load.kv_committed = int(stats["kv_budget_tokens"]), int(stats["kv_committed_tokens"])
        load.report, load.sent_since, load.alive = stats["report"], 0, bool(stats.get("alive", True))

    def sent(self, replica: str, cost: int) -> None:
        self.loads.setdefault(replica, ReplicaLoad()).sent_since += max(0, int(cost))

    def forget(self, keep: set[str]) -> None:
        for gone in set(self.loads) - keep:
            del self.loads[gone]

    def rank(self, replicas: list[str], avoid: frozenset[str] = frozenset(), rng=random) -> list[str]:
        """`replicas` best first: alive before dead, not-avoided before avoided, then most free KV; replicas
        with no report yet count as wholly free (a new replica takes work at once); ties in random order."""
        def key(r: str):
            load = self.loads.get(r)
            free = float("inf") if load is None or load.report < 0 else load.free
            return (r in avoid, not (load is None or load.alive), -free, rng.random())

        return sorted(replicas, key=key)


def request_cost(prompt_bytes: int, max_tokens: int | None) -> int:
    """Tokens a request may take, before it is tokenized: about 4 bytes per token, plus its max_tokens."""
    return prompt_bytes // 4 + (max_tokens or 16)
