"""Decoder for MXFP4 (OCP microscaling FP4): blocks of 32 E2M1 values sharing one E8M0 scale.

Layout of a 17-byte block: e:u8 (the shared exponent, bias 127), qs[16]. Nibble j of qs byte i is
weight i + 16 j, a 4-bit E2M1 code (sign, 2 exponent bits, 1 mantissa bit). ggml keeps the code
values doubled (so they are integers: 0, 1, 2, 3, 4, 6, 8, 12) and halves the scale instead,
2^(e - 128); the products are the same and exact in float32.
"""

from __future__ import annotations

import numpy as np

from forge_cpu_simd.dequant.bits import planes

# the 16 E2M1 codes, doubled; the sign bit is the code's top bit
E2M1_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
_SUBNORMAL_HALF_SCALE = np.uint32(0x00200000)  # the bits of 2^-128, a float32 subnormal


def half_scale(e: np.ndarray) -> np.ndarray:
    """float32 2^(e - 128) of E8M0 exponents `e` (uint8): the exponent field e - 1 builds the
    number directly; e = 0 and 1 fall below float32's normal range and are subnormals."""
    e = e.astype(np.uint32)
    normal = (np.maximum(e, 1) - 1) << np.uint32(23)
    subnormal = _SUBNORMAL_HALF_SCALE << np.minimum(e, 1)
    return np.where(e < 2, subnormal, normal).view(np.float32)


def decode_mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    lo_hi = planes(blocks, (0, 4), 15)[:, :, 1:17]  # [2, n, 16]
    out.reshape(-1, 2, 16)[:] = E2M1_DOUBLED[lo_hi.transpose(1, 0, 2)]
    with np.errstate(over="ignore"):  # 12 * 2^127 is inf in float32, as in ggml
        out *= half_scale(blocks[:, 0])[:, None]
