"""The weight types forge supports, with their block geometry (from the `gguf` package's table)."""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

SUPPORTED_TYPES: tuple[str, ...] = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4",
)  # fmt: skip


def type_name(type_id: int) -> str | None:
    """The GGML name of a type id ("Q4_K"), or None when the id is unknown."""
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return None


def block_geometry(name: str) -> tuple[int, int]:
    """(elements per block, bytes per block) of a GGML type name."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def tensor_nbytes(name: str, n_elements: int) -> int:
    """Bytes a tensor of `n_elements` of type `name` occupies (whole blocks only)."""
    block, size = block_geometry(name)
    return n_elements // block * size
