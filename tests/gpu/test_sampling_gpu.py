"""Device sampling (sampling.hip's sample_rows) against NumPy: top_k=1 and temperature 0 are the
argmax; every pick lies in the set forge.sampling's own stages keep, and equals the host reference
(`forge.backend.sample_host`, the same Philox uniform) on both of the kernel's paths (candidates
ranked in shared memory; bisection over the whole row); draw frequencies match the renormalized
distribution (chi-square); the same key and counter give the same ids; NaN / +inf / all -inf rows
give -1."""

from __future__ import annotations

import math

import numpy as np
import pytest
from forge_hip.library import SAMPLE_THREADS

from forge.backend import DeviceSampling, sample_host

GEMMA_VOCAB = 262144


def _params(rt, picks):
    """Device parameters of sample_rows for rows 0 .. len(picks) - 1 (the runner's packing)."""
    from forge_hip.step_meta import SampleMeta

    meta = SampleMeta(rt, len(picks), 16)
    meta.set_picks(len(picks), list(enumerate(picks)))
    meta.upload(0, None)
    return meta


def sample(rt, lib, dev, logits, picks, parts=1, launches=1):
    """Picked ids of each row of `logits` [rows, n], the max pass split over `parts` blocks per
    row; `launches` > 1 repeats the launch (the slice counters must be back at zero). Picks
    with a mask run mask_logits first (every row: all-ones where a pick has none)."""
    rows, n = logits.shape
    meta = _params(rt, picks)
    try:
        out = dev.poisoned(4 * rows)
        part, cnt = dev.poisoned(12 * rows * parts), dev.put(np.zeros(rows, np.uint32))
        ptr, stride = meta.params
        x = dev.put(np.ascontiguousarray(logits, np.float32))
        if any(p.mask is not None for p in picks):
            words = -(-n // 32)
            masks = np.stack([p.mask if p.mask is not None else np.full(words, 0xFFFFFFFF,
                              np.uint32) for p in picks])  # fmt: skip
            rt.launch(lib.get("mask_logits"), (rows, 3), (256,), [x, n, dev.put(masks)])
        for _ in range(launches):
            rt.launch(lib.get("sample_rows"), (rows, parts), (SAMPLE_THREADS,),
                      [x, n, ptr, stride, 0, out, part, cnt])  # fmt: skip
        np.testing.assert_array_equal(dev.get(cnt, (rows,), np.uint32), 0)
        return dev.get(out, (rows,), np.int32)
    finally:
        meta.close()


def kept_set(row, pick):
    """Token ids forge.sampling's stages keep for `pick` (before the draw)."""
    from forge.sampling.stages import MinP, TopK, TopP

    work = np.array(row, np.float32)
    for stage in (TopK(pick.top_k) if pick.top_k > 0 else None,
                  TopP(pick.top_p) if pick.top_p < 1 else None,
                  MinP(pick.min_p) if pick.min_p > 0 else None):  # fmt: skip
        if stage is not None:
            work = stage(work, None)
    return np.flatnonzero(work > -np.inf)


@pytest.mark.parametrize("parts", [1, 7, 32])
@pytest.mark.parametrize("n", [GEMMA_VOCAB, 151937, 535])
def test_top_k_1_and_temperature_0_are_the_argmax(rt, lib, dev, n, parts):
    rng = np.random.default_rng()
    rows = 24
    logits = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    logits[1, [7, n - 1]] = logits[1].max() + 1  # a tie
    keys = rng.integers(0, 2**63, rows)
    picks = [DeviceSampling(0.8, 1, 0.95, 0.05, key=int(k), counter=i) for i, k in enumerate(keys)]
    want = np.argmax(logits, axis=1)
    got = sample(rt, lib, dev, logits, picks, parts)
    # top_k keeps ties with the k-th (as forge.sampling's TopK does): the draw takes either
    assert got[1] in (7, n - 1)
    np.testing.assert_array_equal(np.delete(got, 1), np.delete(want, 1))
    # temperature 0: the argmax, the lowest id among ties (here in different slices)
    greedy = sample(rt, lib, dev, logits, [DeviceSampling()] * rows, parts, launches=3)
    np.testing.assert_array_equal(greedy, want)


CONFIGS = [
    # temperature, top_k, top_p, min_p, vocab, logit scale: which path
    (0.8, 40, 0.95, 0.05, GEMMA_VOCAB, 3.0),  # the defaults: ranked candidates
    (0.7, 50, 0.8, 0.1, GEMMA_VOCAB, 2.0),
    (1.0, 0, 1.0, 0.0, GEMMA_VOCAB, 3.0),  # no truncation: the draw over the row
    (0.6, 0, 0.9, 0.0, GEMMA_VOCAB, 4.0),  # top_p alone on a peaked row: candidates
    (0.9, 0, 0.9, 0.0, 20000, 0.3),  # top_p alone on a flat row: bisection by mass
    (1.5, 3000, 1.0, 0.0, 20000, 1.0),  # a wide top_k: bisection by count
    (1.2, 3000, 0.6, 0.0, 20000, 0.5),  # a wide top_k, then top_p over it
    (1.1, 2500, 1.0, 0.01, 8000, 1.0),  # a wide top_k cut by min_p
    (0.9, 0, 1.0, 0.3, 151937, 2.0),  # min_p alone
    (2.0, 10, 1.0, 0.0, 4099, "ties"),  # ties at the k-th logit are kept
    (1.3, 5, 0.7, 0.0, 535, 1.0),  # a tiny vocabulary
]


@pytest.mark.parametrize("parts", [1, 32])
@pytest.mark.parametrize("t,k,p,mp,n,scale", CONFIGS)
def test_picks_equal_the_host_reference(rt, lib, dev, t, k, p, mp, n, scale, parts):
    rng = np.random.default_rng()
    rows = 16
    if scale == "ties":
        logits = np.round(rng.standard_normal((rows, n)) * 4) / 4
    else:
        logits = rng.standard_normal((rows, n)) * scale * rng.uniform(0.5, 1.5, (rows, 1))
    logits = logits.astype(np.float32)
    picks = [DeviceSampling(t, k, p, mp, key=int(rng.integers(2**63)), counter=int(c))
             for c in rng.integers(0, 2**32, rows)]  # fmt: skip
    got = sample(rt, lib, dev, logits, picks, parts)
    want = [sample_host(row, pk) for row, pk in zip(logits, picks)]
    for row, pk, g in zip(logits, picks, got):
        assert g in set(kept_set(row, pk).tolist()), (g, pk)
    mismatches = int(np.sum(got != np.array(want)))
    assert mismatches <= 1, (got, want)  # a float tie-break at a boundary, at most


@pytest.mark.parametrize("n", [GEMMA_VOCAB, 535, 4099])
def test_masked_picks_equal_the_host_reference(rt, lib, dev, n):
    """Token masks (structured output) on the device: masked tokens are never picked, greedy and
    sampled picks equal sample_host's with the same mask, and a row whose mask allows nothing
    gets -1."""
    from forge.backend import pack_token_mask

    rng = np.random.default_rng()
    rows = 12
    logits = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    allowed = rng.random((rows, n)) < rng.uniform(0.001, 0.5, (rows, 1))
    allowed[:, 0] = True  # never empty
    allowed[0, np.argmax(logits[0])] = False  # the argmax masked out
    allowed[1] = False
    allowed[1, [3, n - 1]] = True  # two tokens left
    masks = [pack_token_mask(a) for a in allowed]
    for t, k, p in ((0.0, 0, 1.0), (0.8, 40, 0.95), (1.0, 0, 1.0)):
        picks = [DeviceSampling(t, k, p, key=int(rng.integers(2**63)), counter=i, mask=m)
                 for i, m in enumerate(masks)]  # fmt: skip
        got = sample(rt, lib, dev, logits, picks)
        assert all(allowed[r, g] for r, g in enumerate(got)), t
        want = [sample_host(row, pk) for row, pk in zip(logits, picks)]
        assert int(np.sum(got != np.array(want))) <= 1, (t, got, want)
    nothing = [DeviceSampling(mask=pack_token_mask(np.zeros(n, bool)))] * 2
    np.testing.assert_array_equal(sample(rt, lib, dev, logits[:2], nothing), [-1, -1])


def _chi2_critical(df, alpha=1e-4):
    try:
        from scipy.stats import chi2

        return float(chi2.ppf(1 - alpha, df))
    except ImportError:  # Wilson-Hilferty
        z = 3.719  # the normal's 1 - 1e-4 quantile
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "pick",
    [
        DeviceSampling(0.9, 12, 0.9, 0.02),
        DeviceSampling(1.3, 0, 1.0, 0.0),
        DeviceSampling(0.7, 0, 0.95, 0.0),
    ],  # fmt: skip
)
def test_frequencies_match_the_renormalized_distribution(rt, lib, dev, pick):
    """Many draws (counters 0 .. N - 1) of one row: chi-square against the kept tokens'
    softmax at the temperature; the same test rejects the unrenormalized distribution."""
    rng = np.random.default_rng(1)
    n, draws = 400, 20000
    row = (rng.standard_normal(n) * 1.5).astype(np.float32)
    row[:30] += 3.0  # a few likely tokens
    pick = DeviceSampling(pick.temperature, pick.top_k, pick.top_p, pick.min_p, key=987654321)
    picks = [DeviceSampling(pick.temperature, pick.top_k, pick.top_p, pick.min_p, pick.key, c)
             for c in range(draws)]  # fmt: skip
    got = sample(rt, lib, dev, np.broadcast_to(row, (draws, n)), picks)
    kept = kept_set(row, pick)
    assert np.isin(got, kept).all()
    w = np.exp((row[kept].astype(np.float64) - row.max()) / pick.temperature)
    expected = draws * w / w.sum()
    counts = np.bincount(got, minlength=n)[kept]
    big = expected >= 5  # pool the rare tokens into one cell
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    crit = _chi2_critical(len(obs) - 1)
    assert stat < crit, (stat, crit)
    # power: the same statistic rejects the plain softmax of the row (no cut, temperature 1)
    plain = np.exp(row.astype(np.float64) - row.max())
    e2 = draws * plain / plain.sum()
    c2 = np.bincount(got, minlength=n)
    assert float(((c2 - e2) ** 2 / e2).sum()) > _chi2_critical(n - 1)


def test_same_key_and_counter_same_ids(rt, lib, dev):
    rng = np.random.default_rng()
    rows, n = 32, GEMMA_VOCAB
    logits = (rng.standard_normal((rows, n)) * 1.0).astype(np.float32)
    picks = [DeviceSampling(1.0, 0, 0.98, 0.0, key=77, counter=c) for c in range(rows)]
    a = sample(rt, lib, dev, logits, picks)
    np.testing.assert_array_equal(a, sample(rt, lib, dev, logits, picks))
    other = [DeviceSampling(1.0, 0, 0.98, 0.0, key=78, counter=c) for c in range(rows)]
    assert (a != sample(rt, lib, dev, logits, other)).sum() > rows // 2


@pytest.mark.parametrize("parts", [1, 6])
def test_bad_rows_give_minus_one(rt, lib, dev, parts):
    n = 1000
    logits = np.zeros((4, n), np.float32)
    logits[0, 917] = np.nan  # in the last slice of six
    logits[1, :] = -np.inf
    logits[2, 5] = np.inf
    logits[3, :] = -np.inf
    logits[3, 842] = 1.0  # everything else masked: the one token left
    picks = [DeviceSampling(0.8, 40, 0.9, 0.05, key=1, counter=i) for i in range(4)]
    np.testing.assert_array_equal(sample(rt, lib, dev, logits, picks, parts), [-1, -1, -1, 842])
    np.testing.assert_array_equal(sample(rt, lib, dev, logits, [DeviceSampling()] * 4, parts),
                                  [-1, -1, -1, 842])  # fmt: skip
