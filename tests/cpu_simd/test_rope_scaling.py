"""RoPE scaling read from GGUF metadata (forge.models.rope) and applied by cpu_simd's rope tables,
against float64 references written from the formulas: YaRN as ggml's rope kernel defines it
(ramp between the correction dimensions, magnitude scale), and Llama 3.1's per-dimension
factors stored as the `rope_freqs` tensor (synthetic file, factors from the published llama3
rule)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from forge_cpu_simd.ops import rope_tables
from gguf import GGUFValueType as V

import forge
from forge.errors import ModelError
from forge.gguf import open_gguf
from forge.models import RopeScaling, build_spec
from forge.models.rope import rope_frequencies
from tests.support.gguf_factory import read_source, rewrite_gguf, tiny_model

POSITIONS = np.array([0, 1, 7, 100, 4095, 4096, 30000, 131071])


def yarn_reference(p, n_dims, base, factor, orig, beta_fast, beta_slow, attn_factor=1.0):
    """cos and sin of every rotated pair at position p, one pair at a time (ggml rope_yarn)."""

    def corr_dim(rotations):
        return n_dims * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0, math.floor(corr_dim(beta_fast)))
    high = min(n_dims - 1, math.ceil(corr_dim(beta_slow)))
    mscale = attn_factor * (1 + 0.1 * math.log(factor))
    cos, sin = [], []
    for i0 in range(0, n_dims, 2):
        extrap = p * base ** (-i0 / n_dims)
        interp = extrap / factor
        ramp = 1 - min(1.0, max(0.0, (i0 // 2 - low) / max(0.001, high - low)))
        theta = interp * (1 - ramp) + extrap * ramp
        cos.append(math.cos(theta) * mscale)
        sin.append(math.sin(theta) * mscale)
    return cos, sin


def test_gpt_oss_yarn_from_metadata(golden_dir):
    spec = build_spec(open_gguf(golden_dir / "models" / "gpt-oss-q8_0.gguf"))
    want = RopeScaling(kind="yarn", factor=32.0, original_context=4096, beta_fast=32.0,
                       beta_slow=1.0, mscale=1 + 0.1 * math.log(32.0))  # fmt: skip
    assert {layer.rope for layer in spec.layers} == {want}
    assert [layer.sliding_window for layer in spec.layers] == [8, None, 8, None]


@pytest.mark.parametrize("dims, base, factor, orig", [(64, 150000.0, 32.0, 4096),
                                                      (128, 1e6, 4.0, 32768)])  # fmt: skip
def test_yarn_tables_equal_the_reference(dims, base, factor, orig):
    scaling = RopeScaling(kind="yarn", factor=factor, original_context=orig,
                          mscale=1 + 0.1 * math.log(factor))  # fmt: skip
    cos, sin = rope_tables(POSITIONS, rope_frequencies(dims, base, scaling), scaling.mscale)
    for row, p in enumerate(POSITIONS.tolist()):
        want_cos, want_sin = yarn_reference(p, dims, base, factor, orig, 32.0, 1.0)
        np.testing.assert_allclose(cos[row], want_cos, atol=2e-6)
        np.testing.assert_allclose(sin[row], want_sin, atol=2e-6)


def test_yarn_attention_factor_and_bad_factor(golden_dir, tmp_path):
    src = golden_dir / "models" / "gpt-oss-q8_0.gguf"
    attn_factor = ("gpt-oss.rope.scaling.attn_factor", 0.5, V.FLOAT32, None)
    path = rewrite_gguf(src, tmp_path / "a.gguf", set_kv=[attn_factor])
    scaling = build_spec(open_gguf(path)).layers[0].rope
    assert scaling.mscale == pytest.approx(0.5 * (1 + 0.1 * math.log(32.0)))
    negative = ("gpt-oss.rope.scaling.factor", -2.0, V.FLOAT32, None)
    path = rewrite_gguf(src, tmp_path / "b.gguf", set_kv=[negative])
    with pytest.raises(ModelError, match=r"'gpt-oss.rope.scaling.factor' = -2.0 must be"):
        build_spec(open_gguf(path))


def llama3_factors(dims, base, factor=8.0, low=1.0, high=4.0, orig=8192):
    """Llama 3.1's per-pair frequency divisors (the published rope_type "llama3" rule)."""
    out = []
    for i in range(dims // 2):
        freq = base ** (-2 * i / dims)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(freq / ((1 - smooth) * freq / factor + smooth * freq))
    return np.array(out, np.float32)


@pytest.fixture
def llama31(tmp_path):
    """The tiny Llama model with Llama 3.1's factors (and, for comparison, all-ones factors)."""
    src = tiny_model(tmp_path / "llama.gguf", "llama")
    arch, kvs, tensors = read_source(src)

    def with_factors(name, factors):
        return rewrite_gguf((arch, kvs, tensors + [("rope_freqs.weight", factors, None)]),
                            tmp_path / name)  # fmt: skip

    return src, with_factors


def test_llama31_factors_divide_each_frequency(llama31):
    src, with_factors = llama31
    factors = llama3_factors(16, 10000.0)
    assert factors.min() == 1.0 and factors.max() == 8.0  # both ends of the rule occur
    model = forge.load(str(with_factors("l31.gguf", factors)), backend="cpu_simd", n_ctx=64)
    layer = model.spec.layers[0]
    assert layer.rope.kind == "llama3" and "rope_freqs.weight" in model.spec.weight_names()
    block = model.runner.blocks[0][0]
    cos, sin = rope_tables(POSITIONS, block.rope_freqs, layer.rope.mscale)
    for row, p in enumerate(POSITIONS.tolist()):
        theta = [p * 10000.0 ** (-2 * i / 16) / float(f) for i, f in enumerate(factors)]
        np.testing.assert_allclose(cos[row], np.cos(theta), atol=1e-6)
        np.testing.assert_allclose(sin[row], np.sin(theta), atol=1e-6)


def test_llama31_factors_change_the_logits_only_where_they_differ_from_one(llama31):
    src, with_factors = llama31
    ids = list(range(3, 40))

    def logits(path):
        return forge.load(str(path), backend="cpu_simd", n_ctx=64).logits(ids)

    plain = logits(src)
    np.testing.assert_array_equal(logits(with_factors("ones.gguf", np.ones(8, np.float32))), plain)
    scaled = logits(with_factors("l31.gguf", llama3_factors(16, 10000.0)))
    np.testing.assert_array_equal(scaled[0], plain[0])  # position 0 does not rotate
    assert np.abs(scaled[-1] - plain[-1]).max() > 1e-3


def test_llama31_factors_of_the_wrong_size_are_named(llama31):
    _, with_factors = llama31
    with pytest.raises(ModelError, match=r"tensor 'rope_freqs.weight' has shape \[4\].*\[8\]"):
        build_spec(open_gguf(with_factors("bad.gguf", np.ones(4, np.float32))))
