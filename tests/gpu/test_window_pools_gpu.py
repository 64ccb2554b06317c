"""hip's sliding-window layers keep only their window (`HipRunner.windowed_kv`), on the GPU: at
32k positions the cache holds the windowed layers' pools instead of full-length caches; logits
and greedy tokens equal those of full-length caches (prefill pieces with blocks leaving the
window between them, graph-replayed decode steps, four sequences decoding together), and a
generator that finds the pools held says so. The golden gemma3 (5 of 6 layers attend to 8
positions) rewritten for 32k positions."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import window_cases


@pytest.fixture(scope="module")
def long_gemma(golden_dir, tmp_path_factory):
    return window_cases.long_gemma(golden_dir, tmp_path_factory.mktemp("long"))


@pytest.fixture
def hip_runner(rt):
    from forge_hip.runner import HipRunner

    return HipRunner


def test_at_32k_the_windowed_layers_hold_only_their_windows(long_gemma, monkeypatch, hip_runner,
                                                            report):  # fmt: skip
    from forge_hip.kv import layer_bytes

    config = {"kv_cache_type_k": "f16", "kv_cache_type_v": "f16", "server": {"max_batch": 1}}
    sizes = {}
    for windowed in (True, False):
        with window_cases.load(long_gemma, monkeypatch, hip_runner, "hip", windowed,
                               n_ctx=32768, config=config) as m:  # fmt: skip
            sizes[windowed] = m.runner.memory_estimate()["kv_cache"]
            kv, s = m.runner.kv, m.spec
            want = sum(sum(layer_bytes(s, kv.pool_blocks[kv.pool(i)] * 16, kv.format))
                       for i in range(s.n_layer))  # fmt: skip
            assert sizes[windowed] == want
            if windowed:
                window_blocks = m.kv.window_blocks()[8]  # a window of 8 beside a 512-row piece
                assert kv.pool_blocks == (2048, window_blocks) and window_blocks == 35
    saved = 1 - sizes[True] / sizes[False]
    report.append(f"hip 32k context: KV {sizes[False] / 2**20:.1f} -> "
                  f"{sizes[True] / 2**20:.1f} MiB ({saved:.1%} less)")  # fmt: skip
    assert saved > 5 / 6 * (1 - 35 / 2048) - 1e-3  # the windowed layers' share, less their pools


def test_logits_and_tokens_do_not_change(long_gemma, monkeypatch, hip_runner):
    """The same kernels over the same positions, only the slots differ: equal bit for bit."""
    runs = window_cases.logits_and_tokens(long_gemma, monkeypatch, hip_runner, "hip")
    diff = np.abs(runs[True][0] - runs[False][0]).max()
    np.testing.assert_array_equal(runs[True][0], runs[False][0], err_msg=f"max diff {diff}")
    assert runs[True][1] == runs[False][1]


def test_scheduled_sequences_keep_only_their_windows(long_gemma, monkeypatch, hip_runner):
    windowed = window_cases.scheduled_sequences(long_gemma, monkeypatch, hip_runner, "hip")
    whole = window_cases.scheduled_sequences(long_gemma, monkeypatch, hip_runner, "hip", False)
    assert windowed == whole


def test_a_generator_that_cannot_get_blocks_says_so(long_gemma, monkeypatch, hip_runner):
    window_cases.generator_without_blocks(long_gemma, monkeypatch, hip_runner, "hip")
