"""hip's KV cache rows (kernels/kv_format.h) built and read back in NumPy, with the gguf package's
quantizers and dequantizers as the reference for the numbers: Q8_0 and Q4_0 rows hold GGML's
blocks of the head with their integers first (Q4_0: two consecutive values a byte, low half
first) and the f16 scales after them, padded to 8 bytes (Q8_0) or 4 (Q4_0)."""

from __future__ import annotations

import numpy as np
from forge_hip.kv import row_bytes
from gguf import GGMLQuantizationType, quants

from forge.kv_cache import KvFormat

QK = KvFormat.Q8_0.block  # values per scale, Q8_0 and Q4_0 alike


def pack(fmt: KvFormat, x: np.ndarray) -> np.ndarray:
    """x [..., n] float32 -> the cache rows [..., row_bytes] (uint8) of format fmt."""
    x = np.ascontiguousarray(x, np.float32)
    n = x.shape[-1]
    lead = x.shape[:-1]
    if fmt is KvFormat.F32:
        return x.view(np.uint8)
    if fmt is KvFormat.F16:
        return x.astype(np.float16).view(np.uint8)
    if fmt is KvFormat.BF16:
        return quants.quantize(x, GGMLQuantizationType.BF16).view(np.uint8)
    qtype = GGMLQuantizationType[fmt.name]
    blocks = quants.quantize(x.reshape(-1, n), qtype).reshape(
        -1, n // QK, 2 + (QK if fmt is KvFormat.Q8_0 else QK // 2)
    )
    scales, body = blocks[..., :2], blocks[..., 2:]
    if fmt is KvFormat.Q4_0:  # GGML: byte j = q[j] | q[j + 16] << 4; here q[2j] | q[2j + 1] << 4
        q = np.concatenate([body & 15, body >> 4], axis=-1)
        body = q[..., 0::2] | (q[..., 1::2] << 4)
    rows = np.zeros((len(blocks), row_bytes(fmt, n)), np.uint8)
    codes = body.reshape(len(blocks), -1)
    rows[:, : codes.shape[1]] = codes
    rows[:, codes.shape[1] : codes.shape[1] + scales.size // len(blocks)] = scales.reshape(
        len(blocks), -1
    )
    return rows.reshape(*lead, -1)


def unpack(fmt: KvFormat, rows: np.ndarray, n: int) -> np.ndarray:
    """Cache rows [..., row_bytes] (uint8) of format fmt holding n values -> float32 [..., n]."""
    rows = np.ascontiguousarray(rows, np.uint8)
    lead = rows.shape[:-1]
    if fmt is KvFormat.F32:
        return rows.view(np.float32).reshape(*lead, n)
    if fmt is KvFormat.F16:
        return rows.view(np.float16).astype(np.float32).reshape(*lead, n)
    if fmt is KvFormat.BF16:
        return (rows.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(*lead, n)
    flat = rows.reshape(-1, rows.shape[-1])
    width = n if fmt is KvFormat.Q8_0 else n // 2
    codes = flat[:, :width].reshape(len(flat), n // QK, -1)
    scales = flat[:, width : width + 2 * (n // QK)].reshape(len(flat), n // QK, 2)
    if fmt is KvFormat.Q4_0:
        q = np.empty((*codes.shape[:2], QK), np.uint8)
        q[..., 0::2], q[..., 1::2] = codes & 15, codes >> 4
        codes = q[..., : QK // 2] | (q[..., QK // 2 :] << 4)
    blocks = np.concatenate([scales, codes], axis=-1).reshape(
        -1, scales.shape[-1] + codes.shape[-1]
    )
    qtype = GGMLQuantizationType[fmt.name]
    return quants.dequantize(blocks, qtype).reshape(*lead, n).astype(np.float32)
