"""The compiled products: y[m, n] = sum_k x[m, k] * W[n, k] on the GGUF blocks of W.

One activation row (decode): `mv_<type>` streams the weight rows one after the other, unpacking
each 64-weight chunk in registers (`unpack.py`) and multiplying it at once: per chunk and row, one 4-way byte dot
product (`simd.dot4`: `vpdpbusd` with AVX512-VNNI) seeded with the offset correction, its
conversion to float and one multiply-add by the product of the lanes' scales (and for types with
minimums one more by the activations' scaled lane sums). The integer sums are exact, as
llama.cpp's; the scaling is float32 per lane of 4 weights.

Several activation rows (prefill, batched decode): `mm_<type>` unpacks a tile of `TILE` weight
rows into buffers that stay in the L1 cache, then multiplies them by every activation row, 4 rows
by 4 rows with 16 vector accumulators (`_int_4x4`): the unpacking is paid once per tile, not per
activation row.

Both compute weight rows n0..n1 of `raw` (the tensor's GGUF bytes [rows, row bytes]) for the
quantized activations of `quant.py` (xq, xs, xls, xsl) into out[:, col0 + n0 : col0 + n1].
`mm_float(raw, kind, xf, out, col0, n0, n1)` does the same for F32 (kind 0), F16 (1) and BF16 (2)
weights with float activations xf. All release the GIL: the caller spreads row ranges over threads.

The per-type functions and micro-kernels between the GENERATED markers are written by `_generate`
(numba has no macros, and caches only functions defined in a file): edit the templates there and
run `python -m forge_cpu_jit.gemm` to rewrite them.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit.quant import f16_to_f32, q8_0_rows, q8_k_rows, round_rows
from forge_cpu_jit.simd import (
    as_f32_ptr,
    as_i8_ptr,
    as_i32_ptr,
    as_u8_ptr,
    bits_to_f32,
    dot4,
    fma,
    fmul,
    hsum,
    load_bf16x16,
    load_f16x16,
    load_f32x16,
    load_f32x16_bytes,
    load_i8x64,
    load_i32x16,
    load_u8x64,
    neg_shl,
    store_f32x16,
    store_u8x64,
    to_f32,
    zeros_f32x16,
    zeros_i32x16,
)
from forge_cpu_jit.unpack import (
    _u32,
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
)
TILE = 16  # weight rows unpacked at a time (a multiple of 4)
_NB = {"nogil": True, "cache": True, "error_model": "numpy"}
_INLINE = {**_NB, "inline": "always"}
INT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# GENERATED: begin
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
    """Q4_0 weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 3)
            w, s, mn = chunk_q4_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q4_0(args, lo, hi):  # noqa: ANN001
    """Q4_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q4_1 weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
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
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q5_0 weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 4)
            w, s, mn = chunk_q5_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q5_0(args, lo, hi):  # noqa: ANN001
    """Q5_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q5_1 weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
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
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q8_0 weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 7)
            w, s, mn = chunk_q8_0(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q8_0(args, lo, hi):  # noqa: ANN001
    """Q8_0 weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q8_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q8_0(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


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
    """Q2_K weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = chunk_q2_k(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q2_k(args, lo, hi):  # noqa: ANN001
    """Q2_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q3_K weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 2)
            w, s, mn = chunk_q3_k(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q3_k(args, lo, hi):  # noqa: ANN001
    """Q3_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q4_K weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = chunk_q4_k(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q4_k(args, lo, hi):  # noqa: ANN001
    """Q4_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q5_K weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = zeros_i32x16()
            w, s, mn = chunk_q5_k(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
            acc = fma(mn, load_f32x16(xslr, c * 16), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q5_k(args, lo, hi):  # noqa: ANN001
    """Q5_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
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
    """Q6_K weight rows n0..n1 by one activation row, a row at a time (one stream from
    memory: interleaving rows halved the read bandwidth)."""
    nc = xq.shape[1] // 64
    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]
    for n in range(n0, n1):
        row = raw[n]
        acc = zeros_f32x16()
        for c in range(nc):
            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)
            cv = neg_shl(load_i32x16(xlr, c * 16), 5)
            w, s, mn = chunk_q6_k(row, c)
            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)
        out[0, col0 + n] = hsum(acc)


def entry_q6_k(args, lo, hi):  # noqa: ANN001
    """Q6_K weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""
    a = carray(args, 12)
    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))
    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))
    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))
    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))
    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))
    if a[4] == 1:
        mv_q6_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)
    else:
        mm_q6_k(raw, xq, xs, xls, xsl, out, a[11], lo, hi)


ENTRIES = {"Q4_0": entry_q4_0, "Q4_1": entry_q4_1, "Q5_0": entry_q5_0, "Q5_1": entry_q5_1, "Q8_0": entry_q8_0, "Q2_K": entry_q2_k, "Q3_K": entry_q3_k, "Q4_K": entry_q4_k, "Q5_K": entry_q5_k, "Q6_K": entry_q6_k}
# GENERATED: end


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


def entry_act_q8_0(args, lo, hi):  # noqa: ANN001
    """Activation rows lo..hi rounded to Q8_0 (`QUANT_ARGS`)."""
    a = carray(args, 8)
    x = carray(as_f32_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[1], a[4]))
    xs = carray(as_f32_ptr(a[5]), (a[1], a[4] // 4))
    xls = carray(as_i32_ptr(a[6]), (a[1], a[4] // 4))
    xsl = carray(as_f32_ptr(a[7]), (a[1], a[4] // 4))
    q8_0_rows(x, xq, xs, xls, xsl, lo, hi)


def entry_act_q8_k(args, lo, hi):  # noqa: ANN001
    """Activation rows lo..hi rounded to Q8_K (`QUANT_ARGS`)."""
    a = carray(args, 8)
    x = carray(as_f32_ptr(a[0]), (a[1], a[2]))
    xq = carray(as_i8_ptr(a[3]), (a[1], a[4]))
    xs = carray(as_f32_ptr(a[5]), (a[1], a[4] // 4))
    xls = carray(as_i32_ptr(a[6]), (a[1], a[4] // 4))
    xsl = carray(as_f32_ptr(a[7]), (a[1], a[4] // 4))
    q8_k_rows(x, xq, xs, xls, xsl, lo, hi)


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


# -- the generator ---------------------------------------------------------------------------

_SHIFT = {"Q4_0": 3, "Q4_1": -1, "Q5_0": 4, "Q5_1": -1, "Q8_0": 7,
          "Q2_K": -1, "Q3_K": 2, "Q4_K": -1, "Q5_K": -1, "Q6_K": 5}  # = unpack.OFFSET_SHIFT  # fmt: skip


def _micro(kind: str, mr: int, nr: int) -> list[str]:
    """A micro-kernel: mr activation rows by nr (unpacked) weight rows over nc chunks."""
    name = {"int": "_int", "min": "_intmin", "float": "_float"}[kind] + f"_{mr}x{nr}"
    args = ("wf, xf, ot, m0, r0, nc" if kind == "float"
            else "wq, ws, wm, xq, xs, xls, xsl, sh, ot, m0, r0, nc")  # fmt: skip
    lines = ["@njit(**_INLINE)", f"def {name}({args}):  # noqa: ANN001",
             f'    """ot[m0:m0+{mr}, r0:r0+{nr}]: {mr} activation rows by {nr} weight rows."""']  # fmt: skip
    for j in range(mr):
        lines.append("    " + ", ".join(f"a{j}{i}" for i in range(nr)) + " = "
                     + ", ".join("zeros_f32x16()" for _ in range(nr)))  # fmt: skip
    lines.append("    for c in range(nc):")
    for i in range(nr):
        if kind == "float":
            lines.append(f"        w{i} = load_f32x16(wf[r0 + {i}], c * 16)")
            continue
        lines.append(f"        w{i} = load_u8x64(wq[r0 + {i}], c * 64)")
        lines.append(f"        s{i} = load_f32x16(ws[r0 + {i}], c * 16)")
        if kind == "min":
            lines.append(f"        n{i} = load_f32x16(wm[r0 + {i}], c * 16)")
    for j in range(mr):
        if kind == "float":
            lines.append(f"        x{j} = load_f32x16(xf[m0 + {j}], c * 16)")
            lines += [f"        a{j}{i} = fma(w{i}, x{j}, a{j}{i})" for i in range(nr)]
            continue
        lines.append(f"        x{j}, t{j} = load_i8x64(xq[m0 + {j}], c * 64), "
                     f"load_f32x16(xs[m0 + {j}], c * 16)")  # fmt: skip
        if kind == "min":
            lines.append(f"        c{j} = zeros_i32x16()")
            lines.append(f"        l{j} = load_f32x16(xsl[m0 + {j}], c * 16)")
        else:
            lines.append(f"        c{j} = neg_shl(load_i32x16(xls[m0 + {j}], c * 16), sh)")
        for i in range(nr):
            lines.append(f"        a{j}{i} = fma(to_f32(dot4(c{j}, w{i}, x{j})), "
                         f"fmul(s{i}, t{j}), a{j}{i})")  # fmt: skip
            if kind == "min":
                lines.append(f"        a{j}{i} = fma(n{i}, l{j}, a{j}{i})")
    for j in range(mr):
        for i in range(nr):
            lines.append(f"    ot[m0 + {j}, r0 + {i}] = hsum(a{j}{i})")
    return lines + ["", ""]


def _tile_driver(t: str) -> list[str]:
    low, sh = t.lower(), _SHIFT[t]
    mk = "_intmin" if sh < 0 else "_int"
    lines = [
        "@njit(**_NB)",
        f"def mm_{low}(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001",
        f'    """{t} weight rows n0..n1 by several activation rows (tiles unpacked to L1)."""',
        "    m_rows, kp = xq.shape",
        "    nc = kp // 64",
        "    wq = np.zeros((TILE, kp), np.uint8)",
        "    ws = np.zeros((TILE, kp // 4), np.float32)",
        "    wm = np.zeros((TILE, kp // 4 if " + ("True" if sh < 0 else "False") + " else 1), "
        "np.float32)",
        "    ot = np.empty((m_rows, TILE), np.float32)",
        "    for t in range(n0, n1, TILE):",
        "        tn = min(TILE, n1 - t)",
        "        for r in range(tn):",
        "            row = raw[t + r]",
        "            for c in range(nc):",
        f"                w, s, mn = chunk_{low}(row, c)",
        "                store_u8x64(wq[r], c * 64, w)",
        "                store_f32x16(ws[r], c * 16, s)",
    ]
    if sh < 0:
        lines.append("                store_f32x16(wm[r], c * 16, mn)")
    lines += [
        "        m = 0",
        "        while m + 4 <= m_rows:",
        "            for r in range(0, tn, 4):",
        f"                {mk}_4x4(wq, ws, wm, xq, xs, xls, xsl, {sh}, ot, m, r, nc)",
        "            m += 4",
        "        while m < m_rows:",
        "            for r in range(0, tn, 4):",
        f"                {mk}_1x4(wq, ws, wm, xq, xs, xls, xsl, {sh}, ot, m, r, nc)",
        "            m += 1",
        "        for m in range(m_rows):",
        "            for r in range(tn):",
        "                out[m, col0 + t + r] = ot[m, r]",
        "", "",
    ]  # fmt: skip
    return lines


def _row_driver(t: str) -> list[str]:
    low, sh = t.lower(), _SHIFT[t]
    lines = [
        "@njit(**_NB)",
        f"def mv_{low}(raw, xq, xs, xls, xsl, out, col0, n0, n1):  # noqa: ANN001",
        f'    """{t} weight rows n0..n1 by one activation row, a row at a time (one stream from',
        '    memory: interleaving rows halved the read bandwidth)."""',
        "    nc = xq.shape[1] // 64",
        "    x, xsr, xlr, xslr = xq[0], xs[0], xls[0], xsl[0]",
        "    for n in range(n0, n1):",
        "        row = raw[n]",
        "        acc = zeros_f32x16()",
        "        for c in range(nc):",
        "            xv, tv = load_i8x64(x, c * 64), load_f32x16(xsr, c * 16)",
    ]  # fmt: skip
    if sh < 0:
        lines += ["            cv = zeros_i32x16()"]
    else:
        lines.append(f"            cv = neg_shl(load_i32x16(xlr, c * 16), {sh})")
    lines.append(f"            w, s, mn = chunk_{low}(row, c)")
    lines.append("            acc = fma(to_f32(dot4(cv, w, xv)), fmul(s, tv), acc)")
    if sh < 0:
        lines.append("            acc = fma(mn, load_f32x16(xslr, c * 16), acc)")
    lines.append("        out[0, col0 + n] = hsum(acc)")
    return lines + ["", ""]


def _entry(t: str) -> list[str]:
    low = t.lower()
    return [
        f"def entry_{low}(args, lo, hi):  # noqa: ANN001",
        f'    """{t} weight rows lo..hi of the product described by `args` (`ENTRY_ARGS`)."""',
        "    a = carray(args, 12)",
        "    raw = carray(as_u8_ptr(a[0]), (a[1], a[2]))",
        "    xq = carray(as_i8_ptr(a[3]), (a[4], a[5]))",
        "    xs = carray(as_f32_ptr(a[6]), (a[4], a[5] // 4))",
        "    xls = carray(as_i32_ptr(a[7]), (a[4], a[5] // 4))",
        "    xsl = carray(as_f32_ptr(a[8]), (a[4], a[5] // 4))",
        "    out = carray(as_f32_ptr(a[9]), (a[4], a[10]))",
        "    if a[4] == 1:",
        f"        mv_{low}(raw, xq, xs, xls, xsl, out, a[11], lo, hi)",
        "    else:",
        f"        mm_{low}(raw, xq, xs, xls, xsl, out, a[11], lo, hi)",
        "", "",
    ]  # fmt: skip


def _generate() -> str:  # pragma: no cover - a development tool
    out: list[str] = []
    for kind in ("int", "min", "float"):
        for mr in (4, 1):
            out += _micro(kind, mr, 4)
    for t in INT_TYPES:
        out += _tile_driver(t) + _row_driver(t) + _entry(t)
    out.append("ENTRIES = {" + ", ".join(f'"{t}": entry_{t.lower()}' for t in INT_TYPES) + "}")
    return "\n".join(out)


def _rewrite() -> None:  # pragma: no cover - a development tool
    from pathlib import Path

    path = Path(__file__)
    text = path.read_text()
    head, rest = text.split("# GENERATED: begin\n", 1)
    _, tail = rest.split("# GENERATED: end\n", 1)
    path.write_text(head + "# GENERATED: begin\n" + _generate() + "\n# GENERATED: end\n" + tail)


if __name__ == "__main__":  # pragma: no cover
    _rewrite()
