"""The typed description of a decoder-only transformer that every architecture module produces.

A model is its sizes plus two typed parts per layer stack: the attention and the feed-forward
network. Each part says which of its optional pieces exist (biases, norms) and owns its weights
(`forge.models.weights` lists them, with their shapes). Backends dispatch on the part's type:
a new variant (say, an FFN of experts) is a new part class, its rows in the weight table and one
block per backend, not a flag threaded through every runner.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forge.kv_cache import KvFormat

Activation = Literal["silu", "gelu_tanh"]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RopeScaling(_Part):
    """How a layer's RoPE frequencies are stretched for contexts beyond the trained one
    (`forge.models.rope` turns it into per-dimension frequencies).

    - "none": theta_i = pos * base^(-2i/d).
    - "linear": positions are divided by `factor`.
    - "yarn": YaRN (llama.cpp's ggml_rope_yarn): each dimension mixes the interpolated
      frequency (divided by `factor`) with the original one, by a ramp over the dimensions
      whose wavelengths fall between `beta_fast` and `beta_slow` rotations of
      `original_context`; cos and sin are multiplied by `mscale`.
    - "llama3": Llama 3.1's scaling as llama.cpp's converter stores it: per-dimension
      frequency divisors in the model tensor `rope_freqs.weight`.
    """

    kind: Literal["none", "linear", "yarn", "llama3"] = "none"
    factor: float = Field(1.0, gt=0)  # linear, yarn: context extension factor
    original_context: int = Field(0, ge=0)  # yarn: the trained context before extension
    beta_fast: float = 32.0  # yarn: rotations at which the ramp starts (pure extrapolation)
    beta_slow: float = 1.0  # yarn: rotations at which it ends (pure interpolation)
    ext_factor: float = 1.0  # yarn: weight of the extrapolated frequency in the mix
    mscale: float = Field(1.0, gt=0)  # yarn: magnitude of cos and sin (attention temperature)


class LayerSpec(_Part):
    """What differs between layers (Gemma 3 and gpt-oss interleave sliding-window and global
    layers)."""

    sliding_window: int | None = None  # attend to at most this many latest positions; None = all
    rope_base: float = 10000.0  # RoPE frequency base for this layer
    rope: RopeScaling = RopeScaling()

    @property
    def rope_scale(self) -> float:
        """The linear scaling factor (1.0 unless `rope.kind` is "linear")."""
        return self.rope.factor if self.rope.kind == "linear" else 1.0


class Attention(_Part):
    """Grouped-query self-attention with RoPE: norm, Q/K/V projections, attention, output
    projection. Sizes (heads, head dims, RoPE dims) are the model's."""

    kind: Literal["gqa"] = "gqa"
    qkv_bias: bool = False  # Q/K/V projections carry biases (Qwen2, gpt-oss)
    out_bias: bool = False  # the output projection carries a bias (gpt-oss)
    qk_norm: bool = False  # per-head RMSNorm of Q and K before RoPE (Qwen3, Gemma 3)
    post_norm: bool = False  # RMSNorm of the output before the residual add (Gemma 3)
    # a learned logit per query head that joins each softmax's denominator, attending to
    # nothing (gpt-oss's `attn_sinks`)
    sinks: bool = False


class DenseFFN(_Part):
    """A gated feed-forward network: down(act(gate(h)) * up(h))."""

    kind: Literal["dense"] = "dense"
    n_ff: int = Field(gt=0)  # width of the gate/up projections
    activation: Activation = "silu"  # gate activation
    post_norm: bool = False  # RMSNorm of the output before the residual add (Gemma 3)


class ExpertFFN(_Part):
    """A mixture of experts: a router scores `n_expert` gated FFNs per token, the
    `n_expert_used` best run, and their outputs are summed with the router's weights.

    gating "softmax" (Qwen3-MoE): softmax over all router logits, the top k of those
    probabilities, optionally renormalised to sum 1. gating "softmax_chosen" (gpt-oss): the top
    k logits, then a softmax over just those. Each expert is down(act(gate(h)) * up(h));
    activation "swiglu_oai" is gpt-oss's clamped form: g = min(gate, limit),
    u = clip(up, -limit, limit), act = g * sigmoid(alpha * g) * (u + 1).
    """

    kind: Literal["experts"] = "experts"
    n_expert: int = Field(gt=0)  # experts per layer
    n_expert_used: int = Field(gt=0)  # experts each token runs (top k)
    n_ff: int = Field(gt=0)  # width of one expert's gate/up projections
    gating: Literal["softmax", "softmax_chosen"] = "softmax"
    norm_weights: bool = False  # renormalise the chosen weights to sum 1 (gating "softmax")
    weights_scale: float = 1.0  # the chosen weights are multiplied by this
    router_bias: bool = False  # the router carries a bias (gpt-oss)
    expert_bias: bool = False  # each expert's gate, up and down carry biases (gpt-oss)
    activation: Literal["silu", "swiglu_oai"] = "silu"
    swiglu_alpha: float = 1.702  # swiglu_oai: sigmoid slope
    swiglu_limit: float = 7.0  # swiglu_oai: clamp of gate (above) and up (both sides)
    # name of the FFN's input RMSNorm (gpt-oss stores it as post_attention_norm.weight)
    norm: Literal["ffn_norm", "post_attention_norm"] = "ffn_norm"

    @model_validator(mode="after")
    def _used_within_count(self) -> ExpertFFN:
        if self.n_expert_used > self.n_expert:
            raise ValueError(
                f"{self.n_expert_used} experts used per token, but only {self.n_expert} exist"
            )
        return self


FFN = Annotated[DenseFFN | ExpertFFN, Field(discriminator="kind")]


class ModelSpec(_Part):
    """Sizes and parts of a decoder-only transformer."""

    arch: str  # GGUF general.architecture
    name: str = ""  # general.name
    n_vocab: int = Field(gt=0)
    n_embd: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_head_kv: int = Field(gt=0)
    head_dim: int = Field(gt=0)  # per-head size of queries and keys
    head_dim_v: int = Field(gt=0)  # per-head size of values
    n_ctx_train: int = Field(gt=0)
    rms_eps: float = Field(gt=0)
    rope_dim: int = Field(gt=0)  # leading dims of each head that RoPE rotates
    rope_neox: bool = False  # NeoX pairing (i, i + d/2) instead of adjacent pairs (2i, 2i+1)
    attn_scale: float = Field(gt=0)  # scale of Q.K (usually 1/sqrt(head_dim))
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(n_embd))
    tied_output: bool = False  # output head reuses token_embd.weight
    attention: Attention = Attention()
    ffn: FFN
    layers: tuple[LayerSpec, ...]

    def kv_bytes_per_token(self, k: KvFormat = KvFormat.F32, v: KvFormat | None = None) -> int:
        """KV-cache bytes one position costs across all layers, K stored as `k` and V as `v`
        (None: as K)."""
        v = v or k
        per_layer = k.nbytes(self.n_head_kv * self.head_dim) + v.nbytes(
            self.n_head_kv * self.head_dim_v
        )
        return self.n_layer * per_layer

    def weight_names(self) -> list[str]:
        """Every GGUF tensor name this model needs (`forge.models.weights.model_weights`)."""
        from forge.models.weights import model_weights

        return list(model_weights(self))
