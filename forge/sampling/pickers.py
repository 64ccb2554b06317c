"""The built-in samplers: the last step of a chain, which picks the token."""

from __future__ import annotations

import numpy as np

from forge.errors import ForgeRuntimeError
from forge.sampling.context import SamplingContext
from forge.sampling.params import SamplingParams
from forge.sampling.select import survivors, weighted_index


def check_top(top: float) -> None:
    """Raise ForgeRuntimeError unless the highest logit is finite."""
    if np.isnan(top) or top == np.inf:
        raise ForgeRuntimeError(f"cannot sample: the logits contain {top}")
    if top == -np.inf:
        raise ForgeRuntimeError("cannot sample: every token is masked (all logits are -inf)")


def greedy_pick(logits: np.ndarray, ctx: SamplingContext) -> int:
    """The token with the highest logit; among ties, the lowest token id."""
    best = int(np.argmax(logits))
    check_top(float(logits[best]))
    return best


def dist_pick(logits: np.ndarray, ctx: SamplingContext) -> int:
    """Draw from softmax(logits) with ``ctx.rng``: one uniform draw per token."""
    top = float(logits.max())
    check_top(top)
    ids, values = survivors(logits)
    i = weighted_index(np.exp(values - np.float32(top)), float(ctx.rng.random()))
    return int(i if ids is None else ids[i])


def greedy(params: SamplingParams):
    return greedy_pick


def dist(params: SamplingParams):
    return dist_pick
