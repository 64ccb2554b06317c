"""Whether the hip kernels can run a model, and what it needs on the device: weights, an
n_ctx KV cache (in the format the runner picks) and the workspace."""

from __future__ import annotations

import os

from forge.errors import UnsupportedModelError
from forge.gguf import GGUFFile
from forge.kv_cache import KvFormat, KvTypes, require_whole_blocks
from forge.kv_pools import layer_positions
from forge.models.spec import DenseFFN, ExpertFFN, ModelSpec
from forge.models.weights import model_weights
from forge_hip.arena import layout
from forge_hip.contract import constants
from forge_hip.kv import layer_bytes
from forge_hip.library import ROUND_MODE, TYPE_SUFFIX
from forge_hip.workspace import ROW_CAP, workspace_bytes

MAX_HEAD_DIM = constants()["LAYER_MAX_D"]
MAX_EMBD = 1024 * constants()["AN_PER"]  # add_norm holds a row in one block's registers
MOE_MAX = {k: constants()[f"MOE_MAX_{k.upper()}"] for k in ("experts", "used", "pairs")}


def kv_format(spec: ModelSpec, gguf: GGUFFile, kv_types: KvTypes | None = None) -> KvFormat:
    """The cache's format: the one asked for (`kv_types`: K and V alike, one of them naming
    both), else float16 unless
    every matrix is F32 (their golden bounds are below f16 rounding); $FORGE_HIP_KV ("f16" or
    "f32") overrides that default. UnsupportedModelError for formats the kernels do not take."""
    forced = os.environ.get("FORGE_HIP_KV", "").lower()
    if forced in ("f16", "f32"):
        default = KvFormat(forced)
    else:
        matrices = [n for n, w in model_weights(spec).items() if w.kind == "matrix"]
        f32 = all(gguf.tensors[n].type == "F32" for n in matrices)
        default = KvFormat.F32 if f32 else KvFormat.F16
    types = kv_types or KvTypes()
    k, v = types.k or types.v or default, types.v or types.k or default  # one given: both
    if k is not v:
        raise UnsupportedModelError(
            f"hip stores K and V in one format; asked for {k.value} and {v.value}"
        )
    require_whole_blocks(k, [spec.head_dim, spec.head_dim_v])
    return k


def memory_needed(
    spec: ModelSpec,
    gguf: GGUFFile,
    n_ctx: int,
    kv_types: KvTypes | None = None,
    max_seqs: int | None = 1,
) -> dict[str, int]:
    """Device bytes for weights, an `n_ctx` KV cache and the workspace. Sliding-window layers
    hold their window pools, sized for `max_seqs` sequences (None: every layer at full length,
    as a tensor-parallel rank keeps it)."""
    fmt = kv_format(spec, gguf, kv_types)
    positions = [n_ctx] * spec.n_layer
    if max_seqs is not None:
        positions = layer_positions(spec, n_ctx, ROW_CAP, max_seqs)
    kv = sum(sum(layer_bytes(spec, n, fmt)) for n in positions)
    return {
        "weights": layout(spec, gguf)[1],
        "kv_cache": kv,
        "workspace": workspace_bytes(spec),
    }


def check_spec(spec: ModelSpec, gguf: GGUFFile | None = None) -> None:
    """Raise UnsupportedModelError naming what the hip kernels cannot run (with `gguf`, the
    weight types are checked too)."""
    if gguf is not None:
        _check_matrices(spec, gguf)
    if isinstance(spec.ffn, ExpertFFN):
        _check_experts(spec.ffn, spec, gguf)
    elif not isinstance(spec.ffn, DenseFFN):
        raise UnsupportedModelError(f"hip has no kernels for an FFN of kind {spec.ffn.kind!r}")
    if max(spec.head_dim, spec.head_dim_v) > MAX_HEAD_DIM:
        raise UnsupportedModelError(f"hip supports head dims up to {MAX_HEAD_DIM}")
    if spec.head_dim % 8 or spec.head_dim_v % 8:  # attention.hip reads K/V rows in 16-byte words
        raise UnsupportedModelError("hip needs head dims that are multiples of 8")
    if spec.n_embd > MAX_EMBD:
        raise UnsupportedModelError(f"hip supports n_embd up to {MAX_EMBD}")
    if spec.n_head % spec.n_head_kv or spec.rope_dim > spec.head_dim or spec.rope_dim % 2:
        raise UnsupportedModelError("hip needs n_head % n_head_kv == 0 and an even rope_dim")


def _check_matrices(spec: ModelSpec, gguf: GGUFFile) -> None:
    """Matrices other than experts' need a type the dense product kernels decode."""
    for name, w in model_weights(spec).items():
        t = gguf.tensors[name].type
        if w.kind == "matrix" and t not in TYPE_SUFFIX:
            only = f": hip runs {t} in expert matrices only" if t in ROUND_MODE else ""
            raise UnsupportedModelError(f"hip has no product kernels for {t} weights "
                                        f"({name}){only}")  # fmt: skip


def _check_experts(f: ExpertFFN, spec: ModelSpec, gguf: GGUFFile | None) -> None:
    """moe.hip's limits: experts per layer, experts per token, pairs of a pass; expert
    matrices whose products round x to int8 blocks (quantized types it decodes)."""
    if f.n_expert > MOE_MAX["experts"]:
        raise UnsupportedModelError(f"hip runs up to {MOE_MAX['experts']} experts per layer, "
                                    f"not {f.n_expert}")  # fmt: skip
    if f.n_expert_used > MOE_MAX["used"] or ROW_CAP * f.n_expert_used > MOE_MAX["pairs"]:
        raise UnsupportedModelError(f"hip runs up to {MOE_MAX['used']} experts per token, "
                                    f"not {f.n_expert_used}")  # fmt: skip
    if gguf is None:
        return
    for i in range(spec.n_layer):
        for m in ("gate", "up", "down"):
            t = gguf.tensors[f"blk.{i}.ffn_{m}_exps.weight"].type
            if ROUND_MODE.get(t) not in (1, 2):
                raise UnsupportedModelError(f"hip has no expert kernels for {t} weights "
                                            f"(blk.{i}.ffn_{m}_exps.weight)")  # fmt: skip
