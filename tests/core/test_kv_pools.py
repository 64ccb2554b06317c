"""Sliding-window layers keep only their window: the pools' bookkeeping, the memory it saves at a
long context, and logits and tokens unchanged by it (cpu_simd keeps those layers apart)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as V

import forge
from forge.errors import OutOfMemoryError
from forge.kv_pools import FREED, KvPools
from tests.support.gguf_factory import rewrite_gguf

BS = 16


def test_window_tables_free_what_left_the_window_and_take_only_what_they_need():
    pools = KvPools(n_ctx=1024, block_size=BS, windows=(40,), max_seqs=2, chunk=64)
    per_seq = -(-(40 + 64) // BS) + 2
    assert pools.window_blocks() == {40: 2 * per_seq}
    full, win = pools.full, pools.windowed[40]
    seq = pools.table()
    for lo in range(0, 320, 64):  # prompt chunks of 64, as the scheduler runs them
        seq.trim(lo - 1)
        seq.ensure(lo + 64)
        assert win.n_blocks - win.n_free <= per_seq
    assert full.n_blocks - full.n_free == 20
    seq.trim(320)  # queries from 320 on read positions 281..: blocks 0..16 are not needed
    assert seq.window_arrays()[0][:17].tolist() == [FREED] * 17
    assert seq.window_arrays()[0][17:].tolist() == seq.windows[0].blocks[17:]
    assert win.n_blocks - win.n_free == 3 and full.n_blocks - full.n_free == 20
    seq.trim(100)  # never takes back what is gone
    assert win.n_blocks - win.n_free == 3
    seq.ensure(400)  # 5 more blocks, appended after the freed ones
    assert len(seq.window_arrays()[0]) == 25 and win.n_blocks - win.n_free == 8
    seq.release()
    assert full.n_free == full.n_blocks and win.n_free == win.n_blocks


def test_ensure_takes_from_every_pool_or_from_none():
    pools = KvPools(n_ctx=4096, block_size=BS, windows=(8,), max_seqs=1, chunk=32)
    hog = pools.table()
    hog.ensure(pools.window_blocks()[8] * BS - BS)  # one window block left
    seq = pools.table()
    with pytest.raises(OutOfMemoryError, match="KV cache full"):
        seq.ensure(3 * BS)  # the full pool has room, the window pool does not
    assert pools.full.n_free == pools.full.n_blocks - len(hog.full.blocks)
    assert not pools.can_admit(3 * BS) and pools.can_admit(BS)


@pytest.fixture(scope="module")
def long_gemma(golden_dir, tmp_path_factory):
    """The golden gemma3 (5 of 6 layers attend to a window of 8) rewritten for 32k positions."""
    src = golden_dir / "models" / "gemma3-q4_k_m.gguf"
    dst = tmp_path_factory.mktemp("long") / "gemma3-32k.gguf"
    return str(rewrite_gguf(src, dst, set_kv=[("gemma3.context_length", 32768, V.UINT32, None)]))


def _load(path, monkeypatch, windowed: bool, **kw):
    from forge_cpu_simd.runner import CpuRunner

    monkeypatch.setattr(CpuRunner, "windowed_kv", windowed)
    return forge.load(path, backend="cpu_simd", **kw)


def test_at_32k_the_windowed_layers_hold_only_their_windows(long_gemma, monkeypatch):
    config = {"kv_cache_type_k": "f16", "kv_cache_type_v": "f16", "server": {"max_batch": 1}}
    with _load(long_gemma, monkeypatch, True, n_ctx=32768, config=config) as m:
        windowed = m.runner.memory_estimate()["kv_cache"]
        per_slot = m.spec.n_head_kv * (m.spec.head_dim + m.spec.head_dim_v) * 2  # f16
        window_blocks = m.kv.window_blocks()[8]
        assert m.kv.windows == (8,) and window_blocks == -(-(8 + 256) // BS) + 2
        full_layers = sum(ls.sliding_window is None for ls in m.spec.layers)
        assert full_layers == 1
        assert windowed == per_slot * BS * (full_layers * 2048 + 5 * window_blocks)
    with _load(long_gemma, monkeypatch, False, n_ctx=32768, config=config) as m:
        whole = m.runner.memory_estimate()["kv_cache"]
    assert whole == 6 * 2048 * BS * per_slot
    saved = 1 - windowed / whole
    print(
        f"\n  32k context: KV {whole / 2**20:.1f} -> {windowed / 2**20:.1f} MiB ({saved:.1%} less)"
    )
    assert saved > 5 / 6 - 0.01  # the windowed layers' share, less their windows


def test_logits_and_tokens_do_not_change(long_gemma, monkeypatch):
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 200, 700)]
    runs = {}
    for windowed in (True, False):
        with _load(long_gemma, monkeypatch, windowed, n_ctx=1024) as m:
            logits = m.logits(prompt)  # chunks of 256: blocks leave the window between them
            out = m.complete(prompt[:300], max_tokens=24, temperature=0)
            if windowed:
                pool = m.kv.windowed[8]
                assert pool.n_free == pool.n_blocks  # all given back
            runs[windowed] = logits, out.tokens
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    assert runs[True][1] == runs[False][1]


def test_scheduled_sequences_keep_only_their_windows(long_gemma, monkeypatch):
    """Four sequences decoding together: each window pool holds at most what each sequence's
    window needs, however long they get."""
    from forge.scheduler import Finished, Scheduler

    with _load(long_gemma, monkeypatch, True, n_ctx=2048,
               config={"server": {"max_batch": 4}}) as m:  # fmt: skip
        pool, peak = m.kv.windowed[8], [0]
        sched = Scheduler(m, max_batch=4, on_step=lambda: peak.__setitem__(
            0, max(peak[0], pool.n_blocks - pool.n_free)))  # fmt: skip
        sched.start()
        done = []
        no_end = {t: -100 for t in m.tokenizer.eog_ids}
        for i in range(4):
            state = m.start([5 + i] * 30, max_tokens=120, temperature=0, logit_bias=no_end)
            sched.submit(state, lambda ev, d=done: d.append(ev) if isinstance(ev, Finished) else 0)
        sched.stop(timeout=120)
        assert len(done) == 4 and all(f.completion_tokens == 120 for f in done)
        assert 0 < peak[0] <= 4 * 3  # 8 positions and the step in flight: at most 3 blocks each
        assert pool.n_free == pool.n_blocks


def test_a_generator_that_cannot_get_blocks_says_so(long_gemma, monkeypatch):
    """Generators of one model share its pools: one that finds them held by the others fails
    with a clear error instead of waiting for ever."""
    with _load(long_gemma, monkeypatch, True, n_ctx=64, config={"server": {"max_batch": 1}}) as m:
        first = m.generate([5] * 40, max_tokens=20, temperature=0)
        next(first)  # holds 40+ of the 64 positions
        with pytest.raises(OutOfMemoryError, match="no room for this sequence"):
            list(m.generate([6] * 40, max_tokens=20, temperature=0))
        first.close()
        assert m.allocator.n_free == m.allocator.n_blocks  # both gave their blocks back
