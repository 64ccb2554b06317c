"""The compiled "rms_norm" and "rope" ops: bit-identical to cpu_simd's NumPy ops, winning the
kernel table, and falling back to NumPy when they cannot compile."""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd import ops

from forge.plugins import get_plugin_manager

pytest.importorskip("numba")
from forge_cpu_jit import rowwise_op  # noqa: E402
from forge_cpu_jit.rowwise_op import CompiledRmsNorm, CompiledRope  # noqa: E402


def _rows(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 640), (9, 640), (1, 4, 256), (3, 1, 128), (2, 5, 64)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_rms_norm_bits_equal_numpy(shape, scale):
    rng = np.random.default_rng(len(shape) * 1000 + shape[-1])
    x, w = _rows(rng, shape, scale), _rows(rng, shape[-1])
    for eps in (1e-6, 1e-5):
        got = CompiledRmsNorm()(x, w, eps)
        assert got.dtype == np.float32 and got.shape == x.shape
        assert np.array_equal(got, ops.rms_norm(x, w, eps))


def test_rms_norm_of_strided_head_views_bits_equal_numpy():
    rng = np.random.default_rng(1)
    fused = _rows(rng, (5, 1536))  # q | k | v of a fused product, q viewed as heads
    q = fused[:, :1024].reshape(5, 4, 256)
    w = _rows(rng, 256)
    assert not q.flags.c_contiguous
    assert np.array_equal(CompiledRmsNorm()(q, w, 1e-6), ops.rms_norm(q, w, 1e-6))


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("half", [128, 16])  # whole head rotated, or a leading part of it
def test_rope_bits_equal_numpy_in_place(neox, half):
    rng = np.random.default_rng(half + neox)
    cos, sin = _rows(rng, (5, half)), _rows(rng, (5, half))
    fused = _rows(rng, (5, 1536))
    k_and_v = fused[:, 1024:].copy()
    view = fused[:, :1024].reshape(5, 4, 256)  # rotated through the view, as the runner does
    want = ops.rope(view.copy(), cos, sin, neox)
    got = CompiledRope()(view, cos, sin, neox)
    assert got is view
    assert np.array_equal(view, want)
    assert np.array_equal(fused[:, :1024].reshape(5, 4, 256), want)  # written through
    assert np.array_equal(fused[:, 1024:], k_and_v)  # nothing beside the view touched


def test_registered_above_numpy_and_builtin_forces_numpy():
    kernels = get_plugin_manager().kernels
    for op in ("rms_norm", "rope", "gelu_tanh", "silu"):
        won = kernels.get("cpu_simd", op, "*")
        assert won.plugin == "forge_cpu_jit.plugin" and won.priority > 0
        assert won.impl.batch_invariant
        assert kernels.batch_invariant().get("cpu_simd", op, "*").plugin == "forge_cpu_jit.plugin"
        builtin = [k for k in kernels.candidates("cpu_simd", op, "*")
                   if k.plugin == "forge_cpu_simd.plugin"]  # fmt: skip
        assert builtin and builtin[0].impl is getattr(ops, op)


def test_failed_compile_warns_once_and_runs_numpy(monkeypatch, recwarn):
    from forge_cpu_jit import kernel, rowwise

    def broken(*args):
        raise RuntimeError("LLVM said no")

    monkeypatch.setattr(kernel, "_said", set())
    monkeypatch.setattr(rowwise_op, "_kernels", None)
    monkeypatch.setattr(rowwise, "scale_rows", broken)
    rng = np.random.default_rng(2)
    x, w = _rows(rng, (2, 64)), _rows(rng, 64)
    for _ in range(2):
        assert np.array_equal(CompiledRmsNorm()(x, w, 1e-6), ops.rms_norm(x, w, 1e-6))
    said = [str(r.message) for r in recwarn if "norm/RoPE unavailable" in str(r.message)]
    assert len(said) == 1 and "LLVM said no" in said[0]


def test_missing_numba_falls_back_silently(monkeypatch, recwarn):
    import sys

    monkeypatch.setattr(rowwise_op, "_kernels", None)
    monkeypatch.setitem(sys.modules, "forge_cpu_jit.rowwise", None)  # import fails
    rng = np.random.default_rng(3)
    x, cos, sin = _rows(rng, (2, 2, 32)), _rows(rng, (2, 16)), _rows(rng, (2, 16))
    want = ops.rope(x.copy(), cos, sin, True)
    assert np.array_equal(CompiledRope()(x, cos, sin, True), want)
    assert not [r for r in recwarn if "unavailable" in str(r.message)]


@pytest.mark.parametrize("op", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("shape", [(1, 2048), (7, 512), (3, 2, 96)])
def test_activations_bits_equal_numpy(op, shape):
    rng = np.random.default_rng(shape[-1])
    compiled = {"gelu_tanh": rowwise_op.CompiledGeluTanh, "silu": rowwise_op.CompiledSilu}[op]()
    for scale in (0.01, 1.0, 8.0, 60.0):  # into tanh/exp saturation and overflow
        x = _rows(rng, shape, scale)
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf for both, as it should
            got, want = compiled(x), getattr(ops, op)(x)
        assert got.shape == x.shape and got.dtype == np.float32
        assert np.array_equal(got, want)
    strided = _rows(rng, (4, 2 * shape[-1]))[:, : shape[-1]]  # a column slice, as after a split
    assert np.array_equal(compiled(strided), getattr(ops, op)(strided))
