"""Activations rounded as llama.cpp's CPU backend rounds them for its quantized dot products.

Each quantizer fills, for rows of x (float32 [M, K]) and K padded to Kp (a multiple of 64, the
padding zero):
- xq int8 [M, Kp]: the codes;
- xs float32 [M, Kp/4]: each code's scale, one per lane of 4 codes (`simd.dot4` sums 4 products);
- xls int32 [M, Kp/4]: the sum of each lane's 4 codes (undoes the offset of unsigned weight codes);
- xsl float32 [M, Kp/4]: scale times lane sum, what the weights' minimums multiply.

`q8_0_rows` is llama.cpp's x86 quantize_row_q8_0 (scale max|x| / 127 stored as f16, codes
round-half-even of x * 127 / max|x|), for the 32-element types; for Q4_1/Q5_1 llama.cpp's Q8_1 also
stores the scaled code sum rounded to f16, which the lanes' float sums here do not round (a
difference of the order of f16 rounding in the minimum's term). `q8_k_rows` is quantize_row_q8_K
(scale from the signed value of largest magnitude, -127 / max, codes min(127, round(x * iscale)),
f32 scale 1 / iscale), for the K-quants.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit.simd import as_f32_ptr, as_i8_ptr, as_i32_ptr, bits_to_f32, f32_to_bits

_NB = {"nogil": True, "cache": True, "error_model": "numpy"}


@njit(inline="always", **_NB)
def act_views(m, kp, xq, xs, xls, xsl):  # noqa: ANN001, ANN201
    """The buffers above for m rows of padded length kp, as arrays over their addresses (how the
    compiled entries receive them): (xq, xs, xls, xsl)."""
    lanes = (m, kp // 4)
    return (carray(as_i8_ptr(xq), (m, kp)), carray(as_f32_ptr(xs), lanes),
            carray(as_i32_ptr(xls), lanes), carray(as_f32_ptr(xsl), lanes))  # fmt: skip


@njit(inline="always", **_NB)
def f16_to_f32(h):  # noqa: ANN001, ANN201
    """An IEEE half (its 16 bits in an integer) as float32; exact for every finite half."""
    h = np.uint32(h)
    f = bits_to_f32((h & np.uint32(0x7FFF)) << np.uint32(13)) * np.float32(5.192296858534828e33)
    if h & np.uint32(0x8000):
        f = -f
    return f


@njit(inline="always", **_NB)
def f32_to_f16(f):  # noqa: ANN001, ANN201
    """The IEEE half nearest to a float32 (ties to even), as its 16 bits (int64)."""
    u = np.int64(f32_to_bits(np.float32(f)))
    sign = (u >> 16) & 0x8000
    u &= 0x7FFFFFFF
    if u >= 0x47800000:  # beyond the half range: infinity (or NaN)
        o = 0x7E00 if u > 0x7F800000 else 0x7C00
    elif u < 0x38800000:  # a half subnormal (or zero): rounded by a float addition
        v = bits_to_f32(u) + np.float32(0.5)
        o = np.int64(f32_to_bits(v)) - 0x3F000000
    else:
        o = (u + ((15 - 127) << 23) + 0xFFF + ((u >> 13) & 1)) >> 13
    return o | sign


@njit(inline="always", **_NB)
def round_f16(f):  # noqa: ANN001, ANN201
    return f16_to_f32(f32_to_f16(f))


@njit(**_NB)
def q8_0_rows(x, xq, xs, xls, xsl, lo, hi):  # noqa: ANN001
    """Rows lo..hi of x as Q8_0 blocks into the buffers described above."""
    k = x.shape[1]
    for m in range(lo, hi):
        row = x[m]
        for b in range(k // 32):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(row[b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            dh = round_f16(d)
            for j in range(32):
                xq[m, b * 32 + j] = np.int32(np.rint(row[b * 32 + j] * inv))
            for lane in range(8):
                s = 0
                for j in range(4):
                    s += np.int32(xq[m, b * 32 + lane * 4 + j])
                xls[m, b * 8 + lane] = s
                xs[m, b * 8 + lane] = dh
                xsl[m, b * 8 + lane] = dh * np.float32(s)


@njit(**_NB)
def q8_k_rows(x, xq, xs, xls, xsl, lo, hi):  # noqa: ANN001
    """Rows lo..hi of x as Q8_K blocks into the buffers described above."""
    k = x.shape[1]
    for m in range(lo, hi):
        row = x[m]
        for b in range(k // 256):
            base = b * 256
            amax = np.float32(0.0)
            peak = np.float32(0.0)
            for j in range(256):
                v = row[base + j]
                if abs(v) > amax:
                    amax = abs(v)
                    peak = v
            if amax == 0:
                for j in range(256):
                    xq[m, base + j] = 0
                for lane in range(64):
                    xls[m, b * 64 + lane] = 0
                    xs[m, b * 64 + lane] = 0
                    xsl[m, b * 64 + lane] = 0
                continue
            iscale = np.float32(-127.0) / peak
            d = np.float32(1.0) / iscale
            for j in range(256):
                xq[m, base + j] = min(127, np.int32(np.rint(iscale * row[base + j])))
            for lane in range(64):
                s = 0
                for j in range(4):
                    s += np.int32(xq[m, base + lane * 4 + j])
                xls[m, b * 64 + lane] = s
                xs[m, b * 64 + lane] = d
                xsl[m, b * 64 + lane] = d * np.float32(s)


@njit(**_NB)
def round_rows(x, xf, mode, lo, hi):  # noqa: ANN001
    """Rows lo..hi of x, rounded to f16 (mode 1), bf16 (mode 2) or kept (0), into xf [M, Kp]."""
    k = x.shape[1]
    for m in range(lo, hi):
        for i in range(k):
            v = x[m, i]
            if mode == 1:
                v = round_f16(v)
            elif mode == 2:
                u = np.int64(f32_to_bits(v))
                u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
                v = bits_to_f32(u)
            xf[m, i] = v
