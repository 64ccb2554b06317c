"""attn_decode_w<W>_g4 (4 query heads of a KV head per block, each cached K/V row read once for
them) against the per-head attn_decode_w<W> on the same inputs: the same output and the same
stored K/V to the bit (each head's arithmetic and the splits are the same), for groups that fill
the blocks (4, 8) and groups that leave a block short (2, 3, 7), every cache format, sinks,
windows and up to 64 splits; and against float64."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.kv import KV_FORMAT_IDS
from forge_hip.library import ATT_DECODE_GROUP, ATT_THREADS, attn_decode_blocks, attn_decode_kernel

from tests.gpu.test_attention import (
    BF16,
    BS,
    F16,
    F32,
    Q4,
    Q8,
    Case,
    _get_cache,
    attention_ref,
    norm_rope_ref,
)  # fmt: skip
from tests.support.gpu_helpers import rel_err

CASES = [
    # H, KVH, D, positions, window, splits, format, sinks
    (32, 8, 128, [0, 129, 3000], 0, 64, F16, False),  # Llama-3-8B's heads, deep: 64 splits
    (4, 1, 256, [700, 3, 128], 0, 16, F16, False),  # Gemma 3 270M
    (4, 1, 256, [700, 40], 512, 16, Q8, False),  # ... a sliding window, Q8_0 cache
    (32, 8, 128, [6000], 0, 64, F16, False),  # 47 splits: partials merged across warps
    (4, 1, 256, [2500], 0, 64, Q8, True),  # few blocks: 64 splits of 40, sinks in the merge
    (8, 2, 64, [5, 300, 1200], 1024, 8, Q4, True),  # gpt-oss-like: sinks, a window, 8 splits
    (64, 8, 64, [2000], 0, 32, Q8, True),  # gpt-oss-20b's heads: 8 a KV head, two blocks
    (4, 2, 64, [0, 129, 257], 0, 8, F16, False),  # 2 a KV head: half of a block idle
    (6, 2, 128, [200, 17], 0, 16, BF16, False),  # 3 a KV head
    (14, 2, 128, [300, 1000], 0, 16, F32, False),  # 7 a KV head: 4 + 3
    (28, 4, 128, [50], 0, 1, Q4, False),  # one split: no merge
    (32, 8, 128, [5000, 4097], 0, 2, Q8, False),  # long splits: many load rounds a warp
]


@pytest.mark.parametrize("H,KVH,D,positions,window,splits,fmt,sunk", CASES)
def test_grouped_decode_is_the_per_head_kernel(rt, lib, dev, H, KVH, D, positions, window,
                                               splits, fmt, sunk):  # fmt: skip
    grouped, nq = attn_decode_kernel(D, D, H, KVH)
    assert nq == ATT_DECODE_GROUP and grouped.endswith(f"_g{nq}")
    per_head = grouped.removesuffix(f"_g{nq}")
    rng = np.random.default_rng(H * 1009 + positions[0])  # (reproducible per case)
    c = Case(rng, H, KVH, D, D, positions, fmt)
    R, scale, eps, base, n_rot = len(positions), D**-0.5, 1e-6, 10000.0, D
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if sunk else None
    qnw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    knw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)
    common = [dev.put(c.q), dev.put(c.k), dev.put(c.v), dev.put(qnw), dev.put(knw),
              dev.put(c.pos), dev.put(c.slots), dev.put(c.bt), dev.put(c.btoff)]  # fmt: skip
    tail = [KVH, D, D, n_rot, 1, base, 1.0, 0, 1.0, eps, BS, scale, window, KV_FORMAT_IDS[fmt],
            dev.put(sinks) if sunk else 0]  # fmt: skip
    outs, caches = [], []
    blocks = attn_decode_blocks(H, KVH, nq)
    for kernel, grid_x, extra in ((per_head, H, []), (grouped, blocks, [H])):
        b = c.buffers(dev, splits)
        args = [*common, b["kc"], b["vc"], b["part_o"], b["part_ml"], b["cnt"], b["out"],
                *tail, *extra]  # fmt: skip
        for _ in range(2):  # twice: the split counters are back at zero after a launch
            rt.launch(lib.get(kernel), (grid_x, R, splits), (ATT_THREADS,), args)
        outs.append(dev.get(b["out"], (R, H, D)))
        caches.append((_get_cache(dev, b["kc"], c.kc, fmt), _get_cache(dev, b["vc"], c.vc, fmt)))
        assert not dev.get(b["cnt"], (R * H,), np.uint32).any()
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(caches[1][0], caches[0][0])
    np.testing.assert_array_equal(caches[1][1], caches[0][1])
    # against float64 over the cache as the grouped kernel stored it (a second launch at the same
    # position overwrote the row with the same values)
    kc, vc = caches[1]
    for r, p in enumerate(positions):
        qref = np.stack([norm_rope_ref(c.q[r, h], qnw, p, n_rot, 1, base, 1.0, eps)
                         for h in range(H)])  # fmt: skip
        kk, vv = c.cache_view(r, kc, vc)
        assert rel_err(outs[1][r], attention_ref(qref, kk, vv, scale, window, sinks)) < 5e-4, r
