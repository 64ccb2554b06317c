"""attn_decode_tc.hip (decode attention on tensor cores, float16 or Q8_0 cache): each row's
query over its cached positions against a float64 reference, within what rounding Q and P to
float16 costs, across head sizes, groups of query heads, windows, sinks and splits (the last
block's merge). Its fused form (Q/K norm and RoPE, the row's K/V stored by the kernel) against
qk_rope_store followed by the unfused form: the same cache bits and the same outputs, bit for
bit, and against float64."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.kv import KV_FORMAT_IDS
from forge_hip.library import TCD_THREADS, attn_decode_tc_kernel
from forge_hip.tuning import qk_rope_blocks

from forge.kv_cache import KvFormat
from tests.gpu.test_attention import (
    BS,
    Case,
    _get_cache,
    _yarn_freqs,
    attention_ref,
    check_twice_against_float64,
    norm_rope_ref,
)
from tests.support.gpu_helpers import rel_err

F16 = KvFormat.F16
UNFUSED = [0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0.0, 0.0]  # k null: Q rotated, K/V cached already

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
            dev.put(sinks) if sunk else 0, *UNFUSED]  # fmt: skip
    launch = (lib.get(name), (KVH, len(positions), splits), (TCD_THREADS,), args)
    check_twice_against_float64(rt, dev, launch, c, b, scale, window, sinks,
                                2e-3 if fmt is F16 else 3e-3)  # fmt: skip


FUSED_CASES = [
    # H, KVH, D, n_rot, neox, norms, positions, window, splits, oss
    (32, 8, 128, 128, 0, False, [0, 129, 3000], 0, 32, False),  # Llama-like, the first token
    (32, 4, 128, 128, 1, True, [5000, 17], 0, 16, False),  # Qwen3-like: Q/K norms, NeoX
    (16, 2, 128, 64, 1, True, [700, 300], 0, 4, False),  # partial rotation
    (64, 8, 64, 64, 1, False, [0, 129, 700], 0, 33, True),  # gpt-oss: YaRN table, sinks
    (64, 8, 64, 64, 1, False, [5, 300], 128, 8, True),  # ... a sliding window
    (32, 8, 128, 128, 0, False, [3000, 700], 1000, 8, False),  # a window over several splits
    (12, 4, 64, 64, 0, False, [333, 17], 0, 1, False),  # one split: the only block stores
]


@pytest.mark.parametrize("fmt", [F16, KvFormat.Q8_0], ids=["f16", "q8_0"])
@pytest.mark.parametrize("H,KVH,D,n_rot,neox,norms,positions,window,splits,oss", FUSED_CASES)
def test_fused_form_matches_qk_rope_store_then_tensor_cores(rt, lib, dev, H, KVH, D, n_rot, neox,
                                                            norms, positions, window, splits, oss,
                                                            fmt):  # fmt: skip
    """The fused launch leaves the cache as qk_rope_store does (bit for bit), touches no other
    slot, and gives the unfused path's outputs exactly (the same rotated queries, the same
    kernel arithmetic); against float64 within the float16 bound of the unfused cases."""
    if rt.props.arch != "sm_90":
        pytest.skip("attn_decode_tc runs on NVIDIA sm_90 only")
    rng = np.random.default_rng(H * 7 + positions[0])
    c = Case(rng, H, KVH, D, D, positions, fmt)
    R, scale, eps, base, fscale = len(positions), D**-0.5, 1e-6, 10000.0, 1.0 if oss else 0.5
    freqs, mscale = (_yarn_freqs(n_rot), 1.35) if oss else (None, 1.0)
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if oss else None
    qnw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norms else None
    knw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norms else None
    nw = [dev.put(qnw) if norms else 0, dev.put(knw) if norms else 0]
    pos, slots, bt, btoff = (dev.put(x) for x in (c.pos, c.slots, c.bt, c.btoff))
    rope = [n_rot, neox, base, fscale, dev.put(freqs) if oss else 0, mscale, eps]
    sk = dev.put(sinks) if oss else 0
    kernel = lib.get(attn_decode_tc_kernel(D, D, H, KVH, rt.props.arch, fmt))
    q, k, v = dev.put(c.q), dev.put(c.k), dev.put(c.v)

    def tc_args(b, qbuf, tail):
        return [qbuf, b["kc"], b["vc"], bt, btoff, pos, b["part_o"], b["part_ml"], b["cnt"],
                b["out"], H, KVH, BS, scale, window, sk, *tail]  # fmt: skip

    f = c.buffers(dev, splits)
    fused_args = tc_args(f, q, [k, v, *nw, slots, *rope])
    for _ in range(2):  # (the split counters are back at zero after a launch)
        rt.launch(kernel, (KVH, R, splits), (TCD_THREADS,), fused_args)
    fused = dev.get(f["out"], (R, H, D))
    kc_f, vc_f = _get_cache(dev, f["kc"], c.kc, fmt), _get_cache(dev, f["vc"], c.vc, fmt)
    np.testing.assert_array_equal(dev.get(q, (R, H, D)), c.q)  # q is read, not written
    u = c.buffers(dev, splits)
    q2, k2 = dev.put(c.q), dev.put(c.k)
    rt.launch(lib.get("qk_rope_store"), (qk_rope_blocks(H, KVH, 128, rt.props.warp_size), R),
              (128,), [q2, k2, v, *nw, pos, slots, u["kc"], u["vc"], H, KVH, D, D, *rope,
                       KV_FORMAT_IDS[fmt]])  # fmt: skip
    rt.launch(kernel, (KVH, R, splits), (TCD_THREADS,), tc_args(u, q2, UNFUSED))
    np.testing.assert_array_equal(kc_f, _get_cache(dev, u["kc"], c.kc, fmt))
    np.testing.assert_array_equal(vc_f, _get_cache(dev, u["vc"], c.vc, fmt))
    np.testing.assert_array_equal(fused, dev.get(u["out"], (R, H, D)))
    other = np.setdiff1d(np.arange(len(c.kc)), c.slots)
    np.testing.assert_array_equal(kc_f[other], c.kc[other])
    np.testing.assert_array_equal(vc_f[other], c.vc[other])
    assert not dev.get(f["cnt"], (R * H,), np.uint32).any()
    for r, p in enumerate(positions):
        qref = np.stack([norm_rope_ref(c.q[r, h], qnw, p, n_rot, neox, base, fscale, eps, freqs,
                                       mscale) for h in range(H)])  # fmt: skip
        kk, vv = c.cache_view(r, kc_f, vc_f)
        want = attention_ref(qref, kk, vv, scale, window, sinks)
        assert rel_err(fused[r], want) < 2e-3, r
