"""The typed model configuration every architecture module produces from GGUF metadata.

One decoder-only transformer shape covers the supported architectures; the flags below say where
they differ. Backends implement the forward pass for this spec, so a new architecture that fits it
needs only a metadata-reading module in this package.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LayerSpec(BaseModel):
    """What differs between layers (Gemma 3 interleaves sliding-window and global layers)."""

    model_config = ConfigDict(frozen=True)

    sliding_window: int | None = None  # attend to at most this many latest positions; None = all
    rope_base: float = 10000.0  # RoPE frequency base for this layer
    rope_scale: float = 1.0  # linear RoPE scaling factor (positions are divided by it)


class ModelSpec(BaseModel):
    """Hyper-parameters and structural flags of a decoder-only transformer."""

    model_config = ConfigDict(frozen=True)

    arch: str  # GGUF general.architecture
    name: str = ""  # general.name
    n_vocab: int = Field(gt=0)
    n_embd: int = Field(gt=0)
    n_layer: int = Field(gt=0)
    n_head: int = Field(gt=0)
    n_head_kv: int = Field(gt=0)
    head_dim: int = Field(gt=0)  # per-head size of queries and keys
    head_dim_v: int = Field(gt=0)  # per-head size of values
    n_ff: int = Field(gt=0)
    n_ctx_train: int = Field(gt=0)
    rms_eps: float = Field(gt=0)
    rope_dim: int = Field(gt=0)  # leading dims of each head that RoPE rotates
    rope_neox: bool = False  # NeoX pairing (i, i + d/2) instead of adjacent pairs (2i, 2i+1)
    layers: tuple[LayerSpec, ...]
    qkv_bias: bool = False  # Q/K/V projections carry biases (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of Q and K before RoPE (Qwen3, Gemma 3)
    post_norms: bool = False  # RMSNorm after attention and after the FFN (Gemma 3)
    activation: Literal["silu", "gelu_tanh"] = "silu"  # gate activation of the gated FFN
    embed_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(n_embd))
    attn_scale: float = Field(gt=0)  # scale of Q.K (usually 1/sqrt(head_dim))
    tied_output: bool = False  # output head reuses token_embd.weight

    def weight_names(self) -> list[str]:
        """Every GGUF tensor name this model needs (missing ones are an error at load)."""
        names = ["token_embd.weight", "output_norm.weight"]
        if not self.tied_output:
            names.append("output.weight")
        for i in range(self.n_layer):
            names += [f"blk.{i}.{n}.weight" for n in self.layer_weights()]
            if self.qkv_bias:
                names += [f"blk.{i}.attn_{x}.bias" for x in "qkv"]
        return names

    def layer_weights(self) -> list[str]:
        """Per-layer weight stems (without blk.N. and .weight)."""
        stems = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                 "ffn_gate", "ffn_up", "ffn_down"]  # fmt: skip
        if self.qk_norm:
            stems += ["attn_q_norm", "attn_k_norm"]
        if self.post_norms:
            stems += ["post_attention_norm", "post_ffw_norm"]
        return stems

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """KV-cache bytes one position costs across all layers."""
        return self.n_layer * self.n_head_kv * (self.head_dim + self.head_dim_v) * dtype_bytes
