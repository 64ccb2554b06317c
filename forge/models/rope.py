"""RoPE scaling: the GGUF rope-scaling keys as a typed `RopeScaling`, and the per-dimension
rotation frequencies every backend's RoPE uses.

A rotated pair i (of rope_dim / 2) of a head at position p turns by p * freq[i] radians, and
cos/sin are multiplied by `RopeScaling.mscale`. Every kind reduces to that form: linear and YaRN
scale each frequency by a constant (YaRN's mix of interpolated and original frequencies is
linear in p), and Llama 3.1's per-dimension factors divide it. The formulas are those of
llama.cpp's ggml_rope_ext (ggml-cpu ops.cpp rope_yarn, ggml_rope_yarn_corr_dims) and of the
context set-up that derives YaRN's attention factor (llama-context.cpp).
"""

from __future__ import annotations

import math

import numpy as np

from forge.errors import ModelError, UnsupportedModelError
from forge.models.metadata import ArchMetadata
from forge.models.spec import RopeScaling

FREQS_TENSOR = "rope_freqs.weight"  # Llama 3.1's per-dimension frequency divisors


def rope_scaling(m: ArchMetadata) -> RopeScaling:
    """The file's RoPE scaling (`<arch>.rope.scaling.*` keys and the `rope_freqs` tensor).

    Raises UnsupportedModelError for a scaling type forge does not implement and ModelError
    naming the key of a malformed value.
    """
    kind = m.md.get(f"{m.arch}.rope.scaling.type", "none")
    factor = m.optional_float("rope.scaling.factor")
    has_freqs = FREQS_TENSOR in m.gguf.tensors
    if kind not in ("none", "linear", "yarn"):
        raise UnsupportedModelError(f"{m.gguf.path}: RoPE scaling {kind!r} is not supported "
                                    "(supported: none, linear, yarn, llama3)")  # fmt: skip
    if has_freqs:
        if kind != "none":
            raise UnsupportedModelError(
                f"{m.gguf.path}: RoPE scaling {kind!r} together with per-dimension factors "
                f"({FREQS_TENSOR}) is not supported"
            )
        return RopeScaling(kind="llama3")
    if kind == "none" or not factor or (factor == 1.0 and kind == "linear"):
        return RopeScaling()
    if factor <= 0 or not math.isfinite(factor):
        raise ModelError(f"{m.gguf.path}: metadata key '{m.arch}.rope.scaling.factor' = "
                         f"{factor} must be a positive number")  # fmt: skip
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    return _yarn(m, factor)


def _yarn(m: ArchMetadata, factor: float) -> RopeScaling:
    original = m.count("rope.scaling.original_context_length", m.count("context_length"))
    ext_factor = m.float("rope.scaling.yarn_ext_factor", 1.0)
    log_mul = m.float("rope.scaling.yarn_log_multiplier", 0.0)
    attn_factor = m.float("rope.scaling.attn_factor", 1.0)
    # llama.cpp's attention factor: get_mscale(factor, 1) (or its ratio to
    # get_mscale(factor, log_mul)), divided by the 1 + 0.1 ln(factor) that ggml's rope kernel
    # multiplies back in whenever ext_factor != 0
    mscale = _get_mscale(factor, 1.0)
    if log_mul:
        mscale /= _get_mscale(factor, log_mul)
    if not ext_factor:
        mscale /= 1.0 + 0.1 * math.log(factor)
    return RopeScaling(
        kind="yarn",
        factor=factor,
        original_context=original,
        beta_fast=m.float("rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=m.float("rope.scaling.yarn_beta_slow", 1.0),
        ext_factor=ext_factor,
        mscale=mscale * attn_factor,
    )


def _get_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(
    rope_dim: int, base: float, scaling: RopeScaling, freq_factors: np.ndarray | None = None
) -> np.ndarray:
    """float64 [rope_dim / 2]: the angle each rotated pair turns per position.

    `freq_factors` (kind "llama3": the `rope_freqs` tensor) divides each pair's frequency.
    """
    pairs = np.arange(rope_dim // 2, dtype=np.float64)
    freq = base ** (-2.0 * pairs / rope_dim)
    if freq_factors is not None:
        freq = freq / np.asarray(freq_factors, dtype=np.float64)
    if scaling.kind == "linear":
        return freq / scaling.factor
    if scaling.kind != "yarn":
        return freq
    low, high = yarn_corr_dims(rope_dim, scaling.original_context, base, scaling)
    ramp = 1.0 - np.clip((pairs - low) / max(0.001, high - low), 0.0, 1.0)
    mix = ramp * scaling.ext_factor  # 1: the original frequency, 0: the interpolated one
    return freq * (mix + (1.0 - mix) / scaling.factor)


def yarn_corr_dims(
    rope_dim: int, original_context: int, base: float, scaling: RopeScaling
) -> tuple[float, float]:
    """The pair indices (low, high) between which YaRN's ramp falls from 1 to 0: the dimensions
    that turn `beta_fast` and `beta_slow` times over the original context."""

    def dim(rotations: float) -> float:
        turns = original_context / (rotations * 2.0 * math.pi)
        return rope_dim * math.log(turns) / (2.0 * math.log(base))

    return max(0.0, math.floor(dim(scaling.beta_fast))), min(
        rope_dim - 1.0, math.ceil(dim(scaling.beta_slow))
    )
