"""Qwen3-MoE: Qwen3's attention (per-head Q/K RMSNorm, NeoX RoPE) and a mixture-of-experts FFN
whose router takes a softmax over every expert, keeps the top k and renormalises their weights
(llama.cpp's build_moe_ffn with norm_w for this architecture)."""

from forge.models.common import base_fields, uniform_layers
from forge.models.metadata import ArchMetadata
from forge.models.moe import expert_ffn
from forge.models.spec import Attention, ModelSpec


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    return ModelSpec(
        **fields,
        rope_neox=True,
        attention=Attention(qk_norm=True),
        ffn=expert_ffn(m, gating="softmax", norm_weights=True),
        layers=uniform_layers(m, fields["n_layer"]),
    )
