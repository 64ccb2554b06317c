"""The paged KV cache on the device.

The cache is one allocation: per layer K [n_slots, n_kv_head, head_dim] then V
[n_slots, n_kv_head, head_dim_v], in the cache's `KvFormat` (asked for, else float16, or
float32 for all-F32 models, whose golden bounds are tighter than float16 rounding allows).
Each (slot, KV head) is one row of `row_bytes` (kernels/kv_format.h: float32, float16 and
bfloat16 values; Q8_0 and Q4_0 as the head's integers, then its f16 scales, padded to 8 and 4
bytes).
Slot of position p: block_table[p // bs] * bs + p % bs.

Sliding-window layers may keep a cache of their own window's size (`window_blocks`, the core's
window pools: `forge.kv_pools`): their slots index that pool's blocks, through its own block
tables (`step_meta`'s per-pool fields).
"""

from __future__ import annotations

from forge.kv_cache import KvFormat
from forge.models.spec import ModelSpec
from forge_hip.arena import align, preflight
from forge_hip.contract import constants
from forge_hip.runtime.base import DeviceBuffer, Runtime

# The attention kernels' kv_fmt argument per format (contract.h's KV_*).
KV_FORMAT_IDS = {f: constants()[f"KV_{f.name}"] for f in KvFormat}


def row_bytes(fmt: KvFormat, n: int) -> int:
    """Bytes of one cached head of n values (kv_format.h's kv_row_bytes)."""
    if fmt.block == 1:
        return fmt.nbytes(n)
    pad = 8 if fmt is KvFormat.Q8_0 else 4
    return -(-fmt.nbytes(n) // pad) * pad


def layer_bytes(spec: ModelSpec, n_slots: int, fmt: KvFormat) -> tuple[int, int]:
    """(K bytes, V bytes) of one layer's cache, each aligned as allocated."""
    return tuple(align(n_slots * spec.n_head_kv * row_bytes(fmt, d))
                 for d in (spec.head_dim, spec.head_dim_v))  # fmt: skip


class KvCache:
    """K and V of every layer for `n_blocks` blocks of `block_size` positions; layers whose
    sliding window `window_blocks` names ({window: blocks}) get that many blocks instead."""

    def __init__(self, rt: Runtime, spec: ModelSpec, n_blocks: int, block_size: int,
                 fmt: KvFormat, window_blocks: dict[int, int] | None = None):  # fmt: skip
        self.rt, self.format, self.format_id = rt, fmt, KV_FORMAT_IDS[fmt]
        self.n_blocks, self.block_size = n_blocks, block_size
        window_blocks = window_blocks or {}
        self.windows = tuple(sorted(window_blocks))
        # blocks of each pool: the full layers', then each window's (ascending)
        self.pool_blocks = (n_blocks, *(window_blocks[w] for w in self.windows))
        pool_of = {w: j + 1 for j, w in enumerate(self.windows)}
        self._pools = [pool_of.get(ls.sliding_window, 0) for ls in spec.layers]
        sizes = [layer_bytes(spec, self.pool_blocks[p] * block_size, fmt) for p in self._pools]
        self.nbytes = sum(k + v for k, v in sizes)
        preflight(rt, {"kv_cache": self.nbytes})
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        self._layers, at = [], self.buffer.ptr
        for k_size, v_size in sizes:
            self._layers.append((at, at + k_size))
            at += k_size + v_size

    def pool(self, i: int) -> int:
        """The block pool layer i's slots index: 0 for the full layers', j for windows[j - 1]."""
        return self._pools[i]

    def layer(self, i: int) -> tuple[int, int]:
        """(K address, V address) of layer i."""
        return self._layers[i]

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None
