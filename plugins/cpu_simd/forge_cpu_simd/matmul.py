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
CHUNKED_MIN_BYTES = 1 << 20  # below this, handing work to another thread costs more than it saves
MAX_CHUNKED_ROWS = 16


def product(W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ W.T for W float32 [out, in] and x float32 [rows, in].

    W @ x.T is used rather than x @ W.T: OpenBLAS then packs the small operand, not the
    weight (faster for every row count measured, 2..128). Few rows times a weight over 1 MiB
    go through the small-matrix kernels in chunks spread over the worker threads.
    """
    rows, k = x.shape
    if rows == 1:
        return (W @ x[0])[None, :]
    if rows <= MAX_CHUNKED_ROWS and W.nbytes >= CHUNKED_MIN_BYTES:
        chunk = max(1, SMALL_GEMM_MNK // (rows * k))
        return _chunked_product(W, np.ascontiguousarray(x.T), chunk)
    return (W @ x.T).T


def _chunked_product(W: np.ndarray, xt: np.ndarray, chunk: int) -> np.ndarray:
    """W @ xt in chunks of `chunk` weight rows, the chunks split over the worker threads.

    Each thread's whole chunks go to one matmul call on W viewed as [chunks, chunk, in]: NumPy
    then loops over them in C, one small-matrix sgemm each, instead of a Python loop of ~1,300
    calls for the default model's head (8 rows, 2-core EPYC: 42.9 -> 39.6 ms alone; whole decode
    steps moved by less than this machine's noise).
    """
    n, k = W.shape
    rows = xt.shape[1]
    out = np.empty((n, rows), dtype=np.float32)

    def run(lo: int, hi: int) -> None:
        whole = lo + (hi - lo) // chunk * chunk
        if whole > lo:
            stacked = out[lo:whole].reshape(-1, chunk, rows)
            np.matmul(W[lo:whole].reshape(-1, chunk, k), xt, out=stacked)
        if whole < hi:
            np.matmul(W[whole:hi], xt, out=out[whole:hi])

    run_split(n, run)
    return out.T


def embedding_rows(raw: np.ndarray, info: TensorInfo, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of an embedding table, dequantized straight from the file's bytes."""
    return dequantize(raw[ids], info.type, info.shape[0])
