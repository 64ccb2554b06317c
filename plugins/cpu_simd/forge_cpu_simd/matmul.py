"""The built-in matmul kernel: weights dequantized once to float32 at load, BLAS at run time,
with activations rounded as llama.cpp rounds them (see act_round).

A matmul kernel (what `forge_register_kernels` takes for op "matmul" on cpu_simd) is an object
with `prepare(raw, info) -> prepared` (called once at load with the tensor's bytes, uint8
[rows, row_bytes], and its `forge.gguf.TensorInfo`) and `__call__(x, prepared) -> y` computing
y = x @ W.T for x float32 [tokens, in]. Kernels that set `fusable = True` and return float32
[out, in] arrays let the runner stack Q/K/V and gate/up into one product.
Prepared weights here are `DenseWeight`s: float32 [out, in] plus the activation rounding.
"""

from __future__ import annotations

import numpy as np

from forge.gguf import TensorInfo
from forge_cpu_simd.act_round import activation_rounding
from forge_cpu_simd.dequant import dequantize
from forge_cpu_simd.threads import run_split


class DenseWeight:
    """A weight dequantized to float32 [out, in], and how to round activations for it."""

    def __init__(self, matrix: np.ndarray, rounding):
        self.matrix, self.rounding = matrix, rounding

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes


class DenseMatmul:
    """y = x @ W.T with W held as float32 [out, in]."""

    def prepare(self, raw: np.ndarray, info: TensorInfo) -> DenseWeight:
        out = np.empty((raw.shape[0], info.shape[0]), dtype=np.float32)
        dequantize(raw, info.type, info.shape[0], out=out)  # chunked inside: no big temporary
        return DenseWeight(out, activation_rounding(info.type))

    def fuse(self, parts: list[DenseWeight]) -> DenseWeight | None:
        """Stack weights that share an input into one, if they round activations alike."""
        if any(p.rounding is not parts[0].rounding for p in parts):
            return None
        return DenseWeight(np.concatenate([p.matrix for p in parts]), parts[0].rounding)

    def __call__(self, x: np.ndarray, w: DenseWeight) -> np.ndarray:
        if w.rounding is not None:
            x = w.rounding(x)
        return product(w.matrix, x)


# OpenBLAS computes products of at most this many multiply-adds (M*N*K) with its small-matrix
# kernels, which skip packing the weight. Measured on the 2-core EPYC for the default model's
# 262144x640 head: 8 rows in one sgemm 67 ms, in chunks under this size on two threads 36 ms
# (one row, sgemv: 23 ms).
SMALL_GEMM_MNK = 1_000_000
# Weight rows per small-kernel call: the largest power of two within both limits. 2-core AVX-512
# Xeon, 8 rows, two threads, with the argmax of the result: head 262144x640 37.0 ms at 32 or 64
# (43.9 ms for 195-row chunks of the transposed product), gate/up 4096x640 0.40 vs 0.46 ms, down
# 640x2048 0.28-0.29 ms in 32-row chunks vs 0.30 in 61-row ones and a 30-row rest on one thread.
MAX_CHUNK = 64
CHUNKED_MIN_BYTES = 1 << 20  # below this, handing work to another thread costs more than it saves
MAX_CHUNKED_ROWS = 16


def product(W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ W.T for W float32 [out, in] and x float32 [rows, in].

    One row is a GEMV. 2..16 rows times a weight over 1 MiB go through OpenBLAS's small-matrix
    kernels in chunks of weight rows spread over the worker threads; otherwise W @ x.T (OpenBLAS
    then packs the small operand, not the weight).
    """
    rows, k = x.shape
    if rows == 1:
        return (W @ x[0])[None, :]
    if rows <= MAX_CHUNKED_ROWS and W.nbytes >= CHUNKED_MIN_BYTES:
        most = min(MAX_CHUNK, SMALL_GEMM_MNK // (rows * k))
        chunk = 1 << max(0, most.bit_length() - 1)  # a power of two divides model widths
        return _chunked_product(W, np.ascontiguousarray(x), chunk)
    return (W @ x.T).T


def _chunked_product(W: np.ndarray, x: np.ndarray, chunk: int) -> np.ndarray:
    """x @ W.T in chunks of `chunk` weight rows, the chunks split over the worker threads.

    Each thread's whole chunks go to one matmul call of x by W viewed as [chunks, in, chunk],
    writing straight into the row-major result through a strided view: NumPy loops over the
    chunks in C, one small-matrix sgemm each (x @ chunk.T beat chunk @ x.T by 10-15%, and the
    result needs no transposed copy for the argmax or sampling that follows).
    """
    n, k = W.shape
    rows = x.shape[0]
    whole = n // chunk
    out = np.empty((rows, n), dtype=np.float32)
    stacked_out = out[:, : whole * chunk].reshape(rows, whole, chunk).transpose(1, 0, 2)
    stacked_w = W[: whole * chunk].reshape(whole, chunk, k).transpose(0, 2, 1)

    def run(lo: int, hi: int) -> None:
        if hi > lo:
            np.matmul(x, stacked_w[lo:hi], out=stacked_out[lo:hi])

    run_split(whole, run)
    if whole * chunk < n:
        np.matmul(x, W[whole * chunk :].T, out=out[:, whole * chunk :])
    return out


def embedding_rows(raw: np.ndarray, info: TensorInfo, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of an embedding table, dequantized straight from the file's bytes."""
    return dequantize(raw[ids], info.type, info.shape[0])
