"""llama.cpp's logits with K and V cached as Q8_0 (tests/data/kv_q8_0.json.gz, made by
scripts/make_kv_golden.py: llama-cpp-python 0.3.36, flash attention on, as a quantized V cache
requires) and the bounds forge's Q8_0 caches are held to against them, on every backend."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.support.golden_rules import BOUNDS

REFERENCE = json.loads(gzip.decompress((Path(__file__).parents[1] / "data" / "kv_q8_0.json.gz")
                                       .read_bytes()))  # fmt: skip
Q8_0_KV = {"kv_cache_type_k": "q8_0", "kv_cache_type_v": "q8_0"}
# The README's quantized bounds hold for llama and qwen2. qwen3 and gemma3 miss them (max 0.160
# / 0.196, mean 0.039 / 0.038 on cpu_simd): their Q/K norms leave K values whose 8-bit roundings
# fall differently in forge and llama.cpp once the two K differ by the usual ~1e-3 (a quarter of
# the roundings of a block sit that close to a half step), so the two caches carry largely
# independent rounding noise; llama.cpp's own q8_0 cache moves its logits by 0.125 / 0.030
# (max / mean) from its float32 cache on qwen3, forge's by 0.126 / 0.034. Reported on the issue.
KV_BOUNDS = {"qwen3-q4_k_m.gguf": (0.25, 0.05), "gemma3-q4_k_m.gguf": (0.25, 0.05)}


def kv_bounds(model_file: str) -> tuple[float, float]:
    """(max, mean) bound of a model run with a Q8_0 cache against REFERENCE."""
    return KV_BOUNDS.get(model_file, BOUNDS["quant"])
