"""Architectures: each module turns one architecture's GGUF metadata into a `ModelSpec`."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

from forge.errors import ModelError, UnsupportedModelError
from forge.gguf import GGUFFile
from forge.models import gemma3, gpt_oss, llama, qwen2, qwen3, qwen3moe
from forge.models.metadata import ArchMetadata
from forge.models.spec import Attention, DenseFFN, ExpertFFN, LayerSpec, ModelSpec, RopeScaling
from forge.models.validate import validate_hyperparameters
from forge.models.weights import expected_shapes

ARCHITECTURES: dict[str, Callable[[ArchMetadata], ModelSpec]] = {
    "llama": llama.build_spec,
    "mistral": llama.build_spec,
    "qwen2": qwen2.build_spec,
    "qwen3": qwen3.build_spec,
    "gemma3": gemma3.build_spec,
    "qwen3moe": qwen3moe.build_spec,
    "gpt-oss": gpt_oss.build_spec,
}


def build_spec(gguf: GGUFFile) -> ModelSpec:
    """The spec of a GGUF model, after checking that every tensor it needs exists with the
    shape the metadata implies. Raises UnsupportedModelError / ModelError naming the problem."""
    arch = gguf.architecture
    builder = ARCHITECTURES.get(arch)
    if builder is None:
        raise UnsupportedModelError(
            f"{gguf.path}: unknown architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})"
        )
    n_layer = gguf.metadata.get(f"{arch}.block_count")
    if isinstance(n_layer, int) and n_layer > len(gguf.tensors):
        # every layer needs several tensors; refuse before building per-layer tuples
        raise ModelError(
            f"{gguf.path}: metadata key '{arch}.block_count' = {n_layer} cannot be right: the "
            f"file holds only {len(gguf.tensors)} tensors"
        )
    try:
        spec = builder(ArchMetadata(gguf))
    except ValidationError as e:  # out-of-range values that reached the pydantic model
        problems = "; ".join(
            f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})"
            for err in e.errors()
        )
        raise ModelError(f"{gguf.path}: invalid hyper-parameters: {problems}") from None
    except ValueError as e:
        raise ModelError(f"{gguf.path}: invalid hyper-parameters: {e}") from None
    validate_hyperparameters(gguf, spec)
    check_tensors(spec, gguf)
    return spec


def check_tensors(spec: ModelSpec, gguf: GGUFFile) -> None:
    for name, shape in expected_shapes(spec).items():
        info = gguf.tensors.get(name)
        if info is None:
            raise ModelError(f"{gguf.path}: tensor {name!r} is missing")
        if tuple(info.shape) != shape:
            raise ModelError(
                f"{gguf.path}: tensor {name!r} has shape {list(info.shape)}, but the metadata "
                f"implies {list(shape)}"
            )


__all__ = [
    "ARCHITECTURES",
    "Attention",
    "DenseFFN",
    "ExpertFFN",
    "LayerSpec",
    "ModelSpec",
    "RopeScaling",
    "build_spec",
    "expected_shapes",
]
