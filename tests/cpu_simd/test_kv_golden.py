"""cpu_simd with K and V cached as Q8_0 against llama.cpp run with the same cache types
(tests/support/kv_golden.py: the data, and the bounds with their two exceptions)."""

from __future__ import annotations

import pytest

import forge
from tests.support.golden_rules import case_errors
from tests.support.kv_golden import Q8_0_KV, REFERENCE, kv_bounds


@pytest.mark.parametrize("entry", REFERENCE["models"], ids=lambda m: m["model"])
def test_q8_0_cache_matches_llama_cpp_with_the_same_cache(entry, golden_dir, report):
    path = str(golden_dir / "models" / entry["model"])
    with forge.load(path, backend="cpu_simd", n_ctx=256, config=Q8_0_KV) as model:
        worst_max, worst_mean = case_errors(model, entry["cases"])
    report.append(f"golden q8_0 KV {entry['model']:20s} max {worst_max:.2e}  mean {worst_mean:.2e}")
    bound_max, bound_mean = kv_bounds(entry["model"])
    assert worst_max <= bound_max and worst_mean <= bound_mean, (worst_max, worst_mean)
