"""forge_hip.capacity: the parts the hip kernels cannot run yet are refused by name before any
device work, and the memory estimate of a mixture of experts counts every expert."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from forge_hip.backend import HipBackend
from forge_hip.capacity import check_spec

from forge.errors import UnsupportedModelError
from forge.gguf import open_gguf
from forge.models import RopeScaling, build_spec


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
def test_gpt_oss_passes_with_sinks_yarn_and_mxfp4_experts(golden_dir, name):
    gguf, spec = _spec(golden_dir, name)
    assert spec.attention.sinks and spec.attention.out_bias
    assert spec.layers[0].rope.kind == "yarn"
    check_spec(spec, gguf)


class _Typed:
    """A GGUF stand-in whose tensors report `types[name]` (else their own type)."""

    def __init__(self, gguf, types):
        self.tensors = {n: SimpleNamespace(type=types.get(n, t.type), shape=t.shape)
                        for n, t in gguf.tensors.items()}  # fmt: skip


def test_mxfp4_outside_experts_is_refused_by_name(golden_dir):
    gguf, spec = _spec(golden_dir, "gpt-oss-mxfp4.gguf")
    typed = _Typed(gguf, {"blk.1.attn_q.weight": "MXFP4"})
    with pytest.raises(UnsupportedModelError, match=r"MXFP4 weights \(blk\.1\.attn_q\.weight\)"
                                                    r".*expert matrices only"):  # fmt: skip
        check_spec(spec, typed)


def test_unknown_weight_type_is_refused_by_name(golden_dir):
    gguf, spec = _spec(golden_dir, "qwen3-q8_0.gguf")
    typed = _Typed(gguf, {"blk.0.ffn_up.weight": "IQ4_NL"})
    with pytest.raises(UnsupportedModelError, match=r"IQ4_NL weights \(blk\.0\.ffn_up\.weight\)$"):
        check_spec(spec, typed)


@pytest.mark.parametrize("kind", ["yarn", "llama3"])
def test_table_rope_scalings_pass(golden_dir, kind):
    spec = _spec(golden_dir, "qwen3-q8_0.gguf")[1]
    layer = spec.layers[0].model_copy(update={"rope": RopeScaling(kind=kind, factor=4.0)})
    check_spec(spec.model_copy(update={"layers": (layer,) * spec.n_layer}))


def test_memory_estimate_counts_every_expert(golden_dir):
    gguf, spec = _spec(golden_dir, "qwen3moe-q4_k_m.gguf")
    experts = sum(t.nbytes for n, t in gguf.tensors.items() if "_exps." in n)
    assert experts > gguf.size // 2  # most of the file
    need = HipBackend().memory_needed(spec, gguf, 256)
    assert need["weights"] >= sum(t.nbytes for t in gguf.tensors.values())
