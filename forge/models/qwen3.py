"""Qwen3: per-head RMSNorm of Q and K, NeoX-style RoPE, no projection biases."""

from forge.models.common import base_fields, dense_ffn, uniform_layers
from forge.models.metadata import ArchMetadata
from forge.models.spec import Attention, ModelSpec


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    return ModelSpec(
        **fields,
        rope_neox=True,
        attention=Attention(qk_norm=True),
        ffn=dense_ffn(m),
        layers=uniform_layers(m, fields["n_layer"]),
    )
