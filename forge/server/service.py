"""The loaded model behind the server: its scheduler, metrics, and the asyncio bridge.

`Service.generate` submits a `SequenceState` to the scheduler and returns a `Generation`, whose
`take()` gives the `TokenEvent`s that arrived since the last call, the last batch ending with a
`Finished`. The scheduler thread hands messages to the event loop through an `_Inbox`: one
wake-up of the loop for everything produced meanwhile (a scheduler step or more), not one per
token per stream, and a consumer that fell behind gets all its queued tokens at once (to send as
one SSE event).
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from pathlib import Path
from typing import Any

from forge.generation import SequenceState, TokenEvent
from forge.scheduler import Finished, Handle, Scheduler
from forge.server.metrics import Metrics
from forge.tokenizer.chat import render_chat, resolve_chat_template


def model_id(model: Any) -> str:
    """The id clients name the model by: the GGUF file's stem (e.g. "llama-q8_0"), unique per
    file and known before the model loads (general.name is often missing or shared by quants)."""
    return Path(model.path).stem


WAKE_INTERVAL_S = 0.005  # the event loop takes scheduler output at most this often


class _Inbox:
    """Messages from the scheduler thread to one event loop, handed over in batches: the first
    message of a batch schedules one `call_soon_threadsafe`, and the loop takes every message
    queued by then, at most once per `interval` seconds. So a scheduler step wakes the loop once
    for all its streams, not once per token per stream, and with a fast engine each stream
    writes a few tokens per event instead of one: the loop's per-write work (and the GIL it
    holds meanwhile, which the scheduler thread waits for) is paid every few ms, not per token.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float):
        self._loop, self._interval = loop, interval
        self._items: collections.deque = collections.deque()
        self._scheduled = False
        self._next = 0.0  # loop time of the earliest next hand-over

    def put(self, gen: Generation, message: TokenEvent | Finished) -> None:  # scheduler thread
        self._items.append((gen, message, time.perf_counter()))
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except BaseException:  # the loop is closed: later messages must try again
                self._scheduled = False
                raise

    def _wake(self) -> None:  # event loop
        delay = self._next - self._loop.time()
        if delay > 0:
            self._loop.call_later(delay, self._deliver)
        else:
            self._deliver()

    def _deliver(self) -> None:  # event loop
        self._next = self._loop.time() + self._interval
        # cleared before draining: a message queued after this line schedules another call
        self._scheduled = False
        items = self._items
        while items:
            gen, message, at = items.popleft()
            gen._arrived(message, at)


class Generation:
    """One request's TokenEvents, then one Finished; `cancel()` frees its blocks."""

    def __init__(self, service: Service, state: SequenceState):
        self.service, self.state = service, state
        self.started = time.perf_counter()
        self._last: float | None = None  # when the previous token was generated
        self._arrivals: list[TokenEvent | Finished] = []
        self._times: list[float] = []  # when each TokenEvent in _arrivals was generated
        self._waiter: asyncio.Future | None = None
        self.handle: Handle | None = None
        self.finished: Finished | None = None
        self.max_tokens_clamped: int | None = None  # set when the request asked for more
        self._n_tokens = 0  # token events that arrived

    def submit(self) -> Generation:
        inbox = self.service._inbox(asyncio.get_running_loop())
        self.handle = self.service.scheduler.submit(self.state, lambda m: inbox.put(self, m))
        self.service.metrics.prompt_tokens.inc(len(self.state.prompt))
        self.service._active.add(self)
        return self

    def _arrived(self, message: TokenEvent | Finished, at: float) -> None:  # event loop
        if self.finished is not None:  # (the scheduler's own end of an aborted request)
            return
        self._arrivals.append(message)
        if isinstance(message, Finished):
            self.finished = message
            self.service._active.discard(self)
        else:
            self._times.append(at)
            self._n_tokens += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[TokenEvent | Finished]:
        """Every message that arrived since the last call, in order (waits for at least one).
        A Finished is the last message of the last batch."""
        while not self._arrivals:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        messages, self._arrivals = self._arrivals, []
        times, self._times = self._times, []
        # timed when each token reached this process (with the engine in a child process: when
        # the step that made it was sent, within one step), so the loop's batching does not skew
        # them
        if times:
            m = self.service.metrics
            m.generated_tokens.inc(len(times))
            last = self._last
            if last is None:
                m.ttft.observe(times[0] - self.started)
            else:
                m.tpot.observe(times[0] - last)
            for a, b in zip(times, times[1:]):
                m.tpot.observe(b - a)
            self._last = times[-1]
        return messages

    def cancel(self) -> None:
        if self.handle is not None and self.finished is None:
            self.handle.cancel()

    def abort(self, why: str) -> None:  # event loop
        """End the request now with an error (`why`): its consumer sees a Finished("error")."""
        if self.finished is None:
            self.cancel()
            self._arrived(Finished("error", len(self.state.prompt), self._n_tokens, why),
                          time.perf_counter())  # fmt: skip


class Service:
    """A loaded model, its id, scheduler and metrics (the scheduler may run the model in
    another process: `forge.server.engine_process`)."""

    def __init__(self, model: Any, *, max_batch: int, max_queue: int, metrics: Metrics,
                 wake_interval: float = WAKE_INTERVAL_S, scheduler: Any = None):  # fmt: skip
        """`scheduler`: one already running the model elsewhere (an `EngineProcess`, whose
        `model` then only tokenizes); None starts a `Scheduler` in this process."""
        self.model = model
        self.id = model_id(model)
        self.created = int(time.time())
        self.metrics = metrics
        self.scheduler = (
            scheduler or Scheduler(model, max_batch=max_batch, max_queue=max_queue).start()
        )
        self._template = resolve_chat_template(model.tokenizer)
        self._active: set[Generation] = set()  # submitted and not finished
        self.wake_interval = wake_interval
        self._inboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _inbox(self, loop: asyncio.AbstractEventLoop) -> _Inbox:
        inbox = self._inboxes.get(loop)
        if inbox is None:
            inbox = self._inboxes[loop] = _Inbox(loop, self.wake_interval)
        return inbox

    def generate(self, state: SequenceState) -> Generation:
        """Queue `state` (raises QueueFullError / ShuttingDownError at once)."""
        return Generation(self, state).submit()

    def chat_prompt(self, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template (`extra`:
        more template variables, such as ``tools``)."""
        tok = self.model.tokenizer
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        text = render_chat(self._template, messages, bos_token=bos, eos_token=eos, **extra)
        ids = tok.encode(text, add_special=False)
        # the template usually writes BOS itself; add it only where it did not
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def token_text(self, token: int) -> str:
        return self.model.tokenizer.token_bytes(token).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> list[int]:
        return list(self.model.tokenizer.token_bytes(token))

    def abort_all(self, why: str) -> int:  # event loop
        """End every open request with an error (a stop's drain deadline passed); how many."""
        active = list(self._active)
        for gen in active:
            gen.abort(why)
        return len(active)

    def close(self, timeout: float | None = 30.0) -> None:
        self.scheduler.stop(timeout)

    def kill(self) -> None:
        """Stop the engine at once (a second stop signal): cancel whatever still runs."""
        if hasattr(self.scheduler, "kill"):  # an engine process
            self.scheduler.kill()
        else:
            self.scheduler.stop(0)
