"""Batch-invariance checks on a loaded model (any backend), shared by the GPU tests and the device
probe: one prompt whole and in chunks, one sequence's decode step alone and among others (their
number, order and kind: decode rows or another prompt's chunk), requests alone and through the
scheduler."""

from __future__ import annotations

import queue

import numpy as np

from forge.backend import SeqBatch, forward_in_chunks


def prefill(model, ids: np.ndarray, chunk: int) -> np.ndarray:
    """Logits of every position of `ids` fed in chunks of `chunk` tokens (a fresh sequence,
    released after)."""
    table = model.kv.table()
    try:
        return np.concatenate(list(forward_in_chunks(model.runner, table, ids, 0, chunk)))
    finally:
        table.release()


class Sequences:
    """Sequences whose prompts (random tokens of `lengths`) are in the cache, each ready for one
    decode step at the position after its prompt."""

    def __init__(self, model, lengths: list[int], seed: int = 0, chunk: int = 64):
        self.model = model
        rng = np.random.default_rng(seed)
        vocab = model.spec.n_vocab
        self.prompts = [rng.integers(3, vocab, size=n).astype(np.int32) for n in lengths]
        self.tables = []
        for p in self.prompts:
            t = model.kv.table()
            for _ in forward_in_chunks(model.runner, t, p, 0, chunk, "none"):
                pass
            t.ensure(len(p) + 1)
            self.tables.append(t)
        self.token = np.array([7], np.int32)

    def row(self, i: int) -> SeqBatch:
        """Sequence i's decode row (token 7 after its prompt), asking for its logits."""
        t = self.tables[i]
        return SeqBatch(self.token, len(self.prompts[i]), t.array(), "last", t.window_arrays())

    def step(self, order: list[int], who: int = 0) -> np.ndarray:
        """Sequence `who`'s logits from one decode step of the sequences `order` (in that order
        in the batch)."""
        out = self.model.runner.forward([self.row(i) for i in order])
        return out[order.index(who)][-1]

    def mixed(self, order: list[int], prompt: np.ndarray, who: int = 0) -> np.ndarray:
        """Sequence `who`'s logits from one pass holding the decode rows of `order` and, after
        them, a fresh sequence's whole `prompt` (released after)."""
        t = self.model.kv.table()
        try:
            t.ensure(len(prompt))
            chunk = SeqBatch(prompt, 0, t.array(), "last", t.window_arrays())
            out = self.model.runner.forward([*(self.row(i) for i in order), chunk])
        finally:
            t.release()
        return out[order.index(who)][-1]

    def release(self) -> None:
        for t in self.tables:
            t.release()
        self.tables = []


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max())


def alone_and_scheduled(model, prompts: list, kws: list[dict], max_tokens: int, max_batch: int,
                        first: int) -> tuple[list, list, dict]:  # fmt: skip
    """Each request (prompt, sampling keywords) completed alone, then all through a scheduler
    thread, the requests after the first `first` submitted while those decode (their prompts
    in passes beside decode rows). Returns (tokens alone, tokens scheduled, scheduler stats);
    asserts every scheduled request ended by "stop" or "length"."""
    from forge.scheduler import Finished, Scheduler

    alone = [model.complete(p, max_tokens=max_tokens, **kw).tokens for p, kw in zip(prompts, kws)]
    sched = Scheduler(model, max_batch=max_batch).start()
    try:
        queues = []
        for i, (p, kw) in enumerate(zip(prompts, kws)):
            q: queue.Queue = queue.Queue()
            state = model.start(p, max_tokens=max_tokens, **kw)
            sched.submit(state, q.put)
            queues.append((q, state))
            if i == first - 1:  # the rest join while these decode
                head = queues[0][0].get(timeout=60)
                assert not isinstance(head, Finished)
                queues[0][0].put(head)
        scheduled = []
        for q, state in queues:
            while not isinstance(msg := q.get(timeout=60), Finished):
                pass
            assert msg.finish_reason in ("stop", "length"), msg
            scheduled.append(state.generated)
        return alone, scheduled, sched.stats()
    finally:
        sched.stop(5)
