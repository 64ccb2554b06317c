"""kernels/quants.h decodes every GGML block type exactly like the gguf package's reference
(rows as the arena uploads them: forge_hip.arena.device_rows).

The decoders are plain C++ under FORGE_HOST, so they are compiled here with the host compiler and
checked on random bytes, without a GPU. The GPU kernels call these same functions.
"""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
from forge_hip.arena import device_rows
from forge_hip.library import EXPERT_TYPES, TYPE_SUFFIX
from gguf import GGMLQuantizationType, quants

from tests.support.host_cxx import build_host_library
from tests.support.quant_blocks import random_raw

HARNESS = """
#define FORGE_HOST 1
#include "quants.h"
#define DEQ_ROW(T, QB, BYTES) \\
    extern "C" void dequant_##T(const u8* row, int K, float* out) { \\
        for (int c = 0; c < K / 32; ++c) deq32_##T(row, c, out + 32 * c); }
FORGE_WEIGHT_TYPES(DEQ_ROW)
DEQ_ROW(mxfp4, QK, BYTES_MXFP4)
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_host_library(tmp_path_factory.mktemp("quants"), HARNESS)


@pytest.mark.parametrize("type_name", [*TYPE_SUFFIX, *EXPERT_TYPES])
def test_decoder_matches_gguf_reference(lib, type_name):
    rng = np.random.default_rng()
    qtype = GGMLQuantizationType[type_name]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    K = 2 * 256 + (32 if block == 32 else 0)  # odd number of 32-blocks where allowed
    rows = 3
    raw = random_raw(rng, type_name, rows, K)
    with np.errstate(all="ignore"):
        ref = quants.dequantize(raw, qtype).reshape(rows, K).astype(np.float32)
    out = np.full((rows, K), -12345.0, np.float32)  # poisoned
    fn = getattr(lib, "dequant_" + type_name.lower())
    dev_rows, at = device_rows(type_name, raw)  # as the arena uploads them (Q8_0 rearranged)
    for r in range(rows):
        row = np.ascontiguousarray(dev_rows[r])
        fn(ctypes.c_void_p(row.ctypes.data + at), K, ctypes.c_void_p(out[r].ctypes.data))
    assert np.isfinite(ref).all()
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-30)
