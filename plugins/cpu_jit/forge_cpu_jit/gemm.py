"""The compiled products: y[m, n] = sum_k x[m, k] * W[n, k] on the GGUF blocks of W.

Weight rows are taken a tile (`TILE` rows) at a time: unpacked (`unpack.py`) into small buffers
that stay in the L1 cache, then multiplied by every activation row, 4 activation rows by 4 weight
rows at a time with 16 vector accumulators (`_int_4x4`), a 64-weight chunk per step: per chunk and
pair, one 4-way byte dot product (`simd.dot4`: `vpdpbusd` with AVX512-VNNI), its conversion to
float and one multiply-add by the product of the two lanes' scales. The integer sums are exact
(as llama.cpp's), the scaling is float32 per lane of 4 weights.

`mm_<type>(raw, xq, xs, xls, xg, out, col0, n0, n1)` computes weight rows n0..n1 of `raw` (the
tensor's GGUF bytes [rows, row bytes]) for the quantized activations (`quant.py`) into
out[:, col0 + n0 : col0 + n1]. `mm_float(raw, kind, xf, out, col0, n0, n1)` does the same for
F16 (kind 1), BF16 (2) and F32 (0) weights and float activations xf. Each releases the GIL: the
caller spreads row ranges over threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forge_cpu_jit.simd import (
    dot4,
    fma,
    fmul,
    hsum,
    load_f32x16,
    load_i8x64,
    load_i32x16,
    load_u8x64,
    neg_shl,
    to_f32,
    zeros_f32x16,
    zeros_i32x16,
)
from forge_cpu_jit.unpack import (
    unpack_bf16,
    unpack_f16,
    unpack_f32,
    unpack_q2_k,
    unpack_q3_k,
    unpack_q4_0,
    unpack_q4_1,
    unpack_q4_k,
    unpack_q5_0,
    unpack_q5_1,
    unpack_q5_k,
    unpack_q6_k,
    unpack_q8_0,
)

TILE = 16  # weight rows unpacked at a time (a multiple of 4)
_NB = {"nogil": True, "cache": True, "error_model": "numpy"}
_INLINE = {**_NB, "inline": "always"}


# --- micro-kernels: written out by _generate() at the end of this file ---

@njit(**_INLINE)
def _int_4x4(wq, ws, xq, xs, xls, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+4, r0:r0+4]: 4 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a10, a11, a12, a13 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a20, a21, a22, a23 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a30, a31, a32, a33 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0, s0 = load_u8x64(wq[r0 + 0], c * 64), load_f32x16(ws[r0 + 0], c * 16)
        w1, s1 = load_u8x64(wq[r0 + 1], c * 64), load_f32x16(ws[r0 + 1], c * 16)
        w2, s2 = load_u8x64(wq[r0 + 2], c * 64), load_f32x16(ws[r0 + 2], c * 16)
        w3, s3 = load_u8x64(wq[r0 + 3], c * 64), load_f32x16(ws[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = neg_shl(load_i32x16(xls[m0 + 0], c * 16), sh) if sh >= 0 else zeros_i32x16()
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
        x1, t1 = load_i8x64(xq[m0 + 1], c * 64), load_f32x16(xs[m0 + 1], c * 16)
        c1 = neg_shl(load_i32x16(xls[m0 + 1], c * 16), sh) if sh >= 0 else zeros_i32x16()
        a10 = fma(to_f32(dot4(c1, w0, x1)), fmul(s0, t1), a10)
        a11 = fma(to_f32(dot4(c1, w1, x1)), fmul(s1, t1), a11)
        a12 = fma(to_f32(dot4(c1, w2, x1)), fmul(s2, t1), a12)
        a13 = fma(to_f32(dot4(c1, w3, x1)), fmul(s3, t1), a13)
        x2, t2 = load_i8x64(xq[m0 + 2], c * 64), load_f32x16(xs[m0 + 2], c * 16)
        c2 = neg_shl(load_i32x16(xls[m0 + 2], c * 16), sh) if sh >= 0 else zeros_i32x16()
        a20 = fma(to_f32(dot4(c2, w0, x2)), fmul(s0, t2), a20)
        a21 = fma(to_f32(dot4(c2, w1, x2)), fmul(s1, t2), a21)
        a22 = fma(to_f32(dot4(c2, w2, x2)), fmul(s2, t2), a22)
        a23 = fma(to_f32(dot4(c2, w3, x2)), fmul(s3, t2), a23)
        x3, t3 = load_i8x64(xq[m0 + 3], c * 64), load_f32x16(xs[m0 + 3], c * 16)
        c3 = neg_shl(load_i32x16(xls[m0 + 3], c * 16), sh) if sh >= 0 else zeros_i32x16()
        a30 = fma(to_f32(dot4(c3, w0, x3)), fmul(s0, t3), a30)
        a31 = fma(to_f32(dot4(c3, w1, x3)), fmul(s1, t3), a31)
        a32 = fma(to_f32(dot4(c3, w2, x3)), fmul(s2, t3), a32)
        a33 = fma(to_f32(dot4(c3, w3, x3)), fmul(s3, t3), a33)
    ot[m0 + 0, r0 + 0] = hsum(a00)
    ot[m0 + 0, r0 + 1] = hsum(a01)
    ot[m0 + 0, r0 + 2] = hsum(a02)
    ot[m0 + 0, r0 + 3] = hsum(a03)
    ot[m0 + 1, r0 + 0] = hsum(a10)
    ot[m0 + 1, r0 + 1] = hsum(a11)
    ot[m0 + 1, r0 + 2] = hsum(a12)
    ot[m0 + 1, r0 + 3] = hsum(a13)
    ot[m0 + 2, r0 + 0] = hsum(a20)
    ot[m0 + 2, r0 + 1] = hsum(a21)
    ot[m0 + 2, r0 + 2] = hsum(a22)
    ot[m0 + 2, r0 + 3] = hsum(a23)
    ot[m0 + 3, r0 + 0] = hsum(a30)
    ot[m0 + 3, r0 + 1] = hsum(a31)
    ot[m0 + 3, r0 + 2] = hsum(a32)
    ot[m0 + 3, r0 + 3] = hsum(a33)


@njit(**_INLINE)
def _int_1x4(wq, ws, xq, xs, xls, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+1, r0:r0+4]: 1 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0, s0 = load_u8x64(wq[r0 + 0], c * 64), load_f32x16(ws[r0 + 0], c * 16)
        w1, s1 = load_u8x64(wq[r0 + 1], c * 64), load_f32x16(ws[r0 + 1], c * 16)
        w2, s2 = load_u8x64(wq[r0 + 2], c * 64), load_f32x16(ws[r0 + 2], c * 16)
        w3, s3 = load_u8x64(wq[r0 + 3], c * 64), load_f32x16(ws[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = neg_shl(load_i32x16(xls[m0 + 0], c * 16), sh) if sh >= 0 else zeros_i32x16()
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
    ot[m0 + 0, r0 + 0] = hsum(a00)
    ot[m0 + 0, r0 + 1] = hsum(a01)
    ot[m0 + 0, r0 + 2] = hsum(a02)
    ot[m0 + 0, r0 + 3] = hsum(a03)


@njit(**_INLINE)
def _float_4x4(wf, xf, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+4, r0:r0+4]: 4 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a10, a11, a12, a13 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a20, a21, a22, a23 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a30, a31, a32, a33 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_f32x16(wf[r0 + 0], c * 16)
        w1 = load_f32x16(wf[r0 + 1], c * 16)
        w2 = load_f32x16(wf[r0 + 2], c * 16)
        w3 = load_f32x16(wf[r0 + 3], c * 16)
        x0 = load_f32x16(xf[m0 + 0], c * 16)
        a00 = fma(w0, x0, a00)
        a01 = fma(w1, x0, a01)
        a02 = fma(w2, x0, a02)
        a03 = fma(w3, x0, a03)
        x1 = load_f32x16(xf[m0 + 1], c * 16)
        a10 = fma(w0, x1, a10)
        a11 = fma(w1, x1, a11)
        a12 = fma(w2, x1, a12)
        a13 = fma(w3, x1, a13)
        x2 = load_f32x16(xf[m0 + 2], c * 16)
        a20 = fma(w0, x2, a20)
        a21 = fma(w1, x2, a21)
        a22 = fma(w2, x2, a22)
        a23 = fma(w3, x2, a23)
        x3 = load_f32x16(xf[m0 + 3], c * 16)
        a30 = fma(w0, x3, a30)
        a31 = fma(w1, x3, a31)
        a32 = fma(w2, x3, a32)
        a33 = fma(w3, x3, a33)
    ot[m0 + 0, r0 + 0] = hsum(a00)
    ot[m0 + 0, r0 + 1] = hsum(a01)
    ot[m0 + 0, r0 + 2] = hsum(a02)
    ot[m0 + 0, r0 + 3] = hsum(a03)
    ot[m0 + 1, r0 + 0] = hsum(a10)
    ot[m0 + 1, r0 + 1] = hsum(a11)
    ot[m0 + 1, r0 + 2] = hsum(a12)
    ot[m0 + 1, r0 + 3] = hsum(a13)
    ot[m0 + 2, r0 + 0] = hsum(a20)
    ot[m0 + 2, r0 + 1] = hsum(a21)
    ot[m0 + 2, r0 + 2] = hsum(a22)
    ot[m0 + 2, r0 + 3] = hsum(a23)
    ot[m0 + 3, r0 + 0] = hsum(a30)
    ot[m0 + 3, r0 + 1] = hsum(a31)
    ot[m0 + 3, r0 + 2] = hsum(a32)
    ot[m0 + 3, r0 + 3] = hsum(a33)


@njit(**_INLINE)
def _float_1x4(wf, xf, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+1, r0:r0+4]: 1 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_f32x16(wf[r0 + 0], c * 16)
        w1 = load_f32x16(wf[r0 + 1], c * 16)
        w2 = load_f32x16(wf[r0 + 2], c * 16)
        w3 = load_f32x16(wf[r0 + 3], c * 16)
        x0 = load_f32x16(xf[m0 + 0], c * 16)
        a00 = fma(w0, x0, a00)
        a01 = fma(w1, x0, a01)
        a02 = fma(w2, x0, a02)
        a03 = fma(w3, x0, a03)
    ot[m0 + 0, r0 + 0] = hsum(a00)
    ot[m0 + 0, r0 + 1] = hsum(a01)
    ot[m0 + 0, r0 + 2] = hsum(a02)
    ot[m0 + 0, r0 + 3] = hsum(a03)


@njit(**_INLINE)
def _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, sh, has_min, ot, out, col):  # noqa: ANN001
    """Products of the unpacked tile (tn rows) by every activation row, into out[:, col:]."""
    m_rows, nc = xq.shape[0], xq.shape[1] // 64
    m = 0
    while m + 4 <= m_rows:
        for r in range(0, tn, 4):
            _int_4x4(wq, ws, xq, xs, xls, sh, ot, m, r, nc)
        m += 4
    while m < m_rows:
        for r in range(0, tn, 4):
            _int_1x4(wq, ws, xq, xs, xls, sh, ot, m, r, nc)
        m += 1
    groups = xg.shape[1]
    for m in range(m_rows):
        for r in range(tn):
            v = ot[m, r]
            if has_min:
                for g in range(groups):
                    v += wm[r, g] * xg[m, g]
            out[m, col + r] = v


@njit(**_INLINE)
def _int_buffers(xq, xg):  # noqa: ANN001
    kp = xq.shape[1]
    return (np.zeros((TILE, kp), np.uint8), np.zeros((TILE, kp // 4), np.float32),
            np.zeros((TILE, xg.shape[1]), np.float32),
            np.zeros((xq.shape[0], TILE), np.float32))  # fmt: skip


@njit(**_NB)
def mm_q4_0(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q4_0(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, 3, False, ot, out, col0 + t)


@njit(**_NB)
def mm_q4_1(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q4_1(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, -1, True, ot, out, col0 + t)


@njit(**_NB)
def mm_q5_0(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q5_0(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, 4, False, ot, out, col0 + t)


@njit(**_NB)
def mm_q5_1(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q5_1(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, -1, True, ot, out, col0 + t)


@njit(**_NB)
def mm_q8_0(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q8_0(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, 7, False, ot, out, col0 + t)


@njit(**_NB)
def mm_q2_k(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q2_k(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, -1, True, ot, out, col0 + t)


@njit(**_NB)
def mm_q3_k(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q3_k(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, 2, False, ot, out, col0 + t)


@njit(**_NB)
def mm_q4_k(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q4_k(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, -1, True, ot, out, col0 + t)


@njit(**_NB)
def mm_q5_k(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q5_k(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, -1, True, ot, out, col0 + t)


@njit(**_NB)
def mm_q6_k(raw, xq, xs, xls, xg, out, col0, n0, n1):  # noqa: ANN001
    wq, ws, wm, ot = _int_buffers(xq, xg)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            unpack_q6_k(raw[t + r], wq[r], ws[r], wm[r])
        _int_tile(wq, ws, wm, tn, xq, xs, xls, xg, 5, False, ot, out, col0 + t)


@njit(**_NB)
def mm_float(raw, kind, xf, out, col0, n0, n1):  # noqa: ANN001
    """F32 (kind 0), F16 (1) or BF16 (2) weight rows n0..n1 by float activations xf [M, Kp]."""
    m_rows, kp = xf.shape
    nc = kp // 16
    wf = np.zeros((TILE, kp), np.float32)
    ot = np.zeros((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            if kind == 1:
                unpack_f16(raw[t + r], wf[r])
            elif kind == 2:
                unpack_bf16(raw[t + r], wf[r])
            else:
                unpack_f32(raw[t + r], wf[r])
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


# The micro-kernels above are written out by this generator (unrolled: numba has no macros).
def _generate() -> str:  # pragma: no cover - a development tool
    def body(kind: str, mr: int, nr: int) -> list[str]:
        if kind == "int":
            head = [f"def _int_{mr}x{nr}(wq, ws, xq, xs, xls, sh, ot, m0, r0, nc):  # noqa: ANN001",
                    f'    """ot[m0:m0+{mr}, r0:r0+{nr}]: {mr} activation rows by {nr} weight rows."""']  # fmt: skip
        else:
            head = [f"def _float_{mr}x{nr}(wf, xf, ot, m0, r0, nc):  # noqa: ANN001",
                    f'    """ot[m0:m0+{mr}, r0:r0+{nr}]: {mr} activation rows by {nr} weight rows."""']  # fmt: skip
        lines = ["@njit(**_INLINE)", *head]
        for j in range(mr):
            lines.append("    " + ", ".join(f"a{j}{i}" for i in range(nr)) + " = "
                         + ", ".join("zeros_f32x16()" for _ in range(nr)))  # fmt: skip
        lines.append("    for c in range(nc):")
        for i in range(nr):
            if kind == "int":
                lines.append(f"        w{i}, s{i} = load_u8x64(wq[r0 + {i}], c * 64), "
                             f"load_f32x16(ws[r0 + {i}], c * 16)")  # fmt: skip
            else:
                lines.append(f"        w{i} = load_f32x16(wf[r0 + {i}], c * 16)")
        for j in range(mr):
            if kind == "int":
                lines.append(f"        x{j}, t{j} = load_i8x64(xq[m0 + {j}], c * 64), "
                             f"load_f32x16(xs[m0 + {j}], c * 16)")  # fmt: skip
                lines.append(f"        c{j} = neg_shl(load_i32x16(xls[m0 + {j}], c * 16), sh) "
                             f"if sh >= 0 else zeros_i32x16()")  # fmt: skip
                for i in range(nr):
                    lines.append(f"        a{j}{i} = fma(to_f32(dot4(c{j}, w{i}, x{j})), "
                                 f"fmul(s{i}, t{j}), a{j}{i})")  # fmt: skip
            else:
                lines.append(f"        x{j} = load_f32x16(xf[m0 + {j}], c * 16)")
                for i in range(nr):
                    lines.append(f"        a{j}{i} = fma(w{i}, x{j}, a{j}{i})")
        for j in range(mr):
            for i in range(nr):
                lines.append(f"    ot[m0 + {j}, r0 + {i}] = hsum(a{j}{i})")
        return lines

    out: list[str] = []
    for kind in ("int", "float"):
        for mr in (4, 1):
            out += body(kind, mr, 4) + ["", ""]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    print(_generate())
