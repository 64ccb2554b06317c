"""Throughput measurement in the manner of llama-bench: prefill N tokens (pp) and generate N
tokens (tg) on a loaded model, repeated, reporting the median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from forge.backend import DeviceSampling, SeqBatch, forward_in_chunks
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


def bench_decode(model, n_tokens: int, reps: int, depth: int = 0,
                 sync: bool = False) -> BenchResult:  # fmt: skip
    """Time `n_tokens` greedy decode steps after `depth` cached tokens (16 when 0, as a short
    prompt), taken as the engine takes them (`Model.generate`): on a runner that picks on its
    device and feeds the picks (a GPU), each step starts before the previous one's token is
    read. `sync`: every step waits for the previous token first (as llama-bench's tg)."""
    context = depth or 16
    ids = _prompt(model, context)
    times = []
    for _ in range(reps + 1):
        table = model.kv.table()
        _fill(model, table, ids)
        t = time.perf_counter()
        _decode(model.runner, table, int(ids[-1]), context, n_tokens, sync)
        times.append(time.perf_counter() - t)
        table.release()
    label = f"tg{n_tokens}" + (" sync" if sync else "") + (f" @ d{depth}" if depth else "")
    return _result(label, n_tokens, times[1:])


def _decode(runner, table, token: int, pos: int, n: int, sync: bool) -> None:
    """n greedy steps from `token` at `pos`; returns once the last step's token is read."""

    def step(tokens: np.ndarray, p: int) -> list[SeqBatch]:
        table.trim(p - 1)  # (as the engine: a step in flight still queries position p - 1)
        table.ensure(p + 1)
        return [SeqBatch(tokens, p, table.array(), "last", table.window_arrays())]

    if n <= 0:
        return
    if sync or not (runner.feeds_picks and runner.samples_on_device):
        for p in range(pos, pos + n):
            token = runner.forward_argmax(step(np.array([token], np.int32), p))[0]
        return
    greedy, fed = [DeviceSampling()], np.zeros(1, np.int32)  # (fed: the pick's placeholder)
    started = runner.start_sample(step(np.array([token], np.int32), pos), greedy)
    for p in range(pos + 1, pos + n):
        ahead = runner.start_sample(step(fed, p), greedy, [0], started)
        started()
        started = ahead
    started()


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
