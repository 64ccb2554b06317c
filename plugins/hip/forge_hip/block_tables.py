"""A step's block tables on the device: every pool's (the full layers', then each sliding
window's: `KvCache.pool_blocks`), flat in `RowMeta.bt`, with each row's offset into its pool's
tables and its cache slot in that pool.

A window pool's table names FREED (-1) for blocks that left the window (`forge.kv_pools`); the
kernels read only positions inside a row's window, so those entries are written as block 0 (a
valid address, never read), after checking that no row's window reaches one.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from forge.backend import SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError
from forge.kv_pools import FREED


class Pools(Protocol):  # what a KvCache tells about its pools
    block_size: int
    windows: tuple[int, ...]
    pool_blocks: tuple[int, ...]


def fill_tables(meta, kv: Pools, chunk: list[SeqBatch], need: np.ndarray, pos: np.ndarray,
                seq: np.ndarray, moved) -> int:  # noqa: ANN001 - a RowMeta; a callable  # fmt: skip
    """Write the block tables of `chunk` (sequence i: its first need[i] entries, in every pool),
    and for each row (at position pos[r], of sequence seq[r]) its slot and table offset per pool,
    into `meta`'s host arrays. `moved()` is called at once when the table buffer had to grow.
    Returns the table entries written."""
    rows, bs = len(pos), kv.block_size
    per_pool = int(need.sum())
    if meta.ensure_bt(per_pool * len(kv.pool_blocks)):
        moved()
    first = np.cumsum(need) - need
    btoff, in_table = first[seq], first[seq] + pos // bs
    for j, n_blocks in enumerate(kv.pool_blocks):
        flat = _pool_tables(chunk, need, j, len(kv.windows))
        if j:
            _check_window(flat, chunk, need, first, kv.windows[j - 1], bs)
            flat = np.where(flat == FREED, 0, flat)
        check_range(flat, n_blocks, "block table names a block outside 0..{}")
        name = "" if j == 0 else str(j)
        meta.field("slots" + name)[:rows] = flat[in_table] * bs + pos % bs
        meta.field("btoff" + name)[:rows] = btoff + j * per_pool
        meta.bt_host()[j * per_pool : (j + 1) * per_pool] = flat
    return per_pool * len(kv.pool_blocks)


def _pool_tables(chunk: list[SeqBatch], need: np.ndarray, j: int, n_windows: int) -> np.ndarray:
    """The first need[i] entries of each sequence's table in pool j, concatenated
    (ContextOverflowError when a table is shorter)."""
    parts = []
    for b, k in zip(chunk, need.tolist()):
        if j == 0:
            table = b.block_table
        elif len(b.window_tables) != n_windows:
            raise ForgeRuntimeError(f"{len(b.window_tables)} window tables for "
                                    f"{n_windows} window pools")  # fmt: skip
        else:
            table = b.window_tables[j - 1]
        table = np.asarray(table, dtype=np.int32).reshape(-1)
        if len(table) < k:
            raise ContextOverflowError(
                f"sequence position {b.start + len(b.tokens) - 1} has no KV block "
                f"(block table of {len(table)})"
            )
        parts.append(table[:k])
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def _check_window(flat: np.ndarray, chunk: list[SeqBatch], need: np.ndarray, first: np.ndarray,
                  window: int, bs: int) -> None:  # fmt: skip
    """ForgeRuntimeError when a block some row's window reads has left the pool (FREED). Only
    the entries the windows read are looked at (a long sequence's table is mostly FREED)."""
    if not (flat == FREED).any():
        return
    starts = np.fromiter((b.start for b in chunk), np.int64, len(chunk))
    lowest = np.maximum(starts - window + 1, 0) // bs  # the first block a piece's rows read
    count = need - lowest  # entries lowest .. need - 1 of each table
    run = np.cumsum(count) - count
    read = np.repeat(first + lowest - run, count) + np.arange(int(count.sum()))
    bad = flat[read] == FREED
    if bad.any():
        i = int(np.searchsorted(run, np.argmax(bad), side="right") - 1)
        raise ForgeRuntimeError(f"sequence position {int(starts[i])}: a block of its window of "
                                f"{window} positions has left the window's pool")  # fmt: skip


def check_range(values: np.ndarray, n: int, message: str) -> None:
    """Raise `message` (its {} filled with n - 1) unless every value lies in 0 .. n - 1."""
    if len(values) and (values.min() < 0 or values.max() >= n):
        raise ForgeRuntimeError(message.format(n - 1))
