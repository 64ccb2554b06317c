"""Throughput measurement in the manner of llama-bench: prefill N tokens (pp) and generate N
tokens (tg) on a loaded model, repeated, reporting the median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from forge.backend import SeqBatch


@dataclass
class BenchResult:
    test: str  # "pp128" or "tg32"
    tokens: int
    median_tok_s: float
    stdev_tok_s: float
    runs_s: list[float]

    def as_dict(self) -> dict:
        return asdict(self)


def _prompt(model, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(10, model.n_vocab, size=n).astype(np.int32)


def bench_prefill(model, n_tokens: int, reps: int) -> BenchResult:
    """Time one forward pass over `n_tokens` prompt tokens (only the last row's logits)."""
    ids = _prompt(model, n_tokens)
    times = []
    for _ in range(reps + 1):  # the first run warms caches and thread pools
        table = model.kv.table()
        table.ensure(n_tokens)
        t = time.perf_counter()
        model.runner.forward([SeqBatch(ids, 0, table.array(), "last", table.window_arrays())])
        times.append(time.perf_counter() - t)
        table.release()
    return _result(f"pp{n_tokens}", n_tokens, times[1:])


def bench_decode(model, n_tokens: int, reps: int, context: int = 16) -> BenchResult:
    """Time `n_tokens` single-token decode steps after a short `context`, argmax picking."""
    ids = _prompt(model, context)
    times = []
    for _ in range(reps + 1):
        table = model.kv.table()
        table.ensure(context + n_tokens)
        model.runner.forward([SeqBatch(ids, 0, table.array(), "none", table.window_arrays())])
        token, pos = int(ids[-1]), context
        t = time.perf_counter()
        for _ in range(n_tokens):
            batch = [SeqBatch(np.array([token], np.int32), pos, table.array(), "last",
                              table.window_arrays())]  # fmt: skip
            token = model.runner.forward_argmax(batch)[0]
            pos += 1
        times.append(time.perf_counter() - t)
        table.release()
    return _result(f"tg{n_tokens}", n_tokens, times[1:])


def _result(test: str, n: int, times: list[float]) -> BenchResult:
    rates = [n / t for t in times]
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return BenchResult(test, n, statistics.median(rates), spread, times)
