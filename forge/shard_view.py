"""One rank's view of a tensor-parallel model: the sizes it computes (`rank_spec`) and the file
as that rank reads it (`ShardView`: the same tensor table and `raw` as a GGUFFile, each weight
cut to the rank's rows or columns). A backend that runs a model on one device runs a rank's part
through these unchanged; only the collectives are its own.

A tied output head (the embedding table doubling as the head) becomes an "output.weight" of the
rank's vocabulary rows of token_embd, while the embedding lookup keeps the whole table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from forge.gguf import GGUFFile, TensorInfo
from forge.gguf.types import block_geometry
from forge.models.spec import ModelSpec
from forge.sharding import ShardPlan, TensorSplit


def rank_spec(spec: ModelSpec, plan: ShardPlan, rank: int) -> ModelSpec:
    """The sizes rank `rank` computes: its query heads, KV heads and FFN columns; `n_vocab`
    stays the whole vocabulary (the picked token is chosen over all of it), and its output
    head is always an "output.weight" of its own (`ShardView`)."""
    ffn = spec.ffn.model_copy(update={"n_ff": len(plan.ffn[rank])})
    return spec.model_copy(update={
        "n_head": len(plan.heads[rank]), "n_head_kv": len(plan.kv_heads[rank]), "ffn": ffn,
        "tied_output": False,
    })  # fmt: skip


class ShardView:
    """`gguf` as rank `rank` of `plan` reads it: `tensors` and `raw` give each weight's part
    (rows: a view of the mapped file, no copy; columns: the rank's bytes of every row, copied);
    everything else is the file's."""

    def __init__(self, gguf: GGUFFile, spec: ModelSpec, plan: ShardPlan, rank: int):
        self._gguf, self.rank = gguf, rank
        self._source: dict[str, tuple[str, TensorSplit]] = {}  # view name -> file tensor, split
        self.tensors: dict[str, TensorInfo] = {}
        for name, split in plan.tensors.items():
            self._add(name, name, split)
        if spec.tied_output:
            self._add("output.weight", "token_embd.weight", TensorSplit("rows", plan.vocab))

    def _add(self, name: str, source: str, split: TensorSplit) -> None:
        info = self._gguf.tensors[source]
        shape = list(info.shape)
        if split.axis != "none":
            part = split.ranges[self.rank]
            dim = 0 if split.axis == "cols" or len(shape) == 1 else 1
            shape[dim] = len(part)
        block, block_bytes = block_geometry(info.type)
        nbytes = int(np.prod(shape, dtype=np.int64)) // block * block_bytes
        self.tensors[name] = TensorInfo(name, info.type, tuple(shape), info.offset, nbytes)
        self._source[name] = source, split

    def raw(self, name: str) -> np.ndarray:
        """The rank's bytes of a tensor as uint8 [rows, row_bytes] (GGUFFile.raw's layout)."""
        source, split = self._source[name]
        whole = self._gguf.raw(source)
        if split.axis == "none":
            return whole
        part = split.ranges[self.rank]
        info = self._gguf.tensors[source]
        block, block_bytes = block_geometry(info.type)
        if split.axis == "rows" and len(info.shape) > 1:
            return whole[part.start : part.stop]
        # columns of every row (a vector's elements: its one row)
        lo, hi = part.start // block * block_bytes, part.stop // block * block_bytes
        return np.ascontiguousarray(whole[:, lo:hi])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gguf, name)
