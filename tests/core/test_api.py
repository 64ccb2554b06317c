"""The Python API (forge.load / Model) on a tiny golden model: cache consistency, sampling,
stopping, and errors before compute."""

from __future__ import annotations

import numpy as np
import pytest

import forge
from forge.errors import ConfigError, ContextOverflowError, UsageError


@pytest.fixture(scope="module")
def model(golden_dir):
    return forge.load(str(golden_dir / "models" / "llama-q8_0.gguf"), backend="cpu_simd", n_ctx=64)


def test_incremental_decode_matches_one_pass(model):
    """Logits of token-by-token decoding through the paged cache equal one full pass."""
    ids = model.tokenize("Once upon a time there was a little robot")
    full = model.logits(ids)
    from forge.backend import SeqBatch
    from forge.kv_cache import BlockTable

    table = BlockTable(model.allocator, model.n_ctx)
    try:
        table.ensure(len(ids))
        first = model.runner.forward([SeqBatch(np.array(ids[:3]), 0, table.array(), "all")])[0]
        rows = [first]
        for pos in range(3, len(ids)):
            batch = [SeqBatch(np.array([ids[pos]]), pos, table.array(), "last")]
            rows.append(model.runner.forward(batch)[0])
    finally:
        table.release()
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=2e-4)
    assert model.allocator.usage == 0.0


def test_batched_sequences_match_single(model):
    """Two sequences in one forward pass give the same logits as each alone."""
    from forge.backend import SeqBatch
    from forge.kv_cache import BlockTable

    a, b = model.tokenize("The quick brown fox"), model.tokenize("Numbers: 12345 and 3.14159")
    ta, tb = BlockTable(model.allocator, 64), BlockTable(model.allocator, 64)
    ta.ensure(len(a))
    tb.ensure(len(b))
    both = model.runner.forward(
        [SeqBatch(np.array(a), 0, ta.array(), "all"), SeqBatch(np.array(b), 0, tb.array(), "all")]
    )
    ta.release()
    tb.release()
    np.testing.assert_allclose(both[0], model.logits(a), atol=2e-4)
    np.testing.assert_allclose(both[1], model.logits(b), atol=2e-4)


def test_stream_equals_complete_and_seed_repeats(model):
    kw = dict(max_tokens=12, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    pieces = list(model.generate("Once upon a time", **kw))
    again = model.complete("Once upon a time", **kw)
    assert "".join(pieces) == again.text
    assert again.completion_tokens == 12 and again.finish_reason == "length"
    other = model.complete("Once upon a time", **{**kw, "seed": 8})
    assert other.tokens != again.tokens  # 535-token vocabulary at T=1: equal runs are ~impossible


def test_greedy_follows_argmax(model):
    out = model.complete("The quick brown fox", max_tokens=5, temperature=0)
    ids = model.tokenize("The quick brown fox")
    for tok in out.tokens:
        assert tok == int(np.argmax(model.logits(ids)[-1]))
        ids.append(tok)


def test_stop_string_is_cut_and_ends_generation(model):
    free = model.complete("The quick brown fox", max_tokens=16, temperature=0)
    assert len(free.text) > 4
    stop = free.text[2:4]
    out = model.complete("The quick brown fox", max_tokens=16, temperature=0, stop=[stop])
    assert out.finish_reason == "stop"
    assert stop not in out.text and free.text.startswith(out.text)


def test_prompt_beyond_context_fails_before_compute(model, monkeypatch):
    calls = []
    monkeypatch.setattr(model.runner, "forward", lambda *a: calls.append(a))
    with pytest.raises(ContextOverflowError, match="context"):
        model.complete(list(range(5, 5 + 64)), max_tokens=4)
    with pytest.raises(ContextOverflowError):
        model.logits(list(range(5, 5 + 65)))
    assert calls == []


def test_bad_arguments_are_usage_errors(model):
    with pytest.raises(UsageError):
        model.complete("hi", max_tokens=0)
    with pytest.raises(UsageError):
        model.logits([model.n_vocab])
    with pytest.raises(ConfigError, match="temperature"):
        model.complete("hi", max_tokens=2, temperature=-1)


def test_generation_stops_at_context_end(golden_dir):
    small = forge.load(str(golden_dir / "models" / "llama-q8_0.gguf"), backend="cpu_simd", n_ctx=16)
    ids = small.tokenize("The quick brown fox jumps over the lazy dog.")
    out = small.complete(ids, max_tokens=100, temperature=0)
    assert out.finish_reason == "length" and len(ids) + out.completion_tokens == 16


def test_block_table_ensure_allocates_only_past_its_room():
    """ensure() takes blocks only for positions past what its blocks hold, never past the
    context (also once blocks hold more positions than the context allows), and release()
    empties the table so the next ensure() allocates again."""
    from forge.kv_cache import BlockAllocator, BlockTable

    alloc = BlockAllocator(8, 16)
    table = BlockTable(alloc, 40)  # 3 blocks hold 48 positions: 41..48 are still refused
    table.ensure(17)
    assert len(table.blocks) == 2 and alloc.n_free == 6
    held = table.array()
    table.ensure(32)
    assert table.array() is held and alloc.n_free == 6  # nothing new
    table.ensure(33)
    assert len(table.blocks) == 3 and alloc.n_free == 5
    table.ensure(40)
    with pytest.raises(ContextOverflowError, match="41 positions"):
        table.ensure(41)
    table.release()
    assert alloc.n_free == 8 and table.array().size == 0
    table.ensure(1)
    assert len(table.blocks) == 1 and alloc.n_free == 7


def test_kv_cache_types_reach_a_backend_that_takes_them(golden_dir, monkeypatch):
    """kv_cache_type_k/v go to the backend's open_runner; a backend whose open_runner does not
    take them gets no surprise argument, and asking it for a type is a clear error."""
    from forge_cpu_simd.plugin import CpuSimdBackend

    from forge.plugins import get_plugin_manager

    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    with forge.load(path, backend="cpu_simd", n_ctx=64, config={"kv_cache_type_v": "q4_0"}) as m:
        assert (m.runner.k_cache[0].fmt.value, m.runner.v_cache[0].fmt.value) == ("f32", "q4_0")
    with pytest.raises(ConfigError, match="kv_cache_type_k"):
        forge.load(path, backend="cpu_simd", config={"kv_cache_type_k": "q5_0"})

    def old_open_runner(self, spec, gguf, kernels, *, device=0, progress=None, n_ctx=None):
        return original(self, spec, gguf, kernels, device=device, progress=progress, n_ctx=n_ctx)

    original = CpuSimdBackend.open_runner
    monkeypatch.setattr(CpuSimdBackend, "open_runner", old_open_runner)
    get_plugin_manager()._instances.clear()
    with forge.load(path, backend="cpu_simd", n_ctx=64) as m:  # auto: nothing passed
        assert m.runner.k_cache[0].fmt.value == "f32"
    with pytest.raises(UsageError, match="backend 'cpu_simd' takes no KV cache types"):
        forge.load(path, backend="cpu_simd", n_ctx=64, config={"kv_cache_type_k": "f16"})


def test_closing_a_generator_frees_its_blocks_at_once(model, monkeypatch):
    """A generator closed early gives its KV blocks back when it is closed, also while
    something else still holds its step loop (hip's runner keeps the last started step)."""
    from forge.scheduler import Scheduler

    held, run_here = [], Scheduler.run_here

    def holding(self, state):
        loop = run_here(self, state)
        held.append(loop)  # alive past the generator's end, as a kept step would keep it
        return loop

    monkeypatch.setattr(Scheduler, "run_here", holding)
    gen = model.generate([1, 5, 9, 13], max_tokens=20, temperature=0)
    next(gen)
    assert model.allocator.n_free < model.allocator.n_blocks
    gen.close()
    assert held and model.allocator.n_free == model.allocator.n_blocks
