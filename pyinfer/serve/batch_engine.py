"""Continuous batching on the engine: many sequences in one C++ run over a paged KV cache.

The cache holds num_blocks * block_size token rows shared by all sequences; a sequence's tokens live
in the blocks of its block table (the scheduler's BlockManager hands out the ids, in integers). One
step feeds every running sequence's new tokens: a whole prompt for a newly admitted request, one
token for a decoding one. Steps longer than max_batch_tokens are cut into consecutive runs, in
order, so a long prompt is prefilled in chunks within the step.

A model with recurrent layers (Qwen 3.5's linear attention) also keeps a fixed-size state per sequence, in rows of
its own: a sequence takes a row when it starts (position 0: the row starts from zeros), keeps it while it runs and
gives it back through release() (finished, cancelled or evicted; an evicted sequence starts again from position 0).
The scheduler charges each sequence `state_blocks` KV blocks for it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._core import row_bytes
from ..errors import PyinferError
from ..runtime.model_graph import CACHE_TYPES
from ..runtime.running import ModelParts, build_running
from ..runtime.sampling import token_logprob
from ..runtime.sparse_ffn import SparseRuns


@dataclass
class SeqWork:
    seq_id: int
    tokens: list[int]        # fed this step, in order
    start: int               # position of tokens[0] in the sequence
    blocks: list[int]        # the sequence's KV block table (covers start + len(tokens) tokens)
    score: int | None = None  # score each of its tokens after the first: with this many alternatives (echo)


MAX_STATE_ROWS = 256  # sequences of a hybrid model that may run at once (the server keeps their rows resident)


def state_blocks(cfg, cache_type: str, block_size: int) -> int:
    """KV blocks whose bytes one sequence's recurrent state takes (0 without recurrent layers): what the scheduler
    charges a hybrid model's sequence beside its tokens."""
    if not cfg.recurrent_layers:
        return 0
    block_bytes = block_size * cfg.cached_values_per_token * row_bytes(CACHE_TYPES[cache_type], 32) / 32
    return max(1, math.ceil(cfg.state_floats_per_sequence * 4 / block_bytes))


class BatchEngine:
    def __init__(self, parts: ModelParts, num_blocks: int, block_size: int, max_seq_len: int,
                 max_batch_tokens: int = 512, runs: SparseRuns = SparseRuns()):
        """`parts`: the model's parts, as its session resolved them (runtime/running.py ModelParts: with a
        `sparsity` plan, runs of up to runs.max_tokens tokens (a step of decoding sequences) take the sparse FFN over
        the union of their active neurons while it is sparse enough; an `offload` streams the FFN neurons that do
        not fit a RAM budget; `device` and `placement` are the hybrid CPU/GPU split, as load(device=...) runs it).
        The server builds it through BatchEngine.of_session, from the same parts as the Python API's model."""
        self.cfg, self.block_size, self.num_blocks = parts.config, block_size, num_blocks
        self.max_blocks = -(-max_seq_len // block_size)
        self.max_batch_tokens = max_batch_tokens
        self.state_blocks = state_blocks(parts.config, parts.cache_type, block_size)
        n_states = max(1, min(num_blocks // self.state_blocks, MAX_STATE_ROWS)) if self.state_blocks else 0
        self._state_of: dict[int, int] = {}                     # seq_id -> its state row
        self._free_states = list(range(n_states - 1, -1, -1))  # a stack: low rows first
        self.running = build_running(parts, num_blocks * block_size, max_batch_tokens, runs,
                                     (block_size, self.max_blocks), states=max(n_states, 1))
        self.engine = self.running.engine
        self.scores: dict[int, list] = {}  # the last step's scored tokens, by sequence (see step)

    @classmethod
    def of_session(cls, session, num_blocks: int, block_size: int, max_seq_len: int, max_batch_tokens: int = 512,
                   runs: SparseRuns = SparseRuns()) -> BatchEngine:
        """The server's engine for a session's model: many sequences over a paged KV cache of num_blocks *
        block_size rows."""
        return cls(session.parts(), num_blocks, block_size, max_seq_len, max_batch_tokens, runs)

    def release(self, seq_id: int) -> None:
        """The sequence's state row goes back to the pool (it finished, was cancelled or evicted); no-op otherwise."""
        row = self._state_of.pop(seq_id, None)
        if row is not None:
            self._free_states.append(row)

    def _state_row(self, w: SeqWork) -> int:
        row = self._state_of.get(w.seq_id)
        if row is None:
            if w.start != 0:
                raise PyinferError(f"sequence {w.seq_id}: a recurrent state starts at position 0, not {w.start}")
            if not self._free_states:
                raise PyinferError(f"sequence {w.seq_id}: every one of the {len(self._state_of)} state rows is in use")
            row = self._state_of[w.seq_id] = self._free_states.pop()
        return row

    def sparse_layers(self) -> float:
        """Share of FFN layers that took the sparse path in the last run (0 without a sparsity plan)."""
        return self.running.sparse_share()

    def _check_blocks(self, work: list[SeqWork]) -> None:
        """Every block table holds distinct ids in [0, num_blocks), long enough for its tokens, and no two
        sequences share a block (each would overwrite the other's KV)."""
        for w in work:
            if len(w.blocks) > self.max_blocks:
                raise PyinferError(f"sequence {w.seq_id}: {len(w.blocks)} blocks; at most {self.max_blocks}")
            if w.start < 0 or w.start + len(w.tokens) > len(w.blocks) * self.block_size:
                raise PyinferError(f"sequence {w.seq_id}: positions {w.start}..{w.start + len(w.tokens) - 1} "
                                   f"are not covered by its {len(w.blocks)} KV blocks")
        blocks = np.fromiter((b for w in work for b in w.blocks), np.int64)
        if blocks.size and (blocks.min() < 0 or blocks.max() >= self.num_blocks):
            bad = int(blocks[(blocks < 0) | (blocks >= self.num_blocks)][0])
            raise PyinferError(f"KV block {bad} out of range [0, {self.num_blocks})")
        if np.unique(blocks).size != blocks.size:
            raise PyinferError("a KV block is listed twice in this step's block tables")

    def step(self, work: list[SeqWork]) -> dict[int, np.ndarray]:
        """Runs every sequence's tokens; returns F32 [vocab] logits after each sequence's last token. A sequence
        with `score` also has its tokens after the first scored by the logits before them (the prompt's
        log-probabilities, `echo`): self.scores[seq_id] = [runtime.sampling.token_logprob(...), ...], this step's."""
        self._check_blocks(work)
        rows_of = {w.seq_id: self._state_row(w) for w in work} if self.state_blocks else {}
        feed = [(w, i) for w in work for i in range(len(w.tokens))]
        out: dict[int, np.ndarray] = {}
        self.scores = {}
        for c0 in range(0, len(feed), self.max_batch_tokens):
            chunk = feed[c0:c0 + self.max_batch_tokens]
            n = len(chunk)
            tokens = np.empty(n, np.int32)
            positions = np.empty(n, np.int32)
            slots = np.empty(n, np.int32)
            table = np.zeros((n, self.max_blocks), np.int32)
            states = np.array([rows_of[w.seq_id] for w, _ in chunk], np.int32) if rows_of else None
            out_rows, out_of = [], []
            for row, (w, i) in enumerate(chunk):
                pos = w.start + i
                tokens[row], positions[row] = w.tokens[i], pos
                slots[row] = w.blocks[pos // self.block_size] * self.block_size + pos % self.block_size
                table[row, :len(w.blocks)] = w.blocks
                if i == len(w.tokens) - 1 or w.score is not None:
                    out_rows.append(row)
                    out_of.append((w, i))
            self.running.run(n, tokens, positions, np.asarray(out_rows, np.int32), slots, table, states)
            if out_rows:
                logits = self.running.logits()
                for k, (w, i) in enumerate(out_of):
                    if i == len(w.tokens) - 1:
                        out[w.seq_id] = np.array(logits[k])
                    elif w.score is not None:  # row i's logits score the sequence's token i + 1
                        self.scores.setdefault(w.seq_id, []).append(token_logprob(logits[k], w.tokens[i + 1],
                                                                                   w.score))
        return out
