"""cpu_simd's KV cache formats: what each stores against the `gguf` package's quantizers and
float references, its size, and a model run with them."""

from __future__ import annotations

import numpy as np
import pytest
from forge_cpu_simd.act_round import round_bf16
from forge_cpu_simd.kv_store import KvArray, query_rounding
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

import forge
from forge.errors import UnsupportedModelError, UsageError
from forge.kv_cache import KvFormat, KvTypes
from tests.support.golden_rules import BOUNDS, logit_errors

SLOTS, HEADS, DIM = 40, 3, 64


def _stored(fmt: KvFormat, x: np.ndarray) -> np.ndarray:
    """x [n, HEADS, DIM] written at scattered slots of a cache and read back."""
    cache = KvArray(fmt, SLOTS, HEADS, DIM)
    slots = np.random.default_rng(1).permutation(SLOTS)[: len(x)]
    cache.write(slots, x)
    others = np.setdiff1d(np.arange(SLOTS), slots)
    assert not cache.read(others).any()  # nothing else written
    return cache.read(slots)


@pytest.mark.parametrize("fmt", [KvFormat.Q8_0, KvFormat.Q4_0])
def test_quantized_formats_hold_what_gguf_quantizes(fmt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((17, HEADS, DIM)) * rng.uniform(0.1, 30, (17, HEADS, 1))).astype(
        np.float32
    )
    x[3, 1, :32] = 0  # an all-zero block
    qtype = GGMLQuantizationType[fmt.name]
    ref = dequantize(quantize(x.reshape(-1, DIM), qtype), qtype).reshape(x.shape)
    got = _stored(fmt, x)
    # gguf's reference rounds halves away from zero where llama.cpp's CPU copy rounds them to
    # even: an exact tie can land one step apart, nothing else
    same = got == ref
    assert same.mean() > 0.9999, same.mean()
    step = np.abs(x).reshape(17, HEADS, DIM // 32, 32).max(-1) / (
        127 if fmt is KvFormat.Q8_0 else 8
    )
    assert (np.abs(got - ref) <= np.repeat(step, 32, -1) * 1.001 + 1e-12).all()


def test_float_formats_round_as_their_types():
    x = np.random.default_rng(2).standard_normal((9, HEADS, DIM)).astype(np.float32) * 100
    np.testing.assert_array_equal(_stored(KvFormat.F32, x), x)
    np.testing.assert_array_equal(_stored(KvFormat.F16, x), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(
        _stored(KvFormat.BF16, x), round_bf16(x.reshape(9, -1)).reshape(x.shape)
    )


@pytest.mark.parametrize("fmt", list(KvFormat))
def test_sizes_follow_the_format(fmt):
    cache = KvArray(fmt, SLOTS, HEADS, DIM)
    assert cache.nbytes == fmt.nbytes(SLOTS * HEADS * DIM)
    assert {KvFormat.F32: 4.0, KvFormat.F16: 2.0, KvFormat.BF16: 2.0, KvFormat.Q8_0: 34 / 32,
            KvFormat.Q4_0: 18 / 32}[fmt] == fmt.nbytes(3200) / 3200  # fmt: skip


def test_quantized_formats_need_heads_of_whole_blocks():
    with pytest.raises(UnsupportedModelError, match="multiples of 32; this model's are 48"):
        KvArray(KvFormat.Q8_0, 4, 2, 48)
    KvArray(KvFormat.F16, 4, 2, 48)  # any size


def test_queries_are_rounded_as_llama_cpp_rounds_them_for_each_key_format():
    assert query_rounding(KvFormat.F32) is None
    q = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    for fmt in (KvFormat.Q8_0, KvFormat.Q4_0):
        r = query_rounding(fmt)(q)
        ref = dequantize(quantize(q, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
        assert np.abs(r - ref).max() <= np.abs(q).max() / 127 * 1.001


def test_kv_types_come_from_config_values():
    assert KvTypes.parse("q8_0", "auto").resolve(KvFormat.F32) == (KvFormat.Q8_0, KvFormat.F32)
    assert KvTypes.parse().resolve(KvFormat.F16) == (KvFormat.F16, KvFormat.F16)
    assert not KvTypes.parse().chosen and KvTypes.parse("auto", "q4_0").chosen
    with pytest.raises(UsageError, match="kv_cache_type_v must be one of auto, f32, f16"):
        KvTypes.parse("f16", "q5_1")


@pytest.fixture(scope="module")
def reference(golden_dir):
    path = str(golden_dir / "models" / "llama-q8_0.gguf")
    model = forge.load(path, backend="cpu_simd", n_ctx=128)
    yield path, model.logits(list(range(1, 60)))
    model.close()


# 4-bit keys move logits further than the weights' own quantization does (max 0.20, mean 0.053
# on this model); a misread cache gives errors near 1
LOOSE = (0.5, 0.1)


@pytest.mark.parametrize(
    "k,v,bound",
    [("q8_0", "q8_0", BOUNDS["quant"]), ("bf16", "q8_0", BOUNDS["quant"]), ("q4_0", "f16", LOOSE)],
)
def test_a_model_runs_on_each_format_close_to_the_float32_cache(reference, k, v, bound):
    path, ref = reference
    config = {"kv_cache_type_k": k, "kv_cache_type_v": v}
    with forge.load(path, backend="cpu_simd", n_ctx=128, config=config) as model:
        got = model.logits(list(range(1, 60)))
        fk, fv = KvFormat(k), KvFormat(v)
        assert model.runner.memory_estimate()["kv_cache"] == (
            model.allocator.n_blocks * 16 * model.spec.kv_bytes_per_token(fk, fv)
        )
        assert model.runner.k_cache[0].fmt is fk and model.runner.v_cache[0].fmt is fv
    mx, mean = logit_errors(got, ref)
    assert 0 < mx <= bound[0] and mean <= bound[1], (mx, mean)  # changed, and close


def test_float32_reads_of_consecutive_slots_are_read_only_views():
    rng = np.random.default_rng(5)
    cache = KvArray(KvFormat.F32, 64, 2, 32)
    values = rng.standard_normal((64, 2, 32)).astype(np.float32)
    cache.write(np.arange(64), values)
    run = cache.read(np.arange(10, 40))
    assert np.shares_memory(run, cache.values) and not run.flags.writeable
    assert np.array_equal(run, values[10:40])
    with pytest.raises(ValueError):
        run[0] = 0.0  # the cache cannot be changed through a read
    for slots in (np.array([3, 4, 6]), np.array([5, 4, 3]), np.array([7]), np.array([[1, 2]])):
        got = cache.read(slots)  # gaps, reversed, one slot, 2-D: copies
        assert not np.shares_memory(got, cache.values)
        assert np.array_equal(got, values[slots])
