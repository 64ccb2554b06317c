"""Matrix-vector products and embedding lookups for every weight type against NumPy (float64)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from forge_hip.library import TYPE_SUFFIX
from gguf import GGMLQuantizationType, quants

from tests.gpu.helpers import rel_err
from tests.quant_blocks import random_raw


def random_weights(rng, type_name: str, rows: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGML bytes [rows, row_bytes], float64 values [rows, K]) with finite scales."""
    qtype = GGMLQuantizationType[type_name]
    raw = random_raw(rng, type_name, rows, K)
    values = quants.dequantize(raw, qtype).reshape(rows, K).astype(np.float64)
    return np.ascontiguousarray(raw), values


def odd_k(type_name: str) -> int:
    block = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    return {1: 333, 32: 32 * 13, 256: 256 * 3}[block]


@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
@pytest.mark.parametrize("rows_per_block", [1, 4])
def test_matvec(rt, lib, dev, type_name, rows_per_block):
    rng = np.random.default_rng()
    K, N, B = odd_k(type_name), 37, 2
    raw, W = random_weights(rng, type_name, N, K)
    x = rng.standard_normal((B, K)).astype(np.float32)
    y = dev.poisoned(B * N * 4)
    kernel = lib.get("matvec_" + TYPE_SUFFIX[type_name])
    warp = rt.props.warp_size
    grid = ((N + rows_per_block - 1) // rows_per_block, B)
    rt.launch(kernel, grid, (rows_per_block * warp,), [dev.put(raw), dev.put(x), y, K, N])
    out = dev.get(y, (B, N))
    ref = x.astype(np.float64) @ W.T
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
def test_embed(rt, lib, dev, type_name):
    rng = np.random.default_rng()
    K, V = odd_k(type_name), 50
    raw, W = random_weights(rng, type_name, V, K)
    ids = rng.integers(0, V, size=7).astype(np.int32)
    out = dev.poisoned(len(ids) * K * 4)
    rt.launch(
        lib.get("embed_" + TYPE_SUFFIX[type_name]),
        (len(ids),),
        (128,),
        [dev.put(raw), dev.put(ids), out, K, 0.5],
    )
    got = dev.get(out, (len(ids), K))
    np.testing.assert_allclose(got, 0.5 * W[ids], rtol=1e-6, atol=1e-30)


def test_matvec_rejects_wrong_argument_count(lib):
    from forge_hip.runtime.base import ArgPack

    from forge.errors import UsageError

    with pytest.raises(UsageError, match="wants 5 arguments"):
        ArgPack(lib.get("matvec_q4_0").signature, [0, 0, 0, 1])
