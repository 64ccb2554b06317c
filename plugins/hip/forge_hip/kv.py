"""The paged KV cache on the device.

The cache is one allocation: per layer K [n_slots, n_kv_head, head_dim] then V
[n_slots, n_kv_head, head_dim_v], in the cache's `KvFormat` (the runner chooses: float16, or
float32 for all-F32 models, whose golden bounds are tighter than float16 rounding allows).
Slot of position p: block_table[p // bs] * bs + p % bs.
"""

from __future__ import annotations

from forge.kv_cache import KvFormat
from forge.models.spec import ModelSpec
from forge_hip.arena import align, preflight
from forge_hip.contract import constants
from forge_hip.runtime.base import DeviceBuffer, Runtime

# The attention kernels' kv_fmt argument per format (contract.h's KV_*).
KV_FORMAT_IDS = {KvFormat.F32: constants()["KV_F32"], KvFormat.F16: constants()["KV_F16"]}


def kv_bytes(spec: ModelSpec, n_slots: int, fmt: KvFormat) -> int:
    per_layer = align(fmt.nbytes(n_slots * spec.n_head_kv * spec.head_dim))
    per_layer += align(fmt.nbytes(n_slots * spec.n_head_kv * spec.head_dim_v))
    return spec.n_layer * per_layer


class KvCache:
    """K and V of every layer for `n_blocks` blocks of `block_size` positions."""

    def __init__(self, rt: Runtime, spec: ModelSpec, n_blocks: int, block_size: int, fmt: KvFormat):
        self.rt, self.format, self.format_id = rt, fmt, KV_FORMAT_IDS[fmt]
        self.n_blocks, self.block_size = n_blocks, block_size
        n_slots = n_blocks * block_size
        self.nbytes = kv_bytes(spec, n_slots, fmt)
        preflight(rt, {"kv_cache": self.nbytes})
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        k_size = align(fmt.nbytes(n_slots * spec.n_head_kv * spec.head_dim))
        v_size = align(fmt.nbytes(n_slots * spec.n_head_kv * spec.head_dim_v))
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
