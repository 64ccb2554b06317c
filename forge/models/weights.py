"""The weight table: every tensor a model needs, with its shape and when it is present.

One row per tensor, grouped by the part that owns it (`forge.models.spec`). The shape checks at
load, both backends' loaders and the hip plan read this table; a new part brings its rows here.
Shapes are in GGML order: the row length (the product's K) first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from forge.models.rope import FREQS_TENSOR
from forge.models.spec import Attention, DenseFFN, ExpertFFN, ModelSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Weight:
    """One tensor of a part: `stem` is its name inside `blk.N.` (per-layer rows) or its whole
    name (model rows)."""

    stem: str  # e.g. "attn_q.weight"
    shape: Callable[[ModelSpec], Shape]
    # vectors: norms and biases (read as floats; an expert bias is one row per expert);
    # experts: the stacked matrices of a mixture of experts, [K, N, n_expert]
    kind: Literal["matrix", "vector", "experts"] = "matrix"
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
    _vec("attn_output.bias", lambda s: s.n_embd, lambda s: s.attention.out_bias),
    _vec("attn_sinks.weight", lambda s: s.n_head, lambda s: s.attention.sinks),
    _vec("post_attention_norm.weight", lambda s: s.n_embd, lambda s: s.attention.post_norm),
)

DENSE_FFN: tuple[Weight, ...] = (
    _vec("ffn_norm.weight", lambda s: s.n_embd),
    Weight("ffn_gate.weight", lambda s: (s.n_embd, s.ffn.n_ff)),
    Weight("ffn_up.weight", lambda s: (s.n_embd, s.ffn.n_ff)),
    Weight("ffn_down.weight", lambda s: (s.ffn.n_ff, s.n_embd)),
    _vec("post_ffw_norm.weight", lambda s: s.n_embd, lambda s: s.ffn.post_norm),
)


def _exps(stem: str, k: Callable[[ModelSpec], int], n: Callable[[ModelSpec], int]) -> Weight:
    return Weight(stem, lambda s: (k(s), n(s), s.ffn.n_expert), "experts")


def _exps_bias(stem: str, n: Callable[[ModelSpec], int]) -> Weight:
    return Weight(stem, lambda s: (n(s), s.ffn.n_expert), "vector", lambda s: s.ffn.expert_bias)


def _ff(s: ModelSpec) -> int:
    return s.ffn.n_ff


def _embd(s: ModelSpec) -> int:
    return s.n_embd


EXPERT_FFN: tuple[Weight, ...] = (
    _vec("ffn_norm.weight", _embd, lambda s: s.ffn.norm == "ffn_norm"),
    _vec("post_attention_norm.weight", _embd, lambda s: s.ffn.norm == "post_attention_norm"),
    Weight("ffn_gate_inp.weight", lambda s: (s.n_embd, s.ffn.n_expert)),  # the router
    _vec("ffn_gate_inp.bias", lambda s: s.ffn.n_expert, lambda s: s.ffn.router_bias),
    _exps("ffn_gate_exps.weight", _embd, _ff),
    _exps("ffn_up_exps.weight", _embd, _ff),
    _exps("ffn_down_exps.weight", _ff, _embd),
    _exps_bias("ffn_gate_exps.bias", _ff),
    _exps_bias("ffn_up_exps.bias", _ff),
    _exps_bias("ffn_down_exps.bias", _embd),
)

# Per-layer rows by part type.
PART_WEIGHTS: dict[type, tuple[Weight, ...]] = {
    Attention: ATTENTION,
    DenseFFN: DENSE_FFN,
    ExpertFFN: EXPERT_FFN,
}

# Rows outside the layers.
MODEL: tuple[Weight, ...] = (
    Weight("token_embd.weight", lambda s: (s.n_embd, s.n_vocab)),
    _vec("output_norm.weight", lambda s: s.n_embd),
    Weight("output.weight", lambda s: (s.n_embd, s.n_vocab), when=lambda s: not s.tied_output),
    _vec(
        FREQS_TENSOR,
        lambda s: s.rope_dim // 2,
        lambda s: any(layer.rope.kind == "llama3" for layer in s.layers),
    ),  # fmt: skip
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


def parameter_counts(spec: ModelSpec) -> tuple[int, int]:
    """(parameters of the whole model, parameters one token runs through): a mixture of
    experts counts only `n_expert_used / n_expert` of its expert weights and biases as active."""
    total = active = 0
    for name, w in model_weights(spec).items():
        n = math.prod(w.shape(spec))
        total += n
        per_expert = "_exps." in name
        active += n * spec.ffn.n_expert_used // spec.ffn.n_expert if per_expert else n
    return total, active
