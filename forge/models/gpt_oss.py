"""gpt-oss (GGUF architecture "gpt-oss"): attention with Q/K/V/O biases and learned sinks,
sliding-window and full layers alternating (the first of each period slides), YaRN RoPE, and a
mixture of experts with a biased router, a softmax over the chosen experts' logits, expert
biases and the clamped SwiGLU. The FFN's input norm is stored as post_attention_norm.weight.
"""

import math

from forge.models.common import base_fields
from forge.models.metadata import ArchMetadata
from forge.models.moe import expert_ffn
from forge.models.rope import rope_scaling
from forge.models.spec import Attention, LayerSpec, ModelSpec

SLIDING_PERIOD = 2  # llama.cpp's default swa pattern for this architecture


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    fields["attn_scale"] = 1.0 / math.sqrt(fields["rope_dim"])  # llama.cpp: 1/sqrt(n_rot)
    rope = rope_scaling(m)
    base = m.float("rope.freq_base", 10000.0)
    full = LayerSpec(rope_base=base, rope=rope)
    sliding = LayerSpec(
        sliding_window=m.count("attention.sliding_window"),
        rope_base=m.float("rope.freq_base_swa", base),
        rope=rope,
    )
    period = m.count("attention.sliding_window_pattern", SLIDING_PERIOD)
    layers = tuple(sliding if i % period < period - 1 else full for i in range(fields["n_layer"]))
    return ModelSpec(
        **fields,
        rope_neox=True,
        attention=Attention(qkv_bias=True, out_bias=True, sinks=True),
        ffn=expert_ffn(
            m,
            gating="softmax_chosen",
            router_bias=True,
            expert_bias=True,
            activation="swiglu_oai",
            norm="post_attention_norm",
        ),
        layers=layers,
    )
