"""NumPy implementations of the non-matmul ops of the transformer forward pass.

Activations are float32 arrays shaped [tokens, ...]; every function returns a new array or
writes into `out` where that saves a temporary on the hot path.
"""

from __future__ import annotations

import math

import numpy as np

_GELU_C = math.sqrt(2.0 / math.pi)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    ms = np.einsum("...i,...i->...", x, x, dtype=np.float32) / np.float32(x.shape[-1])
    return x * (1.0 / np.sqrt(ms + np.float32(eps)))[..., None] * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    inner = np.float32(_GELU_C) * (x + np.float32(0.044715) * x * x * x)
    return np.float32(0.5) * x * (1.0 + np.tanh(inner))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def rope_tables(positions: np.ndarray, freqs: np.ndarray, mscale: float = 1.0):
    """cos and sin of the rotation angles positions * freqs (`forge.models.rope.
    rope_frequencies`), times `mscale`, each [tokens, rope_dim/2] float32."""
    angles = positions.astype(np.float64)[:, None] * np.asarray(freqs, np.float64)[None, :]
    cos, sin = np.cos(angles) * mscale, np.sin(angles) * mscale
    return cos.astype(np.float32), sin.astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Rotate the leading 2*cos.shape[1] dims of each head of x [tokens, heads, head_dim] in place.

    NeoX pairs dim i with i + d/2; the original (GPT-J/Llama) layout pairs 2i with 2i+1."""
    half = cos.shape[1]
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        a, b = x[..., :half].copy(), x[..., half : 2 * half].copy()
        x[..., :half] = a * c - b * s
        x[..., half : 2 * half] = a * s + b * c
    else:
        a, b = x[..., 0 : 2 * half : 2].copy(), x[..., 1 : 2 * half : 2].copy()
        x[..., 0 : 2 * half : 2] = a * c - b * s
        x[..., 1 : 2 * half : 2] = a * s + b * c
    return x


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_pos: np.ndarray,
    scale: float,
    window: int | None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Causal (optionally sliding-window) grouped-query attention for one sequence.

    q [n, H, D] at positions q_pos; k [T, Hkv, D] and v [T, Hkv, Dv] hold positions 0..T-1.
    Returns [n, H, Dv]. A query at position p sees keys t with t <= p and p - t < window.
    sinks [H]: a logit per head that joins the softmax's denominator only (gpt-oss).
    """
    n, n_head, d = q.shape
    n_kv = k.shape[1]
    group = n_head // n_kv
    lo = 0 if window is None else max(0, int(q_pos.min()) - window + 1)
    hi = int(q_pos.max()) + 1
    k, v = k[lo:hi], v[lo:hi]
    # [Hkv, group*n, D]: the queries that share one KV head form one matrix product.
    qg = q.reshape(n, n_kv, group, d).transpose(1, 2, 0, 3).reshape(n_kv, group * n, d)
    scores = np.matmul(qg, k.transpose(1, 2, 0)) * np.float32(scale)  # [Hkv, group*n, T]
    scores = scores.reshape(n_kv, group, n, -1)
    if n > 1:  # (one query sees every key of lo .. hi - 1: nothing to mask)
        t_pos = np.arange(lo, hi)
        allowed = t_pos[None, :] <= q_pos[:, None]
        if window is not None:
            allowed &= (q_pos[:, None] - t_pos[None, :]) < window
        scores[:, :, ~allowed] = -np.inf
    _softmax(scores, None if sinks is None else sinks.reshape(n_kv, group, 1, 1))
    out = np.matmul(scores.reshape(n_kv, group * n, -1), v.transpose(1, 0, 2))
    return out.reshape(n_kv, group, n, -1).transpose(2, 0, 1, 3).reshape(n, n_head, -1)


def decode_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    valid: np.ndarray,
    scale: float,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Attention of one query row per sequence, several sequences in one set of products.

    q [S, H, D]; k [S, T, Hkv, D] and v [S, T, Hkv, Dv] are the keys and values each
    sequence's query sees (causal and window limits already applied), padded on the right, and
    valid [S, T] marks the real ones. sinks [H] as in `attention`. Returns [S, H, Dv], what
    `attention` gives each sequence alone up to float rounding.
    """
    n_seq, n_head, d = q.shape
    n_kv = k.shape[2]
    group = n_head // n_kv
    k = k.transpose(0, 2, 3, 1)  # [S, Hkv, D, T]
    v = v.transpose(0, 2, 1, 3)  # [S, Hkv, T, Dv]
    scores = np.matmul(q.reshape(n_seq, n_kv, group, d), k)
    scores *= np.float32(scale)
    np.copyto(scores, -np.inf, where=~valid[:, None, None, :])
    _softmax(scores, None if sinks is None else sinks.reshape(1, n_kv, group, 1))
    return np.matmul(scores, v).reshape(n_seq, n_head, -1)


def _softmax(scores: np.ndarray, sinks: np.ndarray | None) -> None:
    """Softmax over the last axis, in place; `sinks` (broadcast to scores[..., :1]) are extra
    logits that count in the denominator but take no weight of their own."""
    peak = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        peak = np.maximum(peak, sinks)
    scores -= peak
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sinks - peak)
    scores /= total
