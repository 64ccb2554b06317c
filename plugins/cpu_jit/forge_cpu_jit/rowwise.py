"""Compiled kernels of cpu_simd's per-row ops (`rowwise_op.py`): RMSNorm's scaling and RoPE.

They do, element by element, the float32 operations of the NumPy ops in `forge_cpu_simd.ops`
in the same order (no fused multiply-adds: numba contracts nothing without fastmath), so their
results are bit-identical to NumPy's; what they save is NumPy's one call (and temporary array)
per operation, which dominates for the few rows of a decode step.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NB = {"nogil": True, "cache": True, "error_model": "numpy"}


@njit(**_NB)
def scale_rows(x, sums, weight, eps, out):  # noqa: ANN001
    """out[r] = x[r] * (1 / sqrt(sums[r] / D + eps)) * weight for x, out [R, D] (sums: each
    row's sum of squares)."""
    rows, d = x.shape
    n = np.float32(d)
    one = np.float32(1.0)
    for r in range(rows):
        s = one / np.sqrt(sums[r] / n + eps)
        for i in range(d):
            out[r, i] = x[r, i] * s * weight[i]


@njit(**_NB)
def rotate(x, cos, sin, neox):  # noqa: ANN001
    """RoPE in place on x [T, H, D]: pair i of token t turned by cos[t, i], sin[t, i]; NeoX
    pairs dim i with i + D/2 (of the rotated part), the original layout 2i with 2i + 1."""
    tokens, heads, _ = x.shape
    half = cos.shape[1]
    for t in range(tokens):
        for h in range(heads):
            for i in range(half):
                lo, hi = (i, i + half) if neox else (2 * i, 2 * i + 1)
                a, b = x[t, h, lo], x[t, h, hi]
                c, s = cos[t, i], sin[t, i]
                x[t, h, lo] = a * c - b * s
                x[t, h, hi] = a * s + b * c


@njit(**_NB)
def gelu_inner(x, out):  # noqa: ANN001
    """out = c * (x + 0.044715 * x * x * x), c = sqrt(2 / pi): the argument of GELU's tanh."""
    c, a = np.float32(0.7978845608028654), np.float32(0.044715)
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = c * (v + a * v * v * v)


@njit(**_NB)
def gelu_outer(x, t):  # noqa: ANN001
    """t = 0.5 * x * (1 + t) in place, t holding tanh of `gelu_inner`'s result."""
    half, one = np.float32(0.5), np.float32(1.0)
    for i in range(x.shape[0]):
        t[i] = half * x[i] * (one + t[i])


@njit(**_NB)
def negate(x, out):  # noqa: ANN001
    for i in range(x.shape[0]):
        out[i] = -x[i]


@njit(**_NB)
def silu_outer(x, e):  # noqa: ANN001
    """e = x / (1 + e) in place, e holding exp(-x)."""
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        e[i] = x[i] / (one + e[i])
