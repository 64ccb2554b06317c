"""Batch invariance on hip (config key batch_invariant, `forge_hip.invariance`): a sequence's
logits are bit-identical alone and among 8 or 32 sequences (shuffled, short and long contexts),
beside another prompt's chunk, and however its prompt is chunked; on every dense golden model and
the default model's shape twin. Seeded sampling through the scheduler gives each request the
tokens it gets alone, among 32 concurrent ones. The invariant plan's logits stay within the
golden bounds."""

from __future__ import annotations

import numpy as np
import pytest

import forge
from tests.gpu.test_golden_gpu import check_gpu
from tests.support.batch_invariance import Sequences, alone_and_scheduled, prefill
from tests.support.golden_rules import golden_model_files

MODELS = golden_model_files()
# sequence 0 past the 128 positions of one attention split, sequence 1 within them; 30 short
LENGTHS = [160, 30] + [3 + (5 * i) % 12 for i in range(30)]


def _orders(n: int, rng) -> list[int]:
    """n of the 32 sequences in a random order, sequences 0 and 1 among them."""
    others = [int(i) for i in rng.permutation(np.arange(2, 32))[: n - 2]]
    at = sorted(rng.choice(n, size=2, replace=False))
    others.insert(at[0], 0)
    others.insert(at[1], 1)
    return others


def _load(path: str, n_ctx: int = 1024):
    return forge.load(path, backend="hip", n_ctx=n_ctx, config={"batch_invariant": True})


def check_invariance(model) -> None:
    """Prompt chunking, then decode steps alone / among 8 and 32 / beside a prompt."""
    rng = np.random.default_rng(0)
    vocab = model.spec.n_vocab
    ids = rng.integers(3, vocab, size=300).astype(np.int32)
    whole = prefill(model, ids, 300)  # (past 128 rows: the default plan's gemm.hip pass)
    for chunk in (128, 64, 7, 1):
        assert np.array_equal(prefill(model, ids, chunk), whole), chunk
    seqs = Sequences(model, LENGTHS)
    try:
        other = rng.integers(3, vocab, size=120).astype(np.int32)
        for who in (0, 1):
            alone = seqs.step([who], who)
            for n in (8, 32):
                order = _orders(n, rng)
                assert np.array_equal(seqs.step(order, who), alone), (who, order)
            # a pass of 8 decode rows and a 60-token prompt; 32 rows and 120 (past 128 rows)
            for n, length in ((8, 60), (32, 120)):
                order = _orders(n, rng)
                got = seqs.mixed(order, other[:length], who)
                assert np.array_equal(got, alone), (who, order, length)
    finally:
        seqs.release()


@pytest.mark.parametrize("model_file", MODELS or ["<golden data missing>"])
def test_logits_do_not_depend_on_the_batch_gpu(rt, golden_dir, model_file):
    model = _load(str(golden_dir / "models" / model_file))
    try:
        check_invariance(model)
    finally:
        model.runner.close()


def test_default_model_twin_logits_do_not_depend_on_the_batch_gpu(rt, twin_path):
    model = _load(twin_path)
    try:
        check_invariance(model)
    finally:
        model.runner.close()


@pytest.mark.parametrize("model_file", ["gemma3-q4_k_m.gguf", "llama-f16.gguf", "qwen2-q2_k.gguf",
                                        "qwen3-q8_0.gguf"])  # fmt: skip
def test_invariant_plan_keeps_the_golden_bounds_gpu(rt, golden_dir, synthetic_golden, report,
                                                    monkeypatch, model_file):  # fmt: skip
    """Its paths (one-row products on mmq.hip, attention in one split) against the reference:
    the checks and bounds of test_golden_gpu, with an f16 cache."""
    if model_file not in synthetic_golden:
        pytest.skip(f"{model_file} not in the golden data")
    monkeypatch.setenv("FORGE_BATCH_INVARIANT", "true")
    check_gpu(golden_dir, model_file, synthetic_golden[model_file], "f16", report, monkeypatch)


def test_seeded_sampling_alone_equals_among_32_requests_gpu(rt, golden_dir):
    """32 requests (half greedy, half sampled with their own seed) through the scheduler, most
    arriving while the first ones decode (their prompts in passes beside decode rows): each
    gets the tokens it gets alone."""
    model = _load(str(golden_dir / "models" / "qwen3-q4_k_m.gguf"))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, model.n_vocab, size=int(n)).tolist()
               for n in rng.integers(4, 20, size=32)]  # fmt: skip
    kws = [dict(temperature=0) if i % 2 else dict(temperature=0.9, top_k=40, top_p=0.95, seed=i)
           for i in range(32)]  # fmt: skip
    try:
        alone, scheduled, stats = alone_and_scheduled(model, prompts, kws, 10, 32, first=4)
        for i, (got, want) in enumerate(zip(scheduled, alone)):
            assert got == want, (i, kws[i])
        assert stats["prompt_steps"] >= 2
    finally:
        model.runner.close()
