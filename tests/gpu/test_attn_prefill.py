"""Prefill attention (attn_prefill.hip) against a float64 reference: batches of several sequences
(chunked prefill: queries from start > 0 over cached keys, single-row pieces), paged caches with
shuffled block tables and NaN in every slot no sequence owns, GQA groups that do and do not
divide the 64-row tile, sliding windows, head sizes 64..256 (Dv may differ), float32 caches and
float16 caches (on tensor cores on NVIDIA, Q and P rounded to float16; or in float32 math),
bfloat16, Q8_0 and Q4_0 caches (kernels/kv_format.h's rows, dequantized as the tiles load),
gpt-oss's attention sinks on every path, and outputs poisoned with NaN (rows past the batch must
stay untouched)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.contract import constants
from forge_hip.kv import KV_FORMAT_IDS

from forge.kv_cache import KvFormat
from tests.support.gpu_helpers import rel_err
from tests.support.kv_rows import pack, unpack

AP_ROWS, AP_THREADS = constants()["AP_ROWS"], constants()["AP_THREADS"]  # tile rows, block size


def padded_d(d: int) -> int:
    return next(p for p in (64, 128, 256) if d <= p)


def reference(q, kc, vc, seqs, tables, bs, scale, window, sinks=None):
    """out [R, H, Dv] in float64: row at position p of a sequence attends to its positions
    lo .. p (lo = p + 1 - window when window > 0); sinks [H]: one more logit per head whose value
    is zero."""
    R, H, _ = q.shape
    kvh_n = kc.shape[1]
    group = H // kvh_n
    out = np.empty((R, H, vc.shape[2]))
    r = 0
    for (start, n), table in zip(seqs, tables):
        for p in range(start, start + n):
            lo = max(0, p + 1 - window) if window > 0 else 0
            keys = np.arange(lo, p + 1)
            slots = table[keys // bs] * bs + keys % bs
            for h in range(H):
                k = kc[slots, h // group].astype(np.float64)
                v = vc[slots, h // group].astype(np.float64)
                s = k @ q[r, h].astype(np.float64) * scale
                sink = None if sinks is None else float(sinks[h])
                m = s.max() if sink is None else max(s.max(), sink)
                w = np.exp(s - m)
                total = w.sum() + (0.0 if sink is None else np.exp(sink - m))
                out[r, h] = (w / total) @ v
            r += 1
    return out


CASES = [
    # H, Hkv, D, Dv, block size, window, cache format ("+tc": tensor cores), (start, rows)...
    (8, 2, 128, 128, 16, 0, "f16+tc", [(0, 77)]),  # llama-like, one prompt
    (4, 1, 256, 256, 16, 64, "f16+tc", [(0, 45), (130, 38)]),  # gemma-like, sliding, chunked
    (6, 6, 64, 64, 24, 0, "f16+tc", [(5, 1), (0, 70), (41, 1), (9, 3)]),  # MHA, decode rows
    (6, 2, 96, 64, 16, 0, "f16+tc", [(0, 50), (17, 20)]),  # group 3, padded D, Dv != D
    (16, 2, 64, 64, 32, 0, "f16+tc", [(300, 129)]),  # group 8, long cached prefix
    (4, 1, 256, 256, 32, 512, "f16+tc", [(0, 300), (700, 211)]),  # gemma, window past the rows
    (8, 2, 128, 128, 16, 100, "f32", [(200, 33), (0, 9)]),  # f32 cache, window
    (4, 2, 192, 128, 16, 0, "f32", [(0, 31), (60, 12)]),  # f32 cache, D 192 in the 256 kernel
    (6, 2, 96, 64, 16, 0, "f16", [(0, 50), (17, 20)]),  # f16 cache, float32 math
    (4, 1, 256, 256, 16, 64, "f16", [(0, 45), (130, 38)]),
    (8, 2, 128, 128, 16, 0, "q8_0", [(0, 77), (40, 9)]),  # quantized caches: llama-like
    (4, 1, 256, 256, 16, 64, "q8_0", [(0, 45), (130, 38)]),  # gemma-like, sliding, chunked
    (6, 2, 96, 64, 16, 0, "q4_0", [(0, 50), (17, 20)]),  # D 96: odd count of blocks, Dv != D
    (16, 2, 64, 64, 32, 0, "q4_0", [(300, 129)]),
    (8, 2, 128, 128, 16, 100, "bf16", [(200, 33), (0, 9)]),
    (8, 2, 128, 128, 16, 0, "q8_0+tc", [(0, 77), (40, 9)]),  # quantized tiles to float16
    (4, 1, 256, 256, 32, 512, "q8_0+tc", [(0, 300), (700, 211)]),
    (6, 2, 96, 64, 16, 0, "q4_0+tc", [(0, 50), (17, 20)]),
]
SINK_CASES = [  # gpt-oss's heads (64 query, 8 KV, D 64 there) on each path
    (8, 2, 64, 64, 16, 0, "f16+tc", [(0, 90), (30, 7)]),
    (8, 2, 64, 64, 16, 8, "f16+tc", [(0, 70)]),  # a sliding-window layer
    (8, 2, 64, 64, 16, 0, "f32", [(0, 40), (12, 5)]),
    (8, 2, 64, 64, 16, 0, "f16", [(0, 40)]),
    (8, 2, 64, 64, 16, 8, "q8_0", [(0, 70)]),
    (8, 2, 64, 64, 16, 0, "q4_0+tc", [(0, 90), (30, 7)]),
]


@pytest.mark.parametrize("sunk", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("H,KVH,D,Dv,bs,window,mode,seqs", CASES[:3] + SINK_CASES)
def test_prefill_attention_with_sinks(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, sunk):
    _check(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, sunk)


@pytest.mark.parametrize("H,KVH,D,Dv,bs,window,mode,seqs", CASES)
def test_prefill_attention(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs):
    _check(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, False)


SPLIT_CASES = [  # key ranges past AP_SPLIT_MIN (512), so that several splits take part
    (8, 2, 128, 128, 16, 0, "f16+tc", [(3000, 70)]),  # Llama-like at depth: 4 splits of 768
    (8, 2, 128, 128, 16, 0, "f16+tc", [(0, 40), (1500, 30), (700, 20)]),  # segments of 3 lengths
    (4, 1, 256, 256, 16, 1024, "f16+tc", [(2000, 100)]),  # windowed; 2 column blocks share a tile
    (8, 2, 64, 64, 16, 0, "f16+tc", [(1500, 60), (0, 9)]),  # gpt-oss-like
    (8, 2, 128, 128, 16, 0, "q8_0+tc", [(2500, 40)]),
    (8, 2, 128, 128, 16, 0, "f32", [(1200, 33)]),  # the SIMT path
    (6, 2, 96, 64, 16, 0, "q4_0", [(900, 50), (17, 20)]),
]


@pytest.mark.parametrize("splits", [2, 4, 16])
@pytest.mark.parametrize("H,KVH,D,Dv,bs,window,mode,seqs", SPLIT_CASES)
def test_prefill_attention_splits(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, splits):
    """Long key ranges cut over several blocks and merged by the last: the float64 reference's
    bounds, sinks included (gpt-oss-like case), the counters left zero."""
    _check(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, H == 8 and D == 64, splits)


@pytest.mark.parametrize("mode", ["f16+tc", "f32"])
def test_prefill_attention_one_part_keeps_bits(rt, lib, dev, mode):
    """Key ranges within one split's minimum: a grid of 16 splits writes what one split writes,
    bit for bit (the other splits' blocks return at once)."""
    args = (8, 2, 128, 128, 16, 0, mode, [(300, 150), (0, 90)])
    one = _check(rt, lib, dev, *args, False, 1, seed=5)
    many = _check(rt, lib, dev, *args, False, 16, seed=5)
    assert np.array_equal(one, many)


def _check(rt, lib, dev, H, KVH, D, Dv, bs, window, mode, seqs, sunk, splits=1, seed=None):
    """mode: the cache's format, "+tc" for tensor cores (NVIDIA; elsewhere the SIMT path).
    Returns the outputs."""
    rng = np.random.default_rng(seed)
    need = [(start + n - 1) // bs + 1 for start, n in seqs]
    n_blocks = sum(need) + 3
    perm = rng.permutation(n_blocks).astype(np.int32)  # scattered, disjoint blocks
    tables, at = [], 0
    for k in need:
        tables.append(perm[at : at + k])
        at += k
    n_slots = n_blocks * bs
    tc = mode.endswith("+tc")
    fmt = KvFormat(mode.removesuffix("+tc"))
    kraw = pack(fmt, rng.standard_normal((n_slots, KVH, D)))
    vraw = pack(fmt, rng.standard_normal((n_slots, KVH, Dv)))
    owned = np.concatenate([t[np.arange(s + n) // bs] * bs + np.arange(s + n) % bs
                            for (s, n), t in zip(seqs, tables)])  # fmt: skip
    unowned = np.setdiff1d(np.arange(n_slots), owned)
    kraw[unowned] = vraw[unowned] = 0xFF  # slots no sequence owns: NaN (values or scales)
    kc, vc = unpack(fmt, kraw, D), unpack(fmt, vraw, Dv)
    R = sum(n for _, n in seqs)
    q = (2.0 * rng.standard_normal((R, H, D))).astype(np.float32)
    pos = np.concatenate([np.arange(s, s + n) for s, n in seqs]).astype(np.int32)
    offs = np.cumsum([0] + need[:-1])
    btoff = np.concatenate([np.full(n, o) for (_, n), o in zip(seqs, offs)]).astype(np.int32)
    bt = np.concatenate(tables).astype(np.int32)
    scale = D**-0.5
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if sunk else None
    extra = 3  # rows past the batch: must keep their poison
    out = dev.poisoned((R + extra) * H * Dv * 4)
    dp = padded_d(D)
    grid = (-(-R * (H // KVH) // AP_ROWS), KVH, -(-Dv // min(dp, 128)) * splits)
    kv_mode = KV_FORMAT_IDS[fmt] | (constants()["AP_TENSOR_CORES"] if tc else 0)
    n_cnt = grid[0] * KVH
    cnt = dev.put(np.zeros(n_cnt, np.uint32))
    rt.launch(
        lib.get(f"attn_prefill_{'q' if fmt.block > 1 else ''}{dp}"),
        grid,
        (AP_THREADS,),
        [dev.put(q), dev.put(kraw), dev.put(vraw), dev.put(bt),
         dev.put(btoff), dev.put(pos), out, R, H, KVH, D, Dv, bs, scale, window, kv_mode,
         dev.put(sinks) if sunk else 0, dev.poisoned(R * H * splits * Dv * 4),
         dev.poisoned(R * H * splits * 8), cnt, splits],
    )  # fmt: skip
    got = dev.get(out, (R + extra, H, Dv))
    assert np.isnan(got[R:]).all()
    assert not dev.get(cnt, (n_cnt,), np.uint32).any()  # every tile's counter back to zero
    ref = reference(q, kc, vc, seqs, tables, bs, scale, window, sinks)
    err = rel_err(got[:R], ref)
    # tensor cores: Q and the probabilities may be rounded to float16
    assert err < (2e-3 if tc else 1e-5), err
    rows = np.linalg.norm(got[:R] - ref, axis=2) / np.linalg.norm(ref, axis=2)
    assert rows.max() < (1e-2 if tc else 1e-4), rows.max()
    return got[:R]


def test_prefill_attention_plan_routing():
    """The plan's attention part sends prefill rows to attn_prefill (padded D), keeping attn_rows
    for head sizes it does not take; nothing here needs a GPU."""
    from types import SimpleNamespace

    from forge_hip.attention_part import AttentionLaunches, Attentions

    launches = []

    class Lib:
        runtime = SimpleNamespace(props=SimpleNamespace(compute_units=132))

        def get(self, name):
            return name

    def plan_for(d, dv, f16, wtype="Q4_K"):
        spec = SimpleNamespace(head_dim=d, head_dim_v=dv, n_head=8, n_head_kv=2, attn_scale=0.1,
                               layers=[SimpleNamespace(sliding_window=None)])  # fmt: skip
        p = Attentions.__new__(Attentions)
        p.spec, p.lib = spec, Lib()
        p.products = SimpleNamespace(
            round_prefill=True,
            mats=[(SimpleNamespace(type=wtype), None)] * 3,
            launch=lambda k, grid, block, args: launches.append((k, grid, block, args)),
            tune=SimpleNamespace(ap_fill=2),
        )
        p.ws = SimpleNamespace(q=1, attn=2, part_o=6, part_ml=7, att_cnt=8)
        fmt = KvFormat.F16 if f16 else KvFormat.F32
        kv = SimpleNamespace(format=fmt, format_id=KV_FORMAT_IDS[fmt], block_size=16,
                             layer=lambda i: (10, 11))  # fmt: skip
        meta = SimpleNamespace(bt=3, btoff=4, pos=5)
        return p, kv, meta

    a = AttentionLaunches(0, 0, 0, 0, 0, 0, sinks=77)
    p, kv, meta = plan_for(128, 128, True)
    assert p.prefill(0, a, 100, meta, kv)
    k, grid, block, args = launches[-1]
    # 400 pairs a KV head: 4 x 2 blocks of 128, 16 splits (the most; 33 would fill 2 per CU of 132)
    assert k == "attn_prefill_128" and grid == (4, 2, 16) and block == (AP_THREADS,)
    assert args[:7] == [1, 10, 11, 3, 4, 5, 2] and args[7:] == [100, 8, 2, 128, 128, 16, 0.1,
                                                                0, 9, 77, 6, 7, 8, 16]  # fmt: skip
    p, kv, meta = plan_for(256, 256, True)
    assert p.prefill(0, a, 9, meta, kv) and launches[-1][0] == "attn_prefill_256"
    assert launches[-1][1] == (1, 2, 2 * 16)  # 2 column blocks per split
    n = len(launches)
    assert not plan_for(512, 512, True)[0].prefill(0, a, 9, meta, kv)
    assert not plan_for(100, 100, True)[0].prefill(0, a, 9, meta, kv)  # 100 % 8
    assert len(launches) == n

    p, kv, meta = plan_for(100, 100, False)  # float32 cache: any D up to 256
    assert p.prefill(0, a, 9, meta, kv) and launches[-1][0] == "attn_prefill_128"
    assert launches[-1][3][15] == 0  # kv_mode
    p, kv, meta = plan_for(128, 128, True)
    p.products.round_prefill = False  # float32 math over the float16 cache
    assert p.prefill(0, a, 9, meta, kv) and launches[-1][3][15] == 1
    p, kv, meta = plan_for(128, 128, True, "F32")  # F32 Q/K/V weights: float32 math as well
    assert p.prefill(0, a, 9, meta, kv) and launches[-1][3][15] == 1


def test_prefill_splits_fill_one_wave_within_the_partials():
    """prefill_splits: as many splits as keep the blocks within ap_fill per compute unit, at
    most AP_MAX_SPLITS, and rows x splits within the partials' pairs."""
    from forge_hip.attention_part import AP_MAX_SPLITS, prefill_blocks, prefill_splits
    from forge_hip.workspace import PART_ROWS

    blocks = prefill_blocks(256, 32, 8, 128, 128)  # a 256-token piece of Llama-3-8B heads
    assert blocks == (8, 8, 1)  # 1,024 pairs a KV head in tiles of 128
    assert prefill_splits(256, 64, 132, 2) == 4  # 4 x 64 blocks: 2 per SM of an H200
    assert prefill_splits(256, 64, 132, 4) == 8
    assert prefill_splits(512, 256, 132, 1) == 1
    assert prefill_splits(100, 2, 132, 4) == AP_MAX_SPLITS
    assert prefill_splits(512, 2, 132, 4) == PART_ROWS // 512
    assert prefill_blocks(9, 4, 1, 256, 256) == (1, 1, 2)
