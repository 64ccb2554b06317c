"""Attention compiled with numba: each (query row, head) on its own, in a fixed order.

A query's scores are 16-lane dot products over the head (`simd.hsum` adds the lanes in a fixed
order), its softmax runs over exactly the keys it sees (causal and window limits as ranges, not
masks), and its output sums the values key by key in position order. Nothing depends on which
other rows or sequences share the call, how many keys were gathered for them, or how a prompt
was chunked: a row's result is bit-identical in every batch (NumPy's batched matrix products
choose their reduction order by shape, so they are not).

`attention` and `decode_attention` take the arguments of cpu_simd's ops of those names
(`forge_cpu_simd.ops`), already as contiguous float32 / int64 arrays (see attention_op.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from forge_cpu_jit import jit as _jit  # noqa: F401  (installs the kernel cache locator first)
from forge_cpu_jit.simd import fma, hsum, load_f32x16, splat_f32, store_f32x16, zeros_f32x16

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


@njit(**_NB)
def _attend_group(q, k, v, kvh, h0, group, t0, t1, scale, sinks, use_sinks, p, acc, out):  # noqa: ANN001, ANN202
    """out[h0 + j] (j < group: the query heads of kv head kvh) = the softmax over keys t0..t1-1
    (and head's sink logit, when used) of scale * q[h].k_t, applied to v_t. Each key and value
    row is read once for the whole group. p [group, >= t1 - t0] and acc [group, Dv]: scratch."""
    n = t1 - t0
    for t in range(t0, t1):
        kt = k[t, kvh]
        for j in range(group):
            p[j, t - t0] = _dot(q[h0 + j], kt) * scale
    dv = acc.shape[1]
    nc = dv // 16
    for j in range(group):
        m = np.float32(-np.inf)
        for i in range(n):
            if p[j, i] > m:
                m = p[j, i]
        sink = sinks[h0 + j]
        if use_sinks and sink > m:
            m = sink
        total = np.float32(0.0)
        for i in range(n):
            e = np.exp(p[j, i] - m)
            p[j, i] = e
            total += e
        if use_sinks:
            total += np.exp(sink - m)
        for i in range(n):  # normalised weights: each value row is then summed in key order
            p[j, i] = p[j, i] / total
        for d in range(dv):
            acc[j, d] = np.float32(0.0)
    for i in range(n):
        vt = v[t0 + i, kvh]
        for j in range(group):
            w = splat_f32(p[j, i])
            aj = acc[j]
            for c in range(nc):
                store_f32x16(aj, c * 16, fma(w, load_f32x16(vt, c * 16), load_f32x16(aj, c * 16)))
            for d in range(nc * 16, dv):
                aj[d] += p[j, i] * vt[d]
    for j in range(group):
        for d in range(dv):
            out[h0 + j, d] = acc[j, d]


@njit(**_NB)
def attention(q, k, v, q_pos, scale, window, sinks, use_sinks, row0, row1, out):  # noqa: ANN001, ANN201
    """One sequence, causal (window > 0: sliding window): rows row0..row1-1 of q [n, H, D] at
    positions q_pos (the index of their keys in k), k [T, Hkv, D], v [T, Hkv, Dv] -> out
    [n, H, Dv]."""
    n_head, n_kv = q.shape[1], k.shape[1]
    t_all = k.shape[0]
    group = n_head // n_kv
    p = np.empty((group, max(t_all, 1)), np.float32)
    acc = np.empty((group, v.shape[2]), np.float32)
    for i in range(row0, row1):
        pos = q_pos[i]
        t1 = min(pos + 1, t_all)
        t0 = max(0, pos - window + 1) if window > 0 else 0
        for g in range(n_kv):
            _attend_group(q[i], k, v, g, g * group, group, t0, t1, scale, sinks, use_sinks, p,
                          acc, out[i])  # fmt: skip


@njit(**_NB)
def decode_attention(q, k, v, n_keys, scale, sinks, use_sinks, row0, row1, out):  # noqa: ANN001, ANN201
    """One query row per sequence: sequences row0..row1-1 of q [S, H, D] over their first
    n_keys[s] keys of k [S, T, Hkv, D], v [S, T, Hkv, Dv] -> out [S, H, Dv]."""
    n_head, n_kv = q.shape[1], k.shape[2]
    group = n_head // n_kv
    p = np.empty((group, max(k.shape[1], 1)), np.float32)
    acc = np.empty((group, v.shape[3]), np.float32)
    for s in range(row0, row1):
        for g in range(n_kv):
            _attend_group(q[s], k[s], v[s], g, g * group, group, 0, n_keys[s], scale, sinks,
                          use_sinks, p, acc, out[s])  # fmt: skip
