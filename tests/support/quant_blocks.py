"""Random GGML weight bytes for kernel tests: every bit pattern of quants and scales, with the f16
scale fields kept finite so that the reference dequantization is finite too."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType

# Byte offsets of the f16 scale fields inside one block, per quant type.
HALF_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip


def random_raw(rng: np.random.Generator, type_name: str, rows: int, k: int) -> np.ndarray:
    """uint8 [rows, row_bytes] of `type_name` weights with row length `k`."""
    block, nbytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    if type_name in ("F32", "F16"):
        dtype = np.float32 if type_name == "F32" else np.float16
        return rng.standard_normal((rows, k)).astype(dtype).view(np.uint8)
    if type_name == "BF16":
        bits = rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(rows, k // block, nbytes), dtype=np.uint8)
    if type_name == "MXFP4":  # E8M0 scales of 2^-8 .. 2^7
        raw[:, :, 0] = rng.integers(119, 135, size=raw.shape[:2])
    for off in HALF_FIELDS.get(type_name, ()):
        raw[:, :, off + 1] &= 0xBF  # exponent below 16: |scale| < 2, never inf/nan
    return raw.reshape(rows, -1)
