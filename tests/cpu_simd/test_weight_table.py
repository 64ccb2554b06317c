"""The cpu_simd loader reads exactly the weights `forge.models.weights` lists for a model."""

from __future__ import annotations

import pytest

from forge.gguf import GGUFFile, open_gguf
from forge.models import build_spec
from forge.models.weights import model_weights
from forge.plugins import get_plugin_manager
from tests.support.golden_rules import golden_model_files


@pytest.mark.parametrize("name", golden_model_files() or ["<golden data missing>"])
def test_loader_reads_the_weight_table(golden_dir, name, monkeypatch):
    from forge_cpu_simd.runner import CpuRunner

    gguf = open_gguf(golden_dir / "models" / name)
    spec = build_spec(gguf)
    read: list[str] = []
    original = GGUFFile.raw
    monkeypatch.setattr(GGUFFile, "raw", lambda self, n: read.append(n) or original(self, n))
    CpuRunner(spec, gguf, get_plugin_manager().kernels)
    wanted = set(model_weights(spec))
    if not spec.tied_output:  # looked up row by row at run time, never prepared
        wanted.discard("token_embd.weight")
    assert set(read) == wanted
    assert len(read) == len(wanted)  # each read once
