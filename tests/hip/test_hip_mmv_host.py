"""kernels/mmv.h's int8 decode units against NumPy (float64), on the CPU.

The units are plain C++ under FORGE_HOST: here every unit of a row is summed in order, for random
GGML blocks and activations rounded like llama.cpp's (tests.gpu.test_kernels_gemv.round_acts),
so the bit fiddling (unaligned loads, nibble/high-bit assembly, scales, mins) is checked without a
GPU. The GPU kernels add the same units over lanes (tests/gpu/test_kernels_gemv.py).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from forge_hip.arena import device_rows
from forge_hip.library import ROUND_MODE, TYPE_IDS

from tests.support.host_cxx import build_host_library
from tests.support.mvq_cases import random_weights, round_acts

HARNESS = """
#define FORGE_HOST 1
#include "mmv.h"
// unit id -> (units per row, call), in TYPE_IDS order; -1: not a unit type
#define CALL(T, U) for (int u = 0; u < (U); ++u) unit_##T<8>(row, u, x, R, acc); return 0;
extern "C" int mmv_row(int type, const u8* row, int K, const i8* q, const float* ds, int R,
                       float* acc) {
    XQ x;
    x.q = q;
    x.ds = (const F2*)ds;
    x.K = K;
    for (int r = 0; r < 8; ++r) acc[r] = 0.0f;
    switch (type) {
        case 3: CALL(q4_0, K / 16)
        case 4: CALL(q4_1, K / 16)
        case 5: CALL(q5_0, K / 16)
        case 6: CALL(q5_1, K / 16)
        case 7: if (((u64)row & 7) == 0) { CALL(q8_0, K / 16) } CALL(q8_0u, K / 16)
        case 8: CALL(q2_k, K / 32)
        case 9: CALL(q3_k, K / 32)
        case 10: CALL(q4_k, K / 64)
        case 11: CALL(q5_k, K / 32)
        case 12: if (((u64)row & 7) == 0) { CALL(q6_k, K / 32) } CALL(q6_ku, K / 32)
        case 13: CALL(mxfp4, K / 16)
    }
    return -1;
}
extern "C" unsigned ld4(const u8* p) { return ld4_a2(p); }
extern "C" void ld8(const u8* p, unsigned* out) { V2 v = ld8_a2(p); out[0] = v.x; out[1] = v.y; }
"""

QUANT_TYPES = [t for t in TYPE_IDS if t not in ("F32", "F16", "BF16")]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return build_host_library(tmp_path_factory.mktemp("mmv"), HARNESS)


def _aligned(a: np.ndarray) -> np.ndarray:
    """A 64-byte aligned copy (the units load 16-byte vectors)."""
    a = np.ascontiguousarray(a)
    buf = np.empty(a.nbytes + 64, np.uint8)
    at = -buf.ctypes.data % 64
    out = buf[at : at + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def test_unaligned_loads(lib):
    data = _aligned(np.arange(64, dtype=np.uint8))
    lib.ld4.restype = ctypes.c_uint
    out = np.zeros(2, np.uint32)
    for off in range(0, 40, 2):
        got4 = lib.ld4(ctypes.c_void_p(data.ctypes.data + off))
        assert got4 == int.from_bytes(bytes(data[off : off + 4]), "little")
        lib.ld8(ctypes.c_void_p(data.ctypes.data + off), _ptr(out))
        assert out.tobytes() == bytes(data[off : off + 8])


@pytest.mark.parametrize(
    "type_name,K",
    [(t, 256 * 3 if ROUND_MODE[t] == 2 else 32 * 13) for t in QUANT_TYPES]
    + [("Q8_0", 128 * 3), ("Q6_K", 1024 * 2)],
)
def test_units_match_numpy(lib, type_name, K):
    """Q8_0 and Q6_K twice: quants 2-aligned (13 and 3 blocks per row) and 8-aligned (12 and
    8), as the arena puts them (forge_hip.arena.device_rows)."""
    rng = np.random.default_rng()
    N, R = 5, 3
    raw, W = random_weights(rng, type_name, N, K)
    x = rng.standard_normal((R, K)).astype(np.float32)
    x[1] *= 100.0  # rows of different scales
    q, ds, xr = round_acts(x, ROUND_MODE[type_name])
    q, ds = _aligned(q), _aligned(ds)
    acc = np.zeros(8, np.float32)
    out = np.empty((R, N))
    rows, at = device_rows(type_name, raw)
    for n in range(N):
        row = _aligned(rows[n])
        ptr = ctypes.c_void_p(row.ctypes.data + at)
        rc = lib.mmv_row(TYPE_IDS[type_name], ptr, K, _ptr(q), _ptr(ds), R, _ptr(acc))
        assert rc == 0
        out[:, n] = acc[:R]
    ref = xr.astype(np.float64) @ W.T
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err < 2e-6, err
