"""HipRunner: a model on one GPU. Weights in one arena, a paged KV cache, forward passes over
mixed batches (prefill chunks and decode tokens), and graph-replayed decode steps.

A decode step (every sequence adds one token) is captured once per batch size and replayed:
positions, slots, block tables, token ids and sampling parameters live in one device buffer
refreshed by a single host->device copy (`forge_hip.step_meta`), so Python launches nothing per
token (`forge_hip.graph_policy` says which passes replay graphs). Greedy decode
(`forward_argmax`) and sampling (`forward_sample`: top-k / top-p / min-p / temperature with a
counter-based generator) pick tokens on the device and copy back only their ids;
`start_sample` returns as soon as such a step is queued on the stream, so the engine's host work
runs while the GPU computes. Its `feed` takes a sequence's next token from the ids an earlier
started step picked, still on the device (`forge_hip.stepping`): the engine starts step N+1
before it reads step N's tokens, and the GPU never waits for the host between decode steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from forge.backend import Placement, Runner, SeqBatch
from forge.errors import ForgeRuntimeError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.kv_cache import KvTypes
from forge.models.spec import ModelSpec
from forge_hip.arena import WeightArena, preflight
from forge_hip.capacity import check_spec, kv_format, memory_needed
from forge_hip.contract import constants
from forge_hip.executor import GraphCache, Launcher
from forge_hip.graph_policy import GraphPolicy
from forge_hip.kv import KvCache
from forge_hip.library import KernelLibrary
from forge_hip.plan import Plan
from forge_hip.step_meta import Pick, SampleMeta, chunks, prepare
from forge_hip.stepping import Deferred, PickedCopies, Steps, TokenMasks, check_picked
from forge_hip.tuning import load_tuning
from forge_hip.workspace import MAX_SPLITS, ROW_CAP, ROWS_SPLITS, Workspace, out_rows

DEFAULT_CTX = 4096  # context the load-time preflight assumes when the caller gives none
SPLIT_LEN = constants()["ATT_SPLIT_MIN"]  # attention: positions per split at least

__all__ = ["HipRunner", "memory_needed"]


class HipRunner(Runner):
    samples_on_device = True
    feeds_picks = True
    prefill_chunk = ROW_CAP  # pp512 in one pass: Llama-3.1-8B twin, H200, 6,973 -> 9,996 tok/s
    pass_rows = ROW_CAP  # (larger batches are cut: step_meta.chunks)
    windowed_kv = True  # sliding-window layers cache only their windows (forge_hip.kv)

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
        kv_types: KvTypes | None = None,
        plan: Callable[..., Plan] = Plan,  # a tensor-parallel rank's: forge_hip.sharded_plan
        max_seqs: int | None = 1,  # the window pools the preflight counts (capacity.memory_needed)
    ):
        from forge_hip.runtime import open_runtime

        check_spec(spec, gguf)
        self.kv_format = kv_format(spec, gguf, kv_types)  # refused before a device is opened
        self.spec = spec
        self.arena = self.ws = self.kv = self.meta = self.picked = self.masks = None
        self.steps = Steps()
        self._own_rt = runtime is None
        self.rt = runtime or open_runtime(None, device)
        self._placement = Placement.single(spec, device, self.rt.props.name)
        try:
            ctx = min(n_ctx or DEFAULT_CTX, spec.n_ctx_train)
            self.tune = load_tuning(self.rt.props.arch)
            preflight(self.rt, memory_needed(spec, gguf, ctx, kv_types, max_seqs))
            self.lib = KernelLibrary(self.rt)
            self.arena = WeightArena(self.rt, spec, gguf, progress)
            self.ws = Workspace(self.rt, spec, self.tune)
            self.rt.copy_to_device(self.ws.att_cnt, np.zeros(ROW_CAP * spec.n_head, np.uint32))
            self.rt.copy_to_device(self.ws.smp_cnt, np.zeros(out_rows(spec), np.uint32))
            self.stream = self.rt.stream()
            self.launch = Launcher(self.rt, self.stream)
            self.graphs = GraphCache(self.launch)
            self.plan = plan(spec, kernels, self.lib, self.arena, self.ws, self.launch,
                             self.rt.props.warp_size, self.tune)  # fmt: skip
            self.meta = SampleMeta(self.rt, ROW_CAP, 1024)
            self.out_rows = out_rows(spec)
            self.graph_policy = GraphPolicy(self.tune, self.out_rows)
            self.picked = PickedCopies(self.rt, self.out_rows)
            self.masks = TokenMasks(self.rt, self.out_rows, spec.n_vocab)
        except BaseException:
            self.close()
            raise

    # -- cache -------------------------------------------------------------------------------------
    def allocate_kv(self, n_blocks: int, block_size: int,
                    window_blocks: dict[int, int] | None = None) -> None:  # fmt: skip
        self.steps.settle()  # a started step may still write the cache being replaced
        self.rt.bind()
        if self.kv is not None:
            self.kv.close()
            self.kv = None
        self.graphs.clear()
        self.kv = KvCache(self.rt, self.spec, n_blocks, block_size, self.kv_format, window_blocks)
        self.meta.set_pools(len(self.kv.pool_blocks))  # each pool's slots and tables
        n_slots = n_blocks * block_size
        self.splits = max(1, min(MAX_SPLITS, -(-n_slots // SPLIT_LEN)))

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        return self._forward(batch, ids=False)

    def forward_argmax(self, batch: list[SeqBatch]) -> list[int]:
        rows = self._forward([replace(b, output="last") for b in batch], ids=True)
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
        lasts = [b if b.output == o else replace(b, output=o) for b, o in zip(batch, outs)]
        fed = [(i, f) for i, f in enumerate(feed or ()) if f >= 0]
        src, on_device = self.steps.source, None
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
            result = Deferred(lambda: [None if p is None else t
                                       for t, p in zip(last_ids(), picks)])  # fmt: skip
        else:
            result = Deferred(lambda: [None if p is None else int(r[-1])
                                       for r, p in zip(fetch(), picks)])  # fmt: skip
        self.steps.started(result, in_am)
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
        rows = self.steps.feed_rows(fed, feed_from)
        if rows is not None and sum(sizes) <= ROW_CAP and all(sizes):
            field = [-1] * len(lasts)
            for (i, _), row in zip(fed, rows.tolist()):
                field[i] = row
            return field
        picked = feed_from()
        for i, f in fed:
            token = picked[f] if f < len(picked) else None
            if token is None:
                raise ForgeRuntimeError(f"feed names row {f}, which picked no token")
            lasts[i] = replace(lasts[i], tokens=np.array([token], np.int32))
        return None

    def _begin(self, batch: list[SeqBatch], keep=None) -> list[tuple[list[SeqBatch], list[int]]]:  # noqa: ANN001
        """Settle started steps' results but `keep` (they are read before anything overwrites
        them), then cut `batch` into pieces (`step_meta.chunks`)."""
        self.steps.begin(keep)
        self.rt.bind()
        if self.kv is None:
            raise ForgeRuntimeError("allocate_kv() must be called before forward()")
        return list(chunks(batch, ROW_CAP))

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

    def _prepare(
        self, chunk: list[SeqBatch], picks: list[Pick] | None = None, feed: list[int] | None = None
    ) -> tuple[int, list[np.ndarray], int]:
        """`step_meta.prepare` for this runner's metadata and cache."""
        return prepare(self.meta, self.spec.n_vocab, self.kv, chunk, self.graphs.clear, picks,
                       feed)  # fmt: skip

    def _launch(
        self, chunk: list[SeqBatch], ids: bool, picks: list[Pick], feed: list[int] | None = None
    ) -> Callable[[], list]:
        """Run one piece; returns a function giving its rows. A graph-replayed decode step is
        only queued: its function waits for the stream (for picked ids: for their copy)."""
        rows, wanted, n_bt = self._prepare(chunk, picks, feed)
        self.meta.upload(n_bt, self.stream)
        plan, v = self.plan, self.spec.n_vocab
        one_each = rows == len(chunk)  # every piece is one token: decode rows
        masked = ids and any(p is not None and p.mask is not None for p in picks or ())
        key = self.graph_policy.decode_key(rows, one_each, masked)
        if key is not None:
            if masked:  # logits row r: piece r's
                self.masks.upload(list(picks), rows, self.stream)
            self.graphs.run(key, lambda: self._enqueue(key))
            if ids:  # ws.am row r: batch row r's pick (rows that want none: not fed from)
                in_am = np.array([r if len(w) else -1 for r, w in enumerate(wanted)])
                return self.picked.later(self.ws.am, self.stream, wanted, rows, in_am)
            return lambda: self._fetch(wanted, np.arange(rows), ids)
        key = self.graph_policy.pass_key(rows, one_each)
        if key is not None:
            self.graphs.run(key, lambda: self._enqueue(key))
        else:
            self._pass(rows, one_each)
        order = np.concatenate(wanted) if wanted else np.zeros(0, np.int64)
        if ids and 0 < len(order) <= self.out_rows and all(len(w) <= 1 for w in wanted):
            mask = 0
            if masked:  # logits row j: the j-th piece that wants a row
                mask = self.masks.upload([p for p, w in zip(picks, wanted) if len(w)],
                                         len(order), self.stream)  # fmt: skip
            plan.output(len(order), self.meta.outidx, self.meta.params, mask)
            # ws.am row j: the pick of the j-th piece that wants one
            picked = np.cumsum([len(w) for w in wanted]) - 1
            in_am = np.where([len(w) == 1 for w in wanted], picked, -1)
            at = [np.arange(j, j + 1) if len(w) else w for j, w in zip(picked, wanted)]
            return self.picked.later(self.ws.am, self.stream, at, len(order), in_am)
        results = np.empty((len(order),) if ids else (len(order), v), np.int32 if ids
                           else np.float32)  # fmt: skip
        row_picks = [p for p, w in zip(picks or [None] * len(wanted), wanted) for _ in w]
        for g0 in range(0, len(order), self.out_rows):
            g = min(self.out_rows, len(order) - g0)
            mask = self.masks.upload(row_picks[g0 : g0 + g], g, self.stream) if masked else 0
            plan.output(g, self.meta.outidx + 4 * g0, self.meta.params if ids else None, mask)
            self._copy_back(results[g0 : g0 + g], g, ids)
        out = self._split(wanted, results)
        return lambda: out

    def _pass(self, rows: int, one_each: bool) -> None:
        """The layers of a pass that is not a graph-replayed decode step."""
        splits = (self.splits if one_each else min(self.splits, ROWS_SPLITS)) if rows <= 16 else 1
        self.plan.layers_pass(rows, splits, self.meta, self.kv, one_each)

    def _enqueue(self, key) -> None:  # noqa: ANN001 - a GraphCache key
        """The launches of a graph key: rows (a decode step), ("masked", rows) (a decode step
        whose picks read token masks) or ("pass", rows, one_each)."""
        if isinstance(key, int):
            self._decode_step(key)
        elif key[0] == "masked":
            self._decode_step(key[1], self.masks.address())
        else:
            self._pass(key[1], key[2])

    def prepare_batches(self, max_seqs: int) -> None:
        """Capture every graph a scheduler of `max_seqs` sequences replays (graph_policy; a few
        ms each, on an H200 about 1 s for 32 sequences), so that none is captured, stalling
        every running sequence for it, while requests are served."""
        self._begin([])
        keys = self.graph_policy.keys_for(max_seqs)
        # a step's block-table entries never outnumber the full pool's blocks, in each pool: the
        # buffer the graphs point at will not move
        if keys and self.meta.ensure_bt(self.kv.n_blocks * len(self.kv.pool_blocks)):
            self.graphs.clear()
        for key in keys:
            if key not in self.graphs.graphs:
                self.graphs.capture(key, lambda k=key: self._enqueue(k))

    def _decode_step(self, rows: int, mask: int = 0) -> None:
        """One decode step: logits into ws.logits and picked ids (argmax unless the row's
        sampling parameters say otherwise) into ws.am, among the tokens `mask` allows."""
        self.plan.layers_pass(rows, self.splits, self.meta, self.kv, decode=True)
        self.plan.output(rows, None, self.meta.params, mask)

    def _copy_back(self, dst: np.ndarray, rows: int, ids: bool) -> None:
        src = self.ws.am if ids else self.ws.logits
        self.rt.copy_to_host(dst, src, self.stream)
        self.rt.synchronize(self.stream)
        if ids:
            check_picked(dst)

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
            self.steps.settle()  # nothing may still run on the buffers freed below
            for part in ("picked", "masks"):
                if getattr(self, part, None) is not None:
                    getattr(self, part).close()
                    setattr(self, part, None)
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
