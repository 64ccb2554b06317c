"""cpu_simd with K and V cached as Q8_0 against llama.cpp run with the same cache types
(tests/data/kv_q8_0.json.gz, made by scripts/make_kv_golden.py: llama-cpp-python 0.3.36, flash
attention on, as a quantized V cache requires), by the golden README's quantized bounds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import forge
from tests.support.golden_rules import BOUNDS, greedy_mismatches, logit_errors

REFERENCE = json.loads(gzip.decompress((Path(__file__).parents[1] / "data" / "kv_q8_0.json.gz")
                                       .read_bytes()))  # fmt: skip
Q8_0_KV = {"kv_cache_type_k": "q8_0", "kv_cache_type_v": "q8_0"}
# The README's quantized bounds hold for llama and qwen2. qwen3 and gemma3 miss them (max 0.160
# / 0.196, mean 0.039 / 0.038): their Q/K norms leave K values whose 8-bit roundings fall
# differently in forge and llama.cpp once the two K differ by the usual ~1e-3 (a quarter of the
# roundings of a block sit that close to a half step), so the two caches carry largely
# independent rounding noise; llama.cpp's own q8_0 cache moves its logits by 0.125 / 0.030
# (max / mean) from its float32 cache on qwen3, forge's by 0.126 / 0.034. Reported on the issue.
KV_BOUNDS = {"qwen3-q4_k_m.gguf": (0.25, 0.05), "gemma3-q4_k_m.gguf": (0.25, 0.05)}


@pytest.mark.parametrize("entry", REFERENCE["models"], ids=lambda m: m["model"])
def test_q8_0_cache_matches_llama_cpp_with_the_same_cache(entry, golden_dir, report):
    path = str(golden_dir / "models" / entry["model"])
    worst_max = worst_mean = 0.0
    with forge.load(path, backend="cpu_simd", n_ctx=256, config=Q8_0_KV) as model:
        for case in entry["cases"]:
            assert model.tokenize(case["prompt"]) == case["tokens"]
            n = len(case["tokens"])
            logits = model.logits(case["tokens"] + case["greedy"])
            mx, mean = logit_errors(logits[:n], case["logits"])
            worst_max, worst_mean = max(worst_max, mx), max(worst_mean, mean)
            assert not greedy_mismatches(logits[n - 1 : -1], case["greedy"]), case["prompt"]
    report.append(f"golden q8_0 KV {entry['model']:20s} max {worst_max:.2e}  mean {worst_mean:.2e}")
    bound_max, bound_mean = KV_BOUNDS.get(entry["model"], BOUNDS["quant"])
    assert worst_max <= bound_max and worst_mean <= bound_mean, (worst_max, worst_mean)
