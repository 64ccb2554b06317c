"""Spec-building pieces shared by the architecture modules."""

from __future__ import annotations

import math
from typing import Any

from forge.models.metadata import ArchMetadata
from forge.models.rope import rope_scaling
from forge.models.spec import DenseFFN, LayerSpec


def base_fields(m: ArchMetadata) -> dict[str, Any]:
    """Fields every supported architecture reads the same way."""
    n_embd = m.count("embedding_length")
    n_head = m.count("attention.head_count")
    head_dim = m.count("attention.key_length", n_embd // n_head)
    return {
        "arch": m.arch,
        "name": m.name(),
        "n_vocab": m.n_vocab(),
        "n_embd": n_embd,
        "n_layer": m.count("block_count"),
        "n_head": n_head,
        "n_head_kv": m.count("attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "head_dim_v": m.count("attention.value_length", head_dim),
        "n_ctx_train": m.count("context_length"),
        "rms_eps": m.float("attention.layer_norm_rms_epsilon"),
        "rope_dim": m.count("rope.dimension_count", head_dim),
        "attn_scale": 1.0 / math.sqrt(head_dim),
        "tied_output": "output.weight" not in m.gguf.tensors,
    }


def dense_ffn(m: ArchMetadata, **fields: Any) -> DenseFFN:
    """The gated FFN of `feed_forward_length` (other fields: DenseFFN's)."""
    return DenseFFN(n_ff=m.count("feed_forward_length"), **fields)


def uniform_layers(m: ArchMetadata, n_layer: int, default_base: float = 10000.0) -> tuple:
    """Every layer global, with the file's RoPE base and scaling."""
    layer = LayerSpec(rope_base=m.float("rope.freq_base", default_base), rope=rope_scaling(m))
    return (layer,) * n_layer
