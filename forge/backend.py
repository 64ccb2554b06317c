"""The contract between the core and a backend plugin.

A backend class (registered through `forge_register_backends`) probes the machine and, when chosen,
opens a `Runner` for one model: the runner places the weights on its device, owns the KV-cache
storage, and runs forward passes over batches of sequences. Everything about sequences, scheduling
and sampling stays in the core; the runner only computes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from forge.devices import BackendProbe

if TYPE_CHECKING:
    from forge.gguf import GGUFFile
    from forge.kernels import KernelTable
    from forge.models.spec import ModelSpec


@dataclass
class SeqBatch:
    """New tokens of one sequence to run in a forward pass.

    `tokens` are appended at positions start .. start+len(tokens)-1; `block_table` lists the
    KV-cache blocks (physical ids, in order) that hold positions 0 .. start+len(tokens)-1.
    """

    tokens: np.ndarray  # int32 [n_new]
    start: int  # position of tokens[0]; equals how many tokens this sequence already cached
    block_table: np.ndarray  # int32 [n_blocks_used]
    output: Literal["last", "all", "none"] = "last"  # which rows of logits to return


class Runner(ABC):
    """A model placed on one device, ready to run forward passes."""

    spec: ModelSpec

    @abstractmethod
    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        """Allocate KV storage for `n_blocks` blocks of `block_size` positions for every layer."""

    @abstractmethod
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        """Run one forward pass over all sequences together and write their K/V into the cache.

        Returns, per sequence, float32 logits of shape [rows, n_vocab] for the rows its `output`
        asked for ("last": 1 row, "all": len(tokens) rows), or None for "none".
        """

    def forward_argmax(self, batch: list[SeqBatch]) -> list[int]:
        """Greedy shortcut: the argmax token of each sequence's last row. Backends that can
        pick on the device override this so that no logits row is copied to the host."""
        rows = self.forward([SeqBatch(b.tokens, b.start, b.block_table, "last") for b in batch])
        return [int(np.argmax(r[-1])) for r in rows if r is not None]

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to free by default
        """Free device memory. Safe to call twice."""

    def memory_estimate(self) -> dict[str, int]:
        """Bytes this runner holds, by kind ("weights", "kv_cache", "workspace")."""
        return {}


class Backend(ABC):
    """A way to execute models. Subclasses are registered by plugins; `probe` must never raise."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def probe(self) -> BackendProbe:
        """Find what this backend can use here. Never raises: failures are reported as
        `BackendProbe(available=False, reason=...)`."""

    @abstractmethod
    def open_runner(
        self,
        spec: ModelSpec,
        gguf: GGUFFile,
        kernels: KernelTable,
        *,
        device: int = 0,
        progress: Callable[[int, int], None] | None = None,
        n_ctx: int | None = None,
    ) -> Runner:
        """Place the model's weights on device `device` and return a runner for it.

        `n_ctx`, when given, is the context the caller will allocate KV blocks for, so that a
        memory preflight can count the KV cache too.

        `progress(done, total)`, when given, is called as weights are placed.

        Raises `OutOfMemoryError` (after freeing what it took) when the weights do not fit.
        """

    def memory_needed(self, spec: ModelSpec, gguf: GGUFFile, n_ctx: int) -> dict[str, int]:
        """Estimated bytes to run this model with an `n_ctx` cache: weights, kv_cache, workspace."""
        return {}
