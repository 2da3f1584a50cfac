"""vLLM-v1-shaped scheduler: schedule() -> SchedulerOutput (plain data), then update_from_output().

Model (arXiv 2508.14544): every running request emits one token per step; a request holding
s_i + a_i tokens needs one more slot each step; an evicted request loses its progress and waits. A hybrid model's
request (linear-attention layers with a fixed-size recurrent state, Qwen 3.5) also holds `state_blocks` from its
admission to its end, whatever its length: every check below charges them beside its tokens."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .block_manager import BlockManager
from .policies import Policy
from .request import Request, Status


@dataclass
class SchedulerOutput:
    step: int
    running: list[int]                       # ids that produce one token this step (admitted included)
    admitted: list[int] = field(default_factory=list)  # started this step: their prompt is prefilled now
    evicted: list[int] = field(default_factory=list)   # KV freed, progress lost, back to waiting
    kv_tokens: int = 0                        # KV tokens held once this step's tokens are written
    used_blocks: int = 0
    prefill_tokens: int = 0


class Scheduler:
    def __init__(self, policy: Policy, kv_budget: int, block_size: int = 1, keep_finished: int | None = None,
                 state_blocks: int = 0):
        """`keep_finished`: how many finished requests `finished` remembers (None: all, for the simulator's
        statistics; a server keeps a few, so a long-running process does not grow). `state_blocks`: the blocks
        a running request's recurrent state takes (its bytes over a block's bytes, rounded up; 0 without one)."""
        if state_blocks < 0:
            raise ValueError("state_blocks must be 0 or more")
        self.policy = policy
        self.state_blocks = state_blocks
        self.blocks = BlockManager(kv_budget // block_size, block_size)
        self.kv_budget = kv_budget
        self.step = 0
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: deque[Request] = deque(maxlen=keep_finished)
        self.finished_count = 0
        self._by_id: dict[int, Request] = {}
        self._last: SchedulerOutput | None = None

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, r: Request) -> None:
        if self.blocks.blocks_for(r.prompt_len + r.upper) + self.state_blocks > self.blocks.num_blocks:
            state = f" and {self.state_blocks} state blocks" if self.state_blocks else ""
            raise ValueError(f"request {r.id} can never fit: {r.prompt_len}+{r.upper} tokens{state} > KV budget")
        self._by_id[r.id] = r
        self.waiting.append(r)

    def abort(self, req_id: int) -> bool:
        """Drops a request wherever it is (client gone); its KV blocks are freed at once."""
        r = self._by_id.pop(req_id, None)
        if r is None or r.status == Status.FINISHED:
            return False
        if r in self.running:
            self.running.remove(r)
            self.blocks.free(req_id)
        elif r in self.waiting:
            self.waiting.remove(r)
        r.status = Status.FINISHED
        self.policy.forget(r)
        return True

    @property
    def kv_tokens_reserved(self) -> int:
        return self.blocks.used_blocks * self.blocks.block_size

    def request(self, req_id: int) -> Request:
        """A waiting or running request (finished ones are forgotten)."""
        return self._by_id[req_id]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- feasibility -----------------------------------------------------------------------
    def _fits(self, batch: list[Request]) -> bool:
        """Does the batch fit now and, for future-aware policies, at every later step of its plan?"""
        if not batch:
            return True
        held = np.fromiter((r.kv_tokens for r in batch), np.int64, len(batch))
        if not self.policy.future_aware:
            return int(self.blocks.blocks_for(held + 1).sum()) + self.state_blocks * len(batch) <= self.blocks.num_blocks
        remaining = np.fromiter((max(1, self.policy.planned_len(r) - r.generated) for r in batch), np.int64,
                                len(batch))
        # Memory only drops when a request completes, so the peaks are the last steps of each request.
        ks = np.unique(remaining)
        alive = remaining[None, :] >= ks[:, None]                      # [peaks, batch]
        need = -(-(held[None, :] + ks[:, None]) // self.blocks.block_size) + self.state_blocks
        return bool(((need * alive).sum(axis=1) <= self.blocks.num_blocks).all())

    def _evict(self, r: Request, out: SchedulerOutput) -> None:
        self.blocks.free(r.id)
        self.policy.on_evict(r)
        r.wasted_tokens += r.generated
        r.generated = 0
        r.evictions += 1
        r.status = Status.WAITING
        self.running.remove(r)
        self.waiting.append(r)
        out.evicted.append(r.id)

    # ---- one step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.step += 1
        out = SchedulerOutput(self.step, [])
        # 1. Overflow: the next token of every running request must fit now.
        while self.running and (sum(self.blocks.blocks_for(r.kv_tokens + 1) for r in self.running)
                                + self.state_blocks * len(self.running) > self.blocks.num_blocks):
            self._evict(min(self.running, key=self.policy.victim_key), out)
        # 2. Admission in policy order while the plan stays feasible (evicted ones wait a step).
        evicted = set(out.evicted)
        ready = sorted((r for r in self.waiting if r.arrival < self.step and r.id not in evicted),
                       key=self.policy.admission_key)
        for r in ready:
            if not self._fits(self.running + [r]):
                break
            self.waiting.remove(r)
            self.running.append(r)
            r.status = Status.RUNNING
            out.admitted.append(r.id)
            out.prefill_tokens += r.prompt_len
        # 3. Reserve this step's slots; the checks above guarantee they exist.
        for r in self.running:
            ok = self.blocks.hold_state(r.id, self.state_blocks) and self.blocks.grow(r.id, r.kv_tokens + 1)
            assert ok, "KV budget exceeded"  # invariant: never more than M
        out.running = [r.id for r in self.running]
        out.kv_tokens = sum(r.kv_tokens + 1 for r in self.running)
        out.used_blocks = self.blocks.used_blocks
        assert out.used_blocks <= self.blocks.num_blocks
        self._last = out
        return out

    def update_from_output(self, finished_ids: list[int] | set[int]) -> None:
        """Every scheduled request produced one token; `finished_ids` produced their last."""
        done = set(finished_ids)
        for rid in self._last.running if self._last else []:
            r = self._by_id.get(rid)
            if r is None or r.status != Status.RUNNING:  # aborted since schedule()
                continue
            r.generated += 1
            if rid in done:
                r.status = Status.FINISHED
                r.finish_step = self.step
                self.blocks.free(rid)
                self.running.remove(r)
                del self._by_id[rid]
                self.finished.append(r)
                self.finished_count += 1
                self.policy.on_finish(r)
                self.policy.forget(r)
