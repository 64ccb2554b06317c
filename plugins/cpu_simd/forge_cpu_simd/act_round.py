"""Rounding of activations the way llama.cpp's CPU matrix products see them.

llama.cpp converts the activation operand of each matrix product to the weight type's "vec_dot"
partner: 8-bit blocks of 32 (Q8_0, with an f16 scale) for the 32-element quant types (MXFP4
included), 8-bit blocks of 256 (Q8_K, f32 scale) for the K-quants, f16 or bf16 for half-precision
weights. Applying the same
rounding before an exact float32 product reproduces its logits several times more closely than an
unrounded product does (measured on the golden models: qwen3-q4_k_m mean error 3.2e-2 -> 8.5e-3).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def round_q8_0(x: np.ndarray) -> np.ndarray:
    """Blocks of 32: scale = max|x| / 127 stored as f16, values rounded to integers."""
    n, k = x.shape
    xb = x.reshape(n, k // 32, 32)
    d = np.abs(xb).max(axis=-1, keepdims=True) / np.float32(127)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(xb * inv)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(n, k)


def round_q8_k(x: np.ndarray) -> np.ndarray:
    """Blocks of 256: scale from the signed value of largest magnitude, f32 scale."""
    n, k = x.shape
    xb = x.reshape(n, k // 256, 256)
    idx = np.abs(xb).argmax(axis=-1)[..., None]
    peak = np.take_along_axis(xb, idx, axis=-1)
    iscale = np.divide(np.float32(-127), peak, out=np.zeros_like(peak), where=peak != 0)
    q = np.minimum(np.rint(xb * iscale), 127)
    d = np.divide(1.0, iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (q * d).reshape(n, k).astype(np.float32, copy=False)


def round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even bf16 (the top 16 bits of a float32)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return u.view(np.float32)


_BY_TYPE: dict[str, tuple[Callable[[np.ndarray], np.ndarray], int]] = {
    "F16": (round_f16, 1), "BF16": (round_bf16, 1),
    "Q4_0": (round_q8_0, 32), "Q4_1": (round_q8_0, 32), "Q5_0": (round_q8_0, 32),
    "Q5_1": (round_q8_0, 32), "Q8_0": (round_q8_0, 32), "MXFP4": (round_q8_0, 32),
    "Q2_K": (round_q8_k, 256), "Q3_K": (round_q8_k, 256), "Q4_K": (round_q8_k, 256),
    "Q5_K": (round_q8_k, 256), "Q6_K": (round_q8_k, 256),
}  # fmt: skip


def activation_rounding(weight_type: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The rounding llama.cpp applies to activations multiplied by `weight_type` weights."""
    entry = _BY_TYPE.get(weight_type)
    return entry[0] if entry else None
