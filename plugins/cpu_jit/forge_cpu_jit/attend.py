"""Attention compiled with numba: each (query row, head) on its own, in a fixed order.

A query's scores are 16-lane dot products over the head (`simd.hsum` adds the lanes in a fixed
order), its softmax runs over exactly the keys it sees (causal and window limits as ranges, not
masks), and its output sums the values key by key in position order. Nothing depends on which
other rows or sequences share the call, how many keys were gathered for them, or how a prompt
was chunked: a row's result is bit-identical in every batch (NumPy's batched matrix products
choose their reduction order by shape, so they are not).

Rows of one sequence are taken in tiles of `ROW_TILE`: each key and value row is read once per
tile and KV head, for every query row and head of the tile that sees it, while each row's own
arithmetic stays what it would be alone. `entry_attention` and `entry_decode_attention` run row
ranges as the matmul kernels' thread pool runs products (`pool.py`, args described by
`ATTENTION_ARGS` and `DECODE_ARGS`); attention_op.py packs them from cpu_simd's op arguments.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from forge_cpu_jit import jit as _jit  # noqa: F401  (installs the kernel cache locator first)
from forge_cpu_jit.simd import (
    as_f32_ptr,
    as_i64_ptr,
    bits_to_f32,
    fma,
    hsum,
    load_f32x16,
    splat_f32,
    store_f32x16,
    zeros_f32x16,
)

_NB = {"nogil": True, "cache": True, "error_model": "numpy"}


@njit(**_NB)
def _dot(a, b):  # noqa: ANN001, ANN202
    """sum a * b of two float32 vectors of one length (16 lanes, then the tail in order)."""
    n = a.shape[0]
    nc = n // 16
    acc = zeros_f32x16()
    for c in range(nc):
        acc = fma(load_f32x16(a, c * 16), load_f32x16(b, c * 16), acc)
    s = hsum(acc)
    for d in range(nc * 16, n):
        s += a[d] * b[d]
    return s


ROW_TILE = 4  # query rows of one sequence that share each pass over the keys


@njit(**_NB)
def _softmax_rows(p, n, sink, use_sink):  # noqa: ANN001, ANN202
    """p[:n] = softmax of p[:n] (the sink logit, when used, joins the denominator): as ggml's
    CPU soft_max, the sum in double in order, then each weight times its float32 reciprocal."""
    m = np.float32(-np.inf)
    for i in range(n):
        if p[i] > m:
            m = p[i]
    if use_sink and sink > m:
        m = sink
    total = 0.0
    for i in range(n):
        e = np.exp(p[i] - m)
        p[i] = e
        total += np.float64(e)
    if use_sink:
        total += np.float64(np.exp(sink - m))
    inv = np.float32(1.0 / total)
    for i in range(n):
        p[i] = p[i] * inv


@njit(**_NB)
def _add_scaled(acc, w, vt):  # noqa: ANN001, ANN202
    """acc += w * vt (float32 vectors of one length)."""
    n = acc.shape[0]
    nc = n // 16
    ws = splat_f32(w)
    for c in range(nc):
        store_f32x16(acc, c * 16, fma(ws, load_f32x16(vt, c * 16), load_f32x16(acc, c * 16)))
    for d in range(nc * 16, n):
        acc[d] += w * vt[d]


@njit(**_NB)
def _attend_tile(q, k, v, kvh, group, t0, t1, scale, sinks, use_sinks, p, acc, out):  # noqa: ANN001, ANN202
    """For each row r of the tile q [R, H, D] and each query head h of kv head kvh: out[r, h] =
    the softmax over keys t0[r]..t1[r]-1 (and h's sink) of scale * q[r, h].k_t, applied to v_t.
    p [R, group, >= keys] and acc [R, group, Dv]: scratch."""
    n_rows = q.shape[0]
    h0 = kvh * group
    lo, hi = t0.min(), t1.max()
    for t in range(lo, hi):
        kt = k[t, kvh]
        for r in range(n_rows):
            if t0[r] <= t < t1[r]:
                for j in range(group):
                    p[r, j, t - t0[r]] = _dot(q[r, h0 + j], kt) * scale
    for r in range(n_rows):
        for j in range(group):
            _softmax_rows(p[r, j], t1[r] - t0[r], sinks[h0 + j], use_sinks)
            acc[r, j, :] = 0.0
    for t in range(lo, hi):
        vt = v[t, kvh]
        for r in range(n_rows):
            if t0[r] <= t < t1[r]:
                for j in range(group):
                    _add_scaled(acc[r, j], p[r, j, t - t0[r]], vt)
    for r in range(n_rows):
        for j in range(group):
            out[r, h0 + j, :] = acc[r, j]


@njit(**_NB)
def attention_rows(q, k, v, q_pos, scale, window, sinks, use_sinks, row0, row1, out):  # noqa: ANN001, ANN201
    """One sequence, causal (window > 0: sliding window): rows row0..row1-1 of q [n, H, D] at
    positions q_pos (the index of their keys in k), k [T, Hkv, D], v [T, Hkv, Dv] -> out
    [n, H, Dv]."""
    n_head, n_kv = q.shape[1], k.shape[1]
    t_all = k.shape[0]
    group = n_head // n_kv
    p = np.empty((ROW_TILE, group, max(t_all, 1)), np.float32)
    acc = np.empty((ROW_TILE, group, v.shape[2]), np.float32)
    t0 = np.empty(ROW_TILE, np.int64)
    t1 = np.empty(ROW_TILE, np.int64)
    for r0 in range(row0, row1, ROW_TILE):
        r1 = min(r0 + ROW_TILE, row1)
        for r in range(r0, r1):
            t1[r - r0] = min(q_pos[r] + 1, t_all)
            t0[r - r0] = max(0, q_pos[r] - window + 1) if window > 0 else 0
        for g in range(n_kv):
            _attend_tile(q[r0:r1], k, v, g, group, t0[: r1 - r0], t1[: r1 - r0], scale, sinks,
                         use_sinks, p, acc, out[r0:r1])  # fmt: skip


@njit(**_NB)
def decode_rows(q, k, v, n_keys, scale, sinks, use_sinks, row0, row1, out):  # noqa: ANN001, ANN201
    """One query row per sequence: sequences row0..row1-1 of q [S, H, D] over their first
    n_keys[s] keys of k [S, T, Hkv, D], v [S, T, Hkv, Dv] -> out [S, H, Dv]."""
    n_head, n_kv = q.shape[1], k.shape[2]
    group = n_head // n_kv
    p = np.empty((1, group, max(k.shape[1], 1)), np.float32)
    acc = np.empty((1, group, v.shape[3]), np.float32)
    t0 = np.zeros(1, np.int64)
    t1 = np.empty(1, np.int64)
    for s in range(row0, row1):
        t1[0] = n_keys[s]
        for g in range(n_kv):
            _attend_tile(q[s : s + 1], k[s], v[s], g, group, t0, t1, scale, sinks, use_sinks, p,
                         acc, out[s : s + 1])  # fmt: skip


# What each entry's int64 args hold (addresses, then sizes; scale as its float32 bits):
ATTENTION_ARGS = "q, n, H, D, k, T, Hkv, v, Dv, q_pos, scale, window, sinks, use_sinks, out"
DECODE_ARGS = "q, S, H, D, k, T, Hkv, v, Dv, n_keys, scale, sinks, use_sinks, out"


def entry_attention(args, lo, hi):  # noqa: ANN001, ANN201
    """Query rows lo..hi of the attention described by `args` (`ATTENTION_ARGS`)."""
    a = carray(args, 15)
    n, h, d, t, hkv, dv = a[1], a[2], a[3], a[5], a[6], a[8]
    q = carray(as_f32_ptr(a[0]), (n, h, d))
    k = carray(as_f32_ptr(a[4]), (t, hkv, d))
    v = carray(as_f32_ptr(a[7]), (t, hkv, dv))
    q_pos = carray(as_i64_ptr(a[9]), (n,))
    sinks = carray(as_f32_ptr(a[12]), (h,))
    out = carray(as_f32_ptr(a[14]), (n, h, dv))
    scale = bits_to_f32(a[10])
    attention_rows(q, k, v, q_pos, scale, a[11], sinks, a[13] != 0, lo, hi, out)


def entry_decode_attention(args, lo, hi):  # noqa: ANN001, ANN201
    """Sequences lo..hi of the decode attention described by `args` (`DECODE_ARGS`)."""
    a = carray(args, 14)
    s, h, d, t, hkv, dv = a[1], a[2], a[3], a[5], a[6], a[8]
    q = carray(as_f32_ptr(a[0]), (s, h, d))
    k = carray(as_f32_ptr(a[4]), (s, t, hkv, d))
    v = carray(as_f32_ptr(a[7]), (s, t, hkv, dv))
    n_keys = carray(as_i64_ptr(a[9]), (s,))
    sinks = carray(as_f32_ptr(a[11]), (h,))
    out = carray(as_f32_ptr(a[13]), (s, h, dv))
    decode_rows(q, k, v, n_keys, bits_to_f32(a[10]), sinks, a[12] != 0, lo, hi, out)
