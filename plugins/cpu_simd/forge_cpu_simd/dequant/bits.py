"""Bit-field extraction shared by the block decoders.

NumPy's per-call overhead dominates on short rows, so fields are cut from whole chunks of blocks
with flat (contiguous, vectorized) operations, and the decoders then take strided views of the
result instead of working block by block. Left shifts are written as multiplies: NumPy vectorizes
uint8 multiplies but not uint8 left shifts.
"""

from __future__ import annotations

import numpy as np


def planes(data: np.ndarray, shifts: tuple[int, ...], mask: int) -> np.ndarray:
    """uint8 [len(shifts), *data.shape]: (data >> shift) & mask for each shift.

    On C-contiguous `data` (whole blocks) every operation runs over one flat buffer; a column
    slice of the blocks costs one inner loop per block, which pays when the field is small.
    """
    out = np.empty((len(shifts), *data.shape), np.uint8)
    for plane, shift in zip(out, shifts):
        if shift:
            np.right_shift(data, shift, out=plane)
            plane &= mask
        else:
            np.bitwise_and(data, mask, out=plane)
    return out


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The f16 at byte `offset` of every block, as float32 [n, 1]."""
    return blocks[:, offset : offset + 2].view(np.float16).astype(np.float32)
