"""Llama (also Mistral and other files that declare architecture "llama")."""

from forge.models.common import base_fields, dense_ffn, uniform_layers
from forge.models.metadata import ArchMetadata
from forge.models.spec import ModelSpec


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    return ModelSpec(**fields, ffn=dense_ffn(m), layers=uniform_layers(m, fields["n_layer"]))
