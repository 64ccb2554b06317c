"""Weights as the cpu_simd kernels want them: each matrix prepared once by the matmul kernel that
wins in the kernel table for its type (the built-in one dequantizes to float32 for BLAS),
vectors (norm weights, biases) as float32.
"""

from __future__ import annotations

import numpy as np

from forge.gguf import GGUFFile, TensorInfo
from forge.kernels import KernelTable
from forge.models.spec import ModelSpec
from forge.models.weights import model_weights

BACKEND = "cpu_simd"


class Linear:
    """A prepared weight plus the kernel that multiplies by it (and optional bias); with `split`,
    the output is cut into the pieces of the weights that were stacked into it."""

    def __init__(self, kernel, weight, bias: np.ndarray | None = None, split=None):
        self.kernel, self.weight, self.bias, self.split = kernel, weight, bias, split

    def __call__(self, x: np.ndarray):
        y = self.kernel(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return np.split(y, self.split, axis=-1) if self.split else y

    @property
    def nbytes(self) -> int:
        return _nbytes(self.weight)


class Stacked:
    """Several separately prepared weights applied to the same input (unfusable kernels)."""

    def __init__(self, parts: list[Linear], bias: np.ndarray | None, sizes: list[int]):
        self.parts, self.bias, self.sizes = parts, bias, sizes

    def __call__(self, x):
        ys = [p(x) for p in self.parts]
        if self.bias is None:
            return ys
        return np.split(np.concatenate(ys, axis=-1) + self.bias, self.sizes, axis=-1)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


class WeightLoader:
    """Reads one model's tensors from its GGUF file through the kernel table."""

    def __init__(self, gguf: GGUFFile, kernels: KernelTable):
        self.gguf, self.kernels = gguf, kernels

    def vector(self, name: str) -> np.ndarray:
        from forge_cpu_simd.dequant import dequantize

        info = self.gguf.tensors[name]
        return dequantize(self.gguf.raw(name), info.type, info.shape[0]).reshape(-1)

    def optional_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if name in self.gguf.tensors else None

    def linear(self, names: list[str], biases: list[str] | None = None) -> Linear | Stacked:
        """The product by the named matrices, which share an input: one prepared weight when
        their kernel can fuse them, else one per matrix; the output is split per matrix when
        there are several."""
        parts = [(self.gguf.raw(n), self.gguf.tensors[n]) for n in names]
        bias = np.concatenate([self.vector(b) for b in biases]) if biases else None
        return prepare_linear(self.kernels, parts, bias)


def prepare_linear(
    kernels: KernelTable, parts: list[tuple[np.ndarray, TensorInfo]], bias: np.ndarray | None
) -> Linear | Stacked:
    """The product by matrices given as (GGUF bytes, TensorInfo) that share an input, each
    prepared by the matmul kernel that wins for its type (see `WeightLoader.linear`)."""
    infos = [info for _, info in parts]
    impls = [kernels.require(BACKEND, "matmul", i.type).impl for i in infos]
    prepared = [k.prepare(raw, i) for k, (raw, i) in zip(impls, parts)]
    if len(parts) == 1:
        return Linear(impls[0], prepared[0], bias)
    sizes = list(np.cumsum([i.shape[1] for i in infos])[:-1])
    if all(k is impls[0] for k in impls) and hasattr(impls[0], "fuse"):
        fused = impls[0].fuse(prepared)
        if fused is not None:
            return Linear(impls[0], fused, bias, sizes)
    return Stacked([Linear(k, p) for k, p in zip(impls, prepared)], bias, sizes)


def weight_bytes(spec: ModelSpec, gguf: GGUFFile) -> int:
    """Bytes the prepared (float32) weights take. An untied token_embd.weight is not counted:
    embedding rows are dequantized from the mapped file as they are looked up. Experts stay in
    the mapped file (`forge_cpu_simd.experts.expert_memory` counts them)."""
    names = [n for n, w in model_weights(spec).items()
             if w.kind != "experts" and (spec.tied_output or n != "token_embd.weight")]  # fmt: skip
    return sum(gguf.tensors[n].n_elements * 4 for n in names)


def _nbytes(obj) -> int:
    if hasattr(obj, "nbytes"):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    return 0
