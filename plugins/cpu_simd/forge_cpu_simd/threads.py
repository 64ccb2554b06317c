"""The cpu_simd backend's worker threads.

OpenBLAS decides its own threading, except in its small-matrix kernels, which run on the calling
thread: few-row products split into such chunks run on this pool. NumPy releases the GIL inside
BLAS calls, so Python threads suffice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache


@lru_cache(maxsize=1)
def workers() -> int:
    return max(1, os.cpu_count() or 1)  # asked once: os.cpu_count() took 16 us a call here


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, workers() - 1), thread_name_prefix="forge-cpu")


def run_split(n: int, fn: Callable[[int, int], None]) -> None:
    """Call fn(lo, hi) on contiguous ranges covering 0..n, one per worker, in parallel."""
    step = max(1, -(-n // workers()))
    ranges = [(lo, min(lo + step, n)) for lo in range(0, n, step)] or [(0, 0)]
    futures = [_pool().submit(fn, lo, hi) for lo, hi in ranges[1:]]
    fn(*ranges[0])
    for f in futures:
        f.result()
