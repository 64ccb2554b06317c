"""Decoders for the 32-element block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

Each decoder takes C-contiguous `blocks` (uint8 [n, block bytes]) and writes float32 [n, 32] into
`out`. Integer codes are built in uint8 (1 byte per weight), widened into `out` by one contiguous
cast and scaled in place, in ggml's operation order (d * q + m) so the results are bit-exact.
Layouts (little endian): Q4_0 d:f16 qs[16]; Q4_1 d:f16 m:f16 qs[16]; Q5_0 d:f16 qh:u32 qs[16];
Q5_1 d:f16 m:f16 qh:u32 qs[16]; Q8_0 d:f16 qs:i8[32]. Nibble j of qs byte i is weight i + 16 j;
bit k of qh is the fifth bit of weight k.
"""

from __future__ import annotations

import numpy as np

from forge_cpu_simd.dequant.bits import f16_field, planes


def _nibble_codes(blocks: np.ndarray, qs: int) -> np.ndarray:
    """uint8 [n, 32]: low nibbles of the 16 bytes at offset `qs` of each block, then high ones."""
    lo_hi = planes(blocks, (0, 4), 15)[:, :, qs : qs + 16]  # [2, n, 16]
    q = np.empty((blocks.shape[0], 2, 16), np.uint8)
    np.copyto(q, lo_hi.transpose(1, 0, 2))
    return q.reshape(-1, 32)


def _five_bit_codes(blocks: np.ndarray, qh: int, qs: int) -> np.ndarray:
    """uint8 [n, 32]: nibble codes with their fifth bits from the 4 bytes at offset `qh`."""
    q = _nibble_codes(blocks, qs)
    high = np.unpackbits(blocks[:, qh : qh + 4], axis=1, bitorder="little")
    high *= 16
    q |= high
    return q


def decode_q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    q = _nibble_codes(blocks, 2)
    q -= 8
    np.copyto(out, q.view(np.int8))
    out *= f16_field(blocks, 0)


def decode_q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, _nibble_codes(blocks, 4))
    out *= f16_field(blocks, 0)
    out += f16_field(blocks, 2)


def decode_q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    q = _five_bit_codes(blocks, 2, 6)
    q -= 16
    np.copyto(out, q.view(np.int8))
    out *= f16_field(blocks, 0)


def decode_q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, _five_bit_codes(blocks, 4, 8))
    out *= f16_field(blocks, 0)
    out += f16_field(blocks, 2)


def decode_q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, blocks[:, 2:34].view(np.int8))
    out *= f16_field(blocks, 0)
