"""64 weights of a GGUF row at a time, in registers, as the product kernels multiply them.

`chunk_<type>(row, c)` reads chunk c (weights 64c .. 64c + 63) of one row's blocks (uint8, as
stored in the file) and returns three vectors:
- the 64 codes made unsigned (U8x64): the signed code is code - 2**OFFSET_SHIFT[type] (no offset
  for the types whose blocks carry a minimum instead);
- the scale of each lane of 4 weights (F32x16): the block or sub-block scale;
- for the types with minimums, minus the minimum of each lane's group (F32x16), which multiplies
  the activations' scaled lane sums; zeros otherwise.
So weight = scale * (code - 2**shift) (+ lane minimum), the values llama.cpp's dot products use.
A chunk past the last block of a 32-element type (row length an odd number of 32s) is zeros.

Block layouts (byte offsets) are ggml's: Q4_0 d qs[16]; Q4_1 d m qs[16]; Q5_0 d qh[4] qs[16];
Q5_1 d m qh[4] qs[16]; Q8_0 d qs[32]; MXFP4 e qs[16]; Q2_K scales[16]@0 qs[64]@16 d@80 dmin@82;
Q3_K hmask[32]@0 qs[64]@32 scales[12]@96 d@108; Q4_K d@0 dmin@2 scales[12]@4 qs[128]@16;
Q5_K d@0 dmin@2 scales[12]@4 qh[32]@16 qs[128]@48; Q6_K ql[128]@0 qh[64]@128 scales[16]@192 d@208.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forge_cpu_jit.simd import (
    band,
    bits32,
    bits_to_f32,
    bor,
    bxor,
    cat,
    e2m1_codes,
    f32x16_2,
    f32x16_4,
    half_at,
    halves2,
    k4_scales,
    load_u8x16,
    load_u8x32,
    pair_lanes,
    scales_i8x4,
    shl,
    shr,
    zeros_f32x16,
    zeros_u8x32,
)

_INLINE = {"nogil": True, "cache": True, "error_model": "numpy", "inline": "always"}

# log2 of the offset that makes codes unsigned; -1: none (the block has a minimum instead)
OFFSET_SHIFT = {"Q4_0": 3, "Q4_1": -1, "Q5_0": 4, "Q5_1": -1, "Q8_0": 7, "MXFP4": 4,
                "Q2_K": -1, "Q3_K": 2, "Q4_K": -1, "Q5_K": -1, "Q6_K": 5}  # fmt: skip
HAS_MIN = {t: s < 0 for t, s in OFFSET_SHIFT.items()}
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "MXFP4": 17,
               "Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # fmt: skip


@njit(**_INLINE)
def _u32(row, at):  # noqa: ANN001, ANN202
    lo = np.uint32(row[at]) | (np.uint32(row[at + 1]) << np.uint32(8))
    return (
        lo | (np.uint32(row[at + 2]) << np.uint32(16)) | (np.uint32(row[at + 3]) << np.uint32(24))
    )


@njit(**_INLINE)
def _nibbles(row, at):  # noqa: ANN001, ANN202
    """32 codes of a 4-bit block: the low nibbles of its 16 bytes, then the high ones."""
    q = load_u8x16(row, at)
    return cat(band(q, 15), shr(q, 4))


@njit(**_INLINE)
def _fifth_bits(row, at):  # noqa: ANN001, ANN202
    """Bit j of the 32-bit qh field at byte `at`, as 16 (the fifth bit of weight j) or 0."""
    return shl(bits32(_u32(row, at)), 4)


# -- 32-element blocks: a chunk is two blocks ----------------------------------------------------


@njit(**_INLINE)
def chunk_q4_0(row, c):  # noqa: ANN001, ANN201
    o = 2 * c * 18
    lo = _nibbles(row, o + 2)
    if o + 36 <= row.shape[0]:
        return cat(lo, _nibbles(row, o + 20)), halves2(row, o, o + 18), zeros_f32x16()
    return cat(lo, zeros_u8x32()), f32x16_2(half_at(row, o), np.float32(0.0)), zeros_f32x16()


@njit(**_INLINE)
def chunk_q4_1(row, c):  # noqa: ANN001, ANN201
    o = 2 * c * 20
    lo = _nibbles(row, o + 4)
    if o + 40 <= row.shape[0]:
        return (cat(lo, _nibbles(row, o + 24)), halves2(row, o, o + 20),
                halves2(row, o + 2, o + 22))  # fmt: skip
    zero = np.float32(0.0)
    return (cat(lo, zeros_u8x32()), f32x16_2(half_at(row, o), zero),
            f32x16_2(half_at(row, o + 2), zero))  # fmt: skip


@njit(**_INLINE)
def chunk_q5_0(row, c):  # noqa: ANN001, ANN201
    o = 2 * c * 22
    lo = bor(_nibbles(row, o + 6), _fifth_bits(row, o + 2))
    if o + 44 <= row.shape[0]:
        hi = bor(_nibbles(row, o + 28), _fifth_bits(row, o + 24))
        return cat(lo, hi), halves2(row, o, o + 22), zeros_f32x16()
    return cat(lo, zeros_u8x32()), f32x16_2(half_at(row, o), np.float32(0.0)), zeros_f32x16()


@njit(**_INLINE)
def chunk_q5_1(row, c):  # noqa: ANN001, ANN201
    o = 2 * c * 24
    lo = bor(_nibbles(row, o + 8), _fifth_bits(row, o + 4))
    if o + 48 <= row.shape[0]:
        hi = bor(_nibbles(row, o + 32), _fifth_bits(row, o + 28))
        return cat(lo, hi), halves2(row, o, o + 24), halves2(row, o + 2, o + 26)
    zero = np.float32(0.0)
    return (cat(lo, zeros_u8x32()), f32x16_2(half_at(row, o), zero),
            f32x16_2(half_at(row, o + 2), zero))  # fmt: skip


@njit(**_INLINE)
def chunk_q8_0(row, c):  # noqa: ANN001, ANN201
    o = 2 * c * 34
    lo = bxor(load_u8x32(row, o + 2), 0x80)
    if o + 68 <= row.shape[0]:
        hi = bxor(load_u8x32(row, o + 36), 0x80)
        return cat(lo, hi), halves2(row, o, o + 34), zeros_f32x16()
    return cat(lo, zeros_u8x32()), f32x16_2(half_at(row, o), np.float32(0.0)), zeros_f32x16()


@njit(**_INLINE)
def _e8m0_half(e):  # noqa: ANN001, ANN202
    """2^(e - 128) as float32 (ggml's E8M0 scale, halved: its E2M1 values are doubled)."""
    e = np.uint32(e)
    if e < 2:  # below float32's normal range
        return bits_to_f32(np.uint32(0x00200000) << e)
    return bits_to_f32((e - np.uint32(1)) << np.uint32(23))


@njit(**_INLINE)
def chunk_mxfp4(row, c):  # noqa: ANN001, ANN201
    """MXFP4 (e:u8 qs[16] per 32 weights): E2M1 codes, each doubled, plus 16 (OFFSET_SHIFT)."""
    o = 2 * c * 17
    lo = e2m1_codes(_nibbles(row, o + 1))
    if o + 34 <= row.shape[0]:
        hi = e2m1_codes(_nibbles(row, o + 18))
        return cat(lo, hi), f32x16_2(_e8m0_half(row[o]), _e8m0_half(row[o + 17])), zeros_f32x16()
    return cat(lo, zeros_u8x32()), f32x16_2(_e8m0_half(row[o]), np.float32(0.0)), zeros_f32x16()


# -- K-quants: a chunk is a quarter of a 256-weight super-block --------------------------------
# `head_<type>(row, o)` decodes what the four chunks of the super-block at byte o share (its
# scales), `part_<type>(row, o, j, head)` unpacks chunk j of it; `chunk_<type>` is the two in
# one. The one-row products call head once per super-block, the tiled ones chunk: the same
# float products either way.


@njit(**_INLINE)
def head_q2_k(row, o):  # noqa: ANN001, ANN201
    return half_at(row, o + 80), half_at(row, o + 82)


@njit(**_INLINE)
def part_q2_k(row, o, q, head):  # noqa: ANN001, ANN201
    d, dmin = head
    n, j = q >> 1, 2 * (q & 1)  # weight 128 n + 32 j + l is bits 2j of qs[32 n + l]
    bits = load_u8x32(row, o + 16 + 32 * n)
    codes = cat(band(shr(bits, 2 * j), 3), band(shr(bits, 2 * j + 2), 3))
    g = o + 4 * q  # the scales of sub-blocks 4q .. 4q + 3 (16 weights each)
    s0, s1, s2, s3 = row[g], row[g + 1], row[g + 2], row[g + 3]
    scales = f32x16_4(d * np.float32(s0 & 15), d * np.float32(s1 & 15),
                      d * np.float32(s2 & 15), d * np.float32(s3 & 15))  # fmt: skip
    mins = f32x16_4(-dmin * np.float32(s0 >> 4), -dmin * np.float32(s1 >> 4),
                    -dmin * np.float32(s2 >> 4), -dmin * np.float32(s3 >> 4))  # fmt: skip
    return codes, scales, mins


@njit(**_INLINE)
def _scale_q3_k(row, o, g):  # noqa: ANN001, ANN202
    """Signed 6-bit scale of sub-block g (0..15) of a Q3_K block at byte o."""
    low = (row[o + 96 + (g & 7)] >> (4 * (g >> 3))) & 15
    high = (row[o + 104 + (g & 3)] >> (2 * (g >> 2))) & 3
    return np.float32(np.int32(low | (high << 4)) - 32)


@njit(**_INLINE)
def head_q3_k(row, o):  # noqa: ANN001, ANN201
    return half_at(row, o + 108)


@njit(**_INLINE)
def part_q3_k(row, o, q, d):  # noqa: ANN001, ANN201
    n, j = q >> 1, 2 * (q & 1)
    low = load_u8x32(row, o + 32 + 32 * n)
    high = load_u8x32(row, o)  # bit 4n + j of hmask[l]: set means no -4
    a = bor(band(shr(low, 2 * j), 3), shl(band(shr(high, 4 * n + j), 1), 2))
    b = bor(band(shr(low, 2 * j + 2), 3), shl(band(shr(high, 4 * n + j + 1), 1), 2))
    g = 4 * q
    scales = f32x16_4(d * _scale_q3_k(row, o, g), d * _scale_q3_k(row, o, g + 1),
                      d * _scale_q3_k(row, o, g + 2), d * _scale_q3_k(row, o, g + 3))  # fmt: skip
    return cat(a, b), scales, zeros_f32x16()


@njit(**_INLINE)
def head_q4_k(row, o):  # noqa: ANN001, ANN201
    """Lanes 0-7: d * scale of sub-block 0..7; lanes 8-15: -dmin * its minimum."""
    return k4_scales(row, o + 4, half_at(row, o), -half_at(row, o + 2))


@njit(**_INLINE)
def part_q4_k(row, o, j, head):  # noqa: ANN001, ANN201
    q = load_u8x32(row, o + 16 + 32 * j)  # sub-blocks 2j (low nibbles) and 2j + 1 (high)
    return cat(band(q, 15), shr(q, 4)), pair_lanes(head, 2 * j), pair_lanes(head, 8 + 2 * j)


head_q5_k = head_q4_k  # the same scale layout


@njit(**_INLINE)
def part_q5_k(row, o, j, head):  # noqa: ANN001, ANN201
    q = load_u8x32(row, o + 48 + 32 * j)
    h = load_u8x32(row, o + 16)  # bit 2j / 2j + 1 of qh[l]: the fifth bit
    lo = bor(band(q, 15), shl(band(shr(h, 2 * j), 1), 4))
    hi = bor(shr(q, 4), shl(band(shr(h, 2 * j + 1), 1), 4))
    return cat(lo, hi), pair_lanes(head, 2 * j), pair_lanes(head, 8 + 2 * j)


@njit(**_INLINE)
def head_q6_k(row, o):  # noqa: ANN001, ANN201
    return half_at(row, o + 208)


@njit(**_INLINE)
def part_q6_k(row, o, q, d):  # noqa: ANN001, ANN201
    n, s = q >> 1, 4 * (q & 1)  # weights 128 n + 64 (q & 1) + 0..63
    lo0, lo1 = load_u8x32(row, o + 64 * n), load_u8x32(row, o + 64 * n + 32)
    h = load_u8x32(row, o + 128 + 32 * n)
    a = bor(band(shr(lo0, s), 15), shl(band(shr(h, s), 3), 4))
    b = bor(band(shr(lo1, s), 15), shl(band(shr(h, s + 2), 3), 4))
    scales = scales_i8x4(row, o + 192 + 4 * q, d)  # d times 4 int8 scales
    return cat(a, b), scales, zeros_f32x16()


@njit(**_INLINE)
def chunk_q2_k(row, c):  # noqa: ANN001, ANN201
    o = (c >> 2) * 84
    return part_q2_k(row, o, c & 3, head_q2_k(row, o))


@njit(**_INLINE)
def chunk_q3_k(row, c):  # noqa: ANN001, ANN201
    o = (c >> 2) * 110
    return part_q3_k(row, o, c & 3, head_q3_k(row, o))


@njit(**_INLINE)
def chunk_q4_k(row, c):  # noqa: ANN001, ANN201
    o = (c >> 2) * 144
    return part_q4_k(row, o, c & 3, head_q4_k(row, o))


@njit(**_INLINE)
def chunk_q5_k(row, c):  # noqa: ANN001, ANN201
    o = (c >> 2) * 176
    return part_q5_k(row, o, c & 3, head_q5_k(row, o))


@njit(**_INLINE)
def chunk_q6_k(row, c):  # noqa: ANN001, ANN201
    o = (c >> 2) * 210
    return part_q6_k(row, o, c & 3, head_q6_k(row, o))
