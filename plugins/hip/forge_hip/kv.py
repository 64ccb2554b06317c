"""The paged KV cache on the device.

The cache is one allocation: per layer K [n_slots, n_kv_head, head_dim] then V
[n_slots, n_kv_head, head_dim_v], in the cache's `KvFormat` (asked for, else float16, or
float32 for all-F32 models, whose golden bounds are tighter than float16 rounding allows).
Each (slot, KV head) is one row of `row_bytes` (kernels/kv_format.h: float32, float16 and
bfloat16 values; Q8_0 and Q4_0 as the head's integers, then its f16 scales, padded to 8 and 4
bytes).
Slot of position p: block_table[p // bs] * bs + p % bs.
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


def kv_bytes(spec: ModelSpec, n_slots: int, fmt: KvFormat) -> int:
    return spec.n_layer * sum(layer_bytes(spec, n_slots, fmt))


class KvCache:
    """K and V of every layer for `n_blocks` blocks of `block_size` positions."""

    def __init__(self, rt: Runtime, spec: ModelSpec, n_blocks: int, block_size: int, fmt: KvFormat):
        self.rt, self.format, self.format_id = rt, fmt, KV_FORMAT_IDS[fmt]
        self.n_blocks, self.block_size = n_blocks, block_size
        n_slots = n_blocks * block_size
        self.nbytes = kv_bytes(spec, n_slots, fmt)
        preflight(rt, {"kv_cache": self.nbytes})
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        k_size, v_size = layer_bytes(spec, n_slots, fmt)
        base = self.buffer.ptr
        self._layers = [
            (base + i * (k_size + v_size), base + i * (k_size + v_size) + k_size)
            for i in range(spec.n_layer)
        ]

    def layer(self, i: int) -> tuple[int, int]:
        """(K address, V address) of layer i."""
        return self._layers[i]

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None
