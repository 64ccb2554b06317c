"""The typed description of a decoder-only transformer that every architecture module produces.

A model is its sizes plus two typed parts per layer stack: the attention and the feed-forward
network. Each part says which of its optional pieces exist (biases, norms) and owns its weights
(`forge.models.weights` lists them, with their shapes). Backends dispatch on the part's type:
a new variant (say, an FFN of experts) is a new part class, its rows in the weight table and one
block per backend, not a flag threaded through every runner.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.kv_cache import KvFormat

Activation = Literal["silu", "gelu_tanh"]


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LayerSpec(_Part):
    """What differs between layers (Gemma 3 interleaves sliding-window and global layers)."""

    sliding_window: int | None = None  # attend to at most this many latest positions; None = all
    rope_base: float = 10000.0  # RoPE frequency base for this layer
    rope_scale: float = 1.0  # linear RoPE scaling factor (positions are divided by it)


class Attention(_Part):
    """Grouped-query self-attention with RoPE: norm, Q/K/V projections, attention, output
    projection. Sizes (heads, head dims, RoPE dims) are the model's."""

    kind: Literal["gqa"] = "gqa"
    qkv_bias: bool = False  # Q/K/V projections carry biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of Q and K before RoPE (Qwen3, Gemma 3)
    post_norm: bool = False  # RMSNorm of the output before the residual add (Gemma 3)


class DenseFFN(_Part):
    """A gated feed-forward network: down(act(gate(h)) * up(h))."""

    kind: Literal["dense"] = "dense"
    n_ff: int = Field(gt=0)  # width of the gate/up projections
    activation: Activation = "silu"  # gate activation
    post_norm: bool = False  # RMSNorm of the output before the residual add (Gemma 3)


FFN = Annotated[DenseFFN, Field(discriminator="kind")]


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
