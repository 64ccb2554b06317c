"""Vectorized NumPy dequantizers for every GGUF weight type forge supports.

    from forge_cpu_simd.dequant import dequantize
    w = dequantize(gguf_file.raw(name), info.type, info.shape[0])  # float32 [rows, row_len]

`dequantize_rows` and `iter_row_chunks` decode a slice of rows, for large tensors whose full
float32 copy is not wanted at once.
"""

from forge_cpu_simd.dequant.api import (
    DECODERS,
    dequantize,
    dequantize_rows,
    iter_row_chunks,
)

SUPPORTED_TYPES: tuple[str, ...] = tuple(DECODERS)

__all__ = ["SUPPORTED_TYPES", "dequantize", "dequantize_rows", "iter_row_chunks"]
