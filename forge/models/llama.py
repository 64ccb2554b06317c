"""Llama (also Mistral and other files that declare architecture "llama")."""

from forge.models.common import base_fields, uniform_layers
from forge.models.metadata import ArchMetadata
from forge.models.spec import ModelSpec


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    return ModelSpec(**fields, layers=uniform_layers(m, fields["n_layer"]))
