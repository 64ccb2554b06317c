"""Paged KV-cache bookkeeping: fixed-size blocks, a block table per sequence.

The storage itself belongs to the backend's runner (`Runner.allocate_kv`); this module decides
which physical blocks each sequence uses, so sequences of any length share one pool and a finished
or cancelled sequence gives its blocks back at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from forge.errors import ContextOverflowError, OutOfMemoryError, UnsupportedModelError, UsageError


class KvFormat(enum.Enum):
    """How a runner stores K or V: the element type of its cache, as llama.cpp's
    --cache-type-k/-v names them. The quantized ones hold blocks of 32 values of a head (8-bit
    or 4-bit integers with an f16 scale, GGML's Q8_0 / Q4_0). Attention reads the stored format
    directly."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"

    @property
    def block(self) -> int:
        """Values per block (a head's size must be a multiple of it)."""
        return 32 if self in (KvFormat.Q8_0, KvFormat.Q4_0) else 1

    @property
    def block_bytes(self) -> int:
        return _BLOCK_BYTES[self]

    def nbytes(self, values: int) -> int:
        """Bytes of `values` values (a whole number of blocks)."""
        return -(-values // self.block) * self.block_bytes


def require_whole_blocks(fmt: KvFormat, dims: list[int]) -> None:
    """UnsupportedModelError unless each head size in `dims` holds whole blocks of `fmt`."""
    if any(d % fmt.block for d in dims):
        sizes = "/".join(str(d) for d in sorted(set(dims)))
        raise UnsupportedModelError(
            f"a {fmt.value} KV cache needs head sizes that are multiples of {fmt.block}; "
            f"this model's are {sizes}"
        )


@dataclass(frozen=True)
class KvTypes:
    """The formats a cache is asked to store K and V in (None: the backend's choice)."""

    k: KvFormat | None = None
    v: KvFormat | None = None

    @classmethod
    def parse(cls, k: str = "auto", v: str = "auto") -> KvTypes:
        """From config values ("auto" or a `KvFormat` value), naming a bad one."""
        return cls(*(None if t == "auto" else _format(t, key) for t, key in
                     ((k, "kv_cache_type_k"), (v, "kv_cache_type_v"))))  # fmt: skip

    def resolve(self, k: KvFormat, v: KvFormat | None = None) -> tuple[KvFormat, KvFormat]:
        """The (K, V) formats, the backend's choices `k` and `v` where none was asked."""
        return self.k or k, self.v or v or k

    @property
    def chosen(self) -> bool:
        return self.k is not None or self.v is not None


def _format(value: str, key: str) -> KvFormat:
    try:
        return KvFormat(value)
    except ValueError:
        names = ", ".join(["auto"] + [f.value for f in KvFormat])
        raise UsageError(f"{key} must be one of {names}; got {value!r}") from None


_BLOCK_BYTES = {KvFormat.F32: 4, KvFormat.F16: 2, KvFormat.BF16: 2, KvFormat.Q8_0: 34,
                KvFormat.Q4_0: 18}  # fmt: skip


class BlockAllocator:
    """A pool of `n_blocks` KV blocks of `block_size` positions each."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks <= 0 or block_size <= 0:
            raise ValueError("n_blocks and block_size must be positive")
        self.n_blocks, self.block_size = n_blocks, block_size
        self._free = list(range(n_blocks - 1, -1, -1))

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use."""
        return 1.0 - len(self._free) / self.n_blocks

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfMemoryError(
                f"KV cache full: {n} more blocks needed, {len(self._free)} of {self.n_blocks} free"
            )
        return [self._free.pop() for _ in range(n)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


class BlockTable:
    """The blocks of one sequence, in position order."""

    def __init__(self, allocator: BlockAllocator, max_positions: int):
        self.allocator = allocator
        self.max_positions = max_positions
        self.blocks: list[int] = []
        self._array: np.ndarray | None = None  # `blocks` as int32, rebuilt when they change
        self._room = 0  # positions the blocks hold (at most max_positions)

    def blocks_missing(self, n_positions: int) -> int:
        """Blocks `ensure(n_positions)` would take from the pool."""
        if n_positions <= self._room:
            return 0
        return max(0, self.allocator.blocks_for(n_positions) - len(self.blocks))

    def ensure(self, n_positions: int) -> None:
        """Make room for positions 0 .. n_positions-1 (allocating blocks as needed)."""
        if n_positions <= self._room:  # (every decode step of every sequence asks)
            return
        if n_positions > self.max_positions:
            raise ContextOverflowError(
                f"sequence needs {n_positions} positions, the context holds {self.max_positions}"
            )
        missing = self.allocator.blocks_for(n_positions) - len(self.blocks)
        if missing > 0:
            self.blocks += self.allocator.allocate(missing)
            self._array = None
        self._room = min(len(self.blocks) * self.allocator.block_size, self.max_positions)

    def array(self) -> np.ndarray:
        """The block ids as int32 (the same array until the blocks change: do not modify)."""
        if self._array is None:
            self._array = np.asarray(self.blocks, dtype=np.int32)
        return self._array

    def release(self) -> None:
        """Give every block back (idempotent)."""
        if self.blocks:
            self.allocator.free(self.blocks)
            self.blocks = []
            self._array = None
            self._room = 0
