"""hip with quantized KV caches: Q8_0 against llama.cpp run with the same cache types
(tests/support/kv_golden.py), teacher-forced and free-running; and a 4,096-token prompt on the
synthetic gpt-oss (sinks, 8-position windows on half the layers) through attn_prefill and
attn_decode with each cache format, against cpu_simd and against hip's float16 cache."""

from __future__ import annotations

import numpy as np
import pytest

import forge
from tests.support.golden_rules import BOUNDS, case_errors, decode_departures, logit_errors
from tests.support.kv_golden import Q8_0_KV, REFERENCE, kv_bounds


@pytest.mark.parametrize("entry", REFERENCE["models"], ids=lambda m: m["model"])
def test_q8_0_cache_matches_llama_cpp_with_the_same_cache_gpu(rt, entry, golden_dir, report):
    path = str(golden_dir / "models" / entry["model"])
    with forge.load(path, backend="hip", n_ctx=256, config=Q8_0_KV) as model:
        worst_max, worst_mean = case_errors(model, entry["cases"], free_running=True)
    report.append(f"golden hip q8_0 KV {entry['model']:20s} max {worst_max:.2e}  "
                  f"mean {worst_mean:.2e}")  # fmt: skip
    bound_max, bound_mean = kv_bounds(entry["model"])
    assert worst_max <= bound_max and worst_mean <= bound_mean, (worst_max, worst_mean)


LONG = 4096
# A cache format against float16 (or the other backend's cache of that format): the rounding noise
# of every cached K and V over 4,096 positions (Q4_0's steps are 16 times Q8_0's).
CACHE_BOUNDS = {"q8_0": (0.25, 0.05), "q4_0": (1.0, 0.25), "bf16": (0.25, 0.05)}


def _run(path, backend, kv, ids, decode=False):
    """Logits of the last 16 positions of one pass over ids; with `decode`, first the 8 tokens
    that greedy decode steps pick after ids[:-8] (returned instead of None)."""
    config = {"kv_cache_type_k": kv, "kv_cache_type_v": kv}
    with forge.load(path, backend=backend, n_ctx=LONG + 64, config=config) as model:
        picks = model.complete(ids[:-8], max_tokens=8, temperature=0).tokens if decode else None
        return model.logits(ids)[-16:], picks


@pytest.fixture(scope="module")
def long_case(golden_dir):
    """gpt-oss-q8_0, a 4,096-token prompt and hip's greedy continuation with a float16 cache:
    (path, ids = prompt + 8 continuation tokens, hip f16 logits, cpu_simd f16 logits)."""
    path = str(golden_dir / "models" / "gpt-oss-q8_0.gguf")
    prompt = [int(t) for t in np.random.default_rng(7).integers(3, 400, LONG)]
    with forge.load(path, backend="hip", n_ctx=LONG + 64) as model:
        ids = prompt + model.complete(prompt, max_tokens=8, temperature=0).tokens
    return path, ids, _run(path, "hip", "f16", ids)[0], _run(path, "cpu_simd", "f16", ids)[0]


@pytest.mark.parametrize("kv", ["q8_0", "q4_0", "bf16"])
def test_long_prompt_cache_formats_gpu(rt, long_case, kv, report):
    path, ids, hip_f16, cpu_f16 = long_case
    got, picks = _run(path, "hip", kv, ids, decode=True)
    cpu = _run(path, "cpu_simd", kv, ids)[0]
    hip_cpu, vs_f16, vs_cpu = (logit_errors(hip_f16, cpu_f16), logit_errors(got, hip_f16),
                               logit_errors(got, cpu))  # fmt: skip
    report.append(f"4k prompt gpt-oss-q8_0: hip f16 vs cpu f16 {hip_cpu}; hip {kv} vs hip f16 "
                  f"{vs_f16}; hip {kv} vs cpu {kv} {vs_cpu}")  # fmt: skip
    assert hip_cpu[0] <= BOUNDS["quant"][0] and hip_cpu[1] <= BOUNDS["quant"][1], hip_cpu
    bound = CACHE_BOUNDS[kv]
    for mx, mean in (vs_f16, vs_cpu):
        assert mx <= bound[0] and mean <= bound[1], (vs_f16, vs_cpu)
    # the decode steps (attn_decode over the quantized cache) pick what the pass's rows pick
    # (got[7]: position LONG - 1), while they follow the continuation
    bad = decode_departures(picks, got[7:], ids[LONG:])
    assert not bad, bad
