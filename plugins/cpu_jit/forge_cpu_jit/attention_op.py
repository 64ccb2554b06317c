"""cpu_simd's "attention" and "decode_attention" ops, compiled (attend.py): batch invariant.

Each op object takes the arguments of the NumPy op of the same name (`forge_cpu_simd.ops`) and
returns what it returns, up to float rounding; unlike NumPy's batched products, a row's result
does not depend on the other rows of the call (see attend.py). numba is imported on the first
call; if it cannot be, or the kernels fail to compile, forge says so once and the NumPy op runs,
as for the compiled matmul kernels.
"""

from __future__ import annotations

import numpy as np

from forge_cpu_jit.kernel import say_once

_kernels = None  # forge_cpu_jit.attend once imported, False when it cannot be
PARALLEL_MIN_KEYS = 4096  # (row, key) pairs below which the calling thread does the whole call


def _run_rows(entry_name: str, args: list, keys_per_row: np.ndarray) -> None:
    """The entry over all rows, on the compiled kernels' thread pool when the call is large
    enough (a row's result does not depend on the range it falls in)."""
    from forge_cpu_jit import attend, jit, pool

    addr = jit.compiled_entry(entry_name, getattr(attend, "entry_" + entry_name))
    packed = np.array(args, np.int64)
    n = len(keys_per_row)
    p = pool.get_pool()
    if p.threads == 1 or n < 2 or int(keys_per_row.sum()) < PARALLEL_MIN_KEYS:
        pool.run_inline(addr, packed.ctypes.data, n)
        return
    # about 4 chunks per thread (causal rows grow in cost), whole row tiles
    tile = attend.ROW_TILE
    step = max(1, -(-n // (4 * p.threads)))
    step = -(-step // tile) * tile if n >= 2 * tile else step
    p.run(addr, packed, n, step)


def _compiled():  # noqa: ANN202
    global _kernels
    if _kernels is None:
        try:
            from forge_cpu_jit import attend, jit

            for name in ("attention", "decode_attention"):  # compiled (or cached) here, once
                jit.compiled_entry(name, getattr(attend, "entry_" + name))
            _kernels = attend
        except Exception as exc:  # numba missing or broken: the matmul kernel says which
            why = f"{type(exc).__name__}: {exc}"
            say_once("attention", f"forge cpu_jit: compiled attention unavailable ({why}); "
                                  "cpu_simd runs NumPy's")  # fmt: skip
            _kernels = False
    return _kernels or None


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _bits(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def _sinks(sinks: np.ndarray | None, n_head: int) -> tuple[np.ndarray, bool]:
    if sinks is None:
        return np.zeros(n_head, np.float32), False
    return _f32(sinks), True


class CompiledAttention:
    """The "attention" op: one sequence's rows, causal and optionally windowed."""

    batch_invariant = True  # chosen by the config key batch_invariant (forge.kernels)

    def __call__(self, q, k, v, q_pos, scale, window, sinks=None):  # noqa: ANN001, ANN204
        kernels = _compiled()
        if kernels is None:
            from forge_cpu_simd import ops

            return ops.attention(q, k, v, q_pos, scale, window, sinks)
        from forge_cpu_jit.jit import address as _addr

        q, k, v = _f32(q), _f32(k), _f32(v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
        s, use = _sinks(sinks, q.shape[1])
        q_pos = np.ascontiguousarray(q_pos, dtype=np.int64)
        window = int(window or 0)
        first = np.maximum(q_pos - window + 1, 0) if window else 0
        keys = np.minimum(q_pos + 1, k.shape[0]) - first
        (n, h, d), (t, hkv), dv = q.shape, k.shape[:2], v.shape[2]
        args = [_addr(q), n, h, d, _addr(k), t, hkv, _addr(v), dv, _addr(q_pos), _bits(scale),
                window, _addr(s), int(use), _addr(out)]  # fmt: skip
        _run_rows("attention", args, keys)
        return out


class CompiledDecodeAttention:
    """The "decode_attention" op: one query row per sequence over its (right-padded) keys."""

    batch_invariant = True

    def __call__(self, q, k, v, valid, scale, sinks=None):  # noqa: ANN001, ANN204
        kernels = _compiled()
        n_keys = valid.sum(axis=1)
        prefix = np.array_equal(valid, np.arange(valid.shape[1])[None, :] < n_keys[:, None])
        if kernels is None or not prefix:  # a mask that is not a prefix: NumPy's masked form
            from forge_cpu_simd import ops

            return ops.decode_attention(q, k, v, valid, scale, sinks)
        from forge_cpu_jit.jit import address as _addr

        q, k, v = _f32(q), _f32(k), _f32(v)
        out = np.empty((q.shape[0], q.shape[1], v.shape[3]), np.float32)
        s, use = _sinks(sinks, q.shape[1])
        n_keys = np.ascontiguousarray(n_keys, dtype=np.int64)
        (n, h, d), (t, hkv), dv = q.shape, k.shape[1:3], v.shape[3]
        args = [_addr(q), n, h, d, _addr(k), t, hkv, _addr(v), dv, _addr(n_keys), _bits(scale),
                _addr(s), int(use), _addr(out)]  # fmt: skip
        _run_rows("decode_attention", args, n_keys)
        return out
