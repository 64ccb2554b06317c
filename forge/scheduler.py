"""Continuous batching: many sequences share each forward pass of one model.

A `Scheduler` owns the model in one background thread. Requests (a `SequenceState` from
`Model.start` plus a callback) join a bounded waiting queue; between steps, waiting sequences are
admitted while there is room (``max_batch`` running sequences, enough free KV blocks for their
prompt). Each step is one `Runner.forward` call holding every running sequence's next tokens: one
token for a decoding sequence, a prompt chunk for a prefilling one (at most ``prefill_chunk``
prompt tokens per step in all, so a long prompt cannot stall the decoders). Each sequence whose
tokens were all fed gets a logits row, sampled by its own `SequenceState`; the resulting
`TokenEvent` goes to the request's callback, called from the scheduler thread.

Blocks of the paged KV cache are freed as soon as a sequence finishes or is cancelled. When the
cache runs out mid-step, the most recently admitted sequence is preempted: its blocks are freed
and it later recomputes its KV from its prompt and the tokens generated so far (same tokens, so
the output is unchanged).

Steps whose tokens the runner picks itself (greedy, or `DeviceSampling` on a device) overlap
with the host: the thread starts step N+1 with the tokens step N picked, then takes them
(detokenization, stop strings, callbacks) while the runner computes (`Runner.start_sample`). A
sequence that a stop string ends meanwhile wastes its row of step N+1, which is dropped; one that
certainly ends (end-of-generation token, max_tokens, context) is left out of it.

A runner that `feeds_picks` goes one step further: step N+1 is started before step N's tokens
are read, each decoding sequence's token fed from step N's picks on the device, so the runner
never waits for the host between steps. An end-of-generation token or a stop string is then
found one step late: that sequence's row of step N+1 is dropped. Steps that need the host's
sampler, and preemption, wait for step N first.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from forge.backend import PREFILL_CHUNK, DeviceSampling, SeqBatch
from forge.errors import ForgeError, ForgeRuntimeError, OutOfMemoryError
from forge.generation import SequenceState, TokenEvent
from forge.kv_pools import SeqBlocks

log = logging.getLogger("forge.scheduler")

_FED_PLACEHOLDER = np.zeros(1, np.int32)  # the token of a sequence fed on the device
_FED_PLACEHOLDER.flags.writeable = False


class QueueFullError(ForgeError):
    """The waiting queue is full; retry later (the server answers 429 with Retry-After)."""

    recoverable = True


class ShuttingDownError(ForgeError):
    """The scheduler is draining or stopped and takes no new requests (HTTP 503)."""

    recoverable = True


@dataclass
class Finished:
    """The last message a request's callback gets: why it ended, and token counts."""

    finish_reason: str  # "stop", "length", "cancelled" or "error"
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


Callback = Callable[["TokenEvent | Finished"], None]


@dataclass(eq=False)  # identity: `in` / remove() on the running list stay cheap
class _Request:
    id: int
    state: SequenceState
    on_event: Callback
    table: SeqBlocks | None = None
    cached: int = 0  # positions already in the KV cache
    pending: list[int] = field(default_factory=list)  # tokens to feed next
    picked: int | None = None  # a token the runner picked that the state has not taken yet
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)


@dataclass
class _Started:
    """A step the runner is computing: the requests it picks tokens for with their rows of the
    batch, how to get the batch's tokens (one per row, None where no row was sampled), and the
    requests (ids) whose token it takes from the step before it on the device."""

    sampling: list[tuple[_Request, int]]
    collect: Callable[[], list[int | None]]
    fed: frozenset[int] = frozenset()


class Handle:
    """A submitted request; `cancel()` is safe from any thread, at any time."""

    def __init__(self, scheduler: Scheduler, request: _Request):
        self._scheduler, self._request = scheduler, request

    @property
    def id(self) -> int:
        return self._request.id

    @property
    def done(self) -> bool:
        """True once the request finished (its last message is sent or being sent)."""
        return self._request.state.finished

    def cancel(self) -> None:
        self._request.cancelled = True
        self._scheduler._wake()


class Scheduler:
    """Runs `model`'s sequences in batches on a background thread (call `start()` first)."""

    def __init__(self, model, *, max_batch: int = 8, max_queue: int = 64,
                 prefill_chunk: int | None = None,
                 on_step: Callable[[], None] | None = None):  # fmt: skip
        """`prefill_chunk`: prompt tokens a step takes, over all prefilling sequences (default:
        the model's, its runner's `prefill_chunk`). `on_step`: called on the scheduler thread
        after each step's tokens were handed to their callbacks, while the next step computes (a
        place to pass them on in bulk)."""
        most = getattr(model, "prefill_chunk", PREFILL_CHUNK)
        if prefill_chunk is None:
            prefill_chunk = most
        if prefill_chunk > most:  # the window pools hold the model's pieces, no larger
            raise ValueError(f"prefill_chunk {prefill_chunk} is past the model's ({most})")
        if max_batch < 1 or max_queue < 1 or prefill_chunk < 1:
            raise ValueError("max_batch, max_queue and prefill_chunk must be >= 1")
        self.model = model
        self.on_step = on_step
        self.max_batch, self.max_queue, self.prefill_chunk = max_batch, max_queue, prefill_chunk
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Request] = []
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._accepting = True
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # forward passes run
        self.prompt_steps = 0  # those holding prompt tokens (the decoders in them wait longer)
        self.preemptions = 0
        self.cancelled = 0  # sequences ended by cancel() (e.g. a client that went away)

    # -- public API (any thread) ---------------------------------------------------------------
    def start(self) -> Scheduler:
        """Get the runner ready for batches of up to `max_batch` sequences
        (`Runner.prepare_batches`: a GPU captures its graphs now), then start the thread."""
        if self._thread is None:
            prepare = getattr(self.model.runner, "prepare_batches", None)  # a Runner's hook
            if prepare is not None:
                prepare(self.max_batch)
            self._thread = threading.Thread(target=self._loop, name="forge-scheduler", daemon=True)
            self._thread.start()
        return self

    def submit(self, state: SequenceState, on_event: Callback) -> Handle:
        """Queue a sequence. Raises QueueFullError when `max_queue` requests already wait and
        ShuttingDownError once draining began."""
        with self._cond:
            if not self._accepting:
                raise ShuttingDownError("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    f"too many requests waiting ({len(self._waiting)}); retry shortly"
                )
            request = _Request(next(self._ids), state, on_event, pending=list(state.prompt))
            self._waiting.append(request)
            self._cond.notify()
        return Handle(self, request)

    def stats(self) -> dict[str, float]:
        """Queue depth, running sequences and KV cache use (fraction of blocks)."""
        return {
            "waiting": len(self._waiting),
            "running": len(self._running),
            "kv_usage": self.model.kv.usage,
            "steps": self.steps,
            "prompt_steps": self.prompt_steps,
            "preemptions": self.preemptions,
            "cancelled": self.cancelled,
        }

    def drain(self) -> None:
        """Refuse new requests; the ones already accepted run to completion."""
        with self._cond:
            self._accepting = False
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> bool:
        """Drain, wait up to `timeout` s for accepted requests to finish, then end the thread
        (sequences still running then are cancelled). Returns True if everything finished."""
        self.drain()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._waiting or self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left if left is not None else 0.5)
            clean = not (self._waiting or self._running)
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        return clean

    @property
    def accepting(self) -> bool:
        return self._accepting

    def run_here(self, state: SequenceState) -> Iterator[TokenEvent | Finished]:
        """Run one sequence on the calling thread through the same steps the scheduler thread
        runs (prefill chunks, the runner's step-ahead feeding), without starting that thread:
        `Model.generate`. Yields its events, the last one `Finished`; an error of a pass is
        raised here. Closing the generator early cancels the sequence and frees its blocks."""
        if self._thread is not None:
            raise ForgeRuntimeError("run_here needs a scheduler without its own thread")
        events: collections.deque[TokenEvent | Finished] = collections.deque()
        handle = self.submit(state, events.append)
        started: _Started | None = None
        try:
            while True:
                while events:
                    event = events.popleft()
                    yield event
                    if isinstance(event, Finished):
                        return
                self._drop_cancelled()
                self._admit()
                preempted = self.preemptions
                started = self._advance(started)
                if self.preemptions > preempted and not self._running:
                    # its only sequence: the blocks it lacks are held by others (another
                    # generator of the same model), and waiting would never end
                    raise OutOfMemoryError(
                        "the KV cache has no room for this sequence while other sequences of "
                        "the model hold it; raise n_ctx (or server.max_batch, which sizes the "
                        "sliding-window pools)"
                    )
        finally:
            if not handle.done:
                handle.cancel()
                self._drop_cancelled()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the scheduler thread ------------------------------------------------------------------
    def _loop(self) -> None:
        started: _Started | None = None
        while True:
            with self._cond:
                while not self._stop and not self._waiting and not self._running:
                    started = None  # every request in it has ended: nothing to take
                    self._cond.wait()
                if self._stop:
                    break
                self._drop_cancelled()
                self._admit()
            try:
                if self._running:
                    started = self._advance(started)
            except Exception as exc:  # a failed pass must not take the server down
                started = None
                log.exception("forward pass failed (%s: %s); ending its sequences",
                              type(exc).__name__, exc)  # fmt: skip
                for request in list(self._running):
                    self._finish(request, "error", f"{type(exc).__name__}: {exc}")
            if self.on_step is not None:
                self.on_step()
            with self._cond:
                self._cond.notify_all()  # wakes stop() waiting for the queues to empty
        leftover = list(self._running) + list(self._waiting)
        self._waiting.clear()
        for request in leftover:
            self._finish(request, "cancelled")
        if self.on_step is not None:
            self.on_step()

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(request)
            self._finish(request, "cancelled")
        for request in [r for r in self._running if r.cancelled]:
            self._finish(request, "cancelled")

    def _admit(self) -> None:
        kv = self.model.kv
        while self._waiting and len(self._running) < self.max_batch:
            request = self._waiting[0]
            # room for the whole prompt (+1 for its first token), so prefill is not preempted
            if not kv.can_admit(len(request.pending) + 1) and self._running:
                return
            self._waiting.popleft()
            request.table = kv.table()
            self._running.append(request)

    def _advance(self, started: _Started | None) -> _Started | None:
        """Collect the step in flight, start the next one with its tokens, then take them (the
        host's share of each token) while the runner computes. Returns the step now running.
        With a runner that feeds picks, the next step starts first when it can (`_start_ahead`)."""
        if started is not None and getattr(self.model.runner, "feeds_picks", False):
            ahead = self._start_ahead(started)
            if ahead is not None:
                self._take(self._collect(started, ahead.fed))
                return ahead
        picked = self._collect(started) if started is not None else []
        plan = self._plan(preempt=False)
        if plan is None:  # the pool ran dry: preemption recomputes from taken tokens only
            self._take(picked)
            picked = []
            plan = self._plan(preempt=True)
        step = self._start(plan, picked) if plan else None
        self._take(picked)
        return step

    def _collect(self, started: _Started, fed: frozenset[int] = frozenset()) -> list[_Request]:
        """Wait for a step's tokens; each still-running request gets its token to feed next,
        unless the step after it already took it on the device (`fed`). Returns those requests
        (their tokens are still to be taken)."""
        tokens = started.collect()
        picked = []
        for request, row in started.sampling:
            if request.state.finished:  # ended while the step ran: its row is dropped
                continue
            token = tokens[row]
            request.picked = token
            if id(request) not in fed:
                request.pending = [token]
            picked.append(request)
        return picked

    def _start_ahead(self, started: _Started) -> _Started | None:
        """Start the next step before `started` is read: its decoding sequences' tokens come
        from `started`'s picks on the device. None (nothing changed) when it cannot: the KV
        pool is dry, nothing to run, or a sequence needs the host's sampler."""
        fed = {id(r): row for r, row in started.sampling
               if not (r.state.finished or r.cancelled or r.state.full_after(1))}  # fmt: skip
        plan = self._plan(preempt=False, fed=fed)
        if not plan:
            return None
        sampling = _sampling(plan, fed)
        runner = self.model.runner
        picks = _picks(runner, sampling, fed)
        if picks is None:
            return None
        batch, feed = self._batch(plan, sampling, fed)
        per_row = [picks.get(i) for i in range(len(batch))]
        collect = runner.start_sample(batch, per_row, feed, started.collect)
        return _Started(sampling, collect, frozenset(id(r) for r, _ in plan if id(r) in fed))

    def _batch(
        self, plan: list[tuple[_Request, int]], sampling: list, fed: dict[int, int]
    ) -> tuple[list[SeqBatch], list[int]]:
        """The step's batch (each request's planned tokens taken from its pending ones, or a
        placeholder for one fed on the device) and its feed (per row: the row of the step
        before whose pick it takes, or -1). Counts the step."""
        out_rows = {i for _, i in sampling}
        batch, feed, prompt = [], [], False
        for i, (request, n) in enumerate(plan):
            if id(request) in fed:
                tokens = _FED_PLACEHOLDER  # the runner feeds the pick
                feed.append(fed[id(request)])
            else:
                prompt = prompt or len(request.pending) > 1  # (pieces of one token too)
                tokens = np.asarray(request.pending[:n], dtype=np.int32)
                del request.pending[:n]
                feed.append(-1)
            batch.append(SeqBatch(tokens, request.cached, request.table.array(),
                                  "last" if i in out_rows else "none",
                                  request.table.window_arrays()))  # fmt: skip
            request.cached += n
        self.steps += 1
        self.prompt_steps += prompt
        return batch, feed

    def _take(self, requests: list[_Request]) -> None:
        """Hand each picked token to its sequence's state and the request's callback."""
        for request in requests:
            token, request.picked = request.picked, None
            state = request.state
            _deliver(request, state.take(token))
            if state.finished:
                self._finish(request, state.finish_reason)

    def _plan(
        self, preempt: bool, fed: dict[int, int] | None = None
    ) -> list[tuple[_Request, int]] | None:
        """(request, tokens fed) of the next step. Without `preempt`, None when the KV pool
        cannot hold it without preempting a sequence. `fed`: ids of requests whose one token
        is still on the device (`_start_ahead`)."""
        budget = self.prefill_chunk
        most = getattr(self.model.runner, "pass_rows", None)
        if most is not None:  # prompt pieces beside the decode rows, all in one pass (while
            # decode rows fill it, prompts still move a token a step: the runner cuts that step)
            decoding = sum(_ready(r, fed) == 1 for r in self._running)
            budget = max(1, min(budget, most - decoding))
        plan: list[tuple[_Request, int]] = []  # (request, tokens fed this step)
        for request in list(self._running):
            if preempt and request not in self._running:  # preempted planning an earlier one
                continue
            if request.picked is not None and request.state.ends_with(request.picked):
                continue
            n = _ready(request, fed)
            if n == 0:  # its next token is in flight, and ends it
                continue
            if n > 1:  # prefill (or recompute after preemption): bounded by the budget
                if budget <= 0:
                    continue
                n = min(n, budget)
                budget -= n
            # window blocks behind every query still to run go back first. A step in flight may
            # still read some (its last query is at `cached` - 1, a prompt piece's earlier rows
            # further back): the steps a runner starts run in order (a device's one stream), so
            # the later step that writes a reused block runs after it
            request.table.trim(request.cached - 1)
            if not preempt:
                try:
                    request.table.ensure(request.cached + n)
                except OutOfMemoryError:
                    return None
            elif not self._reserve(request, request.cached + n, plan):
                continue
            plan.append((request, n))
        return plan

    def _start(self, plan: list[tuple[_Request, int]], picked: list[_Request]) -> _Started | None:
        """Run a planned step: started on the runner when it picks the tokens itself (the
        `_Started` to collect), else computed and sampled on the host now (after `picked` are
        taken, so each sequence gets its tokens in order)."""
        sampling = _sampling(plan, {})
        batch, _ = self._batch(plan, sampling, {})
        runner = self.model.runner
        picks = _picks(runner, sampling)
        if picks is not None:
            per_row = [picks.get(i) for i in range(len(batch))]
            return _Started(sampling, runner.start_sample(batch, per_row))
        self._take(picked)
        picked.clear()
        outs = runner.forward(batch)
        for request, row in sampling:
            if request.state.finished:  # a stop string found by the take just above
                continue
            event = request.state.step(outs[row][-1])
            request.pending = [event.token]
            _deliver(request, event)
            if request.state.finished:
                self._finish(request, request.state.finish_reason)
        return None

    def _reserve(self, request: _Request, n_positions: int, plan: list) -> bool:
        """Blocks for `n_positions`; preempts the newest other sequences when the pool is dry.
        False when `request` itself had to be preempted."""
        while True:
            try:
                request.table.ensure(n_positions)
                return True
            except OutOfMemoryError:
                planned = {id(r) for r, _ in plan}
                victims = [r for r in self._running if r is not request and id(r) not in planned]
                victim = victims[-1] if victims else request
                self._preempt(victim)
                if victim is request:
                    return False

    def _preempt(self, request: _Request) -> None:
        """Free a running sequence's blocks and requeue it to recompute its KV later."""
        self.preemptions += 1
        request.table.release()
        request.cached = 0
        state = request.state
        # the KV of every token but the newest is recomputed; the newest is fed after it
        request.pending = state.prompt + state.generated
        self._running.remove(request)
        with self._cond:
            self._waiting.appendleft(request)

    def _finish(self, request: _Request, reason: str, error: str | None = None) -> None:
        if reason == "cancelled":
            self.cancelled += 1
        if request.table is not None:
            request.table.release()
        if request in self._running:
            self._running.remove(request)
        request.state.cancel(reason)
        state = request.state
        done = Finished(
            state.finish_reason or reason, len(state.prompt), len(state.generated), error
        )
        _deliver(request, done)


def _deliver(request: _Request, message: TokenEvent | Finished) -> None:
    """Hand a message to a request's callback; a failing callback cancels only that request."""
    try:
        request.on_event(message)
    except Exception:
        log.exception("request %d: callback failed; cancelling it", request.id)
        request.cancelled = True


def _ready(request: _Request, fed: dict[int, int] | None) -> int:
    """Tokens `request` can feed the next step: its pending ones, or the one still on the device
    (`fed`)."""
    return 1 if fed and id(request) in fed else len(request.pending)


def _sampling(plan: list[tuple[_Request, int]], fed: dict[int, int]) -> list[tuple[_Request, int]]:
    """(request, its row of the batch) for the rows whose next token is picked: those fed
    their last pending token (or their token on the device: `fed`)."""
    return [(r, i) for i, (r, n) in enumerate(plan) if id(r) in fed or n == len(r.pending)]


def _picks(runner, sampling: list, fed: dict[int, int] | None = None) -> dict | None:
    """{batch row: DeviceSampling} when the runner may pick every sampling row's token:
    all greedy (any runner takes the argmax), or a runner that samples on the device and chains
    `DeviceSampling` expresses. None when the host must sample. A request whose previous token
    is not taken yet (picked, or in flight: in `fed`) draws with the next counter."""
    if all(r.state.is_greedy for r, _ in sampling):
        return {i: _ARGMAX for _, i in sampling}
    if not getattr(runner, "samples_on_device", False):
        return None
    fed = fed or {}
    picks = {i: r.state.device_pick(ahead=int(r.picked is not None or id(r) in fed))
             for r, i in sampling}  # fmt: skip
    return picks if all(p is not None for p in picks.values()) else None


_ARGMAX = DeviceSampling()
