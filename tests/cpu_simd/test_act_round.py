"""Activation rounding of cpu_simd (llama.cpp's vec_dot operand types) against independent
references: gguf's own Q8_0 quantizer, and a float64 block-by-block model of Q8_K."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from forge_cpu_simd.act_round import (
    activation_rounding,
    round_bf16,
    round_f16,
    round_q8_0,
    round_q8_k,
)
from gguf.quants import dequantize, quantize


def _activations(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 30)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 5], x[1, 9] = 4.0, -4.0  # a +a / -a tie for the block's peak
    x[1, :256] = np.clip(x[1, :256], -4.0, 4.0)
    return x


def _q8_k_reference(x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantize_row_q8_K then dequantize, one 256-block at a time."""
    out = np.zeros(x.shape, dtype=np.float32)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], 256):
            blk = x[r, b : b + 256]
            peak = blk[int(np.argmax(np.abs(blk)))]
            if peak == 0:
                continue
            iscale = np.float32(-127.0) / np.float32(peak)
            q = np.minimum(np.rint(blk * iscale), 127)
            out[r, b : b + 256] = q * (np.float32(1.0) / iscale)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q8_0_matches_gguf_quantizer(seed):
    x = _activations(np.random.default_rng(seed), 5, 512)
    t = gguf.GGMLQuantizationType.Q8_0
    np.testing.assert_array_equal(round_q8_0(x), dequantize(quantize(x, t), t))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q8_k_matches_block_reference(seed):
    x = _activations(np.random.default_rng(seed), 5, 768)
    got = round_q8_k(x)
    np.testing.assert_allclose(got, _q8_k_reference(x), rtol=1e-6, atol=0)
    assert not np.array_equal(got, x)  # it did round
    assert np.all(got[0, :32] == 0.0)


def test_half_roundings():
    x = np.array([[1.0 + 2**-12, 3.14159, -65504.5, 1e-8]], dtype=np.float32)
    np.testing.assert_array_equal(round_f16(x), x.astype(np.float16).astype(np.float32))
    # bf16: round to nearest even on the top 16 bits
    b = round_bf16(np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8]], dtype=np.float32))
    np.testing.assert_array_equal(b, np.array([[1.0, 1.0 + 4 * 2**-8]], dtype=np.float32))


def test_rounding_per_weight_type():
    assert activation_rounding("Q4_K") is round_q8_k
    assert activation_rounding("Q8_0") is round_q8_0
    assert activation_rounding("MXFP4") is round_q8_0  # ggml_vec_dot_mxfp4_q8_0
    assert activation_rounding("F32") is None
