"""Attention over a paged KV cache (attention.hip) against float64 NumPy: attn_rows over cached
positions, and the fused decode kernel attn_decode (Q/K RMSNorm + RoPE, the K/V store, split
attention with its in-kernel merge) against the reference and against the unfused path
(qk_rope_store, then attn_rows) on the same inputs. GQA, sliding windows, head sizes 64..512,
D != Dv, f16, f32, bf16, Q8_0 and Q4_0 caches (kernels/kv_format.h's rows; the quantized ones
built and read back with the gguf package's quantizers), one split (no merge) and many (merged by
the last block), gpt-oss's attention sinks and RoPE from a frequency table with a magnitude
(YaRN)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.kv import KV_FORMAT_IDS, row_bytes
from forge_hip.library import ATT_THREADS, attn_decode_width
from forge_hip.tuning import qk_rope_blocks

from forge.kv_cache import KvFormat
from tests.support.gpu_helpers import rel_err
from tests.support.kv_rows import pack, unpack

BS = 16  # positions per cache block


def attention_ref(q, k, v, scale, window, sinks=None):
    """q [H, D]; k [n_kv, KVH, D], v [n_kv, KVH, Dv] (as cached) -> [H, Dv] in float64; sinks
    [H]: one more softmax logit per head whose value is zero."""
    H = q.shape[0]
    n_kv, KVH, _ = k.shape
    lo = max(0, n_kv - window) if window > 0 else 0
    out = np.empty((H, v.shape[2]))
    for h in range(H):
        kh = h // (H // KVH)
        s = (k[lo:, kh].astype(np.float64) @ q[h].astype(np.float64)) * scale
        m = s.max() if sinks is None else max(s.max(), float(sinks[h]))
        p = np.exp(s - m)
        total = p.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - m))
        out[h] = (p / total) @ v[lo:, kh].astype(np.float64)
    return out


def norm_rope_ref(x, w, pos, n_rot, neox, base, freq_scale, eps, freqs=None, mscale=1.0):
    """One head [D]: RMSNorm (when w is given) and RoPE at `pos`, float64 (`freqs`: each pair's
    frequency instead of base^(-2i/n_rot); cos and sin times `mscale`)."""
    x = x.astype(np.float64)
    if w is not None:
        x = x / np.sqrt(np.mean(x * x) + eps) * w
    out, half = x.copy(), n_rot // 2
    i = np.arange(half)
    f = base ** (-2.0 * i / n_rot) if freqs is None else freqs.astype(np.float64)
    theta = pos * freq_scale * f
    c, s = mscale * np.cos(theta), mscale * np.sin(theta)
    a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
    out[a] = x[a] * c - x[b] * s
    out[b] = x[a] * s + x[b] * c
    return out


class Case:
    """R rows, each the newest token of its own sequence, over a scattered paged cache."""

    def __init__(self, rng, H, KVH, D, Dv, positions, fmt):
        self.H, self.KVH, self.D, self.Dv, self.fmt = H, KVH, D, Dv, fmt
        self.pos = np.array(positions, np.int32)
        R = len(positions)
        need = [p // BS + 1 for p in positions]
        n_blocks = sum(need) + 3
        perm = rng.permutation(n_blocks).astype(np.int32)
        self.tables, at = [], 0
        for n in need:
            self.tables.append(perm[at : at + n])
            at += n
        self.bt = np.concatenate(self.tables)
        self.btoff = np.cumsum([0] + need[:-1]).astype(np.int32)
        self.slots = np.array([t[p // BS] * BS + p % BS for t, p in zip(self.tables, positions)],
                              np.int32)  # fmt: skip
        n_slots = n_blocks * BS
        self.kraw = pack(fmt, rng.standard_normal((n_slots, KVH, D)))  # the cache's rows
        self.vraw = pack(fmt, rng.standard_normal((n_slots, KVH, Dv)))
        self.kc, self.vc = unpack(fmt, self.kraw, D), unpack(fmt, self.vraw, Dv)  # their values
        self.q = rng.standard_normal((R, H, D)).astype(np.float32)
        self.k = rng.standard_normal((R, KVH, D)).astype(np.float32)
        self.v = rng.standard_normal((R, KVH, Dv)).astype(np.float32)

    def cache_view(self, r, kc, vc):
        """The cached K, V of row r's sequence, positions 0 .. pos[r]."""
        p = np.arange(self.pos[r] + 1)
        slots = self.tables[r][p // BS] * BS + p % BS
        return kc[slots], vc[slots]

    def buffers(self, dev, splits):
        R, H = len(self.pos), self.H
        return dict(
            kc=dev.put(self.kraw),
            vc=dev.put(self.vraw),
            part_o=dev.poisoned(R * H * splits * self.Dv * 4),
            part_ml=dev.poisoned(R * H * splits * 2 * 4),
            cnt=dev.put(np.zeros(R * H, np.uint32)),
            out=dev.poisoned(R * H * self.Dv * 4),
        )


def _get_cache(dev, buf, like, fmt):
    """The values of a cache shaped as `like` [slots, heads, n], read from the device."""
    n = like.shape[-1]
    return unpack(fmt, dev.get(buf, (*like.shape[:-1], row_bytes(fmt, n)), np.uint8), n)


F16, F32, BF16, Q8, Q4 = KvFormat.F16, KvFormat.F32, KvFormat.BF16, KvFormat.Q8_0, KvFormat.Q4_0


ROWS_CASES = [
    # H, KVH, D, Dv, positions, window, splits, cache format
    (4, 1, 256, 256, [999, 5, 300], 0, 16, F16),  # Gemma 3 270M's heads, GQA 4:1
    (4, 1, 256, 256, [999, 700], 512, 16, F16),  # sliding window
    (4, 4, 64, 64, [36, 0], 0, 8, F16),  # one split: no merge
    (8, 2, 128, 96, [130, 129, 128, 127], 0, 3, F16),  # D != Dv, split boundaries
    (2, 1, 512, 512, [600], 0, 4, F32),  # the largest head, f32 cache
    (6, 3, 80, 80, [200, 17], 0, 16, F16),  # a head size no power of two
    (4, 1, 256, 256, [1000], 0, 16, F16),  # few (head, row) blocks: 16 short splits merged
    (8, 2, 128, 128, [700, 5, 300], 0, 16, Q8),  # quantized caches: Llama-like heads
    (4, 1, 256, 256, [999, 700], 512, 16, Q8),
    (8, 2, 64, 64, [130, 0], 0, 8, Q4),
    (6, 3, 96, 96, [200, 17], 0, 16, Q4),  # 3 blocks a head: rows padded to 4 bytes
    (2, 1, 512, 512, [600], 0, 4, Q8),  # the widest layout (two pieces a lane on 32-lane warps)
    (8, 2, 128, 96, [130, 129], 0, 3, BF16),
]


@pytest.mark.parametrize("sunk", [False, True], ids=["", "sinks"])
@pytest.mark.parametrize("H,KVH,D,Dv,positions,window,splits,fmt", ROWS_CASES)
def test_attn_rows(rt, lib, dev, H, KVH, D, Dv, positions, window, splits, fmt, sunk):
    rng = np.random.default_rng()
    c = Case(rng, H, KVH, D, Dv, positions, fmt)
    b = c.buffers(dev, splits)
    scale = D**-0.5
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if sunk else None
    args = [dev.put(c.q), b["kc"], b["vc"], dev.put(c.bt), dev.put(c.btoff), dev.put(c.pos),
            b["part_o"], b["part_ml"], b["cnt"], b["out"], KVH, D, Dv, BS, scale, window,
            KV_FORMAT_IDS[fmt], dev.put(sinks) if sunk else 0]  # fmt: skip
    launch = (lib.get("attn_rows"), (H, len(positions), splits), (ATT_THREADS,), args)
    check_twice_against_float64(rt, dev, launch, c, b, scale, window, sinks, 2e-6)


def check_twice_against_float64(rt, dev, launch, c: Case, b: dict, scale: float, window: int,
                                sinks, bound: float) -> None:  # fmt: skip
    """Run an attention launch (kernel, grid, block, args) over case `c` and its buffers `b`
    twice (the split counters are back at zero after a launch): each row's output within
    `bound` (rel_err) of the float64 attention over its cached positions; counters zero."""
    R, H = len(c.pos), c.H
    for _ in range(2):
        rt.launch(*launch)
        got = dev.get(b["out"], (R, H, c.Dv))
        for r in range(R):
            k, v = c.cache_view(r, c.kc, c.vc)
            want = attention_ref(c.q[r], k, v, scale, window, sinks)
            assert rel_err(got[r], want) < bound, r
    assert not dev.get(b["cnt"], (R * H,), np.uint32).any()


DECODE_CASES = [
    # H, KVH, D, Dv, n_rot, neox, norms, positions, window, splits, cache format, oss
    (4, 1, 256, 256, 256, 1, True, [700, 3, 128], 0, 16, F16, False),  # Gemma 3: q/k norm, NeoX
    (4, 1, 256, 256, 256, 1, True, [700, 40], 512, 16, F16, False),  # ... a sliding window
    (8, 2, 64, 64, 64, 0, False, [0, 129, 257], 0, 8, F16, False),  # Llama-like, first token
    (4, 2, 128, 128, 64, 1, True, [300], 0, 4, F32, False),  # partial rotation, f32 cache
    (4, 4, 96, 64, 32, 0, False, [50, 51], 0, 1, F16, False),  # D != Dv, one split
    # gpt-oss: sinks, a YaRN frequency table and magnitude; full and windowed layers
    (8, 2, 64, 64, 64, 1, False, [0, 129, 700], 0, 8, F16, True),
    (8, 2, 64, 64, 64, 1, False, [5, 300], 128, 8, F16, True),
    (8, 2, 64, 64, 64, 1, False, [40, 41], 0, 1, F32, True),  # one split, f32 cache
    # quantized and bfloat16 caches: the store rounds as gguf's quantizers do
    (8, 2, 128, 128, 128, 0, False, [0, 129, 700], 0, 16, Q8, False),
    (4, 1, 256, 256, 256, 1, True, [700, 40], 512, 16, Q8, False),
    (8, 2, 64, 64, 64, 1, False, [5, 300], 128, 8, Q4, True),
    (4, 4, 96, 64, 32, 0, False, [50, 51], 0, 1, Q4, False),
    (2, 1, 512, 512, 128, 1, True, [300], 0, 4, Q8, False),
    (8, 2, 128, 128, 128, 0, False, [40, 300], 0, 8, BF16, False),
    # few splits of long ranges: many load rounds a warp (past the L2 prefetch's lead), the
    # last round of a warp short
    (8, 2, 128, 128, 128, 0, False, [4100, 2999], 0, 2, F16, False),
    (8, 2, 128, 128, 128, 0, False, [4100], 0, 2, Q8, False),
    (8, 2, 64, 64, 64, 1, False, [3001], 0, 1, Q4, True),
    (4, 1, 256, 256, 256, 1, True, [2500, 1500], 1800, 1, BF16, False),
]

# How far a stored value may be from the float64 one: float16/32 relative; the quantized formats
# by their step (Q8_0: half of max|x| / 127, one more code near a rounding boundary; Q4_0: up to
# one step of max|x| / 8 at the clipped end); bfloat16 by its 8-bit mantissa.
STORE_TOL = {F16: 2e-3, F32: 2e-3, BF16: 2**-8, Q8: 1.1 / 127, Q4: 1.1 / 8}


def _yarn_freqs(n_rot: int) -> np.ndarray:
    """gpt-oss's RoPE frequencies (base 150000, YaRN factor 32 over 4096 positions)."""
    from forge.models.rope import rope_frequencies
    from forge.models.spec import RopeScaling

    yarn = RopeScaling(kind="yarn", factor=32.0, original_context=4096, beta_fast=32.0,
                       beta_slow=1.0, ext_factor=1.0, mscale=1.35)  # fmt: skip
    return rope_frequencies(n_rot, 150000.0, yarn).astype(np.float32)


@pytest.mark.parametrize("width", [False, True], ids=["any_width", "by_width"])
@pytest.mark.parametrize("H,KVH,D,Dv,n_rot,neox,norms,positions,window,splits,fmt,oss",
                         DECODE_CASES)  # fmt: skip
def test_attn_decode_fused(rt, lib, dev, H, KVH, D, Dv, n_rot, neox, norms, positions, window,
                           splits, fmt, oss, width):  # fmt: skip
    """attn_decode_w512 (every head width), or the attn_decode_w<W> the plan takes for these
    heads."""
    kernel = f"attn_decode_w{attn_decode_width(D, Dv) if width else 512}"
    rng = np.random.default_rng()
    c = Case(rng, H, KVH, D, Dv, positions, fmt)
    R, scale, eps, base, fscale = len(positions), D**-0.5, 1e-6, 10000.0, 1.0 if oss else 0.5
    freqs, mscale = (_yarn_freqs(n_rot), 1.35) if oss else (None, 1.0)
    sinks = (3.0 * rng.standard_normal(H)).astype(np.float32) if oss else None
    sk = dev.put(sinks) if oss else 0
    qnw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norms else None
    knw = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32) if norms else None
    nw = [dev.put(qnw) if norms else 0, dev.put(knw) if norms else 0]
    meta = [dev.put(c.pos), dev.put(c.slots), dev.put(c.bt), dev.put(c.btoff)]
    q, k, v = dev.put(c.q), dev.put(c.k), dev.put(c.v)
    rope = [n_rot, neox, base, fscale, dev.put(freqs) if oss else 0, mscale, eps]
    att = [BS, scale, window, KV_FORMAT_IDS[fmt]]
    # fused
    f = c.buffers(dev, splits)
    rt.launch(lib.get(kernel), (H, R, splits), (ATT_THREADS,),
              [q, k, v, *nw, *meta, f["kc"], f["vc"], f["part_o"], f["part_ml"], f["cnt"],
               f["out"], KVH, D, Dv, *rope, *att, sk])  # fmt: skip
    fused = dev.get(f["out"], (R, H, Dv))
    kc_f, vc_f = _get_cache(dev, f["kc"], c.kc, fmt), _get_cache(dev, f["vc"], c.vc, fmt)
    # unfused: qk_rope_store (in place on copies of q, k), then attn_rows
    u = c.buffers(dev, splits)
    q2, k2 = dev.put(c.q), dev.put(c.k)
    blocks = qk_rope_blocks(H, KVH, 128, rt.props.warp_size)
    rt.launch(lib.get("qk_rope_store"), (blocks, R), (128,),
              [q2, k2, v, *nw, meta[0], meta[1], u["kc"], u["vc"], H, KVH, D, Dv, *rope,
               KV_FORMAT_IDS[fmt]])  # fmt: skip
    rt.launch(lib.get("attn_rows"), (H, R, splits), (ATT_THREADS,),
              [q2, u["kc"], u["vc"], meta[2], meta[3], meta[0], u["part_o"], u["part_ml"],
               u["cnt"], u["out"], KVH, D, Dv, *att, sk])  # fmt: skip
    unfused = dev.get(u["out"], (R, H, Dv))
    kc_u, vc_u = _get_cache(dev, u["kc"], c.kc, fmt), _get_cache(dev, u["vc"], c.vc, fmt)
    # both paths store the same K/V and agree to float rounding
    np.testing.assert_array_equal(kc_f, kc_u)
    np.testing.assert_array_equal(vc_f, vc_u)
    assert rel_err(fused, unfused) < 1e-5  # the own position's score: another summation order
    # the store touched only the rows' own slots
    other = np.setdiff1d(np.arange(len(c.kc)), c.slots)
    np.testing.assert_array_equal(kc_f[other], c.kc[other])
    np.testing.assert_array_equal(vc_f[other], c.vc[other])
    # against float64: the stored K (within the format's rounding) and V (exactly as the gguf
    # package stores it), then the attention over the cache as stored
    tol = STORE_TOL[fmt]
    for r, p in enumerate(positions):
        for j in range(KVH):
            kref = norm_rope_ref(c.k[r, j], knw, p, n_rot, neox, base, fscale, eps, freqs,
                                 mscale)  # fmt: skip
            if fmt in (F16, F32):
                np.testing.assert_allclose(kc_f[c.slots[r], j], kref, rtol=tol, atol=tol)
            else:
                bound = tol * np.abs(kref).max() + 1e-6
                assert np.abs(kc_f[c.slots[r], j] - kref).max() <= bound, (r, j)
            np.testing.assert_array_equal(
                vc_f[c.slots[r], j], unpack(fmt, pack(fmt, c.v[r, j]), Dv)
            )
        qref = np.stack([norm_rope_ref(c.q[r, h], qnw, p, n_rot, neox, base, fscale, eps, freqs,
                                       mscale) for h in range(H)])  # fmt: skip
        kk, vv = c.cache_view(r, kc_f, vc_f)
        want = attention_ref(qref, kk, vv, scale, window, sinks)
        assert rel_err(fused[r], want) < 5e-4, r
