"""Paged KV blocks, in integers: block ids and counts. A request holding t tokens owns ceil(t/B) blocks, and a
request of a hybrid model (linear-attention layers with a recurrent state) also a fixed number of state blocks,
held apart from its KV table from admission to its end."""
from __future__ import annotations


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 1):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # stack: low ids are handed out first
        self._tables: dict[int, list[int]] = {}
        self._states: dict[int, list[int]] = {}

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def table(self, req_id: int) -> list[int]:
        return self._tables.get(req_id, [])

    def grow(self, req_id: int, tokens: int) -> bool:
        """Ensures req_id owns enough blocks for `tokens`; False (and no change) if blocks run out."""
        table = self._tables.setdefault(req_id, [])
        need = self.blocks_for(tokens) - len(table)
        if need > len(self._free):
            if not table:
                del self._tables[req_id]
            return False
        for _ in range(max(0, need)):
            table.append(self._free.pop())
        return True

    def hold_state(self, req_id: int, blocks: int) -> bool:
        """Gives req_id `blocks` state blocks (once; 0: nothing); False (and no change) if blocks run out."""
        if blocks <= 0 or req_id in self._states:
            return True
        if blocks > len(self._free):
            return False
        self._states[req_id] = [self._free.pop() for _ in range(blocks)]
        return True

    def free(self, req_id: int) -> int:
        """Releases every block of req_id at once, its state blocks included; returns how many."""
        table = self._tables.pop(req_id, []) + self._states.pop(req_id, [])
        self._free.extend(reversed(table))
        return len(table)
