"""The compiled matmul kernel for cpu_simd: one object registered for every weight type it handles.

It follows cpu_simd's matmul contract (forge_cpu_simd.plugin): `prepare(raw, info)` keeps the
tensor's memory-mapped GGUF bytes as they are (`layout = "gguf"`: no float32 copy), `fuse` groups
weights that share an input so that their activations are rounded once and their rows split over
the threads together, `__call__(x, prepared)` computes x @ W.T. Activations are rounded as
llama.cpp rounds them (Q8_0/Q8_1 for the 32-element types, Q8_K for the K-quants, f16/bf16 for
half weights) and multiplied with integer dot products.

numba is imported on the first `prepare`, not when the plugin registers. If it cannot be imported,
or a type's kernels fail to compile, forge says so once and that weight is prepared by the NumPy
kernel instead (`forge_cpu_simd.matmul.DenseMatmul`), which this object then runs.
"""

from __future__ import annotations

import logging
import threading
import warnings

import numpy as np

log = logging.getLogger("forge")

# The types it registers for. F32 too, though NumPy could use the file's own float32 matrix: the
# compiled product reduces each row in the same order whatever the batch (batch invariance).
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # fmt: skip


class CompiledKernelWarning(UserWarning):
    """The compiled CPU kernels cannot run (numba missing, a compile failure): NumPy runs."""


_said: set[str] = set()
_said_lock = threading.Lock()


def say_once(key: str, message: str) -> None:
    """Warn (and log) once per process per key."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.warning("%s", message)
    warnings.warn(message, CompiledKernelWarning, stacklevel=3)


def _jit():  # noqa: ANN202
    """forge_cpu_jit.jit (imports numba), or None with the one-time message."""
    try:
        from forge_cpu_jit import jit
    except ImportError as exc:
        say_once("import", f"forge cpu_jit: the compiled CPU kernels need numba ({exc}); "
                           "cpu_simd runs its NumPy kernels (pip install numba)")  # fmt: skip
        return None
    except Exception as exc:  # a broken numba/llvmlite install
        say_once("import", f"forge cpu_jit: cannot load numba ({type(exc).__name__}: {exc}); "
                           "cpu_simd runs its NumPy kernels")  # fmt: skip
        return None
    return jit


def single_threaded_blas() -> None:
    """NumPy's BLAS on one thread, once the compiled kernels run a model: its pool and ours on
    the same cores slowed both (the default model's prefill went 360 -> 540 tok/s on the 2-core
    EPYC; the BLAS products left, in attention, are small). $FORGE_CPU_JIT_BLAS_THREADS
    overrides the count ("0": leave BLAS alone)."""
    global _blas_limited
    if _blas_limited:
        return
    _blas_limited = True
    import os

    want = os.environ.get("FORGE_CPU_JIT_BLAS_THREADS", "1")
    if not want.isdigit() or int(want) == 0:
        return
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=int(want), user_api="blas")
    except Exception as exc:  # threadpoolctl missing or a BLAS it cannot drive
        log.debug("forge cpu_jit: BLAS threads left as they are (%s)", exc)


_blas_limited = False


class BlockWeight:
    """A weight kept as its GGUF blocks: raw uint8 [rows, row bytes], memory-mapped."""

    layout = "gguf"

    def __init__(self, raw: np.ndarray, type_name: str, k: int):
        self.raw, self.type, self.k, self.n = raw, type_name, k, raw.shape[0]

    @property
    def nbytes(self) -> int:  # bytes of the mapped file it reads (not a copy)
        return self.raw.nbytes


class BlockGroup:
    """Weights sharing an input, computed as one product whose output columns are theirs in
    order (cpu_simd splits them again)."""

    layout = "gguf"

    def __init__(self, parts: list[BlockWeight]):
        self.parts = parts
        self.offsets = np.cumsum([0] + [p.n for p in parts]).tolist()
        self.n = self.offsets[-1]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


class JitMatmul:
    """y = x @ W.T on the GGUF blocks of W, compiled with numba (see the module docstring)."""

    batch_invariant = True  # mv and mm paths reduce each row in one order

    layout = "gguf"  # the prepared weights are the mapped blocks (forge_cpu_simd.loading)

    def __init__(self) -> None:
        self._fallback = None

    # -- preparing ------------------------------------------------------------------------
    def _numpy(self):  # noqa: ANN202
        if self._fallback is None:
            from forge_cpu_simd.matmul import DenseMatmul

            self._fallback = DenseMatmul()
        return self._fallback

    def compile(self, type_names) -> None:  # noqa: ANN001
        """Compile (or load from the cache) the kernels of these types now, with one progress
        line for all of them (cpu_simd calls this before preparing a model's weights)."""
        jit = _jit()
        if jit is None:
            return
        from forge_cpu_jit import rowwise_op

        ready = False
        for name, state in jit.compile_types(type_names, also=[rowwise_op.warm]).items():
            if state is not True and name in TYPES:
                say_once(
                    f"compile-{name}",
                    f"forge cpu_jit: the {name} kernel failed to compile ({state}); "
                    f"{name} weights use the NumPy kernel",
                )
            ready = ready or state is True
        if ready:
            single_threaded_blas()

    def ready(self, type_name: str) -> bool:
        jit = _jit()
        if jit is None:
            return False
        self.compile([type_name])
        return jit.compile_types([type_name])[type_name] is True

    def prepare(self, raw: np.ndarray, info):  # noqa: ANN001, ANN201
        k = int(info.shape[0])
        if info.type not in TYPES or not self.ready(info.type):
            return self._numpy().prepare(raw, info)
        from forge_cpu_jit.jit import BLOCK, ROW_BYTES_PER_BLOCK

        block = BLOCK[info.type]
        if raw.ndim != 2 or k % max(block, 32) or raw.shape[1] != k // block * \
                ROW_BYTES_PER_BLOCK[info.type]:  # fmt: skip
            return self._numpy().prepare(raw, info)  # a shape the kernels do not take
        return BlockWeight(raw, info.type, k)

    def fuse(self, parts: list):  # noqa: ANN201
        """One product for weights that share an input: compiled ones whose activations round
        alike, or (all fallen back) the NumPy kernel's fusion; None otherwise."""
        if all(isinstance(p, BlockWeight) for p in parts):
            from forge_cpu_jit.jit import ACT_KIND

            if len({ACT_KIND[p.type] for p in parts}) == 1:
                return BlockGroup(parts)
            return None
        if not any(isinstance(p, BlockWeight) for p in parts):
            return self._numpy().fuse(parts)
        return None

    # -- running --------------------------------------------------------------------------
    def __call__(self, x: np.ndarray, w) -> np.ndarray:  # noqa: ANN001
        if not isinstance(w, BlockWeight | BlockGroup):
            # NumPy's BLAS takes other paths (and sums in other orders) for other row counts:
            # one row at a time keeps the promise of batch_invariant for weights that fell back
            numpy = self._numpy()
            if x.ndim == 2 and x.shape[0] > 1:
                return np.concatenate([numpy(x[i : i + 1], w) for i in range(x.shape[0])])
            return numpy(x, w)
        from forge_cpu_jit import jit

        parts = w.parts if isinstance(w, BlockGroup) else [w]
        offsets = w.offsets if isinstance(w, BlockGroup) else (0,)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != parts[0].k:
            raise ValueError(f"activations of shape {x.shape} for a weight of row length "
                             f"{parts[0].k}")  # fmt: skip
        rows, k = x.shape
        act = jit.activations(rows, k, jit.ACT_KIND[parts[0].type])
        act.quantize(x)
        out = np.empty((rows, w.n), np.float32)
        act.products([(p.type, p.raw, start) for p, start in zip(parts, offsets)], out)
        return out
