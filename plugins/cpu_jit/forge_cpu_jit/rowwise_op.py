"""cpu_simd's "rms_norm", "rope", "gelu_tanh" and "silu" ops, compiled (rowwise.py) and
bit-identical to NumPy's.

Each op object takes the arguments of the NumPy op of the same name (`forge_cpu_simd.ops`) and
returns exactly what it returns: RMSNorm's sums of squares still come from the NumPy op's own
`einsum` (whose summation order depends on NumPy's build and CPU), and the activations' tanh and
exp from NumPy's own functions; only the arithmetic around them is compiled. A decode step calls
these ops about 160 times; NumPy's chain of small calls cost ~15 us each in a step's context,
the compiled ones a few. numba is imported on first use; if it cannot be, or the kernels fail
to compile, forge says so once and the NumPy ops run.
"""

from __future__ import annotations

import numpy as np

from forge_cpu_jit.kernel import say_once

_kernels = None  # forge_cpu_jit.rowwise once compiled, False when it cannot be


def warm() -> None:
    """Compile (or load from the cache) the kernels now, not on the first call."""
    _compiled()


def _compiled():  # noqa: ANN202
    global _kernels
    if _kernels is None:
        try:
            from forge_cpu_jit import rowwise

            x = np.zeros((1, 1, 4), np.float32)  # compile (or load from the cache) now, once:
            # contiguous arrays, and head views of a fused Q/K/V output for RoPE
            rowwise.scale_rows(x[0], np.ones(1, np.float32), np.ones(4, np.float32),
                               np.float32(1e-6), x[0].copy())  # fmt: skip
            cos, sin = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)
            rowwise.rotate(x, cos, sin, True)
            rowwise.rotate(np.zeros((1, 8), np.float32)[:, :4].reshape(1, 1, 4), cos, sin, True)
            flat = x.reshape(-1)
            for fn in (rowwise.gelu_inner, rowwise.gelu_outer, rowwise.negate, rowwise.silu_outer):
                fn(flat, flat.copy())
            _kernels = rowwise
        except ImportError:  # numba missing: the matmul kernel already said so
            _kernels = False
        except Exception as exc:  # numba broken or a failed compile: NumPy's ops run
            why = f"{type(exc).__name__}: {exc}"
            say_once("rowwise", f"forge cpu_jit: compiled norm/RoPE unavailable ({why}); "
                                "cpu_simd runs NumPy's")  # fmt: skip
            _kernels = False
    return _kernels or None


class CompiledRmsNorm:
    """The "rms_norm" op: x / sqrt(mean(x^2) + eps) * weight over the last axis."""

    batch_invariant = True  # each row on its own

    def __call__(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        kernels = _compiled()
        if kernels is None or x.dtype != np.float32 or weight.dtype != np.float32:
            from forge_cpu_simd import ops

            return ops.rms_norm(x, weight, eps)
        sums = np.einsum("...i,...i->...", x, x, dtype=np.float32)  # as the NumPy op sums
        d = x.shape[-1]
        out = np.empty(x.shape, np.float32)
        kernels.scale_rows(np.ascontiguousarray(x).reshape(-1, d), sums.reshape(-1),
                           np.ascontiguousarray(weight), np.float32(eps),
                           out.reshape(-1, d))  # fmt: skip
        return out


class CompiledRope:
    """The "rope" op: rotates x [tokens, heads, head_dim] in place and returns it."""

    batch_invariant = True

    def __call__(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
        kernels = _compiled()
        if kernels is None or x.dtype != np.float32:
            from forge_cpu_simd import ops

            return ops.rope(x, cos, sin, neox)
        kernels.rotate(x, np.ascontiguousarray(cos, np.float32),
                       np.ascontiguousarray(sin, np.float32), bool(neox))  # fmt: skip
        return x


class _CompiledActivation:
    """An elementwise activation op: NumPy's op of the same `name` when the kernels are not
    there, else on the flattened arrays the compiled `inner` kernel, NumPy's `middle` ufunc in
    place (the function NumPy's op calls, so the bits are its) and the compiled `outer` one."""

    batch_invariant = True
    name = inner = outer = ""
    middle = None  # a NumPy ufunc

    def __call__(self, x: np.ndarray) -> np.ndarray:
        kernels = _compiled()
        if kernels is None or x.dtype != np.float32:
            from forge_cpu_simd import ops

            return getattr(ops, self.name)(x)
        out = np.empty(x.shape, np.float32)
        flat, t = np.ascontiguousarray(x).reshape(-1), out.reshape(-1)
        getattr(kernels, self.inner)(flat, t)
        self.middle(t, out=t)
        getattr(kernels, self.outer)(flat, t)
        return out


class CompiledGeluTanh(_CompiledActivation):
    """The "gelu_tanh" op: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    name, inner, middle, outer = "gelu_tanh", "gelu_inner", np.tanh, "gelu_outer"


class CompiledSilu(_CompiledActivation):
    """The "silu" op: x / (1 + exp(-x))."""

    name, inner, middle, outer = "silu", "negate", np.exp, "silu_outer"
