"""A step's row metadata: what the kernels read about each token row, filled on the host and
uploaded by one host->device copy per step.

`RowMeta` holds ids, positions, cache slots, block tables and the rows whose logits are wanted;
`SampleMeta` adds every row's sampling parameters (sampling.hip's fields). `prepare` fills them
for one piece of a batch (`chunks` cuts batches into pieces the workspace holds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from forge.backend import DeviceSampling, SeqBatch
from forge_hip.block_tables import Pools, check_range, fill_tables
from forge_hip.runtime.base import DeviceBuffer, Runtime

Pick = DeviceSampling | None


class PoolRows(NamedTuple):
    """What attention reads of one block pool's rows (device addresses): positions, cache slots,
    the flat block tables and each row's offset in them."""

    pos: int
    slots: int
    bt: int
    btoff: int


POOL_FIELDS = ("slots", "btoff")  # a window pool's own fields (its block tables: in bt)


class RowMeta:
    """Per-row int32 metadata in one device buffer, written by one host->device copy per step:
    ids, pos, slots, btoff (offset of the row's block table in bt), outidx (rows whose logits are
    wanted), feed (the row of the previous step's picked ids that replaces ids, or -1), each
    window pool's slots and btoff (`pools` - 1 of them), then the flat block tables `bt` (the
    full pool's, then each window pool's)."""

    FIELDS: tuple[str, ...] = ("ids", "pos", "slots", "btoff", "outidx", "feed")

    def __init__(self, rt: Runtime, rows: int, bt_cap: int, pools: int = 1):
        self.rt, self.rows = rt, rows
        self.buffer: DeviceBuffer | None = None
        self.set_pools(pools, bt_cap)

    def set_pools(self, pools: int, bt_cap: int | None = None) -> None:
        """Fields for `pools` block pools (a new buffer when that changes: graphs are stale)."""
        if self.buffer is not None and pools == self.pools:
            return
        self.pools = pools
        self.fields = self.FIELDS + tuple(f"{f}{j}" for j in range(1, pools) for f in POOL_FIELDS)
        self._alloc(bt_cap or self.bt_cap)

    def _alloc(self, bt_cap: int) -> None:
        self.close()
        self.bt_cap = bt_cap
        self.host = np.zeros(len(self.fields) * self.rows + bt_cap, np.int32)
        self.buffer = self.rt.alloc(self.host.nbytes)
        for i, name in enumerate(self.fields):
            setattr(self, name, self.buffer.ptr + 4 * i * self.rows)
        self.bt = self.buffer.ptr + 4 * len(self.fields) * self.rows

    def field(self, name: str) -> np.ndarray:
        i = self.fields.index(name)
        return self.host[i * self.rows : (i + 1) * self.rows]

    def pool(self, j: int) -> PoolRows:
        """The rows' fields for block pool j (0: the full layers'; `KvCache.pool`)."""
        if j == 0:
            return PoolRows(self.pos, self.slots, self.bt, self.btoff)
        return PoolRows(self.pos, getattr(self, f"slots{j}"), self.bt, getattr(self, f"btoff{j}"))

    def ensure_bt(self, n: int) -> bool:
        """Make room for n block-table entries; True if the buffer moved (graphs are stale)."""
        if n <= self.bt_cap:
            return False
        self._alloc(max(n, 2 * self.bt_cap))
        return True

    def bt_host(self) -> np.ndarray:
        return self.host[len(self.fields) * self.rows :]

    def upload(self, n_bt: int, stream) -> None:  # noqa: ANN001
        used = len(self.fields) * self.rows + n_bt
        self.rt.copy_to_device(self.buffer, self.host[:used], stream)

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None


# sampling.hip's parameter fields, one int32 word per row each (doubles and the key: two words),
# at the word offsets contract.h's F_* give.
SAMPLE_FIELDS = ("s_temp", "s_topk", "s_topp0", "s_topp1", "s_lminp0", "s_lminp1", "s_key0",
                 "s_key1", "s_ctr")  # fmt: skip


class SampleMeta(RowMeta):
    """RowMeta plus every row's sampling parameters, uploaded in the same copy."""

    FIELDS = RowMeta.FIELDS + SAMPLE_FIELDS

    def set_picks(self, n_rows: int, picks: list[tuple[int, DeviceSampling]]) -> None:
        """Rows 0 .. n_rows - 1 take the argmax, except those given (row, how to pick)."""
        self.field("s_temp")[:n_rows] = 0  # the bits of 0.0f
        for row, p in picks:
            if p.temperature == 0.0:  # the argmax: s_temp 0 is all sample_rows reads
                continue
            words = np.array([p.top_p, p.log_min_p], np.float64).view(np.int32)
            key = np.array([p.key & 0xFFFFFFFFFFFFFFFF], np.uint64).view(np.int32)
            values = (
                np.float32(p.temperature).view(np.int32),
                p.top_k,
                words[0],
                words[1],
                words[2],
                words[3],
                key[0],
                key[1],
                np.uint32(p.counter).view(np.int32),
            )
            for name, value in zip(SAMPLE_FIELDS, values):
                self.field(name)[row] = value

    @property
    def params(self) -> tuple[int, int]:
        """(device address of the first field, words between fields), as sample_rows wants."""
        return self.s_temp, self.rows


def chunks(batch: list[SeqBatch], row_cap: int) -> Iterator[tuple[list[SeqBatch], list[int]]]:
    """Cut the batch into pieces of at most `row_cap` token rows, each with the batch index of
    its sequences (a sequence may be split: its later piece sees the earlier one's K/V, written
    first)."""
    if sum(len(b.tokens) for b in batch) <= row_cap and all(len(b.tokens) for b in batch):
        if batch:  # one piece: the batch as it is
            yield batch, list(range(len(batch)))
        return
    cur: list[SeqBatch] = []
    owners: list[int] = []
    used = 0
    for i, b in enumerate(batch):
        toks = np.asarray(b.tokens, dtype=np.int32).reshape(-1)
        lo = 0
        while lo < len(toks):
            take = min(len(toks) - lo, row_cap - used)
            end = lo + take == len(toks)
            out = b.output if b.output != "last" else ("last" if end else "none")
            cur.append(replace(b, tokens=toks[lo : lo + take], start=b.start + lo, output=out))
            owners.append(i)
            used, lo = used + take, lo + take
            if used == row_cap:
                yield cur, owners
                cur, owners, used = [], [], 0
    if cur:
        yield cur, owners


def prepare(meta: SampleMeta, n_vocab: int, kv: Pools, chunk: list[SeqBatch],
            moved: Callable[[], None], picks: list[Pick] | None = None,
            feed: list[int] | None = None) -> tuple[int, list[np.ndarray], int]:  # fmt: skip
    """Fill the host metadata of one piece (with each sequence's pick for its last row: `picks`,
    and the ids row its token comes from: `feed`, both aligned with `chunk`) for the block
    pools of `kv` (a KvCache); returns (rows, wanted rows per sequence, block-table entries).
    `moved()` is called at once when the block-table buffer had to grow (graphs pointing at it
    are stale). Vectorized over rows: a decode step's engine work waits for it."""
    if chunk and all(len(b.tokens) == 1 for b in chunk):
        return _prepare_decode(meta, n_vocab, kv, chunk, moved, picks, feed)
    return _prepare_rows(meta, n_vocab, kv, chunk, moved, picks, feed)


def _prepare_rows(meta, n_vocab, kv, chunk, moved, picks, feed):  # noqa: ANN001
    """`prepare` for pieces of any length."""
    n_seq = len(chunk)
    lens = np.fromiter((len(b.tokens) for b in chunk), np.int64, n_seq)
    starts = np.fromiter((b.start for b in chunk), np.int64, n_seq)
    at = int(lens.sum())
    tokens = np.concatenate([b.tokens for b in chunk]) if chunk else np.zeros(0, np.int32)
    check_range(tokens, n_vocab, "token id out of range 0..{}")
    need = (starts + lens - 1) // kv.block_size + 1
    first_row = np.cumsum(lens) - lens
    seq = np.repeat(np.arange(n_seq), lens)  # the piece each row belongs to
    pos = starts[seq] + np.arange(at) - first_row[seq]
    at_bt = fill_tables(meta, kv, chunk, need, pos, seq, moved)
    meta.field("ids")[:at] = tokens
    meta.field("pos")[:at] = pos
    ends = first_row + lens - 1
    none = np.zeros(0, np.int64)
    wanted = [
        ends[i : i + 1] if b.output == "last"
        else np.arange(first_row[i], ends[i] + 1) if b.output == "all" else none
        for i, b in enumerate(chunk)
    ]  # fmt: skip
    out = np.concatenate(wanted) if wanted else none
    meta.field("outidx")[: len(out)] = out
    fed = meta.field("feed")
    fed[:at] = -1
    if feed is not None:
        f = np.asarray(feed, np.int64)
        fed[first_row[f >= 0]] = f[f >= 0]
    meta.set_picks(at, [(int(e), p) for e, p in zip(ends, picks or ()) if p is not None])
    return at, wanted, at_bt


def _prepare_decode(meta, n_vocab, kv, chunk, moved, picks, feed):  # noqa: ANN001
    """`prepare` for pieces of one token each (a decode step): the same metadata, without the
    per-row bookkeeping of longer pieces (the server's 32-row steps wait for it)."""
    n_seq = len(chunk)
    tokens = np.concatenate([b.tokens for b in chunk])
    check_range(tokens, n_vocab, "token id out of range 0..{}")
    pos = np.fromiter((b.start for b in chunk), np.int64, n_seq)
    at_bt = fill_tables(meta, kv, chunk, pos // kv.block_size + 1, pos, np.arange(n_seq), moved)
    meta.field("ids")[:n_seq] = tokens
    meta.field("pos")[:n_seq] = pos
    one = one_rows(n_seq)  # row i of the step: piece i's one output row, unless "none"
    wanted = [one[i] if b.output != "none" else one[-1] for i, b in enumerate(chunk)]
    out = np.concatenate(wanted)
    meta.field("outidx")[: len(out)] = out
    meta.field("feed")[:n_seq] = -1 if feed is None else feed
    meta.set_picks(n_seq, [(i, p) for i, p in enumerate(picks or ()) if p and p.temperature])
    return n_seq, wanted, at_bt


@lru_cache(maxsize=256)
def one_rows(n: int) -> tuple[np.ndarray, ...]:
    """[i] for i < n as n one-element int64 arrays, then an empty one (shared: read only)."""
    rows = np.arange(n)
    out = tuple(rows[i : i + 1] for i in range(n)) + (rows[:0],)
    for a in out:
        a.flags.writeable = False
    return out
