"""Throughput measurement in the manner of llama-bench: prefill N tokens (pp) and generate N
tokens (tg) on a loaded model, repeated, reporting the median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from forge.backend import SeqBatch, forward_in_chunks
from forge.errors import UsageError


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


def _prefill(model, table, ids: np.ndarray, start: int, chunk: int, output: str = "none"):
    """Feed `ids` at positions start.. in pieces of `chunk` tokens, as the engine runs a prompt;
    the last piece's result."""
    outs = list(forward_in_chunks(model.runner, table, ids, start, chunk, "none", output))
    return outs[-1] if outs else None  # no ids (depth 0): nothing fed


def _fill(model, table, ids: np.ndarray) -> None:
    """The cached tokens before a measurement, finished before the clock starts (as llama-bench
    synchronizes after its depth): the last chunk returns a row, which a runner that queues its
    passes on a device can only give once they have all run."""
    _prefill(model, table, ids, 0, model.prefill_chunk, "last")


def bench_prefill(model, n_tokens: int, reps: int, depth: int = 0,
                  chunk: int | None = None) -> BenchResult:  # fmt: skip
    """Time the prefill of `n_tokens` prompt tokens after `depth` cached ones (only the last
    row's logits), in pieces of `chunk` tokens (default: the engine's, `model.prefill_chunk`;
    at most that: a cache planned for its pieces may hold no larger ones)."""
    chunk = prompt_piece(model, chunk)
    ids, past = _prompt(model, n_tokens), _prompt(model, depth, seed=1)
    times = []
    for _ in range(reps + 1):  # the first run warms caches and thread pools
        table = model.kv.table()
        _fill(model, table, past)
        t = time.perf_counter()
        _prefill(model, table, ids, depth, chunk, "last")
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


def prompt_piece(model, chunk: int | None) -> int:
    """The prompt piece (ubatch) of a measurement: `chunk`, or the model's when None; a
    UsageError past what the model's runner takes."""
    if chunk is None:
        return model.prefill_chunk
    if not 1 <= chunk <= model.prefill_chunk:
        raise UsageError(f"a prompt piece (ubatch) of {chunk} tokens: this model's runner takes "
                         f"1 to {model.prefill_chunk}")  # fmt: skip
    return chunk


def _result(test: str, n: int, times: list[float]) -> BenchResult:
    rates = [n / t for t in times]
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return BenchResult(test, n, statistics.median(rates), spread, times)
