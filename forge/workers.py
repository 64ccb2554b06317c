"""One worker process per rank, as vLLM and SGLang run tensor parallelism, supervised so that a
worker that dies or fails ends the whole group within seconds with an error naming the rank
and the cause: no hang and no orphan process.

A worker runs `target(rank, world, *args)` (with `channels`: `target(rank, world, conn,
*args)`, `conn` its end of a pipe to the parent); an exception it raises travels to the parent
as text. The parent waits on every worker's process sentinel, so a worker killed by a signal or
the OOM killer is noticed at once, not at the next collective.

Over the channels the parent sends every rank the same request and gathers their replies
(`request`, `replies`): a worker answers each with `reply(conn, ...)`; `serve` is such a loop.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from forge.errors import ForgeError, ForgeRuntimeError

_STOP_GRACE = 3.0  # seconds a worker gets to exit after SIGTERM before SIGKILL
# seconds the other ranks get to answer once one has failed a request: ranks given the same
# request fail alike, unless the failed one left the others waiting in a collective
ERROR_GRACE = 10.0
PARENT_CHECK_S = 0.5  # how often a child checks that its parent still exists


class WorkerFailed(ForgeError):
    """A worker of a tensor-parallel group failed; the group has been stopped."""

    def __init__(self, rank: int, cause: str):
        super().__init__(f"tensor-parallel worker rank {rank} {cause}")
        self.rank, self.cause = rank, cause


class WorkerGroup:
    """`world` processes running `target(rank, world, *args)`, started with `spawn` (a fresh
    interpreter per rank: GPU runtimes cannot be forked); with `local`, ranks 0..local-1 here
    and the others, running on other hosts, `attach`ed."""

    def __init__(self, target: Callable[..., Any], world: int, args: tuple = (),
                 channels: bool = False, local: int | None = None):  # fmt: skip
        ctx = mp.get_context("spawn")
        self._errors = ctx.SimpleQueue()
        pipes = [ctx.Pipe() for _ in range(world if local is None else local)] if channels else []
        self.conns = [parent for parent, _ in pipes]
        self.processes = [
            ctx.Process(
                target=_run,
                args=(
                    target,
                    rank,
                    world,
                    (pipes[rank][1], *args) if channels else args,
                    self._errors,
                    os.getpid(),
                ),
                name=f"forge-rank{rank}",
                daemon=True,
            )  # fmt: skip
            for rank in range(world if local is None else local)  # the others: `attach`
        ]
        for p in self.processes:
            p.start()
        for _, child in pipes:
            child.close()  # the worker's end lives in the worker: EOF here when it dies

    def request(self, message: Any) -> None:
        """Send `message` to every rank; WorkerFailed naming a rank that is gone."""
        for rank, conn in enumerate(self.conns):
            try:
                conn.send(message)
            except OSError:  # its end is closed: the worker died
                raise self._lost(rank, "is gone") from None

    def replies(self, on_note: Callable[[Any], None] | None = None,
                grace: float = ERROR_GRACE) -> list[Any]:  # fmt: skip
        """Every rank's answer to the last request, in rank order. A rank's error is raised
        again here (its ForgeError class, else ForgeRuntimeError) once every rank has answered,
        or after `grace` seconds (the group then stopped, WorkerFailed naming it); a rank that
        dies meanwhile stops the group with WorkerFailed. Notes a rank sends before its answer
        (`note`) go to `on_note`."""
        answers: dict[int, tuple] = {}
        pending = {conn: rank for rank, conn in enumerate(self.conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        failed_at = None
        while pending:
            left = None if failed_at is None else max(0.0, failed_at + grace - time.monotonic())
            ready = wait([*pending, *sentinels], left)
            if not ready:  # a rank failed and another still has not answered
                rank = min(r for r, a in answers.items() if a[0] == "err")
                self.stop()
                raise WorkerFailed(rank, f"failed: {answers[rank][2]} (the other ranks did not "
                                         f"answer within {grace:g} s)")  # fmt: skip
            for obj in ready:
                if obj in sentinels:
                    rank = sentinels.pop(obj)
                    if answers.get(rank, ("",))[0] == "err":
                        continue  # answered with its error, then ended: the others may too
                    raise self._lost(rank, "ended without answering")
                try:
                    msg = obj.recv()
                except (EOFError, OSError):  # its worker is ending (or its host is gone)
                    lost = pending.pop(obj)
                    raise self._lost(lost, "closed its channel without answering") from None
                if msg[0] == "note":
                    if on_note is not None:
                        on_note(msg[1])
                    continue
                answers[pending.pop(obj)] = msg
                if msg[0] == "err" and failed_at is None:
                    failed_at = time.monotonic()
        failed = [(rank, a) for rank, a in sorted(answers.items()) if a[0] == "err"]
        if failed:
            kind, text = failed[0][1][1:]
            others = {f"rank {r}: {a[2]}" for r, a in failed[1:] if a[2] != text}
            raise _rebuilt(kind, "; ".join([text, *sorted(others)]))
        return [answers[rank][1] for rank in range(len(self.conns))]

    def attach(self, conns: dict[int, Any]) -> None:
        """Add ranks that run on other hosts (`forge.remote_ranks`): their channels, by rank,
        right after this host's ranks."""
        for rank in sorted(conns):
            if rank != len(self.conns):
                raise ValueError(f"rank {rank} attached after {len(self.conns) - 1}")
            self.conns.append(conns[rank])

    def _lost(self, rank: int, why: str) -> WorkerFailed:
        """The group stopped, and the error naming rank `rank`, whose channel failed: how its
        process ended (this host's), or that its host's connection is gone."""
        if rank >= len(self.processes):
            self.stop()
            return WorkerFailed(rank, "on another host: its connection closed")
        self.processes[rank].join(_STOP_GRACE)
        code = self.processes[rank].exitcode
        self.stop()
        return WorkerFailed(rank, self._cause(rank, code) if code else why)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every worker has ended well (True) or `timeout` passes (False); a worker
        that fails first stops the others and raises WorkerFailed naming it."""
        running = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        while running:
            ended = wait(list(running), timeout)
            if not ended:
                return False
            for sentinel in ended:
                rank = running.pop(sentinel)
                self.processes[rank].join()  # reaps it: its sentinel says it has ended
                code = self.processes[rank].exitcode
                if code:
                    self.stop()
                    raise WorkerFailed(rank, self._cause(rank, code))
        return True

    def stop(self) -> None:
        """End every worker still running: SIGTERM, then SIGKILL after a grace period (ranks
        on other hosts: their connections are closed, which ends them)."""
        for conn in self.conns[len(self.processes) :]:
            conn.close()
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(_STOP_GRACE)
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns[: len(self.processes)]:
            conn.close()  # (a long-running server loads models again: no descriptor left)

    def _cause(self, rank: int, code: int) -> str:
        while not self._errors.empty():
            failed, text = self._errors.get()
            if failed == rank:
                return f"failed: {text}"
        if code < 0:
            return f"died: killed by {signal.Signals(-code).name}"
        return f"died: exit status {code}"

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reply(conn: Any, value: Any = None, error: BaseException | None = None) -> None:
    """A worker's answer to a request: `value`, or `error` (sent as its class and text)."""
    if error is None:
        conn.send(("ok", value))
    else:
        conn.send(("err", f"{type(error).__module__}:{type(error).__qualname__}", str(error)))


def note(conn: Any, value: Any) -> None:
    """Something a worker tells the parent before its answer (progress)."""
    conn.send(("note", value))


def serve(conn: Any, handle: Callable[[Any], Any]) -> None:
    """Answer requests with `handle(request)` until the request None (or the parent is gone);
    a ForgeError is answered as an error, anything else ends the worker (and the group)."""
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        try:
            value = handle(message)
        except ForgeError as err:
            reply(conn, error=err)
        else:
            reply(conn, value)


def _rebuilt(kind: str, text: str) -> BaseException:
    """A worker's ForgeError as the same class when it can be made from its text."""
    module, _, name = kind.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, ForgeError):
            return cls(text)
    except Exception:  # noqa: BLE001 - any class that cannot be rebuilt so becomes the default
        pass
    return ForgeRuntimeError(text)


def exit_with_parent(parent: int) -> None:
    """A child's watchdog thread: once its parent is gone (killed, or exited without stopping
    it), end this process at once, even while its main thread waits in a collective."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def _run(target: Callable[..., Any], rank: int, world: int, args: tuple, errors: Any,
         parent: int) -> None:  # fmt: skip
    # Ctrl-C reaches the whole process group: the parent handles it and stops the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    try:
        target(rank, world, *args)
    except BaseException as err:  # noqa: BLE001 - every failure must reach the parent
        last = traceback.extract_tb(err.__traceback__)[-1:]
        where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
        errors.put((rank, f"{type(err).__name__}: {err}{where}"))
        raise SystemExit(1) from None
