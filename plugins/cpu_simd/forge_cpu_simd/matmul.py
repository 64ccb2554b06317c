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
        if x.shape[0] == 1:
            return (w.matrix @ x[0])[None, :]
        return x @ w.matrix.T


def embedding_rows(raw: np.ndarray, info: TensorInfo, ids: np.ndarray) -> np.ndarray:
    """Rows `ids` of an embedding table, dequantized straight from the file's bytes."""
    return dequantize(raw[ids], info.type, info.shape[0])
