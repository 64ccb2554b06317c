"""Every model path reproduces llama.cpp (../shared/golden, rules in its README) on cpu_simd, with
the kernels that win (the compiled ones of forge_cpu_jit) and with NumPy forced
(``kernels = "builtin"``)."""

from __future__ import annotations

import numpy as np
import pytest

import forge
from tests.support.golden_rules import (
    BOUNDS,
    TIE,
    case_errors,
    check_default_model,
    golden_model_files,
    greedy_mismatches,
    weight_class,
)

MODELS = golden_model_files()
MOE_MODELS = golden_model_files("moe.json")
KERNELS = ["auto", "builtin"]  # the winning kernels (compiled), NumPy's


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model_file", MODELS or ["<golden data missing>"])
def test_synthetic_model(model_file, kernels, golden_dir, synthetic_golden, report):
    check_model(golden_dir, model_file, synthetic_golden[model_file], report, kernels)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("model_file", MOE_MODELS or ["<golden data missing>"])
def test_mixture_of_experts_model(model_file, kernels, golden_dir, moe_golden, report):
    check_model(golden_dir, model_file, moe_golden[model_file], report, kernels)


@pytest.mark.parametrize("model_file", MOE_MODELS or ["<golden data missing>"])
def test_mixture_of_experts_decode_follows_reference(model_file, golden_dir, moe_golden):
    """Token-by-token decoding (one row per step through the experts, decode attention with
    sinks and windows) gives llama.cpp's greedy tokens up to the first near tie, where the
    texts may legitimately part (the golden README's rule), or up to an end-of-generation
    token (the reference only stopped at EOS)."""
    model = forge.load(str(golden_dir / "models" / model_file), backend="cpu_simd", n_ctx=256)
    for case in moe_golden[model_file]["cases"]:
        out = model.complete(case["prompt"], max_tokens=len(case["greedy"]), temperature=0)
        forced = model.logits(case["tokens"] + case["greedy"])[len(case["tokens"]) - 1 :]
        for i, (ours, ref) in enumerate(zip(out.tokens, case["greedy"])):
            if ours != ref:
                row = forced[i]
                assert row[ours] - row[ref] <= TIE * row.std(), (case["prompt"], i)
                break
        else:
            assert len(out.tokens) == len(case["greedy"]) or out.finish_reason == "stop"


def check_model(golden_dir, model_file: str, entry: dict, report: list[str],
                kernels: str = "auto") -> None:  # fmt: skip
    """Tokens, logits and the teacher-forced greedy continuation of every case of `entry`."""
    model = forge.load(str(golden_dir / "models" / model_file), backend="cpu_simd", n_ctx=256,
                       config={"kernels": kernels})  # fmt: skip
    worst_max, worst_mean = case_errors(model, entry["cases"])
    report.append(f"golden cpu_simd {kernels:7s} {model_file:22s} max {worst_max:.2e}  "
                  f"mean {worst_mean:.2e}")  # fmt: skip
    bound_max, bound_mean = BOUNDS[weight_class(model_file)]
    assert worst_max <= bound_max and worst_mean <= bound_mean, (worst_max, worst_mean)


@pytest.fixture(scope="module", params=KERNELS)
def default_model(request, default_model_path):
    return forge.load(default_model_path, backend="cpu_simd", n_ctx=128,
                      config={"kernels": request.param})  # fmt: skip


def test_default_model_golden(default_model, golden_dir, report):
    import json

    compiled = getattr(default_model.runner.output.weight, "layout", "float32") == "gguf"
    kernels = "auto" if compiled else "builtin"
    cases = json.loads((golden_dir / "gemma3-270m.json").read_text())["models"][0]["cases"]
    for case in cases:
        assert default_model.tokenize(case["prompt"]) == case["tokens"]
        n = len(case["tokens"])
        logits = default_model.logits(case["tokens"] + case["greedy"])
        last = logits[n - 1]
        assert not check_default_model(last, case), case["prompt"]
        assert not greedy_mismatches(logits[n - 1 : -1], case["greedy"]), case["prompt"]
        diff = np.abs(last[case["last_top_ids"][:10]] - case["last_top_logits"][:10]).max()
        report.append(f"golden cpu_simd {kernels:7s} gemma3-270m {case['prompt'][:28]!r:32s} "
                      f"top10 dlogit {diff:.3f}")  # fmt: skip


def test_default_model_generates_reference_start(default_model, golden_dir):
    """Free-running greedy decode through the generation loop follows the reference text
    (the first tokens, before any near tie can let the continuations drift apart)."""
    import json

    case = json.loads((golden_dir / "gemma3-270m.json").read_text())["models"][0]["cases"][0]
    out = default_model.complete(case["prompt"], max_tokens=8, temperature=0)
    assert out.tokens == case["greedy"][:8]
    assert out.finish_reason == "length"
