"""Fixtures of the hip host tests (no GPU: a recording fake runtime)."""

from __future__ import annotations

import json

import pytest
from forge_hip.tuning import load_tuning


@pytest.fixture
def hip_knobs(tmp_path, monkeypatch):
    """A function setting forge_hip tuning knobs (name=value) for the rest of the test, through
    a $FORGE_HIP_TUNING file; the knobs are read afresh before and after."""

    def apply(**values) -> None:
        path = tmp_path / "hip_knobs.json"
        path.write_text(json.dumps({"knobs": {k: {"value": v} for k, v in values.items()}}))
        monkeypatch.setenv("FORGE_HIP_TUNING", str(path))
        load_tuning.cache_clear()  # (a device's knobs are read once)

    yield apply
    load_tuning.cache_clear()


@pytest.fixture
def attn_decode_path(hip_knobs):
    """Decode steps on attention.hip's attn_decode, as AMD GPUs, quantized caches and NVIDIA
    with `tc_decode` off run them (the fake runtime says sm_90, where a float16 cache would
    otherwise take attn_decode_tc)."""
    hip_knobs(tc_decode=False)
