"""cpu_simd's run_split: ranges cover the work once, a worker's error reaches the caller (and the
workers keep serving), and concurrent callers each get their whole result."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from forge_cpu_simd import threads


@pytest.fixture(autouse=True)
def four_workers(monkeypatch):
    pool = [threads._Worker(f"test-worker-{i}") for i in range(3)]
    monkeypatch.setattr(threads, "workers", lambda: 4)
    monkeypatch.setattr(threads, "_workers", lambda: pool)


def test_ranges_cover_every_index_once_on_several_threads():
    for n in (0, 1, 3, 4, 10, 1001):
        seen = np.zeros(n, int)
        idents = set()

        def fn(lo, hi, seen=seen, idents=idents):
            seen[lo:hi] += 1
            idents.add(threading.get_ident())

        threads.run_split(n, fn)
        assert (seen == 1).all()
        if n >= 4:
            assert len(idents) == 4


def test_worker_error_reaches_the_caller_and_workers_keep_serving():
    def fail_late(lo, hi):
        if lo > 0:
            raise ValueError(f"range {lo}..{hi} failed")

    with pytest.raises(ValueError, match="failed"):
        threads.run_split(100, fail_late)
    out = np.zeros(100)
    threads.run_split(100, lambda lo, hi: out.__setitem__(slice(lo, hi), 1))
    assert out.sum() == 100


def test_concurrent_callers_each_get_their_whole_result():
    results = {}

    def caller(i):
        out = np.zeros(1000)
        for _ in range(50):
            threads.run_split(1000, lambda lo, hi: out.__setitem__(slice(lo, hi), out[lo:hi] + 1))
        results[i] = out

    pool = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert all((results[i] == 50).all() for i in range(4))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_its_own_workers(monkeypatch):
    monkeypatch.undo()  # the real workers, as a process that forks has them
    threads.run_split(100, lambda lo, hi: None)  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # child: a hand-over to the parent's (absent) threads would hang
        signal.alarm(20)
        out = np.zeros(100)
        threads.run_split(100, lambda lo, hi: out.__setitem__(slice(lo, hi), 1))
        os._exit(0 if out.sum() == 100 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
