"""Asynchronous stepping: a started step's picked token ids, read only when asked for, and the
bookkeeping that lets the next step take its tokens from them on the device.

`start_sample` (the runner) returns as soon as a graph-replayed decode step is queued; its ids
are copied into page-locked host memory (`PickedCopies`, two buffers in turn, each with an
event) and read by the function it returned (a `Deferred`). `Steps` remembers the started steps
not read yet, and the last one (`Source`) whose ids may still be on the device for a feed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from forge.errors import ForgeRuntimeError


class Deferred:
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


class Source(NamedTuple):
    """A started step that a later step may take tokens from: its results, and per batch row
    the ws.am row holding its pick (-1: none), or None when ws.am no longer holds them."""

    result: Deferred
    in_am: np.ndarray | None


class Steps:
    """The started steps whose results were not read yet (oldest first) and the last started
    one, for the next one's feed."""

    def __init__(self) -> None:
        self.unfetched: list[Deferred] = []
        self.source: Source | None = None

    def settle(self, keep: Deferred | None = None) -> None:
        """Read started steps' results now (their passes are done before this returns), all
        but `keep`."""
        started, self.unfetched = self.unfetched, [d for d in self.unfetched if d is keep]
        for d in started:
            if d is not keep:
                d.settle()

    def begin(self, keep: Deferred | None = None) -> None:
        """Before a pass: settle all but `keep` (read before anything overwrites it); the last
        step's ids will be overwritten in ws.am unless it is `keep`."""
        self.settle(keep)
        if self.source is not None and self.source.result is not keep:
            self.source = Source(self.source.result, None)

    def started(self, result: Deferred, in_am: np.ndarray | None) -> None:
        self.unfetched.append(result)
        self.source = Source(result, in_am)

    def feed_rows(self, fed: list[tuple[int, int]], feed_from: Callable) -> np.ndarray | None:
        """For `fed` (batch row, source row) pairs: the ws.am row of each source row's pick when
        `feed_from` is the last step started and every one is still there, else None."""
        src = self.source
        in_am = src.in_am if src is not None and src.result is feed_from else None
        if in_am is None:
            return None
        rows = np.fromiter((f for _, f in fed), np.int64, len(fed))
        if not ((rows < len(in_am)).all() and (in_am[rows] >= 0).all()):
            return None
        return in_am[rows]


class PickedCopies:
    """Two page-locked host buffers that steps' picked ids are copied into, in turn, each with
    the event recorded after its copy."""

    def __init__(self, rt: Any, rows: int):
        self.rt = rt
        self.host: list[np.ndarray] = []
        for _ in range(2):  # each kept at once: close() frees what was taken
            self.host.append(rt.alloc_host(4 * rows))
        self.done = [rt.event() for _ in range(2)]
        self.slot = 0  # the buffer the next step copies its ids into

    def later(self, src: int, stream: Any, wanted: list[np.ndarray], rows: int,
              in_am: np.ndarray) -> Callable[[], list]:  # fmt: skip
        """Queue the copy of a step's `rows` picked ids (device address `src`) and return the
        function that waits for that copy alone and gives each piece the ids rows `wanted`
        names. `in_am`: per piece, its pick's ids row (-1: none), kept as the function's
        `in_am`; its `last_ids()` gives each piece's last wanted id as an int (None: none)."""
        slot, self.slot = self.slot, self.slot ^ 1
        host = self.host[slot].view(np.int32)[:rows]
        done = self.done[slot]
        self.rt.copy_to_host(host, src, stream)
        self.rt.record(done, stream)

        def read() -> np.ndarray:
            self.rt.wait(done)
            return check_picked(host.copy())

        def fetch() -> list[np.ndarray | None]:
            picked = read()
            return [picked[w] if len(w) else None for w in wanted]

        def last_ids() -> list[int | None]:
            picked = read().tolist()
            return [picked[w[-1]] if len(w) else None for w in wanted]

        fetch.in_am, fetch.last_ids = in_am, last_ids
        return fetch

    def close(self) -> None:
        for host in self.host:
            self.rt.free_host(host)
        self.host = []


class TokenMasks:
    """The allowed tokens of each logits row of a step (structured output), uploaded before the
    picks that read them; the device buffer is allocated on first use and stays (graphs point
    at it)."""

    def __init__(self, rt: Any, rows: int, n_vocab: int):
        self.rt, self.rows, self.words = rt, rows, -(-n_vocab // 32)
        self.host = np.full((rows, self.words), 0xFFFFFFFF, np.uint32)
        self.buffer = None

    def address(self) -> int:
        if self.buffer is None:
            self.buffer = self.rt.alloc(self.host.nbytes)
        return self.buffer.ptr

    def upload(self, picks: list, rows: int, stream: Any) -> int:
        """Row r's mask from picks[r] (every token where it has none), for `rows` rows; returns
        the device address."""
        self.host[:rows] = 0xFFFFFFFF
        for r, p in enumerate(picks[:rows]):
            if p is not None and p.mask is not None:
                if p.mask.size != self.words:
                    raise ForgeRuntimeError(
                        f"a token mask of {p.mask.size} words for a vocabulary of {self.words}"
                    )
                self.host[r] = p.mask
        address = self.address()
        self.rt.copy_to_device(self.buffer, self.host[:rows], stream)
        return address

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None


def check_picked(ids: np.ndarray) -> np.ndarray:
    if len(ids) and ids.min() < 0:
        raise ForgeRuntimeError(
            "cannot sample: the logits contain NaN or +inf, or every token is masked"
        )
    return ids
