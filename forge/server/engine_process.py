"""The model in its own process: `forge serve` runs the engine (model, scheduler, sampling and
detokenization) in a child process and HTTP in the parent, so the per-token work of the event
loop and of the scheduler run on two cores instead of taking turns on one interpreter lock.

`EngineProcess` is the parent's stand-in for a `forge.scheduler.Scheduler` (submit, stats,
drain, stop), and its `model` is a `forge.api.open_front` model: it tokenizes, renders chat
templates and validates requests like the real one, but runs nothing. Two one-way pipes connect
the processes:

- parent -> child: ("submit", rid, prompt ids, max_tokens, stop, logprobs, SamplingParams),
  ("cancel", rid), ("stop", timeout) (which drains: running requests finish first);
- child -> parent: ("ready", info) or ("failed", why) once, then ("out", [(rid, Finished) or
  (rid, *TokenEvent's fields), ...], stats) after each scheduler step (sent from the scheduler
  thread while the next step computes), a ("stats", stats) heartbeat while idle, and
  ("stopped", clean) last.

The parent enforces the waiting-queue bound itself (requests it sent, minus finished ones, minus
those the last stats say are running), so a full queue is refused at once (HTTP 429) without a
round trip. If the child dies, every open request ends with an error and new ones get 503.

The child ignores SIGINT and SIGTERM (a signal to the whole process group must not kill it under
its running requests: the parent drains it), so it never outlives the parent: the parent kills
it at exit, and the child exits by itself when the parent is gone (its parent pid changes).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from forge.errors import ForgeError
from forge.generation import SequenceState, TokenEvent
from forge.scheduler import Finished, QueueFullError, ShuttingDownError
from forge.workers import exit_with_parent

log = logging.getLogger("forge.server")

STATS_INTERVAL_S = 0.1  # the idle child sends fresh stats at most this often


class EngineLost(ForgeError):
    """The engine process exited or failed to load the model."""


class _RemoteHandle:
    """A request sent to the engine; `cancel()` is safe from any thread, at any time."""

    def __init__(self, engine: EngineProcess, rid: int):
        self._engine, self.id = engine, rid

    def cancel(self) -> None:
        self._engine._send(("cancel", self.id))


class EngineProcess:
    """A child process running the model and its scheduler; `submit` like `Scheduler.submit`."""

    def __init__(self, model: Any, config: Any, *, max_batch: int, max_queue: int):
        """Start the child, which loads `model.path` with `config` (a `forge.config.Config`);
        `model` is this process's front model (`forge.api.open_front`)."""
        self.model, self.max_queue = model, max_queue
        ctx = multiprocessing.get_context("spawn")  # no CUDA or threads inherited by a fork
        cmd_read, self._commands = ctx.Pipe(duplex=False)
        self._events, events_write = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main,
            args=(
                cmd_read,
                events_write,
                model.path,
                config,
                max_batch,
                max_queue,
                model.n_ctx,
                os.getpid(),
            ),  # fmt: skip
            name="forge-engine",
            # not daemonic: a tensor-parallel model's engine starts a worker per GPU; the exit
            # handler below and the child's watchdog still end it with this process
            daemon=False,
        )
        self._proc.start()
        # registered after multiprocessing's own exit handler, so it runs before it: that one
        # would send SIGTERM (ignored by the child) and wait for the child forever
        atexit.register(self._kill)
        cmd_read.close()
        events_write.close()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[TokenEvent | Finished], None]] = {}
        self._ids = itertools.count(1)
        self._stats: dict[str, float] = {}
        self._accepting = True
        self._lost: str | None = None
        self._stopped = threading.Event()
        self.info: dict[str, Any] = {}
        self._reader: threading.Thread | None = None

    # -- startup -----------------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> EngineProcess:
        """Block until the child loaded the model (no limit by default: a child that dies ends
        the wait); raises EngineLost with its reason if not."""
        if not self._events.poll(timeout):
            self._kill()
            raise EngineLost(f"the engine process did not load the model in {timeout:.0f} s")
        try:
            kind, payload = self._events.recv()
        except (EOFError, OSError):
            self._kill()
            raise EngineLost("the engine process exited while loading the model") from None
        if kind != "ready":
            self._kill()
            raise EngineLost(str(payload))
        self.info = payload
        self._reader = threading.Thread(target=self._read, name="forge-engine-reader", daemon=True)
        self._reader.start()
        return self

    # -- the Scheduler interface -------------------------------------------------------------------
    def submit(self, state: SequenceState, on_event: Callable) -> _RemoteHandle:
        """Send a validated sequence to the engine. Raises QueueFullError / ShuttingDownError
        at once, like `Scheduler.submit`."""
        with self._lock:
            if self._lost is not None or not self._accepting:
                raise ShuttingDownError(self._lost or "the server is shutting down")
            waiting = len(self._callbacks) - int(self._stats.get("running", 0))
            if waiting >= self.max_queue:
                raise QueueFullError(f"too many requests waiting ({waiting}); retry shortly")
            rid = next(self._ids)
            self._callbacks[rid] = on_event
        params = state.sampler.params
        self._send(("submit", rid, state.prompt, state.max_tokens, state.stop, state.logprobs,
                    params))  # fmt: skip
        return _RemoteHandle(self, rid)

    def stats(self) -> dict[str, float]:
        """The engine's latest queue depth, running sequences, KV use and counters."""
        return dict(self._stats)

    @property
    def accepting(self) -> bool:
        return self._accepting and self._lost is None

    @property
    def lost(self) -> str | None:
        """Why the engine process no longer answers (None while it runs)."""
        return self._lost

    def drain(self) -> None:
        """Refuse new requests; the ones already sent run to completion. Only a flag: the
        parent refuses new submissions itself, and SIGTERM's handler calls this, possibly while
        the interrupted code holds the pipe's lock."""
        self._accepting = False

    def stop(self, timeout: float | None = None) -> bool:
        """Drain, let the engine finish (or cancel past `timeout`), then end the child. True if
        every request finished."""
        self._accepting = False
        self._send(("stop", timeout))
        wait = None if timeout is None else timeout + 10.0
        clean = self._stopped.wait(wait) and self._clean
        self._proc.join(10.0)
        self._kill()  # if still alive; unregisters the exit handler either way
        return bool(clean)

    # -- plumbing ----------------------------------------------------------------------------------
    _clean = False

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._commands.send(message)
        except (OSError, ValueError):  # the child is gone; the reader reports it
            pass

    def _read(self) -> None:
        """The reader thread: hands the child's messages to each request's callback."""
        lost = "the engine process exited"
        try:
            while True:
                message = self._events.recv()
                kind = message[0]
                if kind == "out":
                    self._stats = message[2]
                    self._dispatch(message[1])
                elif kind == "stats":
                    self._stats = message[1]
                elif kind == "stopped":
                    self._clean = bool(message[1])
                    break
        except (EOFError, OSError):
            pass
        except Exception as exc:  # a message that cannot be read: nobody can talk to the child
            log.exception("reading from the engine process failed")
            lost = f"the engine process sent an unreadable message ({type(exc).__name__})"
            self._kill()
        finally:
            self._end_all(lost)
            self._stopped.set()

    def _dispatch(self, items: list) -> None:
        for item in items:
            rid = item[0]
            event = item[1] if len(item) == 2 else TokenEvent(*item[1:])
            if isinstance(event, Finished):
                with self._lock:
                    callback = self._callbacks.pop(rid, None)
            else:
                callback = self._callbacks.get(rid)
            if callback is not None:
                try:
                    callback(event)
                except Exception:  # one request's failing consumer must not stop the others
                    log.exception("request %d: callback failed", rid)
                    self._send(("cancel", rid))

    def _end_all(self, why: str) -> None:
        """Finish every open request with an error (the child will not answer any more)."""
        with self._lock:
            if self._lost is None and self._callbacks:
                self._lost = why
            elif self._lost is None:
                self._lost = "the engine process has stopped"
            open_requests, self._callbacks = self._callbacks, {}
            self._stats = {}  # nothing runs or waits any more
        for callback in open_requests.values():
            try:
                callback(Finished("error", 0, 0, why))
            except Exception:
                log.exception("a callback failed while ending requests")

    def kill(self) -> None:
        """End the child at once (its requests end with an error)."""
        self._accepting = False
        self._kill()

    def _kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5.0)
        atexit.unregister(self._kill)


# -- the child process ----------------------------------------------------------------------
class _Outbox:
    """The child's sender. What the scheduler produces is queued by `put` and sent by `flush`,
    one pipe write per step with the stats as of sending; the scheduler thread flushes after
    each step (`Scheduler.on_step`), while the next step computes, so no other thread of the
    child competes with it for the interpreter lock. `heartbeat` sends changed stats while
    idle."""

    def __init__(self, conn: Any, stats: Callable[[], dict]):
        self._conn, self._stats = conn, stats
        self._items: list = []
        self._lock = threading.Lock()  # the queue
        self._send_lock = threading.Lock()  # the pipe: the scheduler and command threads send
        self._last_stats: dict = {}

    def put(self, rid: int, message: TokenEvent | Finished) -> None:
        if isinstance(message, TokenEvent):  # as plain fields: 32 pickle in 4 us, not 32
            item = (rid, message.token, message.text, message.logprob, message.top_logprobs)
        else:
            item = (rid, message)
        with self._lock:
            self._items.append(item)

    def flush(self) -> None:
        # taken and sent under the pipe's lock: two threads flushing keep the messages in order
        try:
            with self._send_lock:
                with self._lock:
                    items, self._items = self._items, []
                if items:
                    self._send_locked("out", items)
        except Exception:  # messages lost: end the process, so the parent ends their requests
            log.exception("sending to the server process failed")
            os._exit(1)

    def close(self, clean: bool) -> None:
        """The last message: whether every request finished."""
        with self._send_lock:
            try:
                self._conn.send(("stopped", clean))
            except (OSError, ValueError):
                pass

    def heartbeat(self) -> None:
        if self._stats() != self._last_stats:
            with self._send_lock:
                self._send_locked("stats")

    def _send_locked(self, kind: str, items: list | None = None) -> None:
        stats = self._stats()
        try:
            self._conn.send((kind, items, stats) if items is not None else (kind, stats))
        except (OSError, ValueError):  # the parent is gone: the command loop ends the child
            return
        self._last_stats = stats


def _child_main(commands: Any, events: Any, path: str, config: Any, max_batch: int,
                max_queue: int, n_ctx: int, parent: int) -> None:  # fmt: skip
    """The engine process: load the model, then run requests until told to stop (or until
    the parent goes away)."""
    # the parent handles Ctrl-C and SIGTERM (stopping this process after a drain); a signal to
    # the whole process group must not kill the engine under its running requests
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # `parent` comes from the parent itself: one that died before this line is noticed too
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    from forge.api import load
    from forge.cli.common import setup_logging
    from forge.scheduler import Scheduler

    setup_logging(config.log_level)
    scheduler = None
    outbox = _Outbox(events, lambda: scheduler.stats())
    try:
        model = load(path, config=config, n_ctx=n_ctx)
        failed = None
        if model.n_ctx != n_ctx:
            failed = f"the engine's context ({model.n_ctx}) is not {n_ctx}"
        else:  # started here: its preparation (graph captures) may fail too
            # the parent bounds the waiting queue; this bound only catches a parent that does not
            scheduler = Scheduler(model, max_batch=max_batch, max_queue=max_queue + max_batch,
                                  on_step=outbox.flush).start()  # fmt: skip
    except Exception as exc:  # reported to the parent, which serves 503 with the reason
        failed = f"{type(exc).__name__}: {exc}"
    try:
        if failed is not None:
            events.send(("failed", failed))
            return
        events.send(("ready", {"backend": model.backend, "n_ctx": model.n_ctx}))
    except OSError:  # the parent went away while this loaded
        return
    handles: dict[int, Any] = {}
    clean = False
    try:
        while True:
            try:
                if not commands.poll(STATS_INTERVAL_S):
                    outbox.heartbeat()
                    continue
                command = commands.recv()
            except (EOFError, OSError):  # the parent exited: stop at once
                scheduler.stop(0)
                return
            kind = command[0]
            if kind == "submit":
                _submit(model, scheduler, outbox, handles, *command[1:])
            elif kind == "cancel":
                handle = handles.get(command[1])
                if handle is not None:
                    handle.cancel()
            elif kind == "stop":
                clean = scheduler.stop(command[1])
                break
    finally:
        outbox.flush()
        outbox.close(clean)


def _submit(model, scheduler, outbox, handles, rid, prompt, max_tokens, stop, logprobs,
            params) -> None:  # fmt: skip
    """Rebuild the parent's sequence (same prompt ids and sampling parameters) and queue it."""

    def on_event(message: TokenEvent | Finished) -> None:
        if isinstance(message, Finished):
            handles.pop(rid, None)
        outbox.put(rid, message)

    try:
        state = model.start(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
                            **params.model_dump())  # fmt: skip
        handles[rid] = scheduler.submit(state, on_event)
    except Exception as exc:  # the parent validated it: only a bug or a full queue gets here
        outbox.put(rid, Finished("error", len(prompt), 0, f"{type(exc).__name__}: {exc}"))
        outbox.flush()  # the scheduler thread may be idle
        return
    handle = handles.get(rid)  # (on_event may pop it meanwhile, on the scheduler thread)
    if handle is not None and handle.done:
        handles.pop(rid, None)  # it finished before submit returned
