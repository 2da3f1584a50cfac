"""The serving loop: step() = schedule(), then run() on the batch engine, then postprocess().

It owns one Scheduler (integers only) and one BatchEngine (tensors only) and moves requests between
them. It runs on its own thread; front ends submit() and cancel() from any thread and get tokens back
through each request's `emit` callback: ("token", id), then ("done", reason) or ("error", message); a request
asking for log-probabilities also gets ("logprob", (id, logprob, alternatives)) before each token and, with echo,
("prompt_logprobs", [...]) once before the first. A request with a grammar (`constraint`) samples only what its
grammar allows: the masks of a step's constrained requests are computed together, then each is applied to its own
row of logits only; a request whose grammar is complete ends there ("stop").

Eviction (A_min's cancel): the request's KV is freed and it restarts from scratch later, as the
scheduler models. Tokens already streamed are never taken back: on restart the request replays them
(one per step, like generation) instead of sampling, so its output stays consistent.

A failure fails only what it touched: a request whose sampling raises is removed from the scheduler and told
so, a run of the batch that raises fails the requests of that step, and the loop goes on. Should the thread
itself ever end, `alive` says so and submit() refuses at once (the server answers 503)."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..errors import PyinferError
from ..runtime.sampling import Sampler, token_logprob
from .batch_engine import BatchEngine, SeqWork
from .grammar import Constraint, MaskBuffer
from .length_predictor import LengthPredictor
from .policies import make_policy
from .request import Request
from .scheduler import Scheduler


@dataclass
class ServeRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampler: Sampler                          # built (and its values checked) by the front end
    emit: Callable[[str, object], None]       # ("token", id) / ("done", reason) / ("error", message)
    lower: int | None = None                  # client's lower bound on the output length, if any
    logprobs: int | None = None               # each token's log-probability and this many alternatives (None: off)
    echo: bool = False                        # with logprobs: the prompt's tokens scored too ("prompt_logprobs")
    prompt_scored: bool = False               # its prompt's scores went out (an eviction does not repeat them)
    constraint: Constraint | None = None      # its grammar's state (structured outputs, tool calls), if any
    id: int = -1
    emitted: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.monotonic)


log = logging.getLogger("pyinfer.serve")


class EngineStopped(PyinferError):
    """The engine thread is not running: requests cannot be served."""


class EngineLoop:
    def __init__(self, batch: BatchEngine, policy: str, kv_budget: int, eos_ids: set[int], seed: int = 0):
        self.batch, self.eos_ids = batch, eos_ids
        self.sched = Scheduler(make_policy(policy, seed), kv_budget, batch.block_size, keep_finished=0,
                               state_blocks=batch.state_blocks)
        self.policy_name, self.kv_budget = policy, kv_budget
        self.lengths = LengthPredictor()
        self._lock = threading.Condition()
        self._incoming: deque[ServeRequest] = deque()
        self._cancels: set[int] = set()
        self._live: dict[int, ServeRequest] = {}
        self._next_id = 0
        self._stop = False
        self.failure: str | None = None  # why the engine thread ended, if it did
        self._on_stop: list[Callable[[], None]] = []
        self.stats = dict(requests_total=0, finished_total=0, cancelled_total=0, evictions_total=0,
                          tokens_generated_total=0, steps_total=0, kv_peak_tokens=0, failed_total=0,
                          grammar_masks_total=0, grammar_steps_total=0, grammar_mask_seconds_total=0.0)
        self._masks: MaskBuffer | None = None
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps, for tok/s
        self.thread = threading.Thread(target=self._run, name="pyinfer-engine", daemon=True)

    # ---- front-end side (any thread) -------------------------------------------------------
    @property
    def max_request_tokens(self) -> int:
        return min(self.batch.max_blocks * self.batch.block_size, self.kv_budget)

    def check(self, prompt_len: int, max_tokens: int, at_least: bool = False) -> str | None:
        """Why this request can never run here, or None. `at_least`: prompt_len is a lower bound."""
        if prompt_len + max_tokens > self.max_request_tokens:
            return (f"prompt ({'at least ' if at_least else ''}{prompt_len} tokens) + max_tokens ({max_tokens}) exceeds "
                    f"this server's limit of {self.max_request_tokens} tokens per request")
        return None

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.failure is None and not self._stop

    def in_flight(self) -> int:
        """Requests submitted and not yet ended (waiting or running)."""
        with self._lock:
            return len(self._incoming) + len(self._live)

    def submit(self, req: ServeRequest) -> int:
        with self._lock:
            if not self.alive:
                raise EngineStopped(f"the engine is not running ({self.failure or 'stopped'})")
            req.id = self._next_id
            self._next_id += 1
            self._incoming.append(req)
            self.stats["requests_total"] += 1
            self._lock.notify()
        return req.id

    def cancel(self, req_id: int) -> None:
        with self._lock:
            self._cancels.add(req_id)
            self._lock.notify()

    def start(self) -> None:
        self.thread.start()

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Calls fn when the loop stops: what a front end keeps for serving (its tokenizer thread) ends with it."""
        self._on_stop.append(fn)

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        while self._on_stop:
            self._on_stop.pop()()

    def metrics(self) -> dict:
        with self._lock:
            now = time.monotonic()
            window = [n for t, n in self._recent if now - t <= 10.0]
            # What every request in flight may still need at most: the router's measure of a replica's load.
            committed = (sum(r.prompt_len + r.upper for r in self.sched.waiting + self.sched.running)
                         + sum(len(r.prompt_ids) + r.max_tokens for r in self._incoming))
            return dict(self.stats, waiting=len(self.sched.waiting) + len(self._incoming),
                        running=len(self.sched.running), kv_used_tokens=self.sched.kv_tokens_reserved,
                        kv_budget_tokens=self.kv_budget, kv_committed_tokens=committed,
                        tokens_per_second=sum(window) / 10.0)

    # ---- engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (self._stop or self._incoming or self._cancels or self.sched.has_unfinished()):
                        self._lock.wait()
                    if self._stop:
                        break
                    self._admit_new()
                try:
                    self.step()
                except Exception as e:  # noqa: BLE001 - a step's own guards missed it: fail the live requests
                    log.error("pyinfer: an engine step failed", exc_info=True)
                    for rid in list(self._live):
                        self._fail(rid, f"engine failure: {type(e).__name__}: {e}")
        except BaseException as e:  # a bug in the loop itself: say so on /health rather than hang every request
            self.failure = f"engine thread failed: {type(e).__name__}: {e}"
            log.error("pyinfer: %s", self.failure, exc_info=True)
        finally:
            with self._lock:
                pending = list(self._incoming)
                self._incoming.clear()
            for req in pending:
                req.emit("error", self.failure or "server shutting down")
            for rid in list(self._live):
                self._finish(rid, "error", self.failure or "server shutting down")

    def _admit_new(self) -> None:
        while self._incoming:
            req = self._incoming.popleft()
            try:
                lower = self.lengths.lower_bound(len(req.prompt_ids), req.max_tokens, req.lower)
                r = Request(req.id, len(req.prompt_ids), lower, req.max_tokens, arrival=self.sched.step)
                self.sched.add_request(r)
            except ValueError as e:  # the front end checks sizes first; this is the last line of defence
                req.emit("error", f"request refused: {e}")
                continue
            self._live[req.id] = req
        for rid in self._cancels:
            if rid in self._live and self.sched.abort(rid):
                self.stats["cancelled_total"] += 1
                self._finish(rid, "cancelled", None)
        self._cancels.clear()

    def _fail(self, rid: int, message: str) -> None:
        """Ends one request with an error: out of the scheduler (its KV freed), its client told."""
        self.sched.abort(rid)
        self.stats["failed_total"] += 1
        self._finish(rid, "error", message)

    def step(self) -> None:
        out = self.sched.schedule()                                            # schedule()
        self.stats["steps_total"] += 1
        self.stats["evictions_total"] += len(out.evicted)
        for rid in out.evicted:  # recomputed from position 0 when readmitted: its recurrent state row goes back
            self.batch.release(rid)
        self.stats["kv_peak_tokens"] = max(self.stats["kv_peak_tokens"], self.sched.kv_tokens_reserved)
        if not out.running:
            return
        admitted = set(out.admitted)
        work = []
        for rid in out.running:
            req, r = self._live[rid], self.sched.request(rid)
            blocks = self.sched.blocks.table(rid)
            if rid in admitted:
                scored = req.echo and req.logprobs is not None and not req.prompt_scored
                work.append(SeqWork(rid, req.prompt_ids, 0, blocks, req.logprobs if scored else None))
            else:
                fed = req.emitted[r.generated - 1]
                work.append(SeqWork(rid, [fed], r.prompt_len + r.generated - 1, blocks))
        try:
            logits = self.batch.step(work)                                     # run()
        except Exception as e:  # noqa: BLE001 - the requests of this step fail; the loop and the others go on
            log.error("pyinfer: a batch step failed", exc_info=True)
            for rid in out.running:
                self._fail(rid, f"engine failure: {type(e).__name__}: {e}")
            return
        finished = []                                                          # postprocess()
        for rid, scores in self.batch.scores.items():
            self._live[rid].prompt_scored = True
            self._live[rid].emit("prompt_logprobs", scores)
        allowed = self._grammar_masks(out.running, logits)
        for rid in out.running:
            if rid not in self._live:  # its grammar failed (_grammar_masks)
                continue
            req, r = self._live[rid], self.sched.request(rid)
            if r.generated < len(req.emitted):
                tok = req.emitted[r.generated]  # replay after an eviction
            else:
                try:
                    tok = req.sampler(logits[rid], allowed.get(rid))
                    if req.constraint is not None and tok not in self.eos_ids:
                        req.constraint.consume(tok)
                except Exception as e:  # noqa: BLE001 - only this request fails
                    self._fail(rid, f"sampling failed: {type(e).__name__}: {e}")
                    continue
                if tok in self.eos_ids:
                    finished.append((rid, "stop"))
                    continue
                req.emitted.append(tok)
                self.stats["tokens_generated_total"] += 1
                if req.logprobs is not None:
                    req.emit("logprob", token_logprob(logits[rid], tok, req.logprobs))
                req.emit("token", tok)
            if req.constraint is not None and req.constraint.finished:
                finished.append((rid, "stop"))  # the grammar is complete: only end-of-generation could follow
            elif r.generated + 1 >= req.max_tokens:
                finished.append((rid, "length"))
        with self._lock:
            self._recent.append((time.monotonic(), len(out.running)))
            while len(self._recent) > 512:
                self._recent.popleft()
        self.sched.update_from_output([rid for rid, _ in finished])
        for rid, reason in finished:
            self.lengths.observe(len(self._live[rid].prompt_ids), len(self._live[rid].emitted))
            self.stats["finished_total"] += 1
            self._finish(rid, "done", reason)

    def _grammar_masks(self, running: list[int], logits: dict) -> dict:
        """{request id: bool [vocab]} for this step's constrained requests that sample (not replaying), computed
        together. A request whose grammar fails is failed here and left out."""
        todo = [rid for rid in running if self._live[rid].constraint is not None
                and self.sched.request(rid).generated >= len(self._live[rid].emitted)]
        if not todo:
            return {}
        started = time.perf_counter()
        if self._masks is None:
            self._masks = MaskBuffer(len(next(iter(logits.values()))))
        try:
            rows = self._masks.fill([self._live[rid].constraint for rid in todo])
        except Exception as e:  # noqa: BLE001 - the library refused the batch: fail its requests, not the loop
            for rid in todo:
                self._fail(rid, f"grammar failed: {type(e).__name__}: {e}")
            return {}
        out = {}
        for rid, row in zip(todo, rows):
            why = self._live[rid].constraint.failed
            if why:
                self._fail(rid, f"grammar failed: {why}")
            else:
                out[rid] = row
        self.stats["grammar_masks_total"] += len(todo)
        self.stats["grammar_steps_total"] += 1
        self.stats["grammar_mask_seconds_total"] += time.perf_counter() - started
        return out

    def _finish(self, rid: int, kind: str, payload) -> None:
        self.batch.release(rid)
        req = self._live.pop(rid, None)
        if req is not None and kind != "cancelled":
            req.emit(kind, payload)

    def stop_request(self, rid: int) -> None:
        """A front end saw a stop string: end the request as finished (frees its KV)."""
        self.cancel(rid)

