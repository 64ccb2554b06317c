"""The cpu_simd plugin: registers the NumPy backend through forge's hooks like any plugin.

The kernel vocabulary of backend "cpu_simd" (what `forge_register_kernels` takes for it; the
highest priority wins, the built-in kernels register at 0). Arrays are float32 NumPy arrays,
rows first:
- "matmul", per weight type: an object with `prepare(raw, info) -> prepared`, called once at
  load with the tensor's GGUF bytes as stored (uint8 [rows, row_bytes], memory-mapped; no
  rearrangement) and its `forge.gguf.TensorInfo`, and `__call__(x, prepared) -> y` computing
  y = x @ W.T for x [tokens, in]. Optional `fuse(list_of_prepared) -> prepared | None`: stack
  weights that share an input (Q/K/V, gate/up) into one product. Optional `layout`: "float32"
  (the default: prepare builds a float32 copy, as the built-in kernel does) or "gguf" (prepare
  keeps the mapped bytes; the runner then counts the matrix as file bytes, and no float32 copy of
  it exists anywhere, the tied output head included). Optional `compile(weight_types)`: called
  once per model before any prepare, with the types that kernel will get.
  forge_cpu_jit registers compiled "gguf" kernels at priority 10 (and compiled attention ops).
- "rms_norm": (x, weight, eps) -> x / sqrt(mean(x^2) + eps) * weight over the last axis.
- "rope": (x [tokens, heads, head_dim], cos, sin, neox) rotates x in place (`ops.rope_tables`).
- "attention": (q [n, H, D], k [T, Hkv, D], v [T, Hkv, Dv], q_pos, scale, window) -> [n, H, Dv],
  one sequence, causal (and sliding-window).
- "decode_attention": (q [S, H, D], k [S, T, Hkv, D], v [S, T, Hkv, Dv], valid [S, T] mask,
  scale) -> [S, H, Dv]: one query row per sequence, each over the keys it sees (padded).
  Attention ops get K and V as float32, read from the cache in its format
  (`forge_cpu_simd.kv_store`).
- Both attention ops take the keyword `sinks` (float32 [H]: a logit per head that joins the
  softmax's denominator only) for models that have them (gpt-oss); it is not passed otherwise.
- "silu", "gelu_tanh": the gate activations, elementwise.
`forge_cpu_simd.ops` and `forge_cpu_simd.matmul` hold the built-in ones.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import forge
from forge.backend import Backend, Runner
from forge.devices import BackendProbe, DeviceInfo
from forge.errors import ForgeRuntimeError
from forge.gguf.types import SUPPORTED_TYPES
from forge.kv_cache import KvFormat, KvTypes
from forge.kv_pools import layer_positions
from forge_cpu_simd.loading import DEFAULT_EXPERT_CACHE_MB

FORGE_HOOK_API = forge.HOOK_API_VERSION

# The non-matmul ops the runner looks up in the kernel table (ops.py has the built-in ones).
ELEMENTWISE_OPS = ("rms_norm", "rope", "attention", "decode_attention", "silu", "gelu_tanh")
OPS = frozenset({"embed", "matmul", *ELEMENTWISE_OPS})

# Best first: the first level NumPy reports decides the arch suffix ("x86_64-avx512").
_SIMD_LEVELS = (
    ("AVX512F", "avx512"),
    ("AVX2", "avx2"),
    ("AVX", "avx"),
    ("SSE42", "sse4.2"),
    ("SSE2", "sse2"),
    ("SVE", "sve"),
    ("ASIMD", "neon"),
    ("NEON", "neon"),
    ("VSX", "vsx"),
)


def cpu_features() -> frozenset[str]:
    """SIMD features NumPy detected on this CPU (names as NumPy spells them, e.g. "AVX2")."""
    try:  # NumPy 2.x; np.show_runtime() reads the same table
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    return frozenset(name for name, on in __cpu_features__.items() if on)


def simd_arch(features: frozenset[str], machine: str | None = None) -> str:
    """``<machine>-<best SIMD level>``, e.g. "x86_64-avx2"; just the machine if none is known."""
    machine = machine or platform.machine() or "unknown"
    for feature, level in _SIMD_LEVELS:
        if feature in features:
            return f"{machine}-{level}"
    return machine


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _meminfo() -> tuple[int, int]:
    """(total, available) bytes of system memory, (0, 0) where /proc/meminfo is missing."""
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemTotal", 0), values.get("MemAvailable", values.get("MemFree", 0))


class CpuSimdBackend(Backend):
    """NumPy on the host CPU: always available, the correctness baseline and the fallback."""

    name = "cpu_simd"
    description = "NumPy on the CPU (BLAS matmuls, vectorized dequantization)"

    def probe(self) -> BackendProbe:
        features = cpu_features()
        total, free = _meminfo()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        device = DeviceInfo(
            name=_cpu_name(),
            platform="cpu",
            arch=simd_arch(features),
            memory_total=total,
            memory_free=free,
            compute_units=cores or 1,
            flags=features,
            ops=OPS,
            weight_types=frozenset(SUPPORTED_TYPES),
        )
        return BackendProbe(available=True, devices=(device,), score=10)

    def open_runner(
        self,
        spec: Any,
        gguf: Any,
        kernels: Any,
        *,
        device: int = 0,
        progress: Any = None,
        n_ctx: int | None = None,
        kv_types: KvTypes | None = None,
        expert_cache_mb: int = DEFAULT_EXPERT_CACHE_MB,
    ) -> Runner:
        """`expert_cache_mb`: the config key cpu_expert_cache_mb (prepared experts kept)."""
        from forge_cpu_simd.runner import CpuRunner

        if device != 0:
            raise ForgeRuntimeError(f"cpu_simd has one device (0), not {device}")
        formats = (kv_types or KvTypes()).resolve(KvFormat.F32)
        return CpuRunner(spec, gguf, kernels, progress=progress, kv_formats=formats,
                         expert_cache_bytes=expert_cache_mb << 20)  # fmt: skip

    def memory_needed(
        self,
        spec: Any,
        gguf: Any,
        n_ctx: int,
        kv_types: KvTypes | None = None,
        expert_cache_mb: int = DEFAULT_EXPERT_CACHE_MB,
        max_seqs: int = 1,
    ) -> dict[str, int]:
        """Weights: each matrix as its kernel keeps it (a float32 copy, or the mapped GGUF blocks
        for compiled kernels), float32 vectors, plus every expert of a mixture as stored
        (read from the mapped file) and the most its caches of prepared experts hold. The
        cache: sliding-window layers hold their pools, sized for `max_seqs` sequences."""
        from forge_cpu_simd.experts import expert_memory
        from forge_cpu_simd.loading import weight_bytes
        from forge_cpu_simd.runner import CpuRunner

        k, v = (kv_types or KvTypes()).resolve(KvFormat.F32)
        positions = layer_positions(spec, n_ctx, CpuRunner.prefill_chunk, max_seqs)
        kv = sum(positions) * spec.kv_bytes_per_token(k, v) // spec.n_layer
        weights = weight_bytes(spec, gguf) + sum(expert_memory(spec, gguf, expert_cache_mb << 20))
        return {"weights": weights, "kv_cache": kv}


@forge.hookimpl
def forge_register_backends(register) -> None:  # noqa: ANN001
    register(CpuSimdBackend)


@forge.hookimpl
def forge_register_kernels(register) -> None:  # noqa: ANN001
    from forge_cpu_simd import ops
    from forge_cpu_simd.matmul import DenseMatmul

    dense = DenseMatmul()
    for weight_type in SUPPORTED_TYPES:
        register("cpu_simd", "matmul", weight_type, dense)
    for op in ELEMENTWISE_OPS:
        register("cpu_simd", op, "*", getattr(ops, op))
