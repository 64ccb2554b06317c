"""cpu_simd's "attention" and "decode_attention" ops, compiled (attend.py): batch invariant.

Each op object takes the arguments of the NumPy op of the same name (`forge_cpu_simd.ops`) and
returns what it returns, up to float rounding; unlike NumPy's batched products, a row's result
does not depend on the other rows of the call (see attend.py). numba is imported on the first
call; if it cannot be, or the kernels fail to compile, forge says so once and the NumPy op runs,
as for the compiled matmul kernels.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from forge_cpu_jit.kernel import say_once

_kernels = None  # forge_cpu_jit.attend once imported, False when it cannot be
PARALLEL_MIN_KEYS = 4096  # (row, key) pairs below which one thread does the whole call
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _run_split(fn, args: tuple, keys_per_row: np.ndarray, out: np.ndarray) -> None:
    """fn(*args, row0, row1, out) over all rows, the rows cut into one range per thread with
    about equal numbers of keys (a row's result does not depend on the range it falls in)."""
    global _executor
    from forge_cpu_jit.pool import threads

    n_threads, n = threads(), len(keys_per_row)
    total = int(keys_per_row.sum())
    if n_threads == 1 or n < 2 or total < PARALLEL_MIN_KEYS:
        fn(*args, 0, n, out)
        return
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(n_threads - 1, thread_name_prefix="forge-cpu_jit-attn")
    cuts = np.searchsorted(np.cumsum(keys_per_row), total * np.arange(1, n_threads) / n_threads)
    bounds = [0, *np.minimum(cuts + 1, n).tolist(), n]
    ranges = [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    others = [_executor.submit(fn, *args, a, b, out) for a, b in ranges[1:]]
    fn(*args, *ranges[0], out)
    for f in others:
        f.result()


def _compiled():  # noqa: ANN202
    global _kernels
    if _kernels is None:
        try:
            from forge_cpu_jit import attend

            _kernels = attend
        except Exception as exc:  # numba missing or broken: the matmul kernel says which
            why = f"{type(exc).__name__}: {exc}"
            say_once("attention", f"forge cpu_jit: compiled attention unavailable ({why}); "
                                  "cpu_simd runs NumPy's")  # fmt: skip
            _kernels = False
    return _kernels or None


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _sinks(sinks: np.ndarray | None, n_head: int) -> tuple[np.ndarray, bool]:
    if sinks is None:
        return np.zeros(n_head, np.float32), False
    return _f32(sinks), True


class CompiledAttention:
    """The "attention" op: one sequence's rows, causal and optionally windowed."""

    def __call__(self, q, k, v, q_pos, scale, window, sinks=None):  # noqa: ANN001, ANN204
        kernels = _compiled()
        if kernels is None:
            from forge_cpu_simd import ops

            return ops.attention(q, k, v, q_pos, scale, window, sinks)
        q, k, v = _f32(q), _f32(k), _f32(v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
        s, use = _sinks(sinks, q.shape[1])
        q_pos = np.ascontiguousarray(q_pos, dtype=np.int64)
        keys = np.minimum(q_pos + 1, k.shape[0]) - (np.maximum(q_pos - window + 1, 0) if window
                                                    else 0)  # fmt: skip
        args = (q, k, v, q_pos, np.float32(scale), int(window or 0), s, use)
        _run_split(kernels.attention, args, keys, out)
        return out


class CompiledDecodeAttention:
    """The "decode_attention" op: one query row per sequence over its (right-padded) keys."""

    def __call__(self, q, k, v, valid, scale, sinks=None):  # noqa: ANN001, ANN204
        kernels = _compiled()
        n_keys = valid.sum(axis=1)
        prefix = np.array_equal(valid, np.arange(valid.shape[1])[None, :] < n_keys[:, None])
        if kernels is None or not prefix:  # a mask that is not a prefix: NumPy's masked form
            from forge_cpu_simd import ops

            return ops.decode_attention(q, k, v, valid, scale, sinks)
        q, k, v = _f32(q), _f32(k), _f32(v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[3]), np.float32)
        s, use = _sinks(sinks, q.shape[1])
        n_keys = n_keys.astype(np.int64)
        args = (q, k, v, n_keys, np.float32(scale), s, use)
        _run_split(kernels.decode_attention, args, n_keys, out)
        return out
