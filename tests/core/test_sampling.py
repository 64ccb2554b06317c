"""Sampling: each stage against float64 references, the pickers, the chain and the registry."""

from __future__ import annotations

import math

import numpy as np
import pluggy
import pytest

import forge.hookspecs
from forge.errors import ConfigError, ForgeRuntimeError, PluginError, UsageError
from forge.hookspecs import hookimpl
from forge.sampling import (
    DEFAULT_CHAIN,
    SamplerRegistry,
    SamplingContext,
    SamplingParams,
    build_sampler,
    builtin,
    default_registry,
    select,
    stages,
)

VOCAB = 262144
OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)  # every truncation stage inactive


# ---------------------------------------------------------------- float64 references


def softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def ref_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Kept mask: values >= the k-th largest."""
    return x >= np.sort(x)[::-1][k - 1]


def ref_top_p(x: np.ndarray, p: float) -> np.ndarray:
    probs = softmax64(x)
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    m = int(np.argmax(cum >= p)) if cum[-1] >= p else len(x) - 1
    return x >= x[order[m]]


def assert_nucleus(kept: np.ndarray, x: np.ndarray, p: float, tol: float = 1e-9) -> None:
    """``kept`` is ``x >= t`` for a logit ``t`` with mass(x > t) < p <= mass(x >= t), both
    bounds within ``tol`` of p (float32 weights can move a cut that close to p by a token)."""
    t = x[kept].min()
    np.testing.assert_array_equal(kept, x >= t)
    probs = softmax64(x)
    assert probs[x > t].sum() < p + tol and probs[kept].sum() >= p - tol
    exact = ref_top_p(x, p)
    if not np.array_equal(kept, exact):
        print(f"nucleus differs from float64 by {int(kept.sum()) - int(exact.sum())} tokens")


def ref_min_p(x: np.ndarray, p: float) -> np.ndarray:
    probs = softmax64(x)
    return probs >= p * probs.max()


def run_stage(stage, logits, ctx=None) -> np.ndarray:
    return stage(np.array(logits, dtype=np.float32), ctx or SamplingContext())


def flat_logits(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 3).astype(np.float32)


def peaked_logits(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 2).astype(np.float32)
    x[rng.choice(n, 20, replace=False)] += rng.uniform(6, 12, 20).astype(np.float32)
    return x


# ---------------------------------------------------------------- params


def test_params_defaults_and_json_style_input():
    p = SamplingParams.model_validate({"logit_bias": {"7": -5, "3": float("-inf")}, "seed": 4})
    assert p.logit_bias == {7: -5.0, 3: -math.inf}
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_last_n) == (0.8, 40, 0.95, 0.05, 64)


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", -0.01),
        ("min_p", 1.01),
        ("repeat_penalty", 0.0),
        ("repeat_last_n", -2),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("seed", -1),
        ("chain", 5),
        ("constraint", {"kind": "xml"}),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {10**30: 1.0}),  # (was an OverflowError in the sampler stage)
        ("logit_bias", {1: float("nan")}),
        ("logit_bias", {1: float("inf")}),
        ("no_such_knob", 1),
    ],
)
def test_invalid_params_raise_config_error_naming_field(field, value):
    with pytest.raises(ConfigError) as info:
        SamplingParams(**{field: value})
    assert field in str(info.value)
    assert any(f.split(".")[0] == field for f in info.value.fields)
    with pytest.raises(ConfigError, match=field):
        SamplingParams.model_validate({field: value})
    with pytest.raises(ConfigError, match=field):
        build_sampler({field: value})


def test_config_error_lists_every_bad_field():
    with pytest.raises(ConfigError) as info:
        SamplingParams(top_k=-1, top_p=2.0)
    assert set(info.value.fields) == {"top_k", "top_p"}


# ---------------------------------------------------------------- logit_bias, penalties


def test_logit_bias_adds_and_bans():
    stage = stages.logit_bias(SamplingParams(logit_bias={1: 2.5, 3: -math.inf}))
    out = run_stage(stage, [0.0, 1.0, -1.0, 4.0])
    assert out.tolist() == [0.0, 3.5, -1.0, -math.inf]
    assert stages.logit_bias(SamplingParams()) is None


def test_logit_bias_outside_vocab_is_config_error():
    for token in (4, 10):
        stage = stages.logit_bias(SamplingParams(logit_bias={0: 1.0, token: 1.0}))
        with pytest.raises(ConfigError, match=f"token {token}.*4 tokens"):
            run_stage(stage, [0.0, 0.0, 0.0, 0.0])


def test_penalties_match_hand_computed_values():
    params = SamplingParams(
        repeat_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25, repeat_last_n=-1
    )
    ctx = SamplingContext([0, 1, 1, 3, 4, 1])
    out = run_stage(stages.penalties(params), [2.0, -1.0, 0.5, 3.0, 0.0], ctx)
    # token 0 (x1): 2/2 - 0.25 - 0.5; token 1 (x3, negative): -1*2 - 0.75 - 0.5;
    # token 2 unseen; token 3 (x1): 3/2 - 0.75; token 4 (x1, zero logit): 0*2 - 0.75
    np.testing.assert_array_equal(out, np.float32([0.25, -3.25, 0.5, 0.75, -0.75]))


def test_penalties_window_and_off_switches():
    ctx = SamplingContext([2, 2, 0, 1])  # last 2 tokens: 0 and 1
    params = SamplingParams(repeat_penalty=1.5, repeat_last_n=2)
    out = run_stage(stages.penalties(params), [3.0, -3.0, 3.0], ctx)
    np.testing.assert_allclose(out, [2.0, -4.5, 3.0], rtol=1e-6)
    assert stages.penalties(SamplingParams()) is None  # all at their neutral values
    assert stages.penalties(SamplingParams(repeat_penalty=1.3, repeat_last_n=0)) is None
    empty = run_stage(stages.penalties(params), [1.0, 2.0, 3.0], SamplingContext())
    assert empty.tolist() == [1.0, 2.0, 3.0]


def test_penalty_with_context_token_outside_vocab_is_usage_error():
    stage = stages.penalties(SamplingParams(repeat_penalty=1.2))
    with pytest.raises(UsageError, match="token 9"):
        run_stage(stage, [0.0, 0.0], SamplingContext([9]))


# ---------------------------------------------------------------- top_k


def test_top_k_keeps_ties_at_the_boundary():
    stage = stages.TopK(2)
    out = run_stage(stage, [5.0, 4.0, 1.0, 4.0, 4.0])
    assert np.isfinite(out).tolist() == [True, True, False, True, True]
    out = run_stage(stage, [1.0, 3.0, 3.0, 2.0])
    assert np.isfinite(out).tolist() == [False, True, True, False]


def test_top_k_larger_than_vocab_and_all_masked_but_one():
    assert run_stage(stages.TopK(10), [1.0, 2.0, 3.0]).tolist() == [1.0, 2.0, 3.0]
    out = run_stage(stages.TopK(3), [-math.inf, 0.5, -math.inf, -math.inf])
    assert out.tolist() == [-math.inf, 0.5, -math.inf, -math.inf]


@pytest.mark.parametrize("k", [1, 40, 1000, 100000])
@pytest.mark.parametrize("kind", ["flat", "peaked", "ascending", "few_values", "sampled_bans"])
def test_top_k_on_full_vocab_matches_reference(k, kind):
    if kind == "ascending":  # values sorted by id
        x = np.linspace(-10, 10, VOCAB, dtype=np.float32)
    elif kind == "few_values":  # huge ties
        x = np.random.default_rng(k).integers(0, 5, VOCAB).astype(np.float32)
    else:
        x = (flat_logits if kind != "peaked" else peaked_logits)(VOCAB, seed=k)
    if kind == "sampled_bans":  # the subsample that guesses the threshold sees only -inf
        x[select._sample_ids(VOCAB)] = -np.inf
    out = run_stage(stages.TopK(k), x)
    kept = np.isfinite(out)
    np.testing.assert_array_equal(kept, ref_top_k(x, k))
    np.testing.assert_array_equal(out[kept], x[kept])


# ---------------------------------------------------------------- top_p


@pytest.mark.parametrize("p, kept", [(0.45, 1), (0.7, 2), (0.81, 3), (0.99, 4)])
def test_top_p_hand_computed(p, kept):
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    out = run_stage(stages.TopP(p), logits)
    assert np.isfinite(out).tolist() == [i < kept for i in range(4)]


def test_top_p_ties_all_masked_but_one_and_off():
    out = run_stage(stages.TopP(0.3), [1.0, 1.0, 1.0, 1.0])
    assert np.isfinite(out).all()  # the token admitted first has three ties
    out = run_stage(stages.TopP(0.5), [-math.inf, -math.inf, 2.0])
    assert out.tolist() == [-math.inf, -math.inf, 2.0]
    assert stages.top_p(SamplingParams(top_p=1.0)) is None
    assert "top_p" not in build_sampler(SamplingParams(top_p=1.0)).chain


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("kind", ["flat", "peaked", "ascending", "strided_bans", "sampled_bans"])
def test_top_p_on_full_vocab_matches_reference(p, kind):
    if kind == "ascending":
        x = np.linspace(-3, 3, VOCAB, dtype=np.float32)
    else:
        x = (flat_logits if kind != "peaked" else peaked_logits)(VOCAB, seed=int(p * 1000))
    if kind == "strided_bans":
        x[:: select.STRIDE] = -np.inf
    if kind == "sampled_bans":  # the subsample that brackets the threshold sees only -inf
        x[select._sample_ids(VOCAB)] = -np.inf
    out = run_stage(stages.TopP(p), x)
    kept = np.isfinite(out)
    assert_nucleus(kept, x, p)
    np.testing.assert_array_equal(out[kept], x[kept])


@pytest.mark.parametrize("offset", [-1e-3, -1e-5, 1e-5, 1e-3, 0.02])
def test_top_p_when_the_nucleus_ends_near_the_head(offset):
    # ~95% of the mass in 300 tokens; p is set just around the mass of the select.HEAD
    # highest values, where the search switches from the head to the whole vocabulary.
    rng = np.random.default_rng(17)
    x = (rng.standard_normal(VOCAB) * 0.5).astype(np.float32)
    x[rng.choice(VOCAB, 300, replace=False)] = rng.uniform(9.6, 10.0, 300).astype(np.float32)
    p = float(np.sort(softmax64(x))[::-1][: select.HEAD].sum()) + offset
    assert_nucleus(np.isfinite(run_stage(stages.TopP(p), x)), x, p)


def test_top_p_after_masking_renormalises_over_survivors():
    x = flat_logits(VOCAB, seed=3)
    x[np.random.default_rng(4).random(VOCAB) < 0.9] = -np.inf  # sparse path
    out = run_stage(stages.TopP(0.6), x)
    np.testing.assert_array_equal(np.isfinite(out), ref_top_p(x, 0.6))
    assert np.isfinite(out).sum() < np.isfinite(x).sum() / 2


# ---------------------------------------------------------------- min_p, temperature


@pytest.mark.parametrize("p", [0.01, 0.05, 0.3])
def test_min_p_matches_reference(p):
    x = peaked_logits(VOCAB, seed=11)
    out = run_stage(stages.MinP(p), x)
    np.testing.assert_array_equal(np.isfinite(out), ref_min_p(x, p))
    small = run_stage(stages.MinP(p), np.log([0.6, 0.2, 0.019, 0.181]))
    assert np.isfinite(small).tolist() == [True, p <= 1 / 3, p <= 0.019 / 0.6, p <= 0.181 / 0.6]


def test_min_p_one_keeps_the_maximum_and_its_ties():
    out = run_stage(stages.MinP(1.0), [2.0, 3.0, 1.0, 3.0])
    assert np.isfinite(out).tolist() == [False, True, False, True]
    assert stages.min_p(SamplingParams(min_p=0.0)) is None


def test_temperature_scales_the_distribution():
    x = np.float32([1.0, -2.0, 0.5, 3.0])
    out = run_stage(stages.Temperature(0.5), x)
    np.testing.assert_allclose(softmax64(out), softmax64(x.astype(np.float64) / 0.5), rtol=1e-6)
    zero = run_stage(stages.Temperature(0.0), [1.0, 3.0, 3.0, -math.inf])
    assert np.isfinite(zero).tolist() == [False, True, True, False]
    assert stages.temperature(SamplingParams(temperature=1.0)) is None


# ---------------------------------------------------------------- pickers


def test_greedy_picks_argmax_lowest_id_on_ties_and_skips_truncation():
    sampler = build_sampler(SamplingParams(temperature=0))
    assert sampler.chain == ["greedy"]
    assert sampler.sample(np.float32([0.1, 2.0, -1.0, 2.0])) == 1
    biased = build_sampler(SamplingParams(temperature=0, logit_bias={2: 5.0}))
    assert biased.chain == ["logit_bias", "greedy"]
    assert biased.sample(np.float32([0.1, 2.0, -1.0, 2.0])) == 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("picker", ["greedy", "dist"])
def test_pickers_reject_nan_inf_and_all_masked(bad, picker):
    sampler = build_sampler(SamplingParams(chain=[picker], seed=0))
    with pytest.raises(ForgeRuntimeError, match=str(bad)):
        sampler.sample(np.float32([0.0, bad, 1.0]))
    with pytest.raises(ForgeRuntimeError, match="masked"):
        sampler.sample(np.full(4, -np.inf, dtype=np.float32))
    banned = build_sampler(SamplingParams(chain=["logit_bias", picker], logit_bias={0: -np.inf}))
    with pytest.raises(ForgeRuntimeError, match="masked"):
        banned.sample(np.float32([1.0]))


def test_dist_frequencies_pass_chi_square():
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])
    sampler = build_sampler(SamplingParams(seed=1234, **OFF))
    draws = 20000
    counts = np.bincount(
        [sampler.sample(np.log(probs).astype(np.float32)) for _ in range(draws)], minlength=6
    )
    chi2 = float((((counts - draws * probs) ** 2) / (draws * probs)).sum())
    assert chi2 < 20.52, (chi2, counts)  # chi-square critical value, 5 dof, alpha 0.001


def test_dist_never_picks_masked_and_respects_all_masked_but_one():
    sampler = build_sampler(SamplingParams(seed=5, **OFF))
    logits = np.float32([-np.inf, 0.0, -np.inf, 0.0])
    assert {sampler.sample(logits) for _ in range(200)} == {1, 3}
    logits = np.full(VOCAB, -np.inf, dtype=np.float32)
    logits[123457] = -50.0
    assert sampler.sample(logits) == 123457


def test_weighted_index_matches_float64_cumsum_on_a_full_vocab():
    rng = np.random.default_rng(8)
    w = rng.random(VOCAB).astype(np.float32)
    w[rng.random(VOCAB) < 0.5] = 0  # zero weights must never be chosen
    w[:600] = 0  # a whole empty block and more
    cum = np.cumsum(w.astype(np.float64))
    for u in [0.0, 1e-9, 0.25, 0.5, 0.999999, np.nextafter(1.0, 0.0), *rng.random(200)]:
        i = select.weighted_index(w, float(u))
        assert w[i] > 0
        ref = int(np.searchsorted(cum, u * cum[-1], side="right"))
        assert abs(i - ref) <= 1 or cum[i - 1] == cum[ref - 1], (u, i, ref)


def test_dist_on_full_vocab_follows_the_softmax():
    x = np.full(VOCAB, -np.inf, dtype=np.float32)
    ids = np.array([3, 70000, 200001, 262143])  # far apart: different blocks
    x[ids] = np.log([0.5, 0.25, 0.125, 0.125])
    x[1000:1100] = -3.0  # a small dense background: 100 * e^-3 / (1 + ...) of the mass
    x = np.where(np.isfinite(x), x, np.float32(-30.0))  # keep the vocabulary dense
    probs = softmax64(x)
    sampler = build_sampler(SamplingParams(seed=99, **OFF))
    draws = 1500
    tokens = np.array([sampler.sample(x) for _ in range(draws)])
    for cell in [ids[0], ids[1], ids[2], ids[3]]:
        expect = draws * probs[cell]
        assert abs((tokens == cell).sum() - expect) < 4 * math.sqrt(expect), cell
    background = draws * probs[1000:1100].sum()
    assert abs(((tokens >= 1000) & (tokens < 1100)).sum() - background) < 4 * math.sqrt(background)


# ---------------------------------------------------------------- determinism, context


def _generate(seed, n=40, **kw) -> list[int]:
    sampler = build_sampler(SamplingParams(seed=seed, **kw), tokens=[1, 2, 3])
    rng = np.random.default_rng(0)  # the same logits for every run
    out = []
    for _ in range(n):
        token = sampler.sample(rng.standard_normal(512).astype(np.float32))
        sampler.accept(token)
        out.append(token)
    return out


def test_same_seed_same_sequence_different_seed_differs():
    kw = dict(temperature=1.2, top_k=50, repeat_penalty=1.3, frequency_penalty=0.5)
    assert _generate(7, **kw) == _generate(7, **kw)
    assert _generate(7, **kw) != _generate(8, **kw)


def test_accept_feeds_penalties_and_reset_restarts():
    sampler = build_sampler(SamplingParams(temperature=0, presence_penalty=2.0), tokens=[0])
    logits = np.float32([3.0, 2.5, 0.0])
    assert sampler.sample(logits) == 1  # token 0 was in the prompt: 3 - 2 < 2.5
    sampler.accept(1)
    assert sampler.sample(logits) == 0  # both seen now: 1.0 vs 0.5
    assert sampler.ctx.tokens == [0, 1] and sampler.ctx.generated == [1]
    sampler.reset()
    assert sampler.sample(logits) == 0
    assert logits.tolist() == [3.0, 2.5, 0.0]  # input never modified


def test_sample_rejects_bad_shapes():
    sampler = build_sampler()
    with pytest.raises(UsageError):
        sampler.sample(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(UsageError):
        sampler.sample(np.zeros(0, dtype=np.float32))


# ---------------------------------------------------------------- chain building


def test_default_chain_order():
    assert DEFAULT_CHAIN == (
        "grammar", "logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature"
    )  # fmt: skip
    params = SamplingParams(logit_bias={0: 1.0}, repeat_penalty=1.1)
    assert build_sampler(params).chain == [*DEFAULT_CHAIN[1:], "dist"]  # grammar: no constraint


def test_chain_splits_llama_cpp_spelling():
    """--samplers "top_k;top_p;temperature" and a comma list name the same chain."""
    for text in ("top_k;top_p;temperature", "top_k, top_p, temperature"):
        assert SamplingParams(chain=text).chain == ["top_k", "top_p", "temperature"]


def test_chain_override_changes_the_result():
    # min_p first masks token 2 and the bias cannot revive it; bias first makes it the best.
    logits = np.float32([3.0, 2.9, -5.0])
    base = dict(min_p=0.5, logit_bias={2: 20.0})
    masked = build_sampler(SamplingParams(chain=["min_p", "logit_bias", "greedy"], **base))
    boosted = build_sampler(SamplingParams(chain=["logit_bias", "min_p", "greedy"], **base))
    assert masked.chain == ["min_p", "logit_bias", "greedy"]
    assert (masked.sample(logits), boosted.sample(logits)) == (0, 2)
    only_picker = build_sampler(SamplingParams(chain=[], temperature=0))
    assert only_picker.chain == ["greedy"]


def test_unknown_name_and_misplaced_sampler_are_config_errors():
    with pytest.raises(ConfigError) as info:
        build_sampler(SamplingParams(chain=["top_k", "typical_p"]))
    assert "'typical_p'" in str(info.value)
    assert all(name in str(info.value) for name in ["top_k", "min_p", "dist", "greedy"])
    with pytest.raises(ConfigError, match="'greedy' must be last"):
        build_sampler(SamplingParams(chain=["greedy", "top_k"]))


# ---------------------------------------------------------------- registry and plugins


def test_default_registry_registers_builtins_through_the_hook():
    registry = default_registry()
    assert registry.names("sampler") == ["dist", "greedy"]
    assert set(registry.names("stage")) == set(DEFAULT_CHAIN)
    assert {registry.get(n).plugin for n in registry.names()} == {builtin.__name__}


class ThirdParty:
    """A throwaway plugin: one stage and one sampler."""

    @hookimpl
    def forge_register_samplers(self, register):
        register("negate", lambda params: lambda logits, ctx: -logits)
        register("lowest_id", lambda params: lambda logits, ctx: 0, kind="sampler")


def _manager(*plugins) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(forge.hookspecs.PROJECT)
    pm.add_hookspecs(forge.hookspecs)
    pm.register(builtin)
    for plugin in plugins:
        pm.register(plugin, name=type(plugin).__name__)
    return pm


def test_third_party_stage_and_sampler_join_the_chain():
    registry = SamplerRegistry().collect(_manager(ThirdParty()))
    assert registry.get("negate").plugin == "ThirdParty"
    sampler = build_sampler(SamplingParams(chain=["negate"], temperature=0), registry)
    assert sampler.sample(np.float32([3.0, -1.0, 2.0])) == 1
    picker = build_sampler(SamplingParams(chain=["top_k", "lowest_id"], top_k=1), registry)
    assert picker.sample(np.float32([0.0, 5.0])) == 0


def test_registration_errors_name_the_plugins():
    class Duplicate:
        @hookimpl
        def forge_register_samplers(self, register):
            register("top_k", lambda params: None)

    class BadKind:
        @hookimpl
        def forge_register_samplers(self, register):
            register("x", lambda params: None, kind="filter")

    class Crashes:
        @hookimpl
        def forge_register_samplers(self, register):
            raise RuntimeError("boom")

    with pytest.raises(PluginError, match="'Duplicate'.*'top_k'.*forge.sampling.builtin"):
        SamplerRegistry().collect(_manager(Duplicate()))
    with pytest.raises(PluginError, match="'BadKind'.*'filter'"):
        SamplerRegistry().collect(_manager(BadKind()))
    with pytest.raises(PluginError, match="'Crashes'.*boom"):
        SamplerRegistry().collect(_manager(Crashes()))
    with pytest.raises(PluginError, match="not callable"):
        SamplerRegistry().register("y", "not a factory")


def test_misbehaving_stages_and_factories_are_plugin_errors():
    registry = default_registry()
    registry.register("shrinks", lambda params: lambda logits, ctx: logits[:1], plugin="p")
    registry.register("fails", lambda params: 1 / 0, plugin="p")
    registry.register("bad_pick", lambda params: lambda logits, ctx: 99, "sampler", plugin="p")
    with pytest.raises(PluginError, match="'shrinks'"):
        build_sampler(SamplingParams(chain=["shrinks"]), registry).sample(np.zeros(4, np.float32))
    with pytest.raises(PluginError, match="'fails'.*'p'.*ZeroDivisionError"):
        build_sampler(SamplingParams(chain=["fails"]), registry)
    with pytest.raises(PluginError, match="'bad_pick'.*99"):
        build_sampler(SamplingParams(chain=["bad_pick"]), registry).sample(np.zeros(4, np.float32))
