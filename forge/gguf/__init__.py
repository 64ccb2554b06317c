"""GGUF files: parsing, validation and the weight-type table."""

from forge.gguf.reader import GGUFFile, TensorInfo, open_gguf
from forge.gguf.types import SUPPORTED_TYPES, block_geometry, tensor_nbytes, type_name

__all__ = [
    "GGUFFile", "TensorInfo", "open_gguf", "SUPPORTED_TYPES", "block_geometry",
    "tensor_nbytes", "type_name",
]  # fmt: skip
