"""Tensor-core prefill products (gemm.hip) against NumPy float64 on the dequantized weights, and
act_half's rounded 16-bit activations against a NumPy model of llama.cpp's rounding."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import TYPE_IDS, TYPE_SUFFIX

from tests.support.gpu_helpers import rel_err
from tests.support.mvq_cases import odd_k, random_weights

GEMM_TYPES = [t for t in TYPE_SUFFIX if t != "F32"]  # F32 stays on mm_tiled


def f32(v) -> np.float32:
    return np.float32(v)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def act_reference(x: np.ndarray, mode: int) -> np.ndarray:
    """16-bit words act_half writes for float32 rows `x` (act_round's rounding, then 16 bits)."""
    if mode == 3:
        return x.astype(np.float16).view(np.uint16)
    if mode == 4:
        return bf16_bits(x)
    length = 32 if mode == 1 else 256
    out = np.empty(x.shape, np.float16)
    for r in range(x.shape[0]):
        for c in range(x.shape[1] // length):
            v = x[r, c * length : (c + 1) * length]
            amax = np.abs(v).max()
            if mode == 1:
                d = f32(amax) / f32(127.0)
                inv = f32(1.0) / d if d > 0 else f32(0.0)
                dh = f32(np.float16(d))
                y = np.rint(v * inv).astype(np.float32) * dh
            else:
                iscale = f32(-127.0) / f32(amax) if amax != 0 else f32(0.0)
                d = f32(1.0) / iscale if iscale != 0 else f32(0.0)
                y = np.minimum(np.rint(v * iscale), f32(127.0)).astype(np.float32) * d
            out[r, c * length : (c + 1) * length] = y.astype(np.float32).astype(np.float16)
    return out.view(np.uint16)


@pytest.mark.parametrize("mode", [1, 2, 3, 4])
def test_act_half_rounds_like_act_round(rt, lib, dev, mode):
    rng = np.random.default_rng()
    R, K = 5, 256 * 3
    x = (rng.standard_normal((R, K)) * rng.uniform(0.01, 100, size=(R, 1))).astype(np.float32)
    x[1, :256] = 0.0  # an all-zero chunk: scale 0, values 0
    x[2, 7] = -3 * np.abs(x[2]).max()  # a negative peak
    y = dev.poisoned(R * K * 2)
    rt.launch(lib.get("act_half"), (R,), (256,), [dev.put(x), y, K, mode])
    got = dev.get(y, (R, K), np.uint16)
    np.testing.assert_array_equal(got, act_reference(x, mode))


def _descs(entries) -> np.ndarray:
    """int64 [n, 8] descriptor rows: W, x, y, bias, type id, K, N, row bytes."""
    return np.array(entries, dtype=np.int64)


def _activations(rng, type_name: str, R: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(16-bit words the kernel reads, their float64 values): bfloat16 for BF16 weights."""
    x = rng.standard_normal((R, K)).astype(np.float32)
    if type_name == "BF16":
        bits = bf16_bits(x)
        return bits, bf16_values(bits).astype(np.float64)
    h = x.astype(np.float16)
    return h.view(np.uint16), h.astype(np.float64)


@pytest.mark.parametrize("tile_rows", [64, 128])
@pytest.mark.parametrize("type_name", GEMM_TYPES)
def test_gemm_matches_float64(rt, lib, dev, type_name, tile_rows):
    """Two matrices in one launch (the second F16, narrower, of another K): odd row counts and
    widths cut through the tiles; the row past R stays poisoned."""
    rng = np.random.default_rng()
    R = 150  # 3 tiles of 64 rows, 2 of 128, the last one partial
    K, N = odd_k(type_name), 203
    if K % 32:
        K = 32 * 11
    K2, N2 = 96, 77
    raw, W = random_weights(rng, type_name, N, K)
    raw2, W2 = random_weights(rng, "F16", N2, K2)
    xw, xv = _activations(rng, type_name, R, K)
    xw2, xv2 = _activations(rng, "F16", R, K2)
    bias = rng.standard_normal(N).astype(np.float32)
    y = dev.poisoned((R + 1) * N * 4)
    y2 = dev.poisoned((R + 1) * N2 * 4)
    w = dev.put_rows(type_name, raw)
    bufs = [dev.put(a) for a in (xw, bias, raw2, xw2)]
    table = _descs([
        [w, bufs[0].ptr, y.ptr, bufs[1].ptr, TYPE_IDS[type_name], K, N, raw.shape[1]],
        [bufs[2].ptr, bufs[3].ptr, y2.ptr, 0, TYPE_IDS["F16"], K2, N2, raw2.shape[1]],
    ])  # fmt: skip
    descs = dev.put(np.concatenate([np.zeros((1, 8), np.int64), table]))  # starts at `first` 1
    grid = (-(-R // tile_rows), -(-N // 128), 2)
    rt.launch(lib.get(f"gemm_m{tile_rows}"), grid, (256,), [descs, 1, R])
    out = dev.get(y, (R + 1, N))
    out2 = dev.get(y2, (R + 1, N2))
    assert np.isnan(out[R]).all() and np.isnan(out2[R]).all(), "wrote past the last row"
    ref = xv @ W.T + bias
    ref2 = xv2 @ W2.T
    # 16-bit operands multiply exactly; quantized weights are rounded to float16 once (2^-11)
    tol = 1e-5 if type_name in ("F16", "BF16") else 1e-3
    assert rel_err(out[:R], ref) < tol, (type_name, rel_err(out[:R], ref))
    assert rel_err(out2[:R], ref2) < 1e-5


def test_gemm_small_row_count(rt, lib, dev):
    """Fewer rows than one tile (the mixed-batch case): Q4_K, 9 rows."""
    rng = np.random.default_rng()
    R, K, N = 9, 512, 130
    raw, W = random_weights(rng, "Q4_K", N, K)
    xw, xv = _activations(rng, "Q4_K", R, K)
    y = dev.poisoned((R + 1) * N * 4)
    bufs = [dev.put(a) for a in (raw, xw)]
    table = _descs([[bufs[0].ptr, bufs[1].ptr, y.ptr, 0, TYPE_IDS["Q4_K"], K, N, raw.shape[1]]])
    rt.launch(lib.get("gemm_m64"), (1, 2, 1), (256,), [dev.put(table), 0, R])
    out = dev.get(y, (R + 1, N))
    assert np.isnan(out[R]).all()
    assert rel_err(out[:R], xv @ W.T) < 1e-3
