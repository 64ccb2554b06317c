"""cpu_simd's batched decode attention: the op against a float64 reference, and the runner's
use of it (sequences with one query row attend together) against each sequence alone."""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd import ops

import forge
from forge.backend import SeqBatch
from forge.kv_cache import BlockAllocator, BlockTable


def _reference(q, k, v, scale, sinks=None):
    """Softmax attention of one query [H, D] over keys [T, Hkv, D] in float64; sinks [H]: a
    logit per head in the denominator only."""
    group = q.shape[0] // k.shape[1]
    out = []
    for h in range(q.shape[0]):
        kh, vh = k[:, h // group].astype(np.float64), v[:, h // group].astype(np.float64)
        s = kh @ q[h].astype(np.float64) * scale
        sink = -np.inf if sinks is None else float(sinks[h])
        peak = max(s.max(), sink)
        p = np.exp(s - peak)
        out.append(p / (p.sum() + np.exp(sink - peak)) @ vh)
    return np.array(out)


def test_sinks_join_the_softmax_denominator_in_both_ops():
    rng = np.random.default_rng(5)
    n_head, n_kv, d, n = 4, 2, 16, 6
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    q = rng.standard_normal((n, n_head, d)).astype(np.float32)
    sinks = np.array([-3.0, 0.0, 2.5, 30.0], np.float32)  # the last one takes nearly all
    prefill = ops.attention(q, k, v, np.arange(n), 0.25, None, sinks=sinks)
    decode = ops.decode_attention(q[-1:], k[None], v[None], np.ones((1, n), bool), 0.25,
                                  sinks=sinks)  # fmt: skip
    for i in range(n):
        want = _reference(q[i], k[: i + 1], v[: i + 1], 0.25, sinks)
        np.testing.assert_allclose(prefill[i], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(decode[0], _reference(q[-1], k, v, 0.25, sinks), rtol=1e-5,
                               atol=1e-6)  # fmt: skip
    assert np.abs(prefill[:, 3]).max() < 1e-6  # a dominant sink leaves almost no weight
    without = ops.attention(q, k, v, np.arange(n), 0.25, None)
    assert np.abs(without[:, 1] - prefill[:, 1]).max() > 1e-2


def test_decode_attention_matches_float64_per_sequence():
    rng = np.random.default_rng(3)
    n_slots, n_head, n_kv, d, dv = 300, 6, 2, 16, 12
    kc = rng.standard_normal((n_slots, n_kv, d)).astype(np.float32)
    vc = rng.standard_normal((n_slots, n_kv, dv)).astype(np.float32)
    q = rng.standard_normal((4, n_head, d)).astype(np.float32)
    lengths = [1, 37, 5, 80]
    spans = [rng.permutation(n_slots)[:n] for n in lengths]
    # padding points at real slots with large keys: only the mask keeps them out
    kc[rng.permutation(n_slots)[:20]] *= 40
    past = rng.integers(0, n_slots, (4, max(lengths)))
    valid = np.zeros(past.shape, bool)
    for r, span in enumerate(spans):
        past[r, : len(span)] = span
        valid[r, : len(span)] = True
    got = ops.decode_attention(q, kc[past], vc[past], valid, 0.25)
    assert got.shape == (4, n_head, dv) and got.dtype == np.float32
    for r, span in enumerate(spans):
        want = _reference(q[r], kc[span], vc[span], 0.25)
        np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=["gemma3-q4_k_m.gguf", "gpt-oss-mxfp4.gguf"])
def gemma(golden_dir, request):
    # sliding window of 8 in five of gemma's six layers (and in half of gpt-oss's, with
    # sinks): positions below reach past it; the 256-position cache holds four sequences of 64
    return forge.load(str(golden_dir / "models" / request.param), backend="cpu_simd", n_ctx=64)


def test_decode_rows_attend_together_and_match_each_sequence_alone(gemma, monkeypatch):
    prompts = ["The quick brown fox", "Numbers: 12345 and 3.14159 and more digits", "Hi there"]
    ids = [gemma.tokenize(p) for p in prompts]
    allocator = BlockAllocator(16, 16)  # room for four sequences
    gemma.runner.allocate_kv(allocator.n_blocks, allocator.block_size)
    tables = [BlockTable(allocator, 64) for _ in range(4)]
    try:
        for t, seq in zip(tables, ids):
            t.ensure(len(seq) + 1)
            gemma.runner.forward([SeqBatch(np.array(seq), 0, t.array(), "none")])
        steps = [
            SeqBatch(np.array([7 + i]), len(s), t.array())
            for i, (s, t) in enumerate(zip(ids, tables))
        ]
        alone = [gemma.runner.forward([b])[0] for b in steps]
        newcomer = gemma.tokenize("A fourth prompt joins")
        tables[3].ensure(len(newcomer))
        newcomer_alone = gemma.runner.forward([SeqBatch(np.array(newcomer), 0, tables[3].array())])[
            0
        ]

        calls = []
        batched = gemma.runner.ops.decode_attention
        monkeypatch.setattr(
            gemma.runner.ops,
            "decode_attention",
            lambda q, *a, **kw: calls.append(q.shape[0]) or batched(q, *a, **kw),
        )
        together = gemma.runner.forward(
            steps + [SeqBatch(np.array(newcomer), 0, tables[3].array())]
        )
    finally:
        for t in tables:
            t.release()
    n_layer = gemma.spec.n_layer
    # three decode rows in every layer; the prefill's last row joins them in the last layer
    assert calls == [3] * (n_layer - 1) + [4]
    for got, want in zip(together, alone + [newcomer_alone]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
