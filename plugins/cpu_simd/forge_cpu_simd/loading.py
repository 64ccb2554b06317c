"""Weights as the cpu_simd kernels want them: each matrix prepared once by the matmul kernel that
wins in the kernel table for its type, vectors (norm weights, biases) as float32.

A matmul kernel says which weight layout it consumes with its `layout` attribute: "float32" (the
default; the built-in NumPy kernel dequantizes each matrix into a float32 copy for BLAS) or "gguf"
(its prepared weight keeps the memory-mapped GGUF blocks, as compiled kernels such as
forge_cpu_jit's do: no copy is made, and the matrix costs only the mapped file's pages). A kernel
may also have `compile(weight_types)`, called once before any weight is prepared with the types
it will get (one progress line for a first compile instead of one per type).
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
        # the pieces' column ranges (np.split's own bookkeeping costs more than the slicing)
        cuts = [0, *map(int, split), None] if split else []
        self._pieces = [slice(a, b) for a, b in zip(cuts, cuts[1:])]

    def __call__(self, x: np.ndarray):
        y = self.kernel(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return [y[..., piece] for piece in self._pieces] if self.split else y

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


def layout(kernel) -> str:  # noqa: ANN001
    """The weight layout a matmul kernel consumes: "gguf" (the mapped blocks) or "float32"."""
    return getattr(kernel, "layout", "float32")


DEFAULT_EXPERT_CACHE_MB = 2048  # the config key cpu_expert_cache_mb's default


class WeightLoader:
    """Reads one model's tensors from its GGUF file through the kernel table."""

    def __init__(self, gguf: GGUFFile, kernels: KernelTable,
                 expert_cache_bytes: int = DEFAULT_EXPERT_CACHE_MB << 20):  # fmt: skip
        """`expert_cache_bytes`: how many bytes of prepared experts (forge_cpu_simd.experts)
        the blocks it loads keep, over all layers."""
        self.gguf, self.kernels = gguf, kernels
        self.expert_cache_bytes = expert_cache_bytes

    def compile_kernels(self, names: list[str]) -> None:
        """Let each winning matmul kernel that compiles code do so for the types of `names`."""
        by_kernel: dict[int, tuple[object, set[str]]] = {}
        for name in names:
            info = self.gguf.tensors.get(name)
            if info is None or len(info.shape) not in (2, 3):  # 3: stacked experts
                continue
            impl = self.kernels.require(BACKEND, "matmul", info.type).impl
            if hasattr(impl, "compile"):
                by_kernel.setdefault(id(impl), (impl, set()))[1].add(info.type)
        for impl, types in by_kernel.values():
            impl.compile(sorted(types))

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


def matrix_names(spec: ModelSpec) -> list[str]:
    """The weights the forward pass multiplies by, experts aside. An untied token_embd.weight is
    not one: embedding rows are dequantized from the mapped file as they are looked up. Experts
    stay in the mapped file (`forge_cpu_simd.experts.expert_memory` counts them)."""
    return [n for n, w in model_weights(spec).items()
            if w.kind != "experts" and (spec.tied_output or n != "token_embd.weight")]  # fmt: skip


def weight_bytes(spec: ModelSpec, gguf: GGUFFile, kernels: KernelTable | None = None) -> int:
    """Bytes the prepared weights take: the float32 copy of each matrix whose kernel builds one,
    the GGUF bytes (mapped from the file) of each matrix whose kernel reads the blocks, float32
    for vectors. Without a kernel table, the process's plugins decide."""
    if kernels is None:
        from forge.plugins import get_plugin_manager

        kernels = get_plugin_manager().kernels
    total = 0
    for name in matrix_names(spec):
        info = gguf.tensors[name]
        found = kernels.get(BACKEND, "matmul", info.type) if len(info.shape) == 2 else None
        if found is not None and layout(found.impl) == "gguf":
            total += info.nbytes
        else:
            total += info.n_elements * 4
    return total


def _nbytes(obj) -> int:
    if hasattr(obj, "nbytes"):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    return 0
