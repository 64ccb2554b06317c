"""One GGUF row of each quantized type as the product kernel reads it.

`unpack_<type>(row, wq, ws, wm)` turns one row's blocks (uint8, as stored in the file) into:
- wq uint8 [>= K]: each weight's code made unsigned by an offset (`OFFSET_SHIFT`: code - 2**shift is
  the signed code; no shift for the types whose blocks carry a minimum instead);
- ws float32 [>= K/4]: the scale of each lane of 4 weights (block or sub-block scale);
- wm float32 [groups]: minus the minimum of each group of 16 (K-quants) or 32 (Q4_1, Q5_1), which
  multiplies the activations' scaled group sums (`quant.py`'s xg).
So a weight is ws * (wq - 2**shift) - wm-term, exactly the value llama.cpp's dot products use.
Only the tile being multiplied is unpacked, into small buffers that stay in the L1 cache: the
matrix itself stays in the memory-mapped file.

Block layouts (byte offsets) are those of ggml: Q4_0 d qs[16]; Q4_1 d m qs[16]; Q5_0 d qh[4]
qs[16]; Q5_1 d m qh[4] qs[16]; Q8_0 d qs[32]; Q2_K scales[16]@0 qs[64]@16 d@80 dmin@82; Q3_K
hmask[32]@0 qs[64]@32 scales[12]@96 d@108; Q4_K d@0 dmin@2 scales[12]@4 qs[128]@16; Q5_K d@0
dmin@2 scales[12]@4 qh[32]@16 qs[128]@48; Q6_K ql[128]@0 qh[64]@128 scales[16]@192 d@208.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forge_cpu_jit.quant import f16_to_f32
from forge_cpu_jit.simd import bits_to_f32

_NB = {"nogil": True, "cache": True, "error_model": "numpy", "inline": "always"}

# log2 of the offset added to make codes unsigned; -1: none (the block has a minimum instead)
OFFSET_SHIFT = {"Q4_0": 3, "Q4_1": -1, "Q5_0": 4, "Q5_1": -1, "Q8_0": 7,
                "Q2_K": -1, "Q3_K": 2, "Q4_K": -1, "Q5_K": -1, "Q6_K": 5}  # fmt: skip
# weights per group of wm (0: no minimums)
MIN_GROUP = {"Q4_0": 0, "Q4_1": 32, "Q5_0": 0, "Q5_1": 32, "Q8_0": 0,
             "Q2_K": 16, "Q3_K": 0, "Q4_K": 16, "Q5_K": 16, "Q6_K": 0}  # fmt: skip


@njit(**_NB)
def _half(row, at):  # noqa: ANN001, ANN202
    return f16_to_f32(np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8)))


@njit(**_NB)
def _u32(row, at):  # noqa: ANN001, ANN202
    return (np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
            | (np.uint32(row[at + 2]) << np.uint32(16)) | (np.uint32(row[at + 3]) << np.uint32(24)))  # fmt: skip


@njit(**_NB)
def _lanes(ws, lane0, n, value):  # noqa: ANN001, ANN202
    for i in range(n):
        ws[lane0 + i] = value


@njit(**_NB)
def unpack_q4_0(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 18):
        o = b * 18
        _lanes(ws, b * 8, 8, _half(row, o))
        for j in range(16):
            v = row[o + 2 + j]
            wq[b * 32 + j] = v & 15
            wq[b * 32 + 16 + j] = v >> 4


@njit(**_NB)
def unpack_q4_1(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 20):
        o = b * 20
        _lanes(ws, b * 8, 8, _half(row, o))
        wm[b] = _half(row, o + 2)
        for j in range(16):
            v = row[o + 4 + j]
            wq[b * 32 + j] = v & 15
            wq[b * 32 + 16 + j] = v >> 4


@njit(**_NB)
def unpack_q5_0(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 22):
        o = b * 22
        _lanes(ws, b * 8, 8, _half(row, o))
        qh = _u32(row, o + 2)
        for j in range(16):
            v = row[o + 6 + j]
            wq[b * 32 + j] = (v & 15) | (((qh >> j) & 1) << 4)
            wq[b * 32 + 16 + j] = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)


@njit(**_NB)
def unpack_q5_1(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 24):
        o = b * 24
        _lanes(ws, b * 8, 8, _half(row, o))
        wm[b] = _half(row, o + 2)
        qh = _u32(row, o + 4)
        for j in range(16):
            v = row[o + 8 + j]
            wq[b * 32 + j] = (v & 15) | (((qh >> j) & 1) << 4)
            wq[b * 32 + 16 + j] = (v >> 4) | (((qh >> (j + 16)) & 1) << 4)


@njit(**_NB)
def unpack_q8_0(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 34):
        o = b * 34
        _lanes(ws, b * 8, 8, _half(row, o))
        for j in range(32):
            wq[b * 32 + j] = row[o + 2 + j] ^ 0x80


@njit(**_NB)
def unpack_q2_k(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 84):
        o, w0, g0 = b * 84, b * 256, b * 16
        d, dmin = _half(row, o + 80), _half(row, o + 82)
        for g in range(16):
            sc = row[o + g]
            _lanes(ws, (w0 >> 2) + g * 4, 4, d * np.float32(sc & 15))
            wm[g0 + g] = -(dmin * np.float32(sc >> 4))
        for n in range(2):
            for j in range(4):
                for k in range(32):
                    wq[w0 + 128 * n + 32 * j + k] = (row[o + 16 + 32 * n + k] >> (2 * j)) & 3


@njit(**_NB)
def _scales_q3_k(row, o, d, ws, lane0):  # noqa: ANN001, ANN202
    a, bb, c = _u32(row, o + 96), _u32(row, o + 100), _u32(row, o + 104)
    for i in range(4):
        low = a if i % 2 == 0 else bb
        shift = 0 if i < 2 else 4
        word = ((low >> shift) & np.uint32(0x0F0F0F0F)) | (
            ((c >> (2 * i)) & np.uint32(0x03030303)) << np.uint32(4))
        for byte in range(4):
            sc = np.int32((word >> np.uint32(8 * byte)) & np.uint32(0xFF)) - 32
            _lanes(ws, lane0 + (i * 4 + byte) * 4, 4, d * np.float32(sc))


@njit(**_NB)
def unpack_q3_k(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 110):
        o, w0 = b * 110, b * 256
        _scales_q3_k(row, o, _half(row, o + 108), ws, w0 >> 2)
        for n in range(2):
            for j in range(4):
                bit = 4 * n + j
                for k in range(32):
                    low = (row[o + 32 + 32 * n + k] >> (2 * j)) & 3
                    high = (row[o + k] >> bit) & 1  # set: no -4
                    wq[w0 + 128 * n + 32 * j + k] = low + 4 * high


@njit(**_NB)
def _scale_min_k4(row, o, j):  # noqa: ANN001, ANN202
    """Scale and minimum (6-bit) of sub-block j of a Q4_K/Q5_K block at byte o."""
    q = o + 4
    if j < 4:
        return row[q + j] & 63, row[q + j + 4] & 63
    sc = (row[q + j + 4] & 0xF) | ((row[q + j - 4] >> 6) << 4)
    m = (row[q + j + 4] >> 4) | ((row[q + j] >> 6) << 4)
    return sc, m


@njit(**_NB)
def _k4_scales(row, o, w0, ws, wm):  # noqa: ANN001, ANN202
    d, dmin = _half(row, o), _half(row, o + 2)
    for j in range(8):
        sc, m = _scale_min_k4(row, o, j)
        _lanes(ws, (w0 >> 2) + j * 8, 8, d * np.float32(sc))
        mv = -(dmin * np.float32(m))
        wm[(w0 >> 4) + 2 * j] = mv
        wm[(w0 >> 4) + 2 * j + 1] = mv


@njit(**_NB)
def unpack_q4_k(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 144):
        o, w0 = b * 144, b * 256
        _k4_scales(row, o, w0, ws, wm)
        for j in range(4):
            for k in range(32):
                v = row[o + 16 + 32 * j + k]
                wq[w0 + 64 * j + k] = v & 15
                wq[w0 + 64 * j + 32 + k] = v >> 4


@njit(**_NB)
def unpack_q5_k(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 176):
        o, w0 = b * 176, b * 256
        _k4_scales(row, o, w0, ws, wm)
        for j in range(4):
            for k in range(32):
                v = row[o + 48 + 32 * j + k]
                h = row[o + 16 + k]
                wq[w0 + 64 * j + k] = (v & 15) | (((h >> (2 * j)) & 1) << 4)
                wq[w0 + 64 * j + 32 + k] = (v >> 4) | (((h >> (2 * j + 1)) & 1) << 4)


@njit(**_NB)
def unpack_q6_k(row, wq, ws, wm):  # noqa: ANN001
    for b in range(row.shape[0] // 210):
        o, w0 = b * 210, b * 256
        d = _half(row, o + 208)
        for g in range(16):
            sc = np.int8(row[o + 192 + g])
            _lanes(ws, (w0 >> 2) + g * 4, 4, d * np.float32(sc))
        for n in range(2):
            for k in range(32):
                lo0 = row[o + 64 * n + k]
                lo1 = row[o + 64 * n + 32 + k]
                h = row[o + 128 + 32 * n + k]
                base = w0 + 128 * n + k
                wq[base] = (lo0 & 15) | ((h & 3) << 4)
                wq[base + 32] = (lo1 & 15) | (((h >> 2) & 3) << 4)
                wq[base + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4)
                wq[base + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4)


@njit(**_NB)
def unpack_f16(row, wf):  # noqa: ANN001
    for i in range(row.shape[0] // 2):
        wf[i] = f16_to_f32(np.uint32(row[2 * i]) | (np.uint32(row[2 * i + 1]) << np.uint32(8)))


@njit(**_NB)
def unpack_bf16(row, wf):  # noqa: ANN001
    for i in range(row.shape[0] // 2):
        wf[i] = bits_to_f32((np.uint32(row[2 * i]) << np.uint32(16))
                            | (np.uint32(row[2 * i + 1]) << np.uint32(24)))  # fmt: skip


@njit(**_NB)
def unpack_f32(row, wf):  # noqa: ANN001
    for i in range(row.shape[0] // 4):
        wf[i] = bits_to_f32(_u32(row, 4 * i))
