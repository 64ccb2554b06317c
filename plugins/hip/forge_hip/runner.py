"""HipRunner: a model on one GPU. Weights in one arena, a paged float16 KV cache, forward passes
over mixed batches (prefill chunks and decode tokens), and graph-replayed decode steps.

A decode step (every sequence adds one token) is captured once per batch size and replayed:
positions, slots, block tables, token ids and sampling parameters live in one device buffer
refreshed by a single host->device copy, so Python launches nothing per token. Greedy decode
(`forward_argmax`) and sampling (`forward_sample`: top-k / top-p / min-p / temperature with a
counter-based generator) pick tokens on the device and copy back only their ids;
`start_sample` returns as soon as such a step is queued on the stream, so the engine's host work
runs while the GPU computes. Its `feed` takes a sequence's next token from the ids an earlier
started step picked, still on the device: the engine starts step N+1 before it reads step N's
tokens, and the GPU never waits for the host between decode steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from forge.backend import DeviceSampling, Runner, SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError, UnsupportedModelError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.models.spec import ModelSpec
from forge_hip.arena import WeightArena, layout, preflight
from forge_hip.executor import GraphCache, Launcher
from forge_hip.kv import KvCache, RowMeta, kv_bytes
from forge_hip.library import KernelLibrary
from forge_hip.plan import ADD_NORM_PER, Plan
from forge_hip.workspace import MAX_SPLITS, ROW_CAP, Workspace, out_rows, workspace_bytes

Pick = DeviceSampling | None

DEFAULT_CTX = 4096  # context the load-time preflight assumes when the caller gives none
MAX_HEAD_DIM = 512  # attention.hip's LAYER_MAX_D
SPLIT_LEN = 128  # attention.hip's ATT_SPLIT_MIN: positions per split at least
# Passes of up to this many rows that are not decode steps (a prompt chunk, or prompt and decode
# rows together: what a server runs when requests arrive) are graph-captured per row count
# too: their launches depend on the row count alone, and launched one by one from Python they
# cost about 14.5 us each against 2.8 in a graph (tests/gpu/test_runtime_graphs.py). 128: a
# full batch of 32 decoding sequences plus a few ~20-token prompts.
PASS_GRAPH_ROWS = 128
DECODE_GRAPH_ROWS = 64  # decode steps of up to this many rows (and out_rows) replay a graph
# sampling.hip's parameter fields, one int32 word per row each (doubles and the key: two words)
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


def kv_is_f16(spec: ModelSpec, gguf: GGUFFile) -> bool:
    """float16 KV unless every matrix is F32 (their golden bounds are below f16 rounding);
    $FORGE_HIP_KV ("f16" or "f32") overrides."""
    forced = os.environ.get("FORGE_HIP_KV", "").lower()
    if forced in ("f16", "f32"):
        return forced == "f16"
    return any(gguf.tensors[n].type != "F32" for n in spec.weight_names() if "norm" not in n)


def memory_needed(spec: ModelSpec, gguf: GGUFFile, n_ctx: int) -> dict[str, int]:
    """Device bytes for weights, an `n_ctx` KV cache and the workspace."""
    return {
        "weights": layout(spec, gguf)[1],
        "kv_cache": kv_bytes(spec, n_ctx, kv_is_f16(spec, gguf)),
        "workspace": workspace_bytes(spec),
    }


def check_spec(spec: ModelSpec) -> None:
    if max(spec.head_dim, spec.head_dim_v) > MAX_HEAD_DIM:
        raise UnsupportedModelError(f"hip supports head dims up to {MAX_HEAD_DIM}")
    if spec.head_dim % 8 or spec.head_dim_v % 8:  # attention.hip reads K/V rows in 16-byte words
        raise UnsupportedModelError("hip needs head dims that are multiples of 8")
    if spec.n_embd > 1024 * ADD_NORM_PER:  # add_norm holds a row in one block's registers
        raise UnsupportedModelError(f"hip supports n_embd up to {1024 * ADD_NORM_PER}")
    if spec.n_head % spec.n_head_kv or spec.rope_dim > spec.head_dim or spec.rope_dim % 2:
        raise UnsupportedModelError("hip needs n_head % n_head_kv == 0 and an even rope_dim")


class HipRunner(Runner):
    samples_on_device = True
    feeds_picks = True

    def __init__(
        self,
        spec: ModelSpec,
        gguf: GGUFFile,
        kernels: KernelTable,
        *,
        device: int = 0,
        progress: Callable[[int, int], None] | None = None,
        n_ctx: int | None = None,
        runtime=None,  # noqa: ANN001 - a forge_hip Runtime to share (tests); None opens one
    ):
        from forge_hip.runtime import open_runtime

        check_spec(spec)
        self.spec = spec
        self.arena = self.ws = self.kv = self.meta = None
        self._unfetched: list[_Deferred] = []  # started steps' results not read yet, oldest first
        self._source: _Source | None = None  # the last started step, for the next one's feed
        self._picked_host: list[np.ndarray] = []  # page-locked ids of async steps, two in turn
        self._own_rt = runtime is None
        self.rt = runtime or open_runtime(None, device)
        try:
            self.kv_f16 = kv_is_f16(spec, gguf)
            ctx = min(n_ctx or DEFAULT_CTX, spec.n_ctx_train)
            preflight(self.rt, memory_needed(spec, gguf, ctx))
            self.lib = KernelLibrary(self.rt)
            self.arena = WeightArena(self.rt, spec, gguf, progress)
            self.ws = Workspace(self.rt, spec)
            self.rt.copy_to_device(self.ws.att_cnt, np.zeros(ROW_CAP * spec.n_head, np.uint32))
            self.rt.copy_to_device(self.ws.smp_cnt, np.zeros(out_rows(spec), np.uint32))
            self.stream = self.rt.stream()
            self.launch = Launcher(self.rt, self.stream)
            self.graphs = GraphCache(self.launch)
            self.plan = Plan(
                spec, kernels, self.lib, self.arena, self.ws, self.launch, self.rt.props.warp_size
            )
            self.meta = SampleMeta(self.rt, ROW_CAP, 1024)
            self.out_rows = out_rows(spec)
            self._decode_graph_rows = min(self.out_rows, DECODE_GRAPH_ROWS)
            self.use_graphs = True
            for _ in range(2):  # each kept at once: close() frees what was taken
                self._picked_host.append(self.rt.alloc_host(4 * self.out_rows))
            self._picked_done = [self.rt.event() for _ in range(2)]
            self._slot = 0  # the _picked_host entry the next async step copies its ids into
        except BaseException:
            self.close()
            raise

    # -- cache -------------------------------------------------------------------------------------
    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        self._settle()  # a started step may still write the cache being replaced
        self.rt.bind()
        if self.kv is not None:
            self.kv.close()
            self.kv = None
        self.graphs.clear()
        self.kv = KvCache(self.rt, self.spec, n_blocks, block_size, self.kv_f16)
        n_slots = n_blocks * block_size
        self.splits = max(1, min(MAX_SPLITS, -(-n_slots // SPLIT_LEN)))

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        return self._forward(batch, ids=False)

    def forward_argmax(self, batch: list[SeqBatch]) -> list[int]:
        rows = self._forward([SeqBatch(b.tokens, b.start, b.block_table, "last") for b in batch],
                             ids=True)  # fmt: skip
        return [int(r[-1]) for r in rows if r is not None and len(r)]

    def forward_sample(self, batch: list[SeqBatch], picks: list[Pick]) -> list[int | None]:
        return self.start_sample(batch, picks)()

    def start_sample(
        self,
        batch: list[SeqBatch],
        picks: list[Pick],
        feed: list[int] | None = None,
        feed_from: Callable[[], list] | None = None,
    ) -> Callable[[], list]:
        """Queue the pass and return; a graph-replayed decode step's ids are read (waiting for
        the event recorded after their copy) only when the returned function is called. Other
        passes run now. `feed[i] >= 0`: sequence i's one token is the id that the step
        `feed_from` (an earlier start_sample's function, not necessarily called yet) picked for
        its batch row feed[i]: copied on the device when it is the last step started and its ids
        are still there, else read first."""
        if len(picks) != len(batch) or (feed is not None and len(feed) != len(batch)):
            raise ForgeRuntimeError(f"{len(picks)} picks (and feed) for a batch of {len(batch)}")
        outs = ["last" if p is not None else "none" for p in picks]
        lasts = [b if b.output == o else SeqBatch(b.tokens, b.start, b.block_table, o)
                 for b, o in zip(batch, outs)]  # fmt: skip
        fed = [(i, f) for i, f in enumerate(feed or ()) if f >= 0]
        src, on_device = self._source, None
        if fed:
            on_device = self._feed_source(lasts, fed, feed_from)
        pieces = self._begin(lasts, keep=src.result if on_device is not None else None)
        if len(pieces) == 1 and len(pieces[0][0]) == len(batch):  # one piece per sequence
            fetch = self._launch(pieces[0][0], True, picks, on_device)
            in_am = getattr(fetch, "in_am", None)  # set when its ids stay in ws.am
        else:
            rows = self._forward(lasts, ids=True, picks=picks, pieces=pieces)
            fetch = lambda: rows  # noqa: E731
            in_am = None  # ws.am holds the last piece's ids only
        last_ids = getattr(fetch, "last_ids", None)  # one piece per sequence: no arrays
        if last_ids is not None:
            result = _Deferred(lambda: [None if p is None else t
                                        for t, p in zip(last_ids(), picks)])  # fmt: skip
        else:
            result = _Deferred(lambda: [None if p is None else int(r[-1])
                                        for r, p in zip(fetch(), picks)])  # fmt: skip
        self._unfetched.append(result)
        self._source = _Source(result, in_am)
        return result

    def _feed_source(
        self, lasts: list[SeqBatch], fed: list[tuple[int, int]], feed_from: Callable | None
    ) -> list[int] | None:
        """Check `fed` (batch row, source row) against the step `feed_from`. Returns the feed
        field (per row: the ids row to copy, or -1) when that step is the last one started, its
        ids are still on the device and the pass is one piece; otherwise reads them and writes
        them into `lasts`."""
        if feed_from is None:
            raise ForgeRuntimeError("feed names no step to take the tokens from (feed_from)")
        sizes = [len(b.tokens) for b in lasts]
        if any(sizes[i] != 1 for i, _ in fed):
            raise ForgeRuntimeError("a fed sequence adds exactly one token")
        src = self._source
        in_am = src.in_am if src is not None and src.result is feed_from else None
        on_device = False
        if in_am is not None:
            rows = np.fromiter((f for _, f in fed), np.int64, len(fed))
            on_device = bool((rows < len(in_am)).all() and (in_am[rows] >= 0).all())
        if on_device and sum(sizes) <= ROW_CAP and all(sizes):
            field = [-1] * len(lasts)
            for i, f in fed:
                field[i] = int(in_am[f])
            return field
        picked = feed_from()
        for i, f in fed:
            token = picked[f] if f < len(picked) else None
            if token is None:
                raise ForgeRuntimeError(f"feed names row {f}, which picked no token")
            b = lasts[i]
            lasts[i] = SeqBatch(np.array([token], np.int32), b.start, b.block_table, b.output)
        return None

    def _begin(self, batch: list[SeqBatch], keep=None) -> list[tuple[list[SeqBatch], list[int]]]:  # noqa: ANN001
        """Settle started steps' results but `keep` (they are read before anything overwrites
        them), then cut `batch` into pieces (`_chunks`)."""
        self._settle(keep)
        if self._source is not None and self._source.result is not keep:
            self._source = _Source(self._source.result, None)  # its ids will be overwritten
        self.rt.bind()
        if self.kv is None:
            raise ForgeRuntimeError("allocate_kv() must be called before forward()")
        return list(self._chunks(batch))

    def _settle(self, keep=None) -> None:  # noqa: ANN001
        """Read started steps' results now (their passes are done before this returns), all
        but `keep`."""
        started, self._unfetched = self._unfetched, [d for d in self._unfetched if d is keep]
        for d in started:
            if d is not keep:
                d.settle()

    def _forward(self, batch: list[SeqBatch], ids: bool, picks: list[Pick] | None = None,
                 pieces: list | None = None) -> list:  # fmt: skip
        """Logits (ids False) or picked token ids (ids True: argmax unless `picks` says how)
        of the rows each sequence's `output` asks for. `pieces`: `_begin(batch)`, if taken."""
        parts: list[list[np.ndarray]] = [[] for _ in batch]
        for chunk, owners in pieces if pieces is not None else self._begin(batch):
            how = [picks[o] if picks and b.output == "last" else None
                   for b, o in zip(chunk, owners)]  # fmt: skip
            for owner, rows in zip(owners, self._launch(chunk, ids, how)()):
                if rows is not None:
                    parts[owner].append(rows)
        out = []
        for b, p in zip(batch, parts):
            if b.output == "none":
                out.append(None)
            elif p:
                out.append(np.concatenate(p))
            else:
                out.append(np.zeros((0,) if ids else (0, self.spec.n_vocab), np.float32))
        return out

    def _chunks(self, batch: list[SeqBatch]):
        """Cut the batch into pieces of at most ROW_CAP token rows (a sequence may be split:
        its later piece sees the earlier one's K/V, written first)."""
        if sum(len(b.tokens) for b in batch) <= ROW_CAP and all(len(b.tokens) for b in batch):
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
                take = min(len(toks) - lo, ROW_CAP - used)
                end = lo + take == len(toks)
                out = b.output if b.output != "last" else ("last" if end else "none")
                cur.append(SeqBatch(toks[lo : lo + take], b.start + lo, b.block_table, out))
                owners.append(i)
                used, lo = used + take, lo + take
                if used == ROW_CAP:
                    yield cur, owners
                    cur, owners, used = [], [], 0
        if cur:
            yield cur, owners

    def _prepare(
        self, chunk: list[SeqBatch], picks: list[Pick] | None = None, feed: list[int] | None = None
    ) -> tuple[int, list[np.ndarray], int]:
        """Fill the host metadata (with each piece's pick for its last row: `picks`, and the
        ids row its token comes from: `feed`, both aligned with `chunk`); returns (rows, wanted
        rows per piece, block-table entries). Vectorized over rows: a decode step's engine work
        waits for it."""
        if chunk and all(len(b.tokens) == 1 for b in chunk):
            return self._prepare_decode(chunk, picks, feed)
        return self._prepare_rows(chunk, picks, feed)

    def _prepare_rows(
        self, chunk: list[SeqBatch], picks: list[Pick] | None, feed: list[int] | None
    ) -> tuple[int, list[np.ndarray], int]:
        """`_prepare` for pieces of any length."""
        s, kv, meta = self.spec, self.kv, self.meta
        bs = kv.block_size
        n_seq = len(chunk)
        lens = np.fromiter((len(b.tokens) for b in chunk), np.int64, n_seq)
        starts = np.fromiter((b.start for b in chunk), np.int64, n_seq)
        at = int(lens.sum())
        tokens = np.concatenate([b.tokens for b in chunk]) if chunk else np.zeros(0, np.int32)
        _check_range(tokens, s.n_vocab, "token id out of range 0..{}")
        need = (starts + lens - 1) // bs + 1
        tables = []
        for b, k in zip(chunk, need.tolist()):
            table = np.asarray(b.block_table, dtype=np.int32).reshape(-1)
            if len(table) < k:
                raise ContextOverflowError(
                    f"sequence position {b.start + len(b.tokens) - 1} has no KV block "
                    f"(block table of {len(table)})"
                )
            tables.append(table[:k])
        at_bt = int(need.sum())
        if meta.ensure_bt(at_bt):
            self.graphs.clear()
        flat = np.concatenate(tables) if tables else np.zeros(0, np.int32)
        _check_range(flat, kv.n_blocks, "block table names a block outside 0..{}")
        first_row = np.cumsum(lens) - lens
        first_bt = np.cumsum(need) - need
        seq = np.repeat(np.arange(n_seq), lens)  # the piece each row belongs to
        pos = starts[seq] + np.arange(at) - first_row[seq]
        btoff = first_bt[seq]
        meta.field("ids")[:at] = tokens
        meta.field("pos")[:at] = pos
        meta.field("slots")[:at] = flat[btoff + pos // bs] * bs + pos % bs
        meta.field("btoff")[:at] = btoff
        meta.bt_host()[:at_bt] = flat
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

    def _prepare_decode(
        self, chunk: list[SeqBatch], picks: list[Pick] | None, feed: list[int] | None
    ) -> tuple[int, list[np.ndarray], int]:
        """`_prepare` for pieces of one token each (a decode step): the same metadata, without
        the per-row bookkeeping of longer pieces (the server's 32-row steps wait for it)."""
        s, kv, meta = self.spec, self.kv, self.meta
        bs, n_seq = kv.block_size, len(chunk)
        tokens = np.concatenate([b.tokens for b in chunk])
        _check_range(tokens, s.n_vocab, "token id out of range 0..{}")
        pos = np.fromiter((b.start for b in chunk), np.int64, n_seq)
        need = pos // bs + 1
        tables = [b.block_table for b in chunk]
        have = np.fromiter(map(len, tables), np.int64, n_seq)
        if (have < need).any():
            i = int(np.argmax(have < need))
            raise ContextOverflowError(f"sequence position {int(pos[i])} has no KV block "
                                       f"(block table of {int(have[i])})")  # fmt: skip
        at_bt = int(need.sum())
        if meta.ensure_bt(at_bt):
            self.graphs.clear()
        flat = np.concatenate([t[:k] for t, k in zip(tables, need.tolist())])
        _check_range(flat, kv.n_blocks, "block table names a block outside 0..{}")
        btoff = np.cumsum(need) - need
        meta.field("ids")[:n_seq] = tokens
        meta.field("pos")[:n_seq] = pos
        meta.field("slots")[:n_seq] = flat[btoff + pos // bs] * bs + pos % bs
        meta.field("btoff")[:n_seq] = btoff
        meta.bt_host()[:at_bt] = flat
        one = _one_rows(n_seq)  # row i of the step: piece i's one output row, unless "none"
        wanted = [one[i] if b.output != "none" else one[-1] for i, b in enumerate(chunk)]
        out = np.concatenate(wanted)
        meta.field("outidx")[: len(out)] = out
        meta.field("feed")[:n_seq] = -1 if feed is None else feed
        meta.set_picks(n_seq, [(i, p) for i, p in enumerate(picks or ()) if p and p.temperature])
        return n_seq, wanted, at_bt

    def _launch(
        self, chunk: list[SeqBatch], ids: bool, picks: list[Pick], feed: list[int] | None = None
    ) -> Callable[[], list]:
        """Run one piece; returns a function giving its rows. A graph-replayed decode step is
        only queued: its function waits for the stream (for picked ids: for their copy)."""
        rows, wanted, n_bt = self._prepare(chunk, picks, feed)
        self.meta.upload(n_bt, self.stream)
        plan, v = self.plan, self.spec.n_vocab
        one_each = rows == len(chunk)  # every piece is one token: decode rows
        if one_each and rows <= self._decode_graph_rows and self.use_graphs:
            self.graphs.run(rows, lambda: self._enqueue(rows))
            if ids:  # ws.am row r: batch row r's pick (rows that want none: not fed from)
                in_am = np.array([r if len(w) else -1 for r, w in enumerate(wanted)])
                return self._picked_later(wanted, rows, in_am)
            return lambda: self._fetch(wanted, np.arange(rows), ids)
        if 1 < rows <= PASS_GRAPH_ROWS and self.use_graphs:
            key = ("pass", rows, one_each)
            self.graphs.run(key, lambda: self._enqueue(key))
        else:
            self._pass(rows, one_each)
        order = np.concatenate(wanted) if wanted else np.zeros(0, np.int64)
        if ids and 0 < len(order) <= self.out_rows and all(len(w) <= 1 for w in wanted):
            plan.output(len(order), self.meta.outidx, self.meta.params)
            # ws.am row j: the pick of the j-th piece that wants one
            picked = np.cumsum([len(w) for w in wanted]) - 1
            in_am = np.where([len(w) == 1 for w in wanted], picked, -1)
            at = [np.arange(j, j + 1) if len(w) else w for j, w in zip(picked, wanted)]
            return self._picked_later(at, len(order), in_am)
        results = np.empty((len(order),) if ids else (len(order), v), np.int32 if ids
                           else np.float32)  # fmt: skip
        for g0 in range(0, len(order), self.out_rows):
            g = min(self.out_rows, len(order) - g0)
            plan.output(g, self.meta.outidx + 4 * g0, self.meta.params if ids else None)
            self._copy_back(results[g0 : g0 + g], g, ids)
        out = self._split(wanted, results)
        return lambda: out

    def _pass(self, rows: int, one_each: bool) -> None:
        """The layers of a pass that is not a graph-replayed decode step."""
        splits = self.splits if rows <= 16 else 1
        self.plan.layers_pass(rows, splits, self.meta, self.kv, one_each)

    def _enqueue(self, key) -> None:  # noqa: ANN001 - a GraphCache key
        """The launches of a graph key: rows (a decode step) or ("pass", rows, one_each)."""
        if isinstance(key, int):
            self._decode_step(key)
        else:
            self._pass(key[1], key[2])

    def prepare_batches(self, max_seqs: int) -> None:
        """Capture every graph a scheduler of `max_seqs` sequences replays: decode steps of
        1 .. max_seqs rows (up to PASS_GRAPH_ROWS) and passes of 2 .. PASS_GRAPH_ROWS rows (a
        few ms each; on an H200 about 1 s for 32 sequences), so that none is captured, stalling
        every running sequence for it, while requests are served."""
        self._begin([])
        if not self.use_graphs:
            return
        # a step's block-table entries never outnumber the cache's blocks: the buffer the graphs
        # point at will not move
        if self.meta.ensure_bt(self.kv.n_blocks):
            self.graphs.clear()
        # decode steps past the decode graphs' rows run as passes of one token per sequence
        wide = range(self._decode_graph_rows + 1, min(max_seqs, PASS_GRAPH_ROWS) + 1)
        keys = [*range(1, min(max_seqs, self._decode_graph_rows) + 1),
                *(("pass", r, False) for r in range(2, PASS_GRAPH_ROWS + 1)),
                *(("pass", r, True) for r in wide)]  # fmt: skip
        for key in keys:
            if key not in self.graphs.graphs:
                self.graphs.capture(key, lambda k=key: self._enqueue(k))

    def _decode_step(self, rows: int) -> None:
        """One decode step: logits into ws.logits and picked ids (argmax unless the row's
        sampling parameters say otherwise) into ws.am."""
        self.plan.layers_pass(rows, self.splits, self.meta, self.kv, decode=True)
        self.plan.output(rows, None, self.meta.params)

    def _copy_back(self, dst: np.ndarray, rows: int, ids: bool) -> None:
        src = self.ws.am if ids else self.ws.logits
        self.rt.copy_to_host(dst, src, self.stream)
        self.rt.synchronize(self.stream)
        if ids:
            _check_picked(dst)

    def _picked_later(self, wanted, rows: int, in_am: np.ndarray) -> Callable[[], list]:
        """Queue the copy of a step's `rows` picked ids (ws.am) into page-locked memory (the
        next step may run before they are read: its feed reads them on the device first) and
        return the function that waits for that copy alone and gives each piece the ids rows
        `wanted` names. `in_am`: per piece, its pick's ids row (-1: none), for that feed; kept
        as the function's `in_am`."""
        slot, self._slot = self._slot, self._slot ^ 1
        host = self._picked_host[slot].view(np.int32)[:rows]
        done = self._picked_done[slot]
        self.rt.copy_to_host(host, self.ws.am, self.stream)
        self.rt.record(done, self.stream)

        def read() -> np.ndarray:
            self.rt.wait(done)
            return _check_picked(host.copy())

        def fetch() -> list[np.ndarray | None]:
            picked = read()
            return [picked[w] if len(w) else None for w in wanted]

        def last_ids() -> list[int | None]:
            """Each piece's last wanted id as an int (None: it wants none)."""
            picked = read().tolist()
            return [picked[w[-1]] if len(w) else None for w in wanted]

        fetch.in_am, fetch.last_ids = in_am, last_ids
        return fetch

    def _fetch(self, wanted, produced: np.ndarray, ids: bool) -> list[np.ndarray | None]:
        """Results of a decode step: every row was computed; keep the wanted ones."""
        n = len(produced)
        full = np.empty((n,) if ids else (n, self.spec.n_vocab), np.int32 if ids
                        else np.float32)  # fmt: skip
        self._copy_back(full, n, ids)
        return [full[w] if len(w) else None for w in wanted]

    @staticmethod
    def _split(wanted, results: np.ndarray) -> list[np.ndarray | None]:
        out, at = [], 0
        for w in wanted:
            out.append(results[at : at + len(w)] if len(w) else None)
            at += len(w)
        return out

    # -- diagnostics -------------------------------------------------------------------------------
    def profile_decode(self, batch: list[SeqBatch]) -> dict[str, tuple[int, float]]:
        """Run one decode step launch by launch with events; {kernel: (launches, ms)}."""
        self._begin([])
        rows, _, n_bt = self._prepare(batch)
        self.meta.upload(n_bt, self.stream)
        self.launch.start_profile()
        self._decode_step(rows)
        return self.launch.stop_profile()

    def memory_estimate(self) -> dict[str, int]:
        return {
            "weights": self.arena.nbytes if self.arena else 0,
            "kv_cache": self.kv.nbytes if self.kv else 0,
            "workspace": (self.ws.nbytes if self.ws else 0)
            + (self.meta.host.nbytes if self.meta else 0),
        }

    def close(self) -> None:
        if getattr(self, "rt", None) is not None:
            self._settle()  # nothing may still run on the buffers freed below
            for host in self._picked_host:
                self.rt.free_host(host)
            self._picked_host = []
        for part in ("meta", "kv", "ws", "arena"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.close()
                setattr(self, part, None)
        if getattr(self, "graphs", None) is not None:
            self.graphs.clear()
        if self._own_rt and getattr(self, "rt", None) is not None:
            self.rt.close()
            self.rt = None


@lru_cache(maxsize=256)
def _one_rows(n: int) -> tuple[np.ndarray, ...]:
    """[i] for i < n as n one-element int64 arrays, then an empty one (shared: read only)."""
    rows = np.arange(n)
    out = tuple(rows[i : i + 1] for i in range(n)) + (rows[:0],)
    for a in out:
        a.flags.writeable = False
    return out


def _check_range(values: np.ndarray, n: int, message: str) -> None:
    """Raise `message` (its {} filled with n - 1) unless every value lies in 0 .. n - 1."""
    if len(values) and (values.min() < 0 or values.max() >= n):
        raise ForgeRuntimeError(message.format(n - 1))


def _check_picked(ids: np.ndarray) -> np.ndarray:
    if len(ids) and ids.min() < 0:
        raise ForgeRuntimeError(
            "cannot sample: the logits contain NaN or +inf, or every token is masked"
        )
    return ids


class _Source(NamedTuple):
    """A started step that a later step may take tokens from: its results, and per batch row
    the ws.am row holding its pick (-1: none), or None when ws.am no longer holds them."""

    result: _Deferred
    in_am: np.ndarray | None


class _Deferred:
    """A result computed once, on the first call or `settle()`; an error it raised is raised
    again by every call."""

    def __init__(self, compute: Callable[[], list]):
        self._compute: Callable[[], list] | None = compute
        self._result: list = []
        self._error: BaseException | None = None

    def settle(self) -> None:
        if self._compute is not None:
            compute, self._compute = self._compute, None
            try:
                self._result = compute()
            except Exception as exc:  # kept for the caller that collects this step
                self._error = exc

    def __call__(self) -> list:
        self.settle()
        if self._error is not None:
            raise self._error
        return self._result
