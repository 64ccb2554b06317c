"""The compiled products: y[m, n] = sum_k x[m, k] * W[n, k] on the GGUF blocks of W.

One activation row (decode): `mv_<type>` streams the weight rows one after the other, unpacking
each 64-weight chunk in registers (`unpack.py`) and multiplying it at once: per chunk and row,
one 4-way byte dot product (`simd.dot4`: `vpdpbusd` with AVX512-VNNI) seeded with the offset
correction, its conversion to float and one multiply-add by the product of the lanes' scales
(and for types with minimums one more by the activations' scaled lane sums). The integer sums
are exact, as llama.cpp's; the scaling is float32 per lane of 4 weights.

Several activation rows (prefill, batched decode): `mm_<type>` unpacks a tile of `TILE` weight
rows into buffers that stay in the L1 cache, then multiplies them by every activation row, 4 rows
by 4 rows with 16 vector accumulators (`_int_4x4`): the unpacking is paid once per tile, not per
activation row.

Both compute weight rows n0..n1 of `raw` (the tensor's GGUF bytes [rows, row bytes]) for the
quantized activations of `quant.py` (xq, xs, xls, xsl) into out[:, col0 + n0 : col0 + n1].
`mm_float(raw, kind, xf, out, col0, n0, n1)` does the same for F32 (kind 0), F16 (1) and BF16 (2)
weights with float activations xf. All release the GIL: the caller spreads row ranges over threads.

The per-type drivers and the micro-kernels live in `generated.py`, written by `codegen.py`
(numba has no macros, and caches only functions defined in a file).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit.generated import _INLINE, _NB, ENTRIES, TILE, _float_1x4, _float_4x4
from forge_cpu_jit.quant import act_views, f16_to_f32, q8_0_rows, q8_k_rows, round_rows
from forge_cpu_jit.simd import (
    as_f32_ptr,
    as_u8_ptr,
    bits_to_f32,
    call_entry,
    load_bf16x16,
    load_f16x16,
    load_f32x16_bytes,
    store_f32x16,
)
from forge_cpu_jit.unpack import _u32

__all__ = ["ENTRIES", "TILE"]


@njit(**_INLINE)
def _float_row(row, kind, k, wf):  # noqa: ANN001
    """One F32/F16/BF16 row (k weights) as float32 into wf."""
    whole = k // 16
    for c in range(whole):
        if kind == 1:
            store_f32x16(wf, c * 16, load_f16x16(row, c * 32))
        elif kind == 2:
            store_f32x16(wf, c * 16, load_bf16x16(row, c * 32))
        else:
            store_f32x16(wf, c * 16, load_f32x16_bytes(row, c * 64))
    for i in range(whole * 16, k):
        if kind == 1:
            wf[i] = f16_to_f32(np.uint32(row[2 * i]) | (np.uint32(row[2 * i + 1]) << np.uint32(8)))
        elif kind == 2:
            wf[i] = bits_to_f32((np.uint32(row[2 * i]) << np.uint32(16))
                                | (np.uint32(row[2 * i + 1]) << np.uint32(24)))  # fmt: skip
        else:
            wf[i] = bits_to_f32(_u32(row, 4 * i))


@njit(**_NB)
def mm_float(raw, kind, xf, out, col0, n0, n1):  # noqa: ANN001
    """F32 (kind 0), F16 (1) or BF16 (2) weight rows n0..n1 by float activations xf [M, Kp]."""
    m_rows, kp = xf.shape
    k = raw.shape[1] // (4 if kind == 0 else 2)
    nc = kp // 16
    wf = np.zeros((TILE, kp), np.float32)
    ot = np.zeros((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            _float_row(raw[t + r], kind, k, wf[r])
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _float_4x4(wf, xf, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _float_1x4(wf, xf, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


def entry_float(args, lo, hi):  # noqa: ANN001
    """F32/F16/BF16 weight rows lo..hi of the product described by `args` (`FLOAT_ARGS`)."""
    a = carray(args, 10)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xf = carray(as_f32_ptr(a[4]), (a[5], a[6]))
    out = carray(as_f32_ptr(a[7]), (a[5], a[8]))
    mm_float(raw, a[3], xf, out, a[9], lo, hi)


def entry_group(args, lo, hi):  # noqa: ANN001
    """Rows lo..hi of several products run as one job (`GROUP_ARGS`): part p's rows follow
    those of the parts before it, each part run by its own entry on its own args."""
    n = carray(args, 1)[0]
    a = carray(args, 2 + 3 * n)
    for p in range(n):
        start = a[3 + 3 * p]
        end = a[6 + 3 * p] if p + 1 < n else a[1 + 3 * n]
        s, e = max(lo, start), min(hi, end)
        if s < e:
            call_entry(a[1 + 3 * p], a[2 + 3 * p], s - start, e - start)


def entry_act_q8_0(args, lo, hi):  # noqa: ANN001
    """Activation rows lo..hi rounded to Q8_0 (`QUANT_ARGS`)."""
    a = carray(args, 8)
    x = carray(as_f32_ptr(a[0]), (a[1], a[2]))
    q8_0_rows(x, *act_views(a[1], a[4], a[3], a[5], a[6], a[7]), lo, hi)


def entry_act_q8_k(args, lo, hi):  # noqa: ANN001
    """Activation rows lo..hi rounded to Q8_K (`QUANT_ARGS`)."""
    a = carray(args, 8)
    x = carray(as_f32_ptr(a[0]), (a[1], a[2]))
    q8_k_rows(x, *act_views(a[1], a[4], a[3], a[5], a[6], a[7]), lo, hi)


def entry_act_round(args, lo, hi):  # noqa: ANN001
    """Activation rows lo..hi rounded to f16 / bf16 or kept (`ROUND_ARGS`)."""
    a = carray(args, 6)
    x = carray(as_f32_ptr(a[0]), (a[1], a[2]))
    xf = carray(as_f32_ptr(a[3]), (a[1], a[4]))
    round_rows(x, xf, a[5], lo, hi)


# What each entry's int64 args hold (addresses, then sizes):
ENTRY_ARGS = "raw, rows, row bytes, xq, M, Kp, xs, xls, xsl, out, out columns, column 0"
FLOAT_ARGS = "raw, rows, row bytes, kind, xf, M, Kp, out, out columns, column 0"
QUANT_ARGS = "x, M, K, xq, Kp, xs, xls, xsl"
ROUND_ARGS = "x, M, K, xf, Kp, mode"
GROUP_ARGS = "parts n, then per part its entry, its args and its first row, then all rows"
