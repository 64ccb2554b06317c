"""One worker process per rank, as vLLM and SGLang run tensor parallelism, supervised so that a
worker that dies or fails ends the whole group within seconds with an error naming the rank
and the cause: no hang and no orphan process.

A worker runs `target(rank, world, *args)`; an exception it raises travels to the parent as
text. The parent waits on every worker's process sentinel, so a worker killed by a signal or
the OOM killer is noticed at once, not at the next collective.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from forge.errors import ForgeError

_STOP_GRACE = 3.0  # seconds a worker gets to exit after SIGTERM before SIGKILL


class WorkerFailed(ForgeError):
    """A worker of a tensor-parallel group failed; the group has been stopped."""

    def __init__(self, rank: int, cause: str):
        super().__init__(f"tensor-parallel worker rank {rank} {cause}")
        self.rank, self.cause = rank, cause


class WorkerGroup:
    """`world` processes running `target(rank, world, *args)`, started with `spawn` (a fresh
    interpreter per rank: GPU runtimes cannot be forked)."""

    def __init__(self, target: Callable[..., Any], world: int, args: tuple = ()):
        ctx = mp.get_context("spawn")
        self._errors = ctx.SimpleQueue()
        self.processes = [
            ctx.Process(
                target=_run,
                args=(target, rank, world, args, self._errors),
                name=f"forge-rank{rank}",
                daemon=True,
            )  # fmt: skip
            for rank in range(world)
        ]
        for p in self.processes:
            p.start()

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
        """End every worker still running: SIGTERM, then SIGKILL after a grace period."""
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        for p in self.processes:
            p.join(_STOP_GRACE)
            if p.is_alive():
                p.kill()
                p.join()

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


def _run(target: Callable[..., Any], rank: int, world: int, args: tuple, errors: Any) -> None:
    try:
        target(rank, world, *args)
    except BaseException as err:  # noqa: BLE001 - every failure must reach the parent
        last = traceback.extract_tb(err.__traceback__)[-1:]
        where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
        errors.put((rank, f"{type(err).__name__}: {err}{where}"))
        raise SystemExit(1) from None
