"""Throughput measurement in the manner of llama-bench: prefill N tokens (pp) and generate N
tokens (tg) on a loaded model, repeated, reporting the median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from forge.backend import SeqBatch, forward_in_chunks
from forge.scheduler import PREFILL_CHUNK


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


def _prefill(model, table, ids: np.ndarray, start: int, output: str = "none"):
    """Feed `ids` at positions start.. in prefill chunks, as the engine runs a prompt; the last
    chunk's result."""
    outs = list(forward_in_chunks(model.runner, table, ids, start, PREFILL_CHUNK, "none", output))
    return outs[-1] if outs else None  # no ids (depth 0): nothing fed


def _fill(model, table, ids: np.ndarray) -> None:
    """The cached tokens before a measurement, finished before the clock starts (as llama-bench
    synchronizes after its depth): the last chunk returns a row, which a runner that queues its
    passes on a device can only give once they have all run."""
    _prefill(model, table, ids, 0, "last")


def bench_prefill(model, n_tokens: int, reps: int, depth: int = 0) -> BenchResult:
    """Time the prefill of `n_tokens` prompt tokens after `depth` cached ones (only the last
    row's logits), in the engine's prefill chunks."""
    ids, past = _prompt(model, n_tokens), _prompt(model, depth, seed=1)
    times = []
    for _ in range(reps + 1):  # the first run warms caches and thread pools
        table = model.kv.table()
        _fill(model, table, past)
        t = time.perf_counter()
        _prefill(model, table, ids, depth, "last")
        times.append(time.perf_counter() - t)
        table.release()
    return _result(f"pp{n_tokens}" + (f" @ d{depth}" if depth else ""), n_tokens, times[1:])


def bench_decode(model, n_tokens: int, reps: int, depth: int = 0) -> BenchResult:
    """Time `n_tokens` single-token decode steps after `depth` cached tokens (16 when 0, as a
    short prompt), argmax picking."""
    context = depth or 16
    ids = _prompt(model, context)
    times = []
    for _ in range(reps + 1):
        table = model.kv.table()
        _fill(model, table, ids)
        token, pos = int(ids[-1]), context
        t = time.perf_counter()
        for _ in range(n_tokens):
            table.trim(pos)
            table.ensure(pos + 1)
            batch = [SeqBatch(np.array([token], np.int32), pos, table.array(), "last",
                              table.window_arrays())]  # fmt: skip
            token = model.runner.forward_argmax(batch)[0]
            pos += 1
        times.append(time.perf_counter() - t)
        table.release()
    return _result(f"tg{n_tokens}" + (f" @ d{depth}" if depth else ""), n_tokens, times[1:])


def _result(test: str, n: int, times: list[float]) -> BenchResult:
    rates = [n / t for t in times]
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return BenchResult(test, n, statistics.median(rates), spread, times)
