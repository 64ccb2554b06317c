"""Sliding-window layers keep only their window: the pools' bookkeeping, the memory it saves at a
long context, and logits and tokens unchanged by it (cpu_simd keeps those layers apart)."""

from __future__ import annotations

import numpy as np
import pytest

from forge.errors import OutOfMemoryError
from forge.kv_cache import KvFormat, KvTypes
from forge.kv_pools import FREED, KvPools
from tests.support import window_cases

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
    return window_cases.long_gemma(golden_dir, tmp_path_factory.mktemp("long"))


def _load(path, monkeypatch, windowed: bool, **kw):
    from forge_cpu_simd.runner import CpuRunner

    return window_cases.load(path, monkeypatch, CpuRunner, "cpu_simd", windowed, **kw)


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
        from forge_cpu_simd.plugin import CpuSimdBackend

        f16 = KvTypes(KvFormat.F16, KvFormat.F16)
        estimate = CpuSimdBackend().memory_needed(m.spec, m.gguf, 32768, f16)
        assert estimate["kv_cache"] == windowed  # the estimate counts the windows too
    with _load(long_gemma, monkeypatch, False, n_ctx=32768, config=config) as m:
        whole = m.runner.memory_estimate()["kv_cache"]
    assert whole == 6 * 2048 * BS * per_slot
    saved = 1 - windowed / whole
    print(
        f"\n  32k context: KV {whole / 2**20:.1f} -> {windowed / 2**20:.1f} MiB ({saved:.1%} less)"
    )
    assert saved > 5 / 6 - 0.01  # the windowed layers' share, less their windows


def test_logits_and_tokens_do_not_change(long_gemma, monkeypatch):
    from forge_cpu_simd.runner import CpuRunner

    runs = window_cases.logits_and_tokens(long_gemma, monkeypatch, CpuRunner, "cpu_simd")
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    assert runs[True][1] == runs[False][1]


def test_scheduled_sequences_keep_only_their_windows(long_gemma, monkeypatch):
    from forge_cpu_simd.runner import CpuRunner

    tokens = window_cases.scheduled_sequences(long_gemma, monkeypatch, CpuRunner, "cpu_simd")
    assert all(len(t) == 120 for t in tokens)


def test_a_generator_that_cannot_get_blocks_says_so(long_gemma, monkeypatch):
    from forge_cpu_simd.runner import CpuRunner

    window_cases.generator_without_blocks(long_gemma, monkeypatch, CpuRunner, "cpu_simd")
