"""The weight table: every tensor a model needs, with its shape and when it is present.

One row per tensor, grouped by the part that owns it (`forge.models.spec`). The shape checks at
load, both backends' loaders and the hip plan read this table; a new part brings its rows here.
Shapes are in GGML order: the row length (the product's K) first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from forge.models.spec import Attention, DenseFFN, ModelSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Weight:
    """One tensor of a part: `stem` is its name inside `blk.N.` (per-layer rows) or its whole
    name (model rows)."""

    stem: str  # e.g. "attn_q.weight"
    shape: Callable[[ModelSpec], Shape]
    kind: Literal["matrix", "vector"] = "matrix"  # vectors: norms and biases (read as floats)
    when: Callable[[ModelSpec], bool] = lambda s: True


def _q(s: ModelSpec) -> int:
    return s.n_head * s.head_dim


def _kv(s: ModelSpec) -> int:
    return s.n_head_kv * s.head_dim


def _v(s: ModelSpec) -> int:
    return s.n_head_kv * s.head_dim_v


def _vec(stem: str, size: Callable[[ModelSpec], int], when=lambda s: True) -> Weight:  # noqa: ANN001
    return Weight(stem, lambda s: (size(s),), "vector", when)


ATTENTION: tuple[Weight, ...] = (
    _vec("attn_norm.weight", lambda s: s.n_embd),
    Weight("attn_q.weight", lambda s: (s.n_embd, _q(s))),
    Weight("attn_k.weight", lambda s: (s.n_embd, _kv(s))),
    Weight("attn_v.weight", lambda s: (s.n_embd, _v(s))),
    _vec("attn_q.bias", _q, lambda s: s.attention.qkv_bias),
    _vec("attn_k.bias", _kv, lambda s: s.attention.qkv_bias),
    _vec("attn_v.bias", _v, lambda s: s.attention.qkv_bias),
    _vec("attn_q_norm.weight", lambda s: s.head_dim, lambda s: s.attention.qk_norm),
    _vec("attn_k_norm.weight", lambda s: s.head_dim, lambda s: s.attention.qk_norm),
    Weight("attn_output.weight", lambda s: (s.n_head * s.head_dim_v, s.n_embd)),
    _vec("post_attention_norm.weight", lambda s: s.n_embd, lambda s: s.attention.post_norm),
)

DENSE_FFN: tuple[Weight, ...] = (
    _vec("ffn_norm.weight", lambda s: s.n_embd),
    Weight("ffn_gate.weight", lambda s: (s.n_embd, s.ffn.n_ff)),
    Weight("ffn_up.weight", lambda s: (s.n_embd, s.ffn.n_ff)),
    Weight("ffn_down.weight", lambda s: (s.ffn.n_ff, s.n_embd)),
    _vec("post_ffw_norm.weight", lambda s: s.n_embd, lambda s: s.ffn.post_norm),
)

# Per-layer rows by part type.
PART_WEIGHTS: dict[type, tuple[Weight, ...]] = {Attention: ATTENTION, DenseFFN: DENSE_FFN}

# Rows outside the layers.
MODEL: tuple[Weight, ...] = (
    Weight("token_embd.weight", lambda s: (s.n_embd, s.n_vocab)),
    _vec("output_norm.weight", lambda s: s.n_embd),
    Weight("output.weight", lambda s: (s.n_embd, s.n_vocab), when=lambda s: not s.tied_output),
)


def layer_weights(spec: ModelSpec) -> Iterator[Weight]:
    """The per-layer rows present in `spec` (the same for every layer), attention first."""
    for part in (spec.attention, spec.ffn):
        yield from (w for w in PART_WEIGHTS[type(part)] if w.when(spec))


def layer_stems(spec: ModelSpec) -> set[str]:
    """Stems of the per-layer weights present in `spec`."""
    return {w.stem for w in layer_weights(spec)}


def model_weights(spec: ModelSpec) -> dict[str, Weight]:
    """Every tensor name the model needs, with its row: the model rows, then every layer's."""
    names = {w.stem: w for w in MODEL if w.when(spec)}
    rows = list(layer_weights(spec))
    for i in range(spec.n_layer):
        names.update((f"blk.{i}.{w.stem}", w) for w in rows)
    return names


def expected_shapes(spec: ModelSpec) -> dict[str, Shape]:
    """GGML-order shapes (row length first) of every weight the spec needs."""
    return {name: w.shape(spec) for name, w in model_weights(spec).items()}
