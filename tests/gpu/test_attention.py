"""Decode attention over a paged f16 KV cache (GQA, sliding window, split over the KV length)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import ATT_THREADS

from tests.gpu.helpers import rel_err


def attention_ref(q, k, v, scale, window):
    """q [H, D]; k, v [n_kv, KVH, D] (already f16-rounded) -> [H, D] in float64."""
    H, D = q.shape
    n_kv, KVH, _ = k.shape
    lo = max(0, n_kv - window) if window > 0 else 0
    out = np.empty((H, D))
    for h in range(H):
        kh = h // (H // KVH)
        s = (k[lo:, kh].astype(np.float64) @ q[h].astype(np.float64)) * scale
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[lo:, kh].astype(np.float64)
    return out


@pytest.mark.parametrize(
    "H,KVH,D,n_kv,window,splits",
    [
        (8, 2, 256, 1000, 0, 4),  # Gemma 3 270M's head size, GQA 4:1
        (8, 2, 256, 1000, 512, 4),  # sliding window
        (4, 4, 64, 37, 0, 8),  # more splits than some splits have positions
        (6, 1, 128, 1, 0, 2),  # first token
    ],
)
def test_decode_attention(rt, lib, dev, H, KVH, D, n_kv, window, splits):
    rng = np.random.default_rng()
    bs = 16
    n_blocks = (n_kv + bs - 1) // bs
    table = rng.permutation(n_blocks + 3)[:n_blocks].astype(np.int32)  # scattered blocks
    n_slots = (n_blocks + 3) * bs
    kc = rng.standard_normal((n_slots, KVH, D)).astype(np.float16)
    vc = rng.standard_normal((n_slots, KVH, D)).astype(np.float16)
    q = rng.standard_normal((H, D)).astype(np.float32)
    pos = np.arange(n_kv)
    slots = table[pos // bs] * bs + pos % bs
    scale = D**-0.5
    part_o = dev.poisoned(H * splits * D * 4)
    part_ml = dev.poisoned(H * splits * 2 * 4)
    out = dev.poisoned(H * D * 4)
    kb, vb = dev.put(kc.view(np.uint16)), dev.put(vc.view(np.uint16))
    rt.launch(
        lib.get("attn_decode_partial"),
        (H, splits),
        (ATT_THREADS,),
        [
            dev.put(q),
            kb,
            vb,
            dev.put(table),
            dev.put(np.array([n_kv], np.int32)),
            part_o,
            part_ml,
            KVH,
            D,
            bs,
            scale,
            window,
        ],
    )
    rt.launch(lib.get("attn_decode_combine"), (H,), (128,), [part_o, part_ml, out, D, splits])
    ref = attention_ref(q, kc[slots], vc[slots], scale, window)
    assert rel_err(dev.get(out, (H, D)), ref) < 1e-5


def test_kv_store_rounds_to_f16(rt, lib, dev):
    rng = np.random.default_rng()
    T, row, n_slots = 5, 2 * 64 + 3, 40
    k = rng.standard_normal((T, row)).astype(np.float32)
    v = rng.standard_normal((T, row)).astype(np.float32)
    slots = rng.choice(n_slots, size=T, replace=False).astype(np.int32)
    kc, vc = dev.poisoned(n_slots * row * 2), dev.poisoned(n_slots * row * 2)
    rt.launch(
        lib.get("kv_store"), (T,), (64,), [dev.put(k), dev.put(v), kc, vc, dev.put(slots), row]
    )
    got_k = dev.get(kc, (n_slots, row), np.uint16).view(np.float16)
    got_v = dev.get(vc, (n_slots, row), np.uint16).view(np.float16)
    np.testing.assert_array_equal(got_k[slots], k.astype(np.float16))
    np.testing.assert_array_equal(got_v[slots], v.astype(np.float16))
    untouched = np.setdiff1d(np.arange(n_slots), slots)
    assert (got_k[untouched].view(np.uint16) == 0xFFFF).all()
