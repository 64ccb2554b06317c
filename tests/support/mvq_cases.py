"""Decode-product test cases shared by the GPU kernel tests and the host harness: random GGML
weights with float64 values, activations rounded as llama.cpp rounds them, and matrices sharing
x on a device with their descriptors and references."""

from __future__ import annotations

import math

import gguf
import numpy as np
from forge_hip.arena import device_rows
from forge_hip.library import ROUND_MODE, TYPE_IDS
from forge_hip.tuning import MVQ_THREADS, mvq_xbytes
from gguf import GGMLQuantizationType, quants

from tests.support.quant_blocks import random_raw


def random_weights(rng, type_name: str, rows: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGML bytes [rows, row_bytes], float64 values [rows, K]) with finite scales."""
    qtype = GGMLQuantizationType[type_name]
    raw = random_raw(rng, type_name, rows, K)
    values = quants.dequantize(raw, qtype).reshape(rows, K).astype(np.float64)
    return np.ascontiguousarray(raw), values


def odd_k(type_name: str) -> int:
    block = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    return {1: 333, 32: 32 * 13, 256: 256 * 3}[block]


# -- mmv.hip: decode products ---------------------------------------------------------------------
FLOAT_TYPES = ("F32", "F16", "BF16")


def round_acts(x: np.ndarray, mode: int):
    """Activations [R, K] rounded as llama.cpp rounds them for the products of a weight type (its
    forge_hip.library.ROUND_MODE): (int8 [R, K], {scale, sum of int8} float32 [R, K/32, 2],
    the rounded values float32 [R, K]); float modes 0 (none), 3 (f16), 4 (bf16) give only the
    rounded values. Every step in float32, as the kernels do it."""
    x = np.ascontiguousarray(x, np.float32)
    R, K = x.shape
    if mode in (0, 3, 4):
        if mode == 3:
            return None, None, x.astype(np.float16).astype(np.float32)
        if mode == 4:
            u = x.view(np.uint32).astype(np.uint64)
            u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return None, None, u.astype(np.uint32).view(np.float32)
        return None, None, x.copy()
    with np.errstate(divide="ignore"):
        if mode == 1:  # Q8_0: blocks of 32, d = amax / 127 stored as f16
            b = x.reshape(R, K // 32, 32)
            d = np.abs(b).max(axis=2) / np.float32(127)
            inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            q = np.rint(b * inv[..., None])
            scale = d.astype(np.float16).astype(np.float32)
        else:  # Q8_K: blocks of 256 scaled by -127 / (the first element of largest magnitude)
            b = x.reshape(R, K // 256, 256)
            peak = np.take_along_axis(b, np.abs(b).argmax(axis=2)[..., None], axis=2)[..., 0]
            iscale = np.where(peak != 0, np.float32(-127) / peak, np.float32(0)).astype(np.float32)
            d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
            q = np.minimum(np.rint(b * iscale[..., None]), np.float32(127))
            scale = np.repeat(d, 8, axis=1)
    q = q.reshape(R, K).astype(np.int8)
    scale = scale.reshape(R, K // 32).astype(np.float32)
    sums = q.reshape(R, K // 32, 32).astype(np.int64).sum(axis=2).astype(np.float32)
    rounded = (q.reshape(R, K // 32, 32).astype(np.float32) * scale[..., None]).reshape(R, K)
    return q, np.ascontiguousarray(np.stack([scale, sums], axis=2)), rounded


def mvq_k(types) -> int:
    """A row length every type takes: an odd number of blocks where possible."""
    if any(ROUND_MODE[t] == 2 for t in types):
        return 256 * 3
    return 333 if all(t in FLOAT_TYPES for t in types) else 32 * 13


class MvqCase:
    """Matrices of `types` (N rows each) sharing x [R, K] on the device, with their descriptors
    (linear.hip's layout), poisoned outputs and float64 references."""

    def __init__(self, dev, rng, types, R, K, ns, bias):
        self.dev, self.types, self.R, self.K = dev, list(types), R, K
        self.x = rng.standard_normal((R, K)).astype(np.float32)
        self.x[0] *= 30.0  # rows of different scales
        self.xbuf = dev.put(self.x)
        rows, self.W, self.b, self.y = [], [], [], []
        for t, n in zip(types, ns):
            raw, W = random_weights(rng, t, n, K)
            b = rng.standard_normal(n).astype(np.float32) if bias else None
            y = dev.poisoned(R * n * 4)
            row_bytes = device_rows(t, raw)[0].shape[1]  # (MXFP4 rows grow on the device)
            rows.append([dev.put_rows(t, raw), self.xbuf.ptr, y.ptr, dev.put(b).ptr if bias else 0,
                         TYPE_IDS[t], K, n, row_bytes])  # fmt: skip
            self.W.append(W)
            self.b.append(b)
            self.y.append(y)
        self.descs = dev.put(np.asarray(rows, np.int64))

    def ref(self, j: int) -> np.ndarray:
        xr = round_acts(self.x, ROUND_MODE[self.types[j]])[2].astype(np.float64)
        out = xr @ self.W[j].T
        return out + self.b[j] if self.b[j] is not None else out

    def out(self, j: int) -> np.ndarray:
        return self.dev.get(self.y[j], (self.R, self.W[j].shape[0]))


def quantize_x(rt, lib, dev, case: MvqCase, need: int, r0: int = 0, rows: int | None = None):
    """Rows r0 .. r0 + rows - 1 (default: all) of the case's x rounded to int8 by mvq_quant into
    a poisoned buffer (mmv.hip's layout)."""
    K = case.K
    R = case.R - r0 if rows is None else rows
    xq = dev.poisoned(mvq_xbytes(need, R, K))
    tasks = R * -(-K // 256)
    rt.launch(lib.get("mvq_quant"), (-(-tasks // 8),), (MVQ_THREADS,),
              [case.xbuf.ptr + 4 * r0 * K, xq, K, R, need])  # fmt: skip
    return xq


def gated_act(a: np.ndarray, act: int) -> np.ndarray:
    if act == 1:
        return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))
    return a / (1.0 + np.exp(-a))
