"""Paged KV-cache bookkeeping: fixed-size blocks, a block table per sequence.

The storage itself belongs to the backend's runner (`Runner.allocate_kv`); this module decides
which physical blocks each sequence uses, so sequences of any length share one pool and a finished
or cancelled sequence gives its blocks back at once.
"""

from __future__ import annotations

import enum

import numpy as np

from forge.errors import ContextOverflowError, OutOfMemoryError


class KvFormat(enum.Enum):
    """How a runner stores K and V: the element type of its cache. Attention reads the stored
    format directly."""

    F32 = "f32"
    F16 = "f16"

    @property
    def bytes_per_value(self) -> int:
        return {KvFormat.F32: 4, KvFormat.F16: 2}[self]


class BlockAllocator:
    """A pool of `n_blocks` KV blocks of `block_size` positions each."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks <= 0 or block_size <= 0:
            raise ValueError("n_blocks and block_size must be positive")
        self.n_blocks, self.block_size = n_blocks, block_size
        self._free = list(range(n_blocks - 1, -1, -1))

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - len(self._free) / self.n_blocks

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfMemoryError(
                f"KV cache full: {n} more blocks needed, {len(self._free)} of {self.n_blocks} free"
            )
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class BlockTable:
    """The blocks of one sequence, in position order."""

    def __init__(self, allocator: BlockAllocator, max_positions: int):
        self.allocator = allocator
        self.max_positions = max_positions
        self.blocks: list[int] = []
        self._array: np.ndarray | None = None  # `blocks` as int32, rebuilt when they change
        self._room = 0  # positions the blocks hold (at most max_positions)

    def ensure(self, n_positions: int) -> None:
        """Make room for positions 0 .. n_positions-1 (allocating blocks as needed)."""
        if n_positions <= self._room:  # (every decode step of every sequence asks)
            return
        if n_positions > self.max_positions:
            raise ContextOverflowError(
                f"sequence needs {n_positions} positions, the context holds {self.max_positions}"
            )
        missing = self.allocator.blocks_for(n_positions) - len(self.blocks)
        if missing > 0:
            self.blocks += self.allocator.allocate(missing)
            self._array = None
        self._room = min(len(self.blocks) * self.allocator.block_size, self.max_positions)

    def array(self) -> np.ndarray:
        """The block ids as int32 (the same array until the blocks change: do not modify)."""
        if self._array is None:
            self._array = np.asarray(self.blocks, dtype=np.int32)
        return self._array

    def release(self) -> None:
        """Give every block back (idempotent)."""
        if self.blocks:
            self.allocator.free(self.blocks)
            self.blocks = []
            self._array = None
            self._room = 0
