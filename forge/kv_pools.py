"""The paged KV cache's block pools, and the blocks each sequence holds in them.

Layers that attend to every position share one pool sized for the context. Where the runner
keeps sliding-window layers' cache apart (`Runner.windowed_kv`), each window has a pool of its
own in which a sequence holds only the blocks its window still reaches: blocks that leave the
window go back to the pool (`SeqBlocks.trim`) and serve other sequences. A window pool is sized
for `max_seqs` sequences of window + one prefill chunk each, never more than the full pool.
"""

from __future__ import annotations

import numpy as np

from forge.kv_cache import BlockAllocator, BlockTable
from forge.models.spec import ModelSpec

FREED = -1  # a window table's entry for a block that left the window
BLOCK_SIZE = 16  # positions per KV block


def kept_windows(spec: ModelSpec, n_ctx: int) -> tuple[int, ...]:
    """The sliding windows (ascending) that keep a pool of their own at an `n_ctx` context:
    those shorter than it."""
    return tuple(sorted({w for w in (ls.sliding_window for ls in spec.layers) if w and w < n_ctx}))


def layer_positions(spec: ModelSpec, n_ctx: int, chunk: int, max_seqs: int = 1) -> list[int]:
    """Cache positions each layer allocates where windowed layers are kept apart: n_ctx (in
    whole blocks) for full layers, their pool's for windowed ones (the memory estimates)."""
    pools = KvPools(n_ctx, BLOCK_SIZE, kept_windows(spec, n_ctx), max_seqs, chunk)
    blocks = pools.window_blocks()
    return [blocks.get(ls.sliding_window, pools.full.n_blocks) * BLOCK_SIZE for ls in spec.layers]


class WindowTable(BlockTable):
    """A sequence's blocks in a sliding window's pool; entries below the window are FREED."""

    def __init__(self, allocator: BlockAllocator, max_positions: int, window: int):
        super().__init__(allocator, max_positions)
        self.window = window
        self._trimmed = 0  # blocks before this index are freed

    def trim(self, first_query: int) -> None:
        """Free the blocks that no query at position `first_query` or later reads (every
        position below first_query - window + 1)."""
        keep_from = max(0, first_query - self.window + 1) // self.allocator.block_size
        gone = [b for b in self.blocks[self._trimmed : keep_from] if b != FREED]
        if gone:
            self.allocator.free(gone)
            self.blocks[self._trimmed : keep_from] = [FREED] * (keep_from - self._trimmed)
            self._array = None
        self._trimmed = max(self._trimmed, keep_from)

    def release(self) -> None:
        held = [b for b in self.blocks if b != FREED]
        if held:
            self.allocator.free(held)
        self.blocks, self._array, self._room, self._trimmed = [], None, 0, 0


class SeqBlocks:
    """One sequence's blocks in every pool: `array()` for the full layers, `window_arrays()`
    for the window pools (in `KvPools.windows` order)."""

    def __init__(self, pools: KvPools):
        self.full = BlockTable(pools.full, pools.n_ctx)
        self.windows = [WindowTable(pools.windowed[w], pools.n_ctx, w) for w in pools.windows]

    def ensure(self, n_positions: int) -> None:
        """Room for positions 0 .. n_positions - 1 in every pool (OutOfMemoryError, having
        taken nothing more, when one pool has too few blocks left)."""
        tables = [self.full, *self.windows]
        for t in tables:  # all or nothing
            missing = t.blocks_missing(n_positions)
            if missing > t.allocator.n_free:
                t.allocator.allocate(missing)  # raises OutOfMemoryError, naming the shortfall
        for t in tables:
            t.ensure(n_positions)

    def trim(self, first_query: int) -> None:
        """Free window blocks that queries from `first_query` on no longer read."""
        for t in self.windows:
            t.trim(first_query)

    def array(self) -> np.ndarray:
        return self.full.array()

    def window_arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(t.array() for t in self.windows)

    def release(self) -> None:
        self.full.release()
        for t in self.windows:
            t.release()


class KvPools:
    """The block pools of one model's cache (`windows`: the sliding windows kept apart)."""

    def __init__(self, n_ctx: int, block_size: int, windows: tuple[int, ...] = (),
                 max_seqs: int = 1, chunk: int = 256):  # fmt: skip
        self.n_ctx, self.block_size, self.windows = n_ctx, block_size, tuple(sorted(windows))
        self.full = BlockAllocator(-(-n_ctx // block_size), block_size)
        # a step's window: its chunk and the window before it, one position more for the step
        # in flight beside it, over block boundaries
        self.per_seq = {w: -(-(w + chunk) // block_size) + 2 for w in self.windows}
        self.windowed = {
            w: BlockAllocator(min(self.full.n_blocks, max_seqs * self.per_seq[w]), block_size)
            for w in self.windows
        }

    def table(self) -> SeqBlocks:
        return SeqBlocks(self)

    def window_blocks(self) -> dict[int, int]:
        """{window: blocks of its pool} (what the runner allocates for those layers)."""
        return {w: a.n_blocks for w, a in self.windowed.items()}

    def can_admit(self, n_positions: int) -> bool:
        """Whether a new sequence of `n_positions` fits in every pool's free blocks now."""
        need = self.full.blocks_for(n_positions)
        if need > self.full.n_free:
            return False
        return all(min(need, self.per_seq[w]) <= a.n_free for w, a in self.windowed.items())

    @property
    def usage(self) -> float:
        """The fullest pool's share of blocks in use."""
        return max([self.full.usage] + [a.usage for a in self.windowed.values()])
