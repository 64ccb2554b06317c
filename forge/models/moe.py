"""The mixture-of-experts FFN shared by the MoE architectures: its sizes from the file's
`<arch>.expert_*` keys, with errors that name the key."""

from __future__ import annotations

from typing import Any

from forge.errors import ModelError
from forge.models.metadata import ArchMetadata
from forge.models.spec import ExpertFFN


def expert_ffn(m: ArchMetadata, **fields: Any) -> ExpertFFN:
    """An `ExpertFFN` of `expert_count` experts, `expert_used_count` per token, each of width
    `expert_feed_forward_length` (llama.cpp's fallback when absent: feed_forward_length /
    expert_used_count); other fields are the architecture's."""
    count = m.count("expert_count")
    used = m.count("expert_used_count")
    if used > count:
        raise ModelError(f"{m.gguf.path}: metadata key '{m.arch}.expert_used_count' = {used} "
                         f"exceeds '{m.arch}.expert_count' = {count}")  # fmt: skip
    if f"{m.arch}.expert_feed_forward_length" in m.md:
        n_ff = m.count("expert_feed_forward_length")
    else:
        n_ff = m.count("feed_forward_length") // used
    scale = m.float("expert_weights_scale", 0.0)  # llama.cpp: 0 means no scaling
    return ExpertFFN(n_expert=count, n_expert_used=used, n_ff=max(n_ff, 1),
                     weights_scale=scale or 1.0, **fields)  # fmt: skip
