"""forge_hip.capacity: the parts the hip kernels cannot run yet are refused by name before any
device work, and the memory estimate of a mixture of experts counts every expert."""

from __future__ import annotations

import pytest
from forge_hip.backend import HipBackend
from forge_hip.capacity import check_spec

from forge.errors import UnsupportedModelError
from forge.gguf import open_gguf
from forge.models import DenseFFN, RopeScaling, build_spec


def _spec(golden_dir, name):
    gguf = open_gguf(golden_dir / "models" / name)
    return gguf, build_spec(gguf)


def test_dense_golden_model_passes(golden_dir):
    check_spec(_spec(golden_dir, "qwen3-q8_0.gguf")[1])


def test_qwen3moe_passes_with_its_weight_types(golden_dir):
    for name in ("qwen3moe-q4_k_m.gguf", "qwen3moe-q8_0.gguf"):
        gguf, spec = _spec(golden_dir, name)
        check_spec(spec, gguf)


@pytest.mark.parametrize("name", ["gpt-oss-mxfp4.gguf", "gpt-oss-q8_0.gguf"])
def test_gpt_oss_is_refused_for_its_sinks(golden_dir, name):
    gguf, spec = _spec(golden_dir, name)
    with pytest.raises(UnsupportedModelError, match=r"attention sinks or an output bias"):
        check_spec(spec, gguf)


def test_attention_sinks_are_refused(golden_dir):
    spec = _spec(golden_dir, "gpt-oss-q8_0.gguf")[1].model_copy(update={"ffn": DenseFFN(n_ff=64)})
    with pytest.raises(UnsupportedModelError, match=r"attention sinks or an output bias"):
        check_spec(spec)


def test_yarn_rope_is_refused(golden_dir):
    spec = _spec(golden_dir, "qwen3-q8_0.gguf")[1]
    yarn = spec.layers[0].model_copy(update={"rope": RopeScaling(kind="yarn", factor=4.0)})
    with pytest.raises(UnsupportedModelError, match=r"RoPE scaling \['yarn'\]"):
        check_spec(spec.model_copy(update={"layers": (yarn,) * spec.n_layer}))


def test_memory_estimate_counts_every_expert(golden_dir):
    gguf, spec = _spec(golden_dir, "qwen3moe-q4_k_m.gguf")
    experts = sum(t.nbytes for n, t in gguf.tensors.items() if "_exps." in n)
    assert experts > gguf.size // 2  # most of the file
    need = HipBackend().memory_needed(spec, gguf, 256)
    assert need["weights"] >= sum(t.nbytes for t in gguf.tensors.values())
