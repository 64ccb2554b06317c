"""Gemma 3: interleaved sliding-window and global layers, Q/K norms, post-norms, GELU-tanh gating,
embeddings scaled by sqrt(n_embd), tied output head.

Every sixth layer is global (layers 5, 11, ...); the others attend to a sliding window and use a
fixed RoPE base of 10000 (llama.cpp's convention for Gemma 3), while global layers use the file's
base and RoPE scaling.
"""

import math

from forge.models.common import base_fields, dense_ffn
from forge.models.metadata import ArchMetadata
from forge.models.rope import rope_scaling
from forge.models.spec import Attention, LayerSpec, ModelSpec

SLIDING_PATTERN = 6
SLIDING_ROPE_BASE = 10000.0


def build_spec(m: ArchMetadata) -> ModelSpec:
    fields = base_fields(m)
    window = m.int("attention.sliding_window")
    global_layer = LayerSpec(rope_base=m.float("rope.freq_base", 1e6), rope=rope_scaling(m))
    local_layer = LayerSpec(sliding_window=window, rope_base=SLIDING_ROPE_BASE)
    layers = tuple(
        global_layer if (i + 1) % SLIDING_PATTERN == 0 else local_layer
        for i in range(fields["n_layer"])
    )
    return ModelSpec(
        **fields,
        layers=layers,
        rope_neox=True,
        attention=Attention(qk_norm=True, post_norm=True),
        ffn=dense_ffn(m, activation="gelu_tanh", post_norm=True),
        embed_scale=math.sqrt(fields["n_embd"]),
    )
