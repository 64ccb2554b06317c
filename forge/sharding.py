"""Tensor parallelism as Megatron-LM splits a transformer: which part of every weight each of N
ranks holds, which KV heads its cache keeps, and which logits it computes. Pure data: no device.

- Q/K/V (and their biases) and gate/up are split by output rows: whole heads, whole FFN columns.
- The attention output and down products are split by input columns (each rank multiplies its
  heads' / columns' slice of every row); their partial sums are all-reduced once per layer.
- KV heads: split when there are at least as many as ranks, else each rank keeps the one its
  query heads read (replicated).
- The output head is split by vocabulary rows: each rank computes its rows' logits, and the token
  is picked across ranks.
- Norm weights and the embedding table (looked up by token) are replicated.
A split must cut quantized rows at block boundaries; `ShardPlan.build` names what prevents it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from forge.backend import Placement, Shard
from forge.devices import DeviceInfo
from forge.errors import UsageError
from forge.gguf import GGUFFile, TensorInfo
from forge.gguf.types import block_geometry
from forge.models.spec import DenseFFN, ModelSpec
from forge.models.weights import model_weights
from forge.remote_ranks import local_ranks

Axis = Literal["rows", "cols", "none"]


@dataclass(frozen=True)
class TensorSplit:
    """How one tensor is divided: `rows` (GGML shape (K, N): each rank holds whole rows of N),
    `cols` (each rank holds a slice of K of every row) or `none` (every rank holds it all);
    `ranges[r]` are rank r's rows or columns."""

    axis: Axis
    ranges: tuple[range, ...]

    def byte_spans(self, info: TensorInfo, rank: int) -> list[tuple[int, int]]:
        """(offset, length) of the bytes rank `rank` reads, relative to the tensor's data:
        one span for a row split (its rows are contiguous), one per row for a column split."""
        k = info.shape[0]
        block, block_bytes = block_geometry(info.type)
        row_bytes = k // block * block_bytes
        if self.axis == "none":
            return [(0, info.nbytes)]
        part = self.ranges[rank]
        if self.axis == "rows":
            return [(part.start * row_bytes, len(part) * row_bytes)]
        start, length = part.start // block * block_bytes, len(part) // block * block_bytes
        return [(row * row_bytes + start, length) for row in range(info.rows)]


@dataclass(frozen=True)
class ShardPlan:
    """The split of one model over `world` ranks."""

    world: int
    heads: tuple[range, ...]  # per rank: query heads
    kv_heads: tuple[range, ...]  # per rank: KV heads its cache holds
    ffn: tuple[range, ...]  # per rank: FFN columns
    vocab: tuple[range, ...]  # per rank: output-head rows
    tensors: dict[str, TensorSplit]

    @classmethod
    def build(cls, spec: ModelSpec, gguf: GGUFFile, world: int) -> ShardPlan:
        """The plan for `world` ranks; UsageError naming the first size the split cannot
        divide (checked before any weight loads)."""
        if world < 1:
            raise UsageError(f"tensor_parallel must be >= 1, got {world}")
        if not isinstance(spec.ffn, DenseFFN):
            raise UsageError(f"tensor parallelism splits dense FFNs only, not {spec.ffn.kind!r}")
        if spec.attention.sinks or spec.attention.out_bias:
            raise UsageError("tensor parallelism does not split attention sinks or an attention "
                             "output bias (gpt-oss)")  # fmt: skip
        heads = _even(spec.n_head, world, "attention heads")
        kv = _kv_heads(spec.n_head, spec.n_head_kv, world)
        ffn = _even(spec.ffn.n_ff, world, "FFN columns (feed_forward_length)")
        vocab = tuple(range(r * -(-spec.n_vocab // world), min(spec.n_vocab,
                      (r + 1) * -(-spec.n_vocab // world))) for r in range(world))  # fmt: skip
        d, dv = spec.head_dim, spec.head_dim_v
        by_stem = {
            "attn_q.weight": ("rows", _scale(heads, d)), "attn_q.bias": ("rows", _scale(heads, d)),
            "attn_k.weight": ("rows", _scale(kv, d)), "attn_k.bias": ("rows", _scale(kv, d)),
            "attn_v.weight": ("rows", _scale(kv, dv)), "attn_v.bias": ("rows", _scale(kv, dv)),
            "attn_output.weight": ("cols", _scale(heads, dv)),
            "ffn_gate.weight": ("rows", ffn), "ffn_up.weight": ("rows", ffn),
            "ffn_down.weight": ("cols", ffn),
        }  # fmt: skip
        tensors: dict[str, TensorSplit] = {}
        head = "token_embd.weight" if spec.tied_output else "output.weight"
        for name in model_weights(spec):
            stem = name.split(".", 2)[-1] if name.startswith("blk.") else name
            axis, ranges = by_stem.get(stem, ("none", ()))
            if name == head and not spec.tied_output:
                axis, ranges = "rows", vocab
            if axis == "cols":
                _check_blocks(gguf.tensors[name], ranges)
            tensors[name] = TensorSplit(axis, tuple(ranges))
        # a tied head's rank computes the logits of its `vocab` rows of token_embd, which it
        # holds whole: the embedding lookup reads every row
        return cls(world, heads, kv, ffn, vocab, tensors)

    def placement(self, devices: list[tuple[int, str]]) -> Placement:
        """The Placement of this plan on `devices` ((index, name) per rank)."""
        if len(devices) != self.world:
            raise UsageError(f"{self.world} ranks need {self.world} devices, got {len(devices)}")
        shards = (Shard(r, i, name, self.heads[r], self.kv_heads[r], self.ffn[r], self.vocab[r])
                  for r, (i, name) in enumerate(devices))  # fmt: skip
        return Placement(tuple(shards))


def _even(n: int, world: int, what: str) -> tuple[range, ...]:
    if n % world:
        raise UsageError(f"tensor_parallel = {world} does not divide the model's {n} {what}")
    step = n // world
    return tuple(range(r * step, (r + 1) * step) for r in range(world))


def _kv_heads(n_head: int, n_kv: int, world: int) -> tuple[range, ...]:
    """Split when every rank gets whole KV heads; else each rank keeps the KV head its query
    heads read (possible when the ranks divide evenly into KV heads)."""
    if n_kv % world == 0:
        return _even(n_kv, world, "KV heads")
    if world % n_kv:
        raise UsageError(f"tensor_parallel = {world} cannot share the model's {n_kv} KV heads: "
                         "use a divisor or a multiple of it")  # fmt: skip
    per = world // n_kv  # ranks per KV head
    return tuple(range(r // per, r // per + 1) for r in range(world))


def _scale(ranges: tuple[range, ...], size: int) -> tuple[range, ...]:
    return tuple(range(r.start * size, r.stop * size) for r in ranges)


def _check_blocks(info: TensorInfo, ranges: tuple[range, ...]) -> None:
    block, _ = block_geometry(info.type)
    for r in ranges:
        if r.start % block or len(r) % block:
            raise UsageError(
                f"{info.name} ({info.type}, blocks of {block}) cannot be split at column "
                f"{r.start if r.start % block else r.stop}: fewer ranks would split it"
            )


def tensor_parallel_args(
    method: Callable, spec: ModelSpec, gguf: GGUFFile, world: int, first: int,
    devices: tuple[DeviceInfo, ...], backend: str,
) -> dict:  # fmt: skip
    """The keyword arguments giving a backend's `open_runner` the split of the model over
    `world` devices from index `first`: none for one device; a UsageError, before any weight
    loads, when the devices are too few, the model's sizes do not divide, or the backend runs
    a model on one device only."""
    if world == 1:
        return {}
    here = local_ranks(world)  # the others run on other hosts (forge.remote_ranks)
    if first + here > len(devices):
        here_only = f" (FORGE_TP_LOCAL_RANKS: {here} ranks run here)" if here < world else ""
        raise UsageError(
            f"tensor_parallel = {world} from device {first} needs devices {first}.."
            f"{first + here - 1}, but backend {backend!r} has {len(devices)}{here_only}"
        )
    plan = ShardPlan.build(spec, gguf, world)
    if "shard_plan" not in inspect.signature(method).parameters:
        raise UsageError(
            f"backend {backend!r} runs a model on one device only: tensor_parallel = {world} "
            "needs a backend that splits models over devices"
        )
    picked = [(first + r, d.name) for r, d in enumerate(devices[first : first + here])]
    picked += [(r - here, "on another host") for r in range(here, world)]
    return {"shard_plan": plan, "placement": plan.placement(picked)}
