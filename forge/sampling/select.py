"""Selection helpers behind the truncation stages and the picker: O(n_vocab), no full sort.

Each threshold helper works on logit values and returns a threshold ``t``; the stage then keeps
the logits ``>= t``, which keeps ties with the last admitted token and so does not depend on
any sort order. Large inputs are narrowed with a subsample first, so that only a few
thousand values are ever sorted or partitioned.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

NEG_INF = np.float32(-np.inf)
SMALL = 4096  # at most this many values are sorted outright
STRIDE = 64  # thresholds are guessed from a subsample of one value in STRIDE
HEAD = 256  # nucleus_threshold first looks among this many highest values
BLOCK = 512  # block length for two-level cumulative sums


@lru_cache(maxsize=8)
def _sample_ids(n: int) -> np.ndarray:
    # Fixed pseudo-random positions: unlike a plain stride, no layout of the vocabulary (sorted
    # ids, bans every k-th token) makes the subsample unrepresentative.
    ids = np.random.default_rng(n).choice(n, n // STRIDE, replace=False)
    ids.sort()
    ids.flags.writeable = False
    return ids


def subsample(values: np.ndarray) -> np.ndarray:
    """About one value in STRIDE, at fixed pseudo-random positions."""
    return values[_sample_ids(values.size)]


def survivors(logits: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """``(ids, values)`` of the unmasked logits, or ``(None, logits)`` when most are unmasked.

    After top_k most of the vocabulary is ``-inf``: later stages then touch only a few values.
    """
    alive = logits > NEG_INF
    if np.count_nonzero(alive) * 4 > logits.size:
        return None, logits
    ids = np.flatnonzero(alive)
    return ids, logits[ids]


def keep_at_least(
    logits: np.ndarray, ids: np.ndarray | None, values: np.ndarray, t: float
) -> np.ndarray:
    """``logits`` with every entry below ``t`` set to ``-inf``; ``ids``/``values`` as from
    `survivors`. Returns a new array."""
    keep = values >= t
    if ids is None and np.count_nonzero(keep) * 4 > logits.size:
        return np.where(keep, logits, NEG_INF)
    kept = np.flatnonzero(keep) if ids is None else ids[keep]
    out = np.full_like(logits, NEG_INF)
    out[kept] = logits[kept]
    return out


def kth_largest(values: np.ndarray, k: int) -> float:
    """The k-th largest value (1-based), for ``1 <= k <= values.size``.

    A subsample gives a guess ``g`` low enough that ``values >= g`` very likely holds
    at least k values; if so the answer is among those few, else one full partition runs.
    """
    n = values.size
    if n > SMALL and k * 4 < n // STRIDE:
        sample = subsample(values)
        rank = min(sample.size, (k * 4) // STRIDE + 8)  # about 4k values expected above g
        guess = np.partition(sample, sample.size - rank)[sample.size - rank]
        head = values[values >= guess]
        if head.size >= k:
            values, n = head, head.size
    return float(np.partition(values, n - k)[n - k])


def nucleus_threshold(values: np.ndarray, p: float) -> float:
    """The largest value ``t`` whose entries ``>= t`` hold at least ``p`` of the softmax mass.

    The HEAD highest values are checked first (a confident model's nucleus fits there). Else a
    subsample of the rest brackets ``lo <= t < hi`` (mass from ``hi`` < target <= mass from
    ``lo``, checked on the full array); bisection narrows the bracket while it holds more than
    SMALL values, and the band is sorted.
    """
    top = np.float32(values.max())
    weights = values - top
    np.exp(weights, out=weights)
    total = float(weights.sum(dtype=np.float64))
    need = p * total
    if values.size <= SMALL:
        return _sorted_cut(values, weights, need)

    scratch = np.empty_like(weights)

    def mass(mask: np.ndarray) -> float:
        # No compaction and no BLAS (threaded dots stall on a busy machine); summed in float64
        # so that the cut is right to far better than one token's share of the mass.
        return float(np.multiply(weights, mask, out=scratch).sum(dtype=np.float64))

    h = kth_largest(values, HEAD)
    head = values >= h
    head_mass = mass(head)
    if head_mass >= need:
        return _sorted_cut(values[head], weights[head], need)
    sample = subsample(values)
    sample = sample[(sample < h) & (sample > NEG_INF)]
    hi, lo = _bracket_guess(sample, top, (need - head_mass) / (total - head_mass), h)
    above = mass(values >= hi)  # invariant: above (mass from hi) < need <= mass from lo
    if above >= need:
        hi, above = h, head_mass
    if mass(values >= lo) < need:  # the guess missed: fall back to the smallest finite value
        lo = float(np.min(values, where=values > NEG_INF, initial=top))
    while True:
        band = (values >= lo) & (values < hi)
        mid = float(np.float32((lo + hi) / 2))
        if np.count_nonzero(band) <= SMALL or mid in (lo, hi):
            break
        from_mid = mass(values >= mid)
        if from_mid >= need:
            lo = mid
        else:
            hi, above = mid, from_mid
    return _sorted_cut(values[band], weights[band], need - above)


def _bracket_guess(
    sample: np.ndarray, top: np.float32, fraction: float, ceiling: float
) -> tuple[float, float]:
    """(hi, lo) around the value where the sample's running mass reaches ``fraction`` of its
    total, a few standard deviations of rank either side."""
    if sample.size == 0:
        return ceiling, ceiling
    desc = np.sort(sample)[::-1]
    est = np.cumsum(np.exp(desc - top), dtype=np.float64)
    j = int(np.searchsorted(est, fraction * est[-1]))
    margin = 4 + 3 * math.isqrt(j)
    hi = float(desc[j - margin]) if j >= margin else ceiling
    lo = float(desc[min(j + margin, desc.size - 1)])
    return hi, lo


def _sorted_cut(values: np.ndarray, weights: np.ndarray, need: float) -> float:
    order = np.argsort(values)[::-1]
    mass = np.cumsum(weights[order], dtype=np.float64)
    cut = int(np.searchsorted(mass, need))  # first index whose running mass reaches ``need``
    return float(values[order[min(cut, values.size - 1)]])  # past the end: rounding, keep all


def weighted_index(weights: np.ndarray, u: float) -> int:
    """The index where the running sum of ``weights`` first exceeds ``u`` times their total.

    ``u`` is uniform in [0, 1). Zero weights are never chosen. Long inputs use block sums so
    that only BLOCK values get a float64 running sum.
    """
    n = weights.size
    if n <= SMALL:
        return _first_above(weights, u * float(weights.sum(dtype=np.float64)))
    whole = n // BLOCK * BLOCK
    sums = weights[:whole].reshape(-1, BLOCK).sum(axis=1, dtype=np.float64)
    sums = np.append(sums, weights[whole:].sum(dtype=np.float64))
    target = u * float(sums.sum())
    b = _first_above(sums, target)
    start = b * BLOCK
    return start + _first_above(weights[start : start + BLOCK], target - float(sums[:b].sum()))


def _first_above(weights: np.ndarray, target: float) -> int:
    mass = np.cumsum(weights, dtype=np.float64)
    i = min(int(np.searchsorted(mass, target, side="right")), weights.size - 1)
    while i > 0 and weights[i] == 0.0:  # only when rounding pushed the target past the end
        i -= 1
    return i
