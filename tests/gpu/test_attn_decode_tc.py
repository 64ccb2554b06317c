"""attn_decode_tc.hip (decode attention on tensor cores, float16 or Q8_0 cache): each row's
query over its cached positions against a float64 reference, within what rounding Q and P to
float16 costs, across head sizes, groups of query heads, windows, sinks and splits (the last
block's merge)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import TCD_THREADS, attn_decode_tc_kernel

from forge.kv_cache import KvFormat
from tests.gpu.test_attention import BS, Case, check_twice_against_float64

F16 = KvFormat.F16

CASES = [
    # H, KVH, D, positions, window, splits, sinks
    (32, 8, 128, [0, 129, 3000], 0, 32, False),  # Llama-3-8B's heads, the first position too
    (32, 8, 128, [5000, 4097], 0, 2, False),  # long splits: a warp's ring wraps many times
    (32, 8, 128, [17000, 9000], 0, 64, True),  # more partials than a warp has lanes (64, 36)
    (4, 1, 128, [700, 3, 128], 0, 16, False),  # one KV head (Gemma-like group of 4)
    (4, 1, 128, [700, 40], 512, 16, False),  # a sliding window
    (8, 2, 64, [5, 300, 4100], 0, 8, True),  # gpt-oss-like: sinks through the merge
    (8, 2, 64, [40, 300], 128, 8, True),  # ... a window and sinks
    (4, 4, 128, [50, 1000], 0, 1, False),  # one head a KV head, one split: no merge
    (64, 4, 64, [2000], 0, 16, False),  # 16 query heads a KV head: a full tile
    (12, 4, 64, [333, 17], 0, 4, True),  # 3 a KV head, tiles cut short at the end
]


@pytest.mark.parametrize("fmt", [F16, KvFormat.Q8_0], ids=["f16", "q8_0"])
@pytest.mark.parametrize("H,KVH,D,positions,window,splits,sunk", CASES)
def test_tensor_core_decode_matches_float64(rt, lib, dev, H, KVH, D, positions, window, splits,
                                            sunk, fmt):  # fmt: skip
    """A Q8_0 cache's rows are turned into float16 tiles (each value rounded once), so its bound
    adds that rounding of K and V to the float16 cache's."""
    if rt.props.arch != "sm_90":
        pytest.skip("attn_decode_tc runs on NVIDIA sm_90 only")
    rng = np.random.default_rng(H * 131 + positions[0])
    c = Case(rng, H, KVH, D, D, positions, fmt)
    b = c.buffers(dev, splits)
    scale = D**-0.5
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if sunk else None
    name = attn_decode_tc_kernel(D, D, H, KVH, rt.props.arch, fmt)
    args = [dev.put(c.q), b["kc"], b["vc"], dev.put(c.bt), dev.put(c.btoff), dev.put(c.pos),
            b["part_o"], b["part_ml"], b["cnt"], b["out"], H, KVH, BS, scale, window,
            dev.put(sinks) if sunk else 0]  # fmt: skip
    launch = (lib.get(name), (KVH, len(positions), splits), (TCD_THREADS,), args)
    check_twice_against_float64(rt, dev, launch, c, b, scale, window, sinks,
                                2e-3 if fmt is F16 else 3e-3)  # fmt: skip
