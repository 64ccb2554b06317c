"""Batch invariance on cpu_simd (config key batch_invariant: the compiled kernels and attention):
a sequence's logits at a position are bit-identical whatever else runs in the step (other
sequences, their number and order) and however its prompt was chunked; and the compiled attention
against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from forge_cpu_jit.attention_op import CompiledAttention, CompiledDecodeAttention  # noqa: E402

import forge  # noqa: E402
from forge.backend import SeqBatch, forward_in_chunks  # noqa: E402

MODELS = ["gemma3-q4_k_m", "gpt-oss-mxfp4", "qwen3moe-q4_k_m", "llama-f32", "qwen2-q6_k"]


def reference_attention(q, k, v, q_pos, scale, window, sinks):
    """Causal (windowed) attention in float64, one query and head at a time."""
    n, n_head, _ = q.shape
    group = n_head // k.shape[1]
    out = np.zeros((n, n_head, v.shape[2]))
    for i in range(n):
        p = int(q_pos[i])
        t0 = max(0, p - window + 1) if window else 0
        for h in range(n_head):
            kk, vv = k[t0 : p + 1, h // group].astype(np.float64), v[t0 : p + 1, h // group]
            s = kk @ q[i, h].astype(np.float64) * scale
            m = max(s.max(), sinks[h]) if sinks is not None else s.max()
            e = np.exp(s - m)
            total = e.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
            out[i, h] = e @ vv.astype(np.float64) / total
    return out


@pytest.mark.parametrize("d", [24, 64])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_compiled_attention_matches_float64(d, window, with_sinks):
    rng = np.random.default_rng(d)
    n_head, n_kv, t = 6, 2, 19
    q = rng.standard_normal((7, n_head, d)).astype(np.float32)
    k = rng.standard_normal((t, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((t, n_kv, d + 8)).astype(np.float32)
    q_pos = np.array([0, 3, 8, 12, 13, 17, 18])
    sinks = rng.standard_normal(n_head).astype(np.float32) if with_sinks else None
    got = CompiledAttention()(q, k, v, q_pos, 0.3, window, sinks)
    want = reference_attention(q, k, v, q_pos, 0.3, window, sinks)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # each row alone gives the same bits as among the others
    for i in range(len(q_pos)):
        alone = CompiledAttention()(q[i : i + 1], k, v, q_pos[i : i + 1], 0.3, window, sinks)
        assert np.array_equal(alone[0], got[i])


def test_compiled_decode_attention_reads_only_the_valid_keys():
    rng = np.random.default_rng(1)
    n_seq, t, n_head, n_kv, d = 3, 11, 4, 1, 32
    q = rng.standard_normal((n_seq, n_head, d)).astype(np.float32)
    k = rng.standard_normal((n_seq, t, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_seq, t, n_kv, d)).astype(np.float32)
    n_keys = np.array([11, 4, 1])
    valid = np.arange(t)[None, :] < n_keys[:, None]
    k[~valid] = 1e30  # padding that must not be read
    got = CompiledDecodeAttention()(q, k, v, valid, 0.2)
    for s in range(n_seq):
        want = reference_attention(q[s : s + 1], k[s], v[s], [n_keys[s] - 1], 0.2, None, None)
        np.testing.assert_allclose(got[s], want[0], rtol=2e-5, atol=2e-6)
        # the decode op and the prefill op give one row the same bits
        row = CompiledAttention()(q[s : s + 1], k[s, : n_keys[s]], v[s, : n_keys[s]],
                                  np.array([n_keys[s] - 1]), 0.2, None)  # fmt: skip
        assert np.array_equal(row[0], got[s])


@pytest.fixture
def no_third_party(fresh_forge_env, monkeypatch):
    """Only the built-in plugins (the example plugin's F32 kernel would win otherwise)."""
    monkeypatch.setenv("FORGE_PLUGINS", "")


def _prefill(model, table, ids, chunk):
    """Logits of every position of `ids`, fed in chunks of `chunk` tokens."""
    return np.concatenate(list(forward_in_chunks(model.runner, table, ids, 0, chunk)))


@pytest.mark.parametrize("name", MODELS)
def test_logits_do_not_depend_on_chunking_or_batch(name, golden_dir, no_third_party):
    model = forge.load(str(golden_dir / "models" / f"{name}.gguf"), backend="cpu_simd",
                       n_ctx=1024, config={"batch_invariant": True})  # fmt: skip
    rng = np.random.default_rng(0)
    vocab = model.spec.n_vocab
    prompts = [rng.integers(3, vocab, size=n).astype(np.int32) for n in (40, 9, 23, 31, 5, 17)]
    # one prompt in one piece and in chunks of 16, 7 and 1 tokens
    whole = _prefill(model, model.kv.table(), prompts[0], 64)
    for chunk in (16, 7, 1):
        assert np.array_equal(_prefill(model, model.kv.table(), prompts[0], chunk), whole), chunk
    # one decode step of sequence 0 alone, then among 1, 4 and 7 others, in shuffled orders
    tables = []
    for p in prompts:
        t = model.kv.table()
        _prefill(model, t, p, 16)
        t.ensure(len(p) + 1)
        tables.append(t)

    def step(order):
        batch = [SeqBatch(np.array([7], np.int32), len(prompts[i]), tables[i].array(), "last",
                          tables[i].window_arrays()) for i in order]  # fmt: skip
        return model.runner.forward(batch)[order.index(0)]

    alone = step([0])
    for order in ([1, 0], [3, 0, 2, 4, 1], [5, 4, 3, 2, 1, 0], [0, 5, 1, 4, 2, 3]):
        assert np.array_equal(step(order), alone), order


def test_weights_that_fall_back_to_numpy_stay_batch_invariant(golden_dir, monkeypatch):
    """A weight the compiled kernels do not take (here: as if its type failed to compile) runs
    on NumPy's kernel, whose BLAS sums a row differently with other rows beside it (8 rows of
    this head: up to 1.9e-6 apart on this machine); through JitMatmul each row's bits are the
    ones it gets alone."""
    from forge_cpu_jit.kernel import BlockWeight, JitMatmul

    from forge.gguf import open_gguf

    gguf = open_gguf(str(golden_dir / "models" / "qwen2-q6_k.gguf"))
    info = gguf.tensors["output.weight"]
    jm = JitMatmul()
    monkeypatch.setattr(jm, "ready", lambda type_name: False)
    w = jm.prepare(gguf.raw("output.weight"), info)
    assert not isinstance(w, BlockWeight)  # the NumPy kernel's weight
    x = np.random.default_rng(0).standard_normal((8, info.shape[0])).astype(np.float32)
    together = jm(x, w)
    for i in range(len(x)):
        assert np.array_equal(jm(x[i : i + 1], w)[0], together[i]), i
