"""Sliding-window pools through a whole model, for any backend whose runner keeps windowed
layers apart (`Runner.windowed_kv`): logits and tokens unchanged by it, sequences decoding
together holding only their windows. Used by tests/core (cpu_simd) and tests/gpu (hip)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFValueType as V

import forge
from forge.errors import OutOfMemoryError
from tests.support.gguf_factory import rewrite_gguf


def long_gemma(golden_dir, tmp_dir) -> str:
    """The golden gemma3 (5 of 6 layers attend to a window of 8) rewritten for 32k positions."""
    src = golden_dir / "models" / "gemma3-q4_k_m.gguf"
    dst = tmp_dir / "gemma3-32k.gguf"
    return str(rewrite_gguf(src, dst, set_kv=[("gemma3.context_length", 32768, V.UINT32, None)]))


def load(path: str, monkeypatch, runner_cls, backend: str, windowed: bool, **kw):
    """forge.load with the backend's runner keeping windowed layers apart or not."""
    monkeypatch.setattr(runner_cls, "windowed_kv", windowed)
    return forge.load(path, backend=backend, **kw)


def logits_and_tokens(path, monkeypatch, runner_cls, backend) -> dict[bool, tuple]:
    """{windowed: (logits of a 700-token prompt, 24 greedy tokens after its first 300)}; the
    window pool is checked to have every block back after each call."""
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 200, 700)]
    runs = {}
    for windowed in (True, False):
        with load(path, monkeypatch, runner_cls, backend, windowed, n_ctx=1024) as m:
            logits = m.logits(prompt)  # in prefill chunks: blocks leave the window between them
            out = m.complete(prompt[:300], max_tokens=24, temperature=0)
            if windowed:
                assert m.kv.windows == (8,)
                pool = m.kv.windowed[8]
                assert pool.n_free == pool.n_blocks  # all given back
            runs[windowed] = logits, out.tokens
    return runs


def scheduled_sequences(path, monkeypatch, runner_cls, backend, windowed=True) -> list[list[int]]:
    """Four sequences decoding 120 tokens together (the scheduler's one-step-ahead decode);
    windowed: each window pool holds at most what each sequence's window needs, however long
    they get. Returns each sequence's tokens."""
    from forge.scheduler import Finished, Scheduler

    with load(path, monkeypatch, runner_cls, backend, windowed, n_ctx=2048,
              config={"server": {"max_batch": 4}}) as m:  # fmt: skip
        pool, peak = m.kv.windowed.get(8), [0]
        on_step = None
        if windowed:
            on_step = lambda: peak.__setitem__(0, max(peak[0], pool.n_blocks - pool.n_free))  # noqa: E731
        sched = Scheduler(m, max_batch=4, on_step=on_step)
        sched.start()
        done, tokens = [], [[] for _ in range(4)]
        no_end = {t: -100 for t in m.tokenizer.eog_ids}

        def collect(ev, i):
            (done.append if isinstance(ev, Finished) else lambda e: tokens[i].append(e.token))(ev)

        for i in range(4):
            state = m.start([5 + i] * 30, max_tokens=120, temperature=0, logit_bias=no_end)
            sched.submit(state, lambda ev, i=i: collect(ev, i))
        sched.stop(timeout=120)
        assert len(done) == 4 and all(f.completion_tokens == 120 for f in done)
        if windowed:
            assert 0 < peak[0] <= 4 * 3  # 8 positions and the step in flight: <= 3 blocks each
            assert pool.n_free == pool.n_blocks
        return tokens


def generator_without_blocks(path, monkeypatch, runner_cls, backend) -> None:
    """Generators of one model share its pools: one that finds them held by the others fails
    with a clear error instead of waiting for ever."""
    with load(path, monkeypatch, runner_cls, backend, True, n_ctx=64,
              config={"server": {"max_batch": 1}}) as m:  # fmt: skip
        first = m.generate([5] * 40, max_tokens=20, temperature=0)
        next(first)  # holds 40+ of the 64 positions
        with pytest.raises(OutOfMemoryError, match="no room for this sequence"):
            list(m.generate([6] * 40, max_tokens=20, temperature=0))
        first.close()
        assert m.allocator.n_free == m.allocator.n_blocks  # both gave their blocks back
