"""The per-type products and micro-kernels (see gemm.py).

Written by codegen.py (`python -m forge_cpu_jit.codegen`): do not edit.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit.quant import act_views
from forge_cpu_jit.simd import (
    as_f32_ptr,
    as_u8_ptr,
    dot4,
    fma,
    fmul,
    hsum,
    load_f32x16,
    load_i8x64,
    load_i32x16,
    load_u8x64,
    neg_shl,
    prefetch,
    store_f32x16,
    store_u8x64,
    to_f32,
    zeros_f32x16,
    zeros_i32x16,
)
from forge_cpu_jit.unpack import (
    chunk_mxfp4,
    chunk_q2_k,
    chunk_q3_k,
    chunk_q4_0,
    chunk_q4_1,
    chunk_q4_k,
    chunk_q5_0,
    chunk_q5_1,
    chunk_q5_k,
    chunk_q6_k,
    chunk_q8_0,
    head_q2_k,
    head_q3_k,
    head_q4_k,
    head_q5_k,
    head_q6_k,
    part_q2_k,
    part_q3_k,
    part_q4_k,
    part_q5_k,
    part_q6_k,
)

TILE = 16  # weight rows unpacked at a time (a multiple of 4)
PREFETCH_BYTES = 2048  # how far ahead of the row being multiplied the one-row products prefetch
_NB = {"nogil": True, "cache": True, "error_model": "numpy"}
_INLINE = {**_NB, "inline": "always"}


@njit(**_INLINE)
def _int_4x4(wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+4, r0:r0+4]: 4 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a10, a11, a12, a13 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a20, a21, a22, a23 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a30, a31, a32, a33 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_u8x64(wq[r0 + 0], c * 64)
        s0 = load_f32x16(ws[r0 + 0], c * 16)
        w1 = load_u8x64(wq[r0 + 1], c * 64)
        s1 = load_f32x16(ws[r0 + 1], c * 16)
        w2 = load_u8x64(wq[r0 + 2], c * 64)
        s2 = load_f32x16(ws[r0 + 2], c * 16)
        w3 = load_u8x64(wq[r0 + 3], c * 64)
        s3 = load_f32x16(ws[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = neg_shl(load_i32x16(xls[m0 + 0], c * 16), sh)
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
        x1, t1 = load_i8x64(xq[m0 + 1], c * 64), load_f32x16(xs[m0 + 1], c * 16)
        c1 = neg_shl(load_i32x16(xls[m0 + 1], c * 16), sh)
        a10 = fma(to_f32(dot4(c1, w0, x1)), fmul(s0, t1), a10)
        a11 = fma(to_f32(dot4(c1, w1, x1)), fmul(s1, t1), a11)
        a12 = fma(to_f32(dot4(c1, w2, x1)), fmul(s2, t1), a12)
        a13 = fma(to_f32(dot4(c1, w3, x1)), fmul(s3, t1), a13)
        x2, t2 = load_i8x64(xq[m0 + 2], c * 64), load_f32x16(xs[m0 + 2], c * 16)
        c2 = neg_shl(load_i32x16(xls[m0 + 2], c * 16), sh)
        a20 = fma(to_f32(dot4(c2, w0, x2)), fmul(s0, t2), a20)
        a21 = fma(to_f32(dot4(c2, w1, x2)), fmul(s1, t2), a21)
        a22 = fma(to_f32(dot4(c2, w2, x2)), fmul(s2, t2), a22)
        a23 = fma(to_f32(dot4(c2, w3, x2)), fmul(s3, t2), a23)
        x3, t3 = load_i8x64(xq[m0 + 3], c * 64), load_f32x16(xs[m0 + 3], c * 16)
        c3 = neg_shl(load_i32x16(xls[m0 + 3], c * 16), sh)
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
def _int_1x4(wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+1, r0:r0+4]: 1 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_u8x64(wq[r0 + 0], c * 64)
        s0 = load_f32x16(ws[r0 + 0], c * 16)
        w1 = load_u8x64(wq[r0 + 1], c * 64)
        s1 = load_f32x16(ws[r0 + 1], c * 16)
        w2 = load_u8x64(wq[r0 + 2], c * 64)
        s2 = load_f32x16(ws[r0 + 2], c * 16)
        w3 = load_u8x64(wq[r0 + 3], c * 64)
        s3 = load_f32x16(ws[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = neg_shl(load_i32x16(xls[m0 + 0], c * 16), sh)
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
    ot[m0 + 0, r0 + 0] = hsum(a00)
    ot[m0 + 0, r0 + 1] = hsum(a01)
    ot[m0 + 0, r0 + 2] = hsum(a02)
    ot[m0 + 0, r0 + 3] = hsum(a03)


@njit(**_INLINE)
def _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+4, r0:r0+4]: 4 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a10, a11, a12, a13 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a20, a21, a22, a23 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    a30, a31, a32, a33 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_u8x64(wq[r0 + 0], c * 64)
        s0 = load_f32x16(ws[r0 + 0], c * 16)
        n0 = load_f32x16(wm[r0 + 0], c * 16)
        w1 = load_u8x64(wq[r0 + 1], c * 64)
        s1 = load_f32x16(ws[r0 + 1], c * 16)
        n1 = load_f32x16(wm[r0 + 1], c * 16)
        w2 = load_u8x64(wq[r0 + 2], c * 64)
        s2 = load_f32x16(ws[r0 + 2], c * 16)
        n2 = load_f32x16(wm[r0 + 2], c * 16)
        w3 = load_u8x64(wq[r0 + 3], c * 64)
        s3 = load_f32x16(ws[r0 + 3], c * 16)
        n3 = load_f32x16(wm[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = zeros_i32x16()
        l0 = load_f32x16(xsl[m0 + 0], c * 16)
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a00 = fma(n0, l0, a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a01 = fma(n1, l0, a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a02 = fma(n2, l0, a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
        a03 = fma(n3, l0, a03)
        x1, t1 = load_i8x64(xq[m0 + 1], c * 64), load_f32x16(xs[m0 + 1], c * 16)
        c1 = zeros_i32x16()
        l1 = load_f32x16(xsl[m0 + 1], c * 16)
        a10 = fma(to_f32(dot4(c1, w0, x1)), fmul(s0, t1), a10)
        a10 = fma(n0, l1, a10)
        a11 = fma(to_f32(dot4(c1, w1, x1)), fmul(s1, t1), a11)
        a11 = fma(n1, l1, a11)
        a12 = fma(to_f32(dot4(c1, w2, x1)), fmul(s2, t1), a12)
        a12 = fma(n2, l1, a12)
        a13 = fma(to_f32(dot4(c1, w3, x1)), fmul(s3, t1), a13)
        a13 = fma(n3, l1, a13)
        x2, t2 = load_i8x64(xq[m0 + 2], c * 64), load_f32x16(xs[m0 + 2], c * 16)
        c2 = zeros_i32x16()
        l2 = load_f32x16(xsl[m0 + 2], c * 16)
        a20 = fma(to_f32(dot4(c2, w0, x2)), fmul(s0, t2), a20)
        a20 = fma(n0, l2, a20)
        a21 = fma(to_f32(dot4(c2, w1, x2)), fmul(s1, t2), a21)
        a21 = fma(n1, l2, a21)
        a22 = fma(to_f32(dot4(c2, w2, x2)), fmul(s2, t2), a22)
        a22 = fma(n2, l2, a22)
        a23 = fma(to_f32(dot4(c2, w3, x2)), fmul(s3, t2), a23)
        a23 = fma(n3, l2, a23)
        x3, t3 = load_i8x64(xq[m0 + 3], c * 64), load_f32x16(xs[m0 + 3], c * 16)
        c3 = zeros_i32x16()
        l3 = load_f32x16(xsl[m0 + 3], c * 16)
        a30 = fma(to_f32(dot4(c3, w0, x3)), fmul(s0, t3), a30)
        a30 = fma(n0, l3, a30)
        a31 = fma(to_f32(dot4(c3, w1, x3)), fmul(s1, t3), a31)
        a31 = fma(n1, l3, a31)
        a32 = fma(to_f32(dot4(c3, w2, x3)), fmul(s2, t3), a32)
        a32 = fma(n2, l3, a32)
        a33 = fma(to_f32(dot4(c3, w3, x3)), fmul(s3, t3), a33)
        a33 = fma(n3, l3, a33)
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
def _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc):  # noqa: ANN001
    """ot[m0:m0+1, r0:r0+4]: 1 activation rows by 4 weight rows."""
    a00, a01, a02, a03 = zeros_f32x16(), zeros_f32x16(), zeros_f32x16(), zeros_f32x16()
    for c in range(nc):
        w0 = load_u8x64(wq[r0 + 0], c * 64)
        s0 = load_f32x16(ws[r0 + 0], c * 16)
        n0 = load_f32x16(wm[r0 + 0], c * 16)
        w1 = load_u8x64(wq[r0 + 1], c * 64)
        s1 = load_f32x16(ws[r0 + 1], c * 16)
        n1 = load_f32x16(wm[r0 + 1], c * 16)
        w2 = load_u8x64(wq[r0 + 2], c * 64)
        s2 = load_f32x16(ws[r0 + 2], c * 16)
        n2 = load_f32x16(wm[r0 + 2], c * 16)
        w3 = load_u8x64(wq[r0 + 3], c * 64)
        s3 = load_f32x16(ws[r0 + 3], c * 16)
        n3 = load_f32x16(wm[r0 + 3], c * 16)
        x0, t0 = load_i8x64(xq[m0 + 0], c * 64), load_f32x16(xs[m0 + 0], c * 16)
        c0 = zeros_i32x16()
        l0 = load_f32x16(xsl[m0 + 0], c * 16)
        a00 = fma(to_f32(dot4(c0, w0, x0)), fmul(s0, t0), a00)
        a00 = fma(n0, l0, a00)
        a01 = fma(to_f32(dot4(c0, w1, x0)), fmul(s1, t0), a01)
        a01 = fma(n1, l0, a01)
        a02 = fma(to_f32(dot4(c0, w2, x0)), fmul(s2, t0), a02)
        a02 = fma(n2, l0, a02)
        a03 = fma(to_f32(dot4(c0, w3, x0)), fmul(s3, t0), a03)
        a03 = fma(n3, l0, a03)
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


@njit(**_NB)
def mm_q4_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_0 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q4_0(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 3, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 3, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q4_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_0 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 36, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 3)
            w, s, mn = chunk_q4_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q4_0(args, lo, hi):  # noqa: ANN001
    """Q4_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q4_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q4_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q4_1(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_1 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if True else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q4_1(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
                store_f32x16(wm[r], c * 16, mn)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q4_1(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_1 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xslr = xq[0], xs[0], xsl[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 40, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = chunk_q4_1(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q4_1(args, lo, hi):  # noqa: ANN001
    """Q4_1 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q4_1(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q4_1(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q5_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_0 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q5_0(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 4, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 4, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q5_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_0 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 44, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 4)
            w, s, mn = chunk_q5_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q5_0(args, lo, hi):  # noqa: ANN001
    """Q5_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q5_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q5_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q5_1(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_1 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if True else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q5_1(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
                store_f32x16(wm[r], c * 16, mn)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q5_1(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_1 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xslr = xq[0], xs[0], xsl[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 48, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = chunk_q5_1(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q5_1(args, lo, hi):  # noqa: ANN001
    """Q5_1 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q5_1(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q5_1(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q8_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q8_0 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q8_0(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 7, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 7, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q8_0(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q8_0 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 68, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 7)
            w, s, mn = chunk_q8_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q8_0(args, lo, hi):  # noqa: ANN001
    """Q8_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q8_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q8_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_mxfp4(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """MXFP4 weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_mxfp4(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 4, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 4, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_mxfp4(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """MXFP4 weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for c in range(xq.shape[1] // 64):
            prefetch(flat, min(ahead + c * 34, last))
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 4)
            w, s, mn = chunk_mxfp4(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_mxfp4(args, lo, hi):  # noqa: ANN001
    """MXFP4 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_mxfp4(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_mxfp4(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q2_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q2_K weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if True else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q2_k(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
                store_f32x16(wm[r], c * 16, mn)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q2_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q2_K weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xslr = xq[0], xs[0], xsl[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for b in range(raw.shape[1] // 84):
            o = b * 84
            prefetch(flat, min(ahead + o + 0, last))
            prefetch(flat, min(ahead + o + 64, last))
            h = head_q2_k(row, o)
            c = 4 * b + 0
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q2_k(row, o, 0, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 1
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q2_k(row, o, 1, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 2
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q2_k(row, o, 2, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 3
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q2_k(row, o, 3, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q2_k(args, lo, hi):  # noqa: ANN001
    """Q2_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q2_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q2_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q3_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q3_K weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q3_k(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 2, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 2, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q3_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q3_K weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for b in range(raw.shape[1] // 110):
            o = b * 110
            prefetch(flat, min(ahead + o + 0, last))
            prefetch(flat, min(ahead + o + 64, last))
            h = head_q3_k(row, o)
            c = 4 * b + 0
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 2)
            w, s, mn = part_q3_k(row, o, 0, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 1
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 2)
            w, s, mn = part_q3_k(row, o, 1, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 2
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 2)
            w, s, mn = part_q3_k(row, o, 2, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 3
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 2)
            w, s, mn = part_q3_k(row, o, 3, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q3_k(args, lo, hi):  # noqa: ANN001
    """Q3_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q3_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q3_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q4_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_K weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if True else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q4_k(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
                store_f32x16(wm[r], c * 16, mn)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q4_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q4_K weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xslr = xq[0], xs[0], xsl[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for b in range(raw.shape[1] // 144):
            o = b * 144
            prefetch(flat, min(ahead + o + 0, last))
            prefetch(flat, min(ahead + o + 64, last))
            prefetch(flat, min(ahead + o + 128, last))
            h = head_q4_k(row, o)
            c = 4 * b + 0
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q4_k(row, o, 0, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 1
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q4_k(row, o, 1, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 2
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q4_k(row, o, 2, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 3
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q4_k(row, o, 3, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q4_k(args, lo, hi):  # noqa: ANN001
    """Q4_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q4_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q4_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q5_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_K weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if True else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q5_k(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
                store_f32x16(wm[r], c * 16, mn)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _intmin_4x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _intmin_1x4(wq, ws, wm, xq, xs, xls, xsl, -1, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q5_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q5_K weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xslr = xq[0], xs[0], xsl[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for b in range(raw.shape[1] // 176):
            o = b * 176
            prefetch(flat, min(ahead + o + 0, last))
            prefetch(flat, min(ahead + o + 64, last))
            prefetch(flat, min(ahead + o + 128, last))
            h = head_q5_k(row, o)
            c = 4 * b + 0
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q5_k(row, o, 0, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 1
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q5_k(row, o, 1, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 2
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q5_k(row, o, 2, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
            c = 4 * b + 3
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = part_q5_k(row, o, 3, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q5_k(args, lo, hi):  # noqa: ANN001
    """Q5_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q5_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q5_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


@njit(**_NB)
def mm_q6_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q6_K weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""
    m_rows, kp = xq.shape
    nc = kp // 64
    wq = np.zeros((TILE, kp), np.uint8)
    ws = np.zeros((TILE, kp // 4), np.float32)
    wm = np.zeros((TILE, kp // 4 if False else 1), np.float32)
    ot = np.empty((m_rows, TILE), np.float32)
    for t in range(n0, n1, TILE):
        tn = min(TILE, n1 - t)
        for r in range(tn):
            row = raw[t + r]
            for c in range(nc):
                w, s, mn = chunk_q6_k(row, c)
                store_u8x64(wq[r], c * 64, w)
                store_f32x16(ws[r], c * 16, s)
        m = 0
        while m + 4 <= m_rows:
            for r in range(0, tn, 4):
                _int_4x4(wq, ws, wm, xq, xs, xls, xsl, 5, ot, m, r, nc)
            m += 4
        while m < m_rows:
            for r in range(0, tn, 4):
                _int_1x4(wq, ws, wm, xq, xs, xls, xsl, 5, ot, m, r, nc)
            m += 1
        for m in range(m_rows):
            for r in range(tn):
                out[m, col0 + t + r] = ot[m, r]


@njit(**_NB)
def mv_q6_k(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001
    """Q6_K weight rows n0..n1 by one activation row, a row at a time."""
    x, xsr, xlr = xq[0], xs[0], xls[0]
    flat = raw.reshape(raw.shape[0] * raw.shape[1])
    last = flat.shape[0] - 1
    for n in range(n0, n1):
        row = raw[n]
        ahead = n * raw.shape[1] + PREFETCH_BYTES
        acc = zeros_f32x16()
        for b in range(raw.shape[1] // 210):
            o = b * 210
            prefetch(flat, min(ahead + o + 0, last))
            prefetch(flat, min(ahead + o + 64, last))
            prefetch(flat, min(ahead + o + 128, last))
            prefetch(flat, min(ahead + o + 192, last))
            h = head_q6_k(row, o)
            c = 4 * b + 0
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 5)
            w, s, mn = part_q6_k(row, o, 0, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 1
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 5)
            w, s, mn = part_q6_k(row, o, 1, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 2
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 5)
            w, s, mn = part_q6_k(row, o, 2, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            c = 4 * b + 3
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 5)
            w, s, mn = part_q6_k(row, o, 3, h)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q6_k(args, lo, hi):  # noqa: ANN001
    """Q6_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq, xs, xls, xsl = act_views(a[4], a[5], a[3], a[6], a[7], a[8])
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q6_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q6_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


ENTRIES = {
    "Q4_0": entry_q4_0,
    "Q4_1": entry_q4_1,
    "Q5_0": entry_q5_0,
    "Q5_1": entry_q5_1,
    "Q8_0": entry_q8_0,
    "MXFP4": entry_mxfp4,
    "Q2_K": entry_q2_k,
    "Q3_K": entry_q3_k,
    "Q4_K": entry_q4_k,
    "Q5_K": entry_q5_k,
    "Q6_K": entry_q6_k,
}
