"""Decoders for the 256-element K-quant types Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.

Each decoder takes C-contiguous `blocks` (uint8 [n, block bytes]) and writes float32 [n, 256] into
`out`. Codes come from `planes` (bit-field passes over the chunk) and are gathered, high bits
merged, into contiguous uint8 codes by one pass over strided views (NumPy's mixed-type multiply is
slow on strided input), cast into `out` and scaled there per sub-block in ggml's operation order
((d * scale) * q - dmin * min), so the results are bit-exact.
Layouts (byte offsets): Q2_K scales[16]@0 qs[64]@16 d@80 dmin@82; Q3_K hmask[32]@0 qs[64]@32
scales[12]@96 d@108; Q4_K d@0 dmin@2 scales[12]@4 qs[128]@16; Q5_K d@0 dmin@2 scales[12]@4
qh[32]@16 qs[128]@48; Q6_K ql[128]@0 qh[64]@128 scales:i8[16]@192 d@208.
"""

from __future__ import annotations

import numpy as np

from forge_cpu_simd.dequant.bits import f16_field, planes

_NIBBLES = (0, 4)
_CRUMBS = (0, 2, 4, 6)
_BITS = (0, 1, 2, 3, 4, 5, 6, 7)


def _scaled(q: np.ndarray, scale: np.ndarray, out: np.ndarray, bias: np.ndarray | None) -> None:
    """out = scale * q (- bias) per sub-block: q contiguous [n, 256]; scale, bias [n, subs]."""
    n, subs = scale.shape
    o = out.reshape(n, subs, -1)
    np.copyto(out, q.reshape(out.shape))
    o *= scale[:, :, None]
    if bias is not None:
        np.subtract(o, bias[:, :, None], out=o)


def _codes(view: np.ndarray, extra: np.ndarray | None = None, op=np.add) -> np.ndarray:
    """Contiguous uint8 [n, 256] codes: view, or op(view, extra), in one pass."""
    q = np.empty(view.shape, np.uint8)
    if extra is None:
        np.copyto(q, view)
    else:
        op(view, extra, out=q)
    return q.reshape(view.shape[0], -1)


def _words(packed: np.ndarray) -> list[np.ndarray]:
    """The little-endian uint32 columns of packed [n, 4k] bytes, as k arrays [n]."""
    words = packed.view("<u4")
    return [words[:, i] for i in range(words.shape[1])]


def _scale_min_k4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: the eight 6-bit scales and mins packed in bytes 4..16, as uint8 [n, 8] each."""
    lo, mid, hi = _words(blocks[:, 4:16])
    sc = np.empty((blocks.shape[0], 2), np.uint32)
    mn = np.empty_like(sc)
    # Scales/mins 0-3 are the low 6 bits of lo/mid; 4-7 take hi's nibbles plus lo/mid's top bits.
    np.bitwise_and(lo, 0x3F3F3F3F, out=sc[:, 0])
    np.bitwise_and(mid, 0x3F3F3F3F, out=mn[:, 0])
    sc[:, 1] = (hi & 0x0F0F0F0F) | ((lo >> 6) & 0x03030303) * 16
    mn[:, 1] = ((hi >> 4) & 0x0F0F0F0F) | ((mid >> 6) & 0x03030303) * 16
    return sc.view(np.uint8), mn.view(np.uint8)


def _scales_q3_k(blocks: np.ndarray) -> np.ndarray:
    """Q3_K: the sixteen signed 6-bit scales packed in bytes 96..108, as int8 [n, 16]."""
    a, b, c = _words(blocks[:, 96:108])
    six = np.empty((blocks.shape[0], 4), np.uint32)
    # Low nibbles: bytes 0-7 low then high halves; top 2 bits: 2-bit fields of bytes 8-11.
    for i, (low, shift) in enumerate(((a, 0), (b, 0), (a, 4), (b, 4))):
        six[:, i] = ((low >> shift) & 0x0F0F0F0F) | ((c >> 2 * i) & 0x03030303) * 16
    six = six.view(np.uint8)
    six -= 32
    return six.view(np.int8)


def decode_q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    # Weight 128 h + 32 j + l is bits 2j of qs[32 h + l]; scales are in weight order, by 16.
    q = _codes(planes(blocks, _CRUMBS, 3)[:, :, 16:80].reshape(4, n, 2, 32).transpose(1, 2, 0, 3))
    sc = blocks[:, 0:16]
    _scaled(q, f16_field(blocks, 80) * (sc & 15), out, f16_field(blocks, 82) * (sc >> 4))


def decode_q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    low = planes(blocks, _CRUMBS, 3)[:, :, 32:96].reshape(4, n, 2, 32).transpose(1, 2, 0, 3)
    # Bit m of hmask[l] belongs to weight 32 m + l: set means no offset, clear means -4.
    high = planes(blocks[:, 0:32], _BITS, 1)
    high *= 4
    high -= 4
    q = _codes(low, high.transpose(1, 0, 2).reshape(n, 2, 4, 32))
    _scaled(q.view(np.int8), f16_field(blocks, 108) * _scales_q3_k(blocks), out, None)


def decode_q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    sc, mn = _scale_min_k4(blocks)
    # Chunk c of 32 qs bytes holds sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles).
    q = _codes(
        planes(blocks, _NIBBLES, 15)[:, :, 16:144].reshape(2, n, 4, 32).transpose(1, 2, 0, 3)
    )
    _scaled(q, f16_field(blocks, 0) * sc, out, f16_field(blocks, 2) * mn)


def decode_q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    sc, mn = _scale_min_k4(blocks)
    nib = planes(blocks, _NIBBLES, 15)[:, :, 48:176].reshape(2, n, 4, 32).transpose(1, 2, 0, 3)
    # Bit j of qh[l] is the fifth bit of weight 32 j + l.
    high = planes(blocks[:, 16:48], _BITS, 1)
    high *= 16
    q = _codes(nib, high.transpose(1, 0, 2).reshape(n, 4, 2, 32), np.bitwise_or)
    _scaled(q, f16_field(blocks, 0) * sc, out, f16_field(blocks, 2) * mn)


def decode_q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = blocks.shape[0]
    # Weight 128 h + 32 k + l: nibble k // 2 of ql[64 h + 32 (k % 2) + l], bits 2k of qh[32 h + l].
    nib = planes(blocks[:, 0:128], _NIBBLES, 15).reshape(2, n, 2, 2, 32)
    high = planes(blocks[:, 128:192], _CRUMBS, 3).reshape(4, n, 2, 32)
    high *= 16
    high -= 32
    q = _codes(nib.transpose(1, 2, 0, 3, 4), high.transpose(1, 2, 0, 3).reshape(n, 2, 2, 2, 32))
    scale = f16_field(blocks, 208) * blocks[:, 192:208].view(np.int8)
    _scaled(q.view(np.int8), scale, out, None)
