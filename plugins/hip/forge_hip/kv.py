"""The paged KV cache on the device, and the per-step row metadata the kernels read.

The cache is one allocation: per layer K [n_slots, n_kv_head, head_dim] then V
[n_slots, n_kv_head, head_dim_v], float16 (float32 for all-F32 models, whose golden bounds are
tighter than float16 rounding allows). Slot of position p: block_table[p // bs] * bs + p % bs.
"""

from __future__ import annotations

import numpy as np

from forge.models.spec import ModelSpec
from forge_hip.arena import align, preflight
from forge_hip.runtime.base import DeviceBuffer, Runtime


def kv_bytes(spec: ModelSpec, n_slots: int, f16: bool) -> int:
    per_layer = align(n_slots * spec.n_head_kv * spec.head_dim * (2 if f16 else 4))
    per_layer += align(n_slots * spec.n_head_kv * spec.head_dim_v * (2 if f16 else 4))
    return spec.n_layer * per_layer


class KvCache:
    """K and V of every layer for `n_blocks` blocks of `block_size` positions."""

    def __init__(self, rt: Runtime, spec: ModelSpec, n_blocks: int, block_size: int, f16: bool):
        self.rt, self.f16 = rt, f16
        self.n_blocks, self.block_size = n_blocks, block_size
        n_slots = n_blocks * block_size
        self.nbytes = kv_bytes(spec, n_slots, f16)
        preflight(rt, {"kv_cache": self.nbytes})
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        elem = 2 if f16 else 4
        k_size = align(n_slots * spec.n_head_kv * spec.head_dim * elem)
        v_size = align(n_slots * spec.n_head_kv * spec.head_dim_v * elem)
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


class RowMeta:
    """Per-row int32 metadata in one device buffer, written by one host->device copy per step:
    ids, pos, slots, btoff (offset of the row's block table in bt), outidx (rows whose logits are
    wanted), feed (the row of the previous step's picked ids that replaces ids, or -1), then the
    flat block tables `bt`."""

    FIELDS = ("ids", "pos", "slots", "btoff", "outidx", "feed")

    def __init__(self, rt: Runtime, rows: int, bt_cap: int):
        self.rt, self.rows = rt, rows
        self.buffer: DeviceBuffer | None = None
        self._alloc(bt_cap)

    def _alloc(self, bt_cap: int) -> None:
        self.close()
        self.bt_cap = bt_cap
        self.host = np.zeros(len(self.FIELDS) * self.rows + bt_cap, np.int32)
        self.buffer = self.rt.alloc(self.host.nbytes)
        for i, name in enumerate(self.FIELDS):
            setattr(self, name, self.buffer.ptr + 4 * i * self.rows)
        self.bt = self.buffer.ptr + 4 * len(self.FIELDS) * self.rows

    def field(self, name: str) -> np.ndarray:
        i = self.FIELDS.index(name)
        return self.host[i * self.rows : (i + 1) * self.rows]

    def ensure_bt(self, n: int) -> bool:
        """Make room for n block-table entries; True if the buffer moved (graphs are stale)."""
        if n <= self.bt_cap:
            return False
        self._alloc(max(n, 2 * self.bt_cap))
        return True

    def bt_host(self) -> np.ndarray:
        return self.host[len(self.FIELDS) * self.rows :]

    def upload(self, n_bt: int, stream) -> None:  # noqa: ANN001
        used = len(self.FIELDS) * self.rows + n_bt
        self.rt.copy_to_device(self.buffer, self.host[:used], stream)

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None
