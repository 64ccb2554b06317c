"""cpu_simd's float32 product x @ W.T on each of its paths (one row: GEMV; 2..16 rows times a
weight over 1 MiB: small-kernel chunks, stacked, on the worker threads; otherwise one W @ x.T)
against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd.matmul import MAX_CHUNKED_ROWS, product


@pytest.mark.parametrize(
    ("rows", "n", "k"),
    [
        (1, 1000, 640),  # GEMV
        (3, 1031, 640),  # chunked: 1031 * 640 * 4 bytes > 1 MiB, odd row count
        (8, 1000, 640),  # chunked: 15 stacked chunks of 64 rows and a rest of 40
        (8, 1000, 2048),  # chunked: 61 rows fit the limit, chunks of 32
        (MAX_CHUNKED_ROWS, 600, 640),  # chunked, largest row count
        (MAX_CHUNKED_ROWS, 5, 70_000),  # chunked, rows * k beyond the small-kernel limit
        (MAX_CHUNKED_ROWS + 1, 300, 640),  # one sgemm
        (5, 7, 33),  # small weight: one sgemm
    ],
)
def test_product_matches_float64(rows, n, k):
    rng = np.random.default_rng(rows * 1000 + n)
    W = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    got = product(W, x)
    ref = x.astype(np.float64) @ W.astype(np.float64).T
    assert got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3 * np.sqrt(k))
