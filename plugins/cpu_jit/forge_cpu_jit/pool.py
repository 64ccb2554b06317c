"""The compiled kernels' threads: work sharing without a barrier, spinning briefly between jobs.

A product is a job of chunks (row ranges) run by a compiled entry (`void(int64* args, lo, hi)`,
see gemm.py). The calling thread posts it, then takes chunks itself like the workers do; it waits
only for chunks that were taken, never for a worker to show up. So a worker that the OS has not
scheduled (another process on its core) costs nothing: the caller runs everything. Workers spin
on the job counter for `SPIN` pause-iterations after a job (jobs come every few microseconds in a
decode step), then sleep until the next post.

Why not numba's prange: its OpenMP and workqueue layers end every parallel loop in a barrier that
waits for every thread. On these 2-core virtual machines waking a sleeping thread took ~60 us and
a barrier with a descheduled thread up to a scheduler tick (8 ms per product measured while
another process ran), where this pool stays at the single-thread speed.

Protocol (one job at a time, under `Pool._lock`): the control array holds the job's entry, args,
row count, chunk rows and chunk count, the next-chunk counter NEXT and the done counter DONE.
Posting writes the fields, then NEXT = 0 (release) and GEN += 1. A thread takes chunk
c = NEXT++ and runs it if c < CHUNKS (reading the fields after the increment). After a job NEXT
is set to CLOSED, so a late worker's increment lands far beyond any chunk count.
"""

from __future__ import annotations

import os
import threading

import numpy as np
from numba import njit

from forge_cpu_jit.simd import atomic_add, atomic_load, atomic_store, call_entry, cpu_pause

_NB = {"nogil": True, "cache": True}

# control array fields, a cache line (8 int64) apart
GEN, NEXT, DONE, CHUNKS, ENTRY, ARGS, ROWS, STEP, STOP = (8 * i for i in range(9))
CLOSED = 1 << 40
SPIN = int(os.environ.get("FORGE_CPU_JIT_SPIN", "100000"))  # ~1-3 ms of pause instructions


@njit(**_NB)
def _take_chunks(ctrl) -> int:  # noqa: ANN001
    """Run chunks of the posted job until none is left; returns how many this thread ran."""
    ran = 0
    while True:
        c = atomic_add(ctrl, NEXT, 1)
        if c >= atomic_load(ctrl, CHUNKS):
            return ran
        step, rows = atomic_load(ctrl, STEP), atomic_load(ctrl, ROWS)
        lo = c * step
        call_entry(atomic_load(ctrl, ENTRY), atomic_load(ctrl, ARGS), lo, min(rows, lo + step))
        atomic_add(ctrl, DONE, 1)
        ran += 1


@njit(**_NB)
def _run_posted(ctrl) -> None:  # noqa: ANN001
    """The caller's part: take chunks, then wait for the chunks others took, then close."""
    _take_chunks(ctrl)
    n = atomic_load(ctrl, CHUNKS)
    while atomic_load(ctrl, DONE) < n:
        cpu_pause()
    atomic_store(ctrl, NEXT, CLOSED)


@njit(**_NB)
def _wait_post(ctrl, seen, spin) -> int:  # noqa: ANN001
    """Spin until GEN differs from `seen` (returns it) or `spin` pauses pass (returns seen)."""
    for _ in range(spin):
        g = atomic_load(ctrl, GEN)
        if g != seen:
            return g
        cpu_pause()
    return seen


@njit(**_NB)
def _post(ctrl, entry, args, rows, step, chunks) -> None:  # noqa: ANN001
    atomic_store(ctrl, ENTRY, entry)
    atomic_store(ctrl, ARGS, args)
    atomic_store(ctrl, ROWS, rows)
    atomic_store(ctrl, STEP, step)
    atomic_store(ctrl, CHUNKS, chunks)
    atomic_store(ctrl, DONE, 0)
    atomic_store(ctrl, NEXT, 0)
    atomic_add(ctrl, GEN, 1)


@njit(**_NB)
def run_inline(entry, args, rows) -> None:  # noqa: ANN001
    """The whole job on the calling thread."""
    call_entry(entry, args, 0, rows)


class Pool:
    """Worker threads for the compiled kernels (one fewer than `threads`: the caller works)."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self.ctrl = np.zeros(8 * 9, np.int64)
        self.ctrl[NEXT] = CLOSED
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._sleeping = 0
        self._workers = [
            threading.Thread(target=self._loop, name=f"forge-cpu_jit-{i}", daemon=True)
            for i in range(self.threads - 1)
        ]
        for w in self._workers:
            w.start()

    def _loop(self) -> None:
        ctrl, seen = self.ctrl, 0
        while True:
            g = _wait_post(ctrl, seen, SPIN)
            if g == seen:
                with self._cv:
                    self._sleeping += 1
                    try:
                        while ctrl[GEN] == seen and not ctrl[STOP]:
                            self._cv.wait()
                    finally:
                        self._sleeping -= 1
                continue
            if ctrl[STOP]:
                return
            seen = g
            _take_chunks(ctrl)

    def run(self, entry: int, args: np.ndarray, rows: int, step: int) -> None:
        """Run entry(args, lo, hi) over rows 0..rows in chunks of `step` rows (the args array
        must stay alive until this returns: it does, as the caller's argument)."""
        chunks = -(-rows // step)
        if chunks <= 1 or self.threads == 1 or not self._lock.acquire(blocking=False):
            run_inline(entry, args.ctypes.data, rows)  # busy (another thread's job): run here
            return
        try:
            _post(self.ctrl, entry, args.ctypes.data, rows, step, chunks)
            if self._sleeping:
                with self._cv:
                    self._cv.notify_all()
            _run_posted(self.ctrl)
        except BaseException:
            # A signal (Ctrl-C stopping a reply) raised between the post and the wait: the
            # workers are still reading this job's arrays, which the caller's unwinding frees
            # (a crash, seen in `forge chat`). Finish the job first; on a closed or completed
            # job _run_posted does nothing.
            _run_posted(self.ctrl)
            raise
        finally:
            self._lock.release()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def threads() -> int:
    """Threads the kernels use: $FORGE_CPU_JIT_THREADS, else every core this process may use."""
    env = os.environ.get("FORGE_CPU_JIT_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def get_pool() -> Pool:
    """The process's pool (started on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = Pool(threads())
        return _pool


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: it starts its own pool when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
