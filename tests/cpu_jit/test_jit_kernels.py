"""The compiled cpu_simd kernels (plugins/cpu_jit) against NumPy float64 on the dequantized
weights, with activations rounded as llama.cpp rounds them (forge_cpu_simd.act_round)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from forge_cpu_simd.act_round import activation_rounding  # noqa: E402
from forge_cpu_simd.dequant import dequantize  # noqa: E402

from forge.gguf import TensorInfo  # noqa: E402
from tests.support.quant_blocks import random_raw as _random_raw  # noqa: E402

QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def random_raw(rng, type_name, rows, k):
    """tests.support's random blocks, and MXFP4 ones (every code, exponents that keep the
    products finite, the two subnormal scales included)."""
    if type_name != "MXFP4":
        return _random_raw(rng, type_name, rows, k)
    raw = rng.integers(0, 256, size=(rows, k // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.choice([0, 1, 2, 100, 120, 126, 127, 128, 130], size=(rows, k // 32))
    return raw.reshape(rows, -1)


FLOAT = ["F16", "BF16"]


def _reference(raw, type_name, k, x):
    w = dequantize(raw, type_name, k).astype(np.float64)
    rounding = activation_rounding(type_name)
    xr = rounding(x) if rounding else x
    return xr.astype(np.float64) @ w.T


def _info(name, type_name, k, rows, raw):
    return TensorInfo(name, type_name, (k, rows), 0, raw.nbytes)


@pytest.fixture(scope="module")
def kernel():
    from forge_cpu_jit.kernel import JitMatmul

    k = JitMatmul()
    k.compile(QUANT + FLOAT)
    return k


@pytest.mark.parametrize("type_name", QUANT + FLOAT)
@pytest.mark.parametrize("rows", [1, 3, 9])  # one row (decode), the 1-row tail of 4x4, tiles
def test_product_matches_float64(kernel, type_name, rows):
    from forge_cpu_jit.kernel import BlockWeight

    rng = np.random.default_rng(rows * 100 + len(type_name))
    ks = [512] if type_name.endswith("_K") else [96, 128]  # 96: a half 64-weight chunk
    for k in ks:
        n = 37  # not a multiple of the 16-row tiles
        raw = random_raw(rng, type_name, n, k)
        prepared = kernel.prepare(raw, _info("w", type_name, k, n, raw))
        assert isinstance(prepared, BlockWeight) and prepared.raw is raw  # no copy
        x = rng.standard_normal((rows, k)).astype(np.float32)
        got = kernel(x, prepared)
        ref = _reference(raw, type_name, k, x)
        assert got.shape == (rows, n) and got.dtype == np.float32
        scale = np.abs(ref).max()
        assert np.abs(got - ref).max() <= 2e-6 * scale, (type_name, k)


def test_large_product_splits_over_threads(kernel):
    """Enough rows for the pool to hand out chunks (and rows that are no multiple of them)."""
    rng = np.random.default_rng(7)
    raw = random_raw(rng, "Q5_0", 4099, 640)
    prepared = kernel.prepare(raw, _info("w", "Q5_0", 640, 4099, raw))
    for rows in (1, 8, 33):
        x = rng.standard_normal((rows, 640)).astype(np.float32)
        ref = _reference(raw, "Q5_0", 640, x)
        got = kernel(x, prepared)
        assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


def test_fused_weights_run_as_one_job_give_each_weights_bits(kernel):
    """A group large enough for the threads, whose chunks straddle its parts: each part's
    columns are bit for bit what that weight gives alone, for 1 and several rows."""
    rng = np.random.default_rng(11)
    parts = [("Q5_0", 37), ("Q8_0", 300), ("Q5_0", 1003)]
    raws = [random_raw(rng, t, n, 640) for t, n in parts]
    prepared = [kernel.prepare(r, _info("w", t, 640, n, r)) for r, (t, n) in zip(raws, parts)]
    group = kernel.fuse(prepared)
    for rows in (1, 3, 20):
        x = rng.standard_normal((rows, 640)).astype(np.float32)
        for _ in range(2):  # the second call reuses the cached job
            got = kernel(x, group)
            alone = np.concatenate([kernel(x, p) for p in prepared], axis=1)
            assert np.array_equal(got, alone)


def test_fused_weights_of_types_that_round_alike(kernel):
    """Q/K/V of types Q5_0, Q5_0, Q8_0 (both Q8_0 activations): one group, outputs in order;
    a K-quant beside them rounds differently and is not fused."""
    from forge_cpu_jit.kernel import BlockGroup

    rng = np.random.default_rng(3)
    parts = [("Q5_0", 64), ("Q5_0", 32), ("Q8_0", 48)]
    raws = [random_raw(rng, t, n, 256) for t, n in parts]
    prepared = [kernel.prepare(r, _info("w", t, 256, n, r)) for r, (t, n) in zip(raws, parts)]
    group = kernel.fuse(prepared)
    assert isinstance(group, BlockGroup) and group.n == 144
    x = rng.standard_normal((5, 256)).astype(np.float32)
    got = kernel(x, group)
    ref = np.concatenate([_reference(r, t, 256, x) for r, (t, _) in zip(raws, parts)], axis=1)
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()
    k_quant = random_raw(rng, "Q4_K", 16, 256)
    assert kernel.fuse(prepared + [kernel.prepare(k_quant, _info("w", "Q4_K", 256, 16,
                                                                 k_quant))]) is None  # fmt: skip


def test_f16_helpers_are_exact():
    """The f16 conversions the kernels use (scales, activation rounding) against NumPy's."""
    from forge_cpu_jit.quant import f16_to_f32, f32_to_f16
    from numba import njit

    @njit
    def both(bits, values, out_f, out_h):
        for i in range(bits.size):
            out_f[i] = f16_to_f32(bits[i])
        for i in range(values.size):
            out_h[i] = f32_to_f16(values[i])

    bits = np.arange(0, 1 << 16, dtype=np.uint32)
    finite = np.isfinite(bits.astype(np.uint16).view(np.float16))
    rng = np.random.default_rng(0)
    wide = rng.standard_normal(10000) * 10.0 ** rng.integers(-9, 5, 10000)
    edges = [0.0, -0.0, 6.1e-5, 5.96e-8, 65504.0, 1e-9]
    values = np.concatenate([wide, edges]).astype(np.float32)
    out_f = np.zeros(bits.size, np.float32)
    out_h = np.zeros(values.size, np.int64)
    both(bits, values, out_f, out_h)
    expect = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out_f[finite], expect[finite])
    np.testing.assert_array_equal(
        out_h.astype(np.uint16), values.astype(np.float16).view(np.uint16)
    )
