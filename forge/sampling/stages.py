"""The built-in stages. Each is ``factory(params) -> stage | None`` plus the stage class.

A stage takes the sampler's own float32 working copy of the logits (``[n_vocab]``, masked entries
already ``-inf``), may change it in place, and returns it. Stages never mask every token: each
keeps at least the highest logit. Work stays O(n_vocab) with no full sort (see
`forge.sampling.select`), and touches only the survivors once most tokens are masked.
"""

from __future__ import annotations

import math

import numpy as np

from forge.errors import ConfigError, UsageError
from forge.sampling.context import SamplingContext
from forge.sampling.params import SamplingParams
from forge.sampling.select import (
    NEG_INF,
    keep_at_least,
    kth_largest,
    nucleus_threshold,
    survivors,
)


class LogitBias:
    """Add a fixed value to chosen tokens' logits (``-inf`` bans a token)."""

    def __init__(self, bias: dict[int, float]) -> None:
        self.ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.max_id = int(self.ids.max())

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        if self.max_id >= logits.shape[0]:
            raise ConfigError(
                f"logit_bias names token {self.max_id} but the vocabulary has "
                f"{logits.shape[0]} tokens"
            )
        logits[self.ids] += self.values
        return logits


def logit_bias(params: SamplingParams) -> LogitBias | None:
    return LogitBias(params.logit_bias) if params.logit_bias else None


class Penalties:
    """Repetition (llama.cpp), presence and frequency (OpenAI) penalties over recent tokens.

    For each distinct token among the last ``last_n`` with count ``c``: a positive logit is
    divided by ``repeat``, a non-positive one multiplied by it; then
    ``c * frequency + presence`` is subtracted.
    """

    def __init__(self, repeat: float, last_n: int, presence: float, frequency: float) -> None:
        self.repeat, self.last_n = repeat, last_n
        self.presence, self.frequency = presence, frequency

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        window = ctx.recent(self.last_n)
        if window.size == 0:
            return logits
        ids, counts = np.unique(window, return_counts=True)
        if ids[0] < 0 or ids[-1] >= logits.shape[0]:
            bad = ids[0] if ids[0] < 0 else ids[-1]
            raise UsageError(
                f"context token {bad} is outside the vocabulary of {logits.shape[0]} tokens"
            )
        vals = logits[ids]
        if self.repeat != 1.0:
            vals = np.where(vals > 0, vals / self.repeat, vals * self.repeat)
        vals -= (counts * self.frequency + self.presence).astype(np.float32)
        logits[ids] = vals
        return logits


def penalties(params: SamplingParams) -> Penalties | None:
    off = (
        params.repeat_penalty == 1.0
        and params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
    )
    if off or params.repeat_last_n == 0:
        return None
    return Penalties(
        params.repeat_penalty,
        params.repeat_last_n,
        params.presence_penalty,
        params.frequency_penalty,
    )


class TopK:
    """Keep the ``k`` highest logits; every token tied with the k-th highest is kept too."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        ids, values = survivors(logits)
        if self.k >= values.size:
            return logits
        return keep_at_least(logits, ids, values, kth_largest(values, self.k))


def top_k(params: SamplingParams) -> TopK | None:
    return TopK(params.top_k) if params.top_k > 0 else None


class TopP:
    """Nucleus: keep the smallest set of most probable tokens whose softmax mass reaches ``p``.

    Tokens tied with the last one admitted are kept too. Found by selection
    (`forge.sampling.select.nucleus_threshold`), not by sorting the vocabulary.
    """

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        ids, values = survivors(logits)
        if values.size <= 1 or values.max() == NEG_INF:
            return logits
        return keep_at_least(logits, ids, values, nucleus_threshold(values, self.p))


def top_p(params: SamplingParams) -> TopP | None:
    return TopP(params.top_p) if params.top_p < 1.0 else None


class MinP:
    """Keep tokens whose probability is at least ``p`` times the top token's.

    Done in logit space (``logit >= max + ln p``), which needs no softmax.
    """

    def __init__(self, p: float) -> None:
        self.log_p = math.log(p)

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        ids, values = survivors(logits)
        if values.size <= 1:
            return logits
        return keep_at_least(logits, ids, values, float(values.max()) + self.log_p)


def min_p(params: SamplingParams) -> MinP | None:
    return MinP(params.min_p) if params.min_p > 0.0 else None


class Temperature:
    """Divide logits by ``t``; ``t == 0`` keeps only the highest logit(s), i.e. greedy."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self, logits: np.ndarray, ctx: SamplingContext) -> np.ndarray:
        if self.t == 0.0:
            ids, values = survivors(logits)
            return keep_at_least(logits, ids, values, float(values.max()))
        logits /= np.float32(self.t)
        return logits


def temperature(params: SamplingParams) -> Temperature | None:
    return Temperature(params.temperature) if params.temperature != 1.0 else None
