"""Decoders for the unquantized types F32, F16 and BF16.

Each decoder takes `blocks` (uint8 [n, bytes per element]) and writes float32 [n, 1] into `out`.
"""

from __future__ import annotations

import numpy as np


def decode_f32(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = blocks.view(np.float32)


def decode_f16(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = blocks.view(np.float16)


def decode_bf16(blocks: np.ndarray, out: np.ndarray) -> None:
    # bf16 is the high half of an f32: widen the bits and shift them into place.
    bits = out.view(np.uint32)
    bits[:] = blocks.view(np.uint16)
    bits <<= 16
