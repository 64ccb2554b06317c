"""One layer's K or V cache in a `KvFormat`: [slots, heads, dim] values, written a token row at
a time and read back as float32 only for the slots an attention reads.

Storage per format: float32 or float16 arrays; bf16 as its 16 bits; Q8_0 as int8 values with one
f16 scale per 32 values of a head, Q4_0 as 4-bit values (two per byte) with the same scales.
Rounding follows llama.cpp's CPU conversions into its cache (Q8_0: values x * 127 / max|x|
rounded half to even, scale max|x| / 127; Q4_0: scale from the value of largest magnitude / -8,
values truncated from x / scale + 8.5 and capped at 15), so the cache holds the numbers
llama.cpp's does. `query_rounding` is what llama.cpp's flash attention does to Q before its dot
products with K in that format.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from forge.errors import OutOfMemoryError
from forge.kv_cache import KvFormat, require_whole_blocks
from forge_cpu_simd.act_round import round_bf16, round_f16, round_q8_0

QK = 32  # values per block of the quantized formats


class KvArray:
    """A [slots, heads, dim] cache of one layer's K or V, stored as `fmt`."""

    def __init__(self, fmt: KvFormat, slots: int, heads: int, dim: int):
        require_whole_blocks(fmt, [dim])
        self.fmt, self.heads, self.dim = fmt, heads, dim
        shape = (slots, heads)
        try:
            if fmt is KvFormat.F32:
                self.values = np.zeros((*shape, dim), np.float32)
            elif fmt is KvFormat.F16:
                self.values = np.zeros((*shape, dim), np.float16)
            elif fmt is KvFormat.BF16:
                self.values = np.zeros((*shape, dim), np.uint16)
            else:
                width = dim if fmt is KvFormat.Q8_0 else dim // 2
                self.values = np.zeros((*shape, width), np.int8 if width == dim else np.uint8)
                self.scales = np.zeros((*shape, dim // QK), np.float16)
        except MemoryError:
            raise OutOfMemoryError(
                f"cannot allocate a {fmt.nbytes(slots * heads * dim) / 2**20:.0f} MiB KV cache"
            ) from None

    @property
    def nbytes(self) -> int:
        scales = getattr(self, "scales", None)
        return self.values.nbytes + (scales.nbytes if scales is not None else 0)

    def write(self, slots: np.ndarray, x: np.ndarray) -> None:
        """Store x [len(slots), heads, dim] (float32) at `slots`."""
        fmt = self.fmt
        if fmt is KvFormat.F32 or fmt is KvFormat.F16:
            self.values[slots] = x
        elif fmt is KvFormat.BF16:
            self.values[slots] = (round_bf16(x.reshape(len(x), -1)).view(np.uint32) >> 16).reshape(
                x.shape
            )
        elif fmt is KvFormat.Q8_0:
            q, d = quantize_q8_0(x)
            self.values[slots], self.scales[slots] = q, d
        else:
            q, d = quantize_q4_0(x)
            self.values[slots], self.scales[slots] = q, d

    def read(self, slots: np.ndarray | slice) -> np.ndarray:
        """The values at `slots` (any shape S, or a slice of slots) as float32 [*S, heads,
        dim]: for a slice or consecutive slots of a float32 cache a read-only view, else a
        copy."""
        fmt = self.fmt
        if fmt is KvFormat.F32:
            run = slots if isinstance(slots, slice) else consecutive(slots)
            if run is None:
                return self.values[slots]
            view = self.values[run]
            view.flags.writeable = False
            return view
        if fmt is KvFormat.F16:
            return self.values[slots].astype(np.float32)
        if fmt is KvFormat.BF16:
            return (self.values[slots].astype(np.uint32) << 16).view(np.float32)
        d = self.scales[slots].astype(np.float32)
        if fmt is KvFormat.Q8_0:
            q = self.values[slots].astype(np.float32)
        else:
            packed = self.values[slots]
            q = np.empty((*packed.shape[:-1], self.dim), np.float32)
            q[..., 0::2] = (packed & 0x0F).astype(np.float32) - 8
            q[..., 1::2] = (packed >> 4).astype(np.float32) - 8
        blocks = q.reshape(*q.shape[:-1], self.dim // QK, QK) * d[..., None]
        return blocks.reshape(q.shape)


def consecutive(slots: np.ndarray) -> slice | None:
    """slots[0] .. slots[-1] as a slice when `slots` (1-D) counts up by one, else None (a
    sequence's cache blocks are usually allocated in order, so its keys are one run)."""
    if slots.ndim != 1 or len(slots) < 2:
        return None
    first, last = int(slots[0]), int(slots[-1])
    if last - first != len(slots) - 1 or not (np.diff(slots) == 1).all():
        return None
    return slice(first, last + 1)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., dim] as Q8_0: int8 values and f16 scales [..., dim / 32]."""
    b = x.reshape(*x.shape[:-1], -1, QK)
    amax = np.abs(b).max(axis=-1)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.rint(b * inv[..., None]).astype(np.int8)
    return q.reshape(x.shape), (amax / np.float32(127)).astype(np.float16)


def quantize_q4_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., dim] as Q4_0: 4-bit values (value + 8, two per byte: even index in the low
    nibble) and f16 scales [..., dim / 32]."""
    b = x.reshape(*x.shape[:-1], -1, QK)
    peak = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    d = peak / np.float32(-8)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(np.trunc(b * inv[..., None] + np.float32(8.5)), 15).astype(np.uint8)
    q = q.reshape(x.shape)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), d.astype(np.float16)


def query_rounding(fmt: KvFormat) -> Callable[[np.ndarray], np.ndarray] | None:
    """How llama.cpp's CPU flash attention rounds Q [rows, dim] before its dot products with K
    stored as `fmt` (the format's vec_dot partner: Q8_0 for the quantized ones)."""
    return _QUERY_ROUNDING.get(fmt)


_QUERY_ROUNDING = {KvFormat.F16: round_f16, KvFormat.BF16: round_bf16, KvFormat.Q8_0: round_q8_0,
                   KvFormat.Q4_0: round_q8_0}  # fmt: skip
