"""The weights arena: every weight of a model in ONE device allocation, and the memory preflight.

Matrices are uploaded as their raw GGML blocks (the kernels decode them in place), except Q8_0,
Q6_K and MXFP4, whose rows are rearranged (q8_0_rows, q6_k_rows, mxfp4_rows; MXFP4 rows grow by
their padding) so that their quants load as aligned words; vectors (norm weights, biases) are
widened to float32 on the host first, since the kernels read them as floats. Every tensor starts
on a 256-byte boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from forge.errors import OutOfMemoryError
from forge.gguf import GGUFFile
from forge.models.spec import ModelSpec
from forge.models.weights import model_weights
from forge_hip.runtime.base import DeviceBuffer, Runtime

ALIGN = 256
MARGIN_MIN = 256 << 20  # keep at least this much device memory free ...
MARGIN_FRACTION = 0.04  # ... or this share of the device, whichever is larger


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def vector_f32(gguf: GGUFFile, name: str) -> np.ndarray:
    """A 1-D tensor as float32 (F32/F16/BF16 directly, other types through gguf's dequantizer)."""
    info = gguf.tensors[name]
    raw = gguf.raw(name).reshape(-1)
    if info.type == "F32":
        return raw.view(np.float32).copy()
    if info.type == "F16":
        return raw.view(np.float16).astype(np.float32)
    if info.type == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType[info.type]).astype(np.float32).reshape(-1)


def q8_0_rows(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Q8_0 rows [n, 34 * blocks] as the kernels read them on the device, and the offset of the
    first row's pointer into them: each row becomes its block scales (f16) in reverse order, then
    its int8 quants, and a row pointer addresses the quants (kernels/quants.h deq32_q8_0: block c's
    scale sits 2 (c + 1) bytes before the pointer). Same bytes per row, so row strides and tensor
    sizes do not change; rows of K % 128 == 0 elements keep their quants 8-byte aligned."""
    return _aux_before_quants(raw, 34, slice(0, 2), slice(2, None))


def q6_k_rows(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Q6_K rows [n, 210 * blocks] as the kernels read them on the device, and the offset of the
    first row's pointer into them: each block's 16 int8 scales and f16 d (18 bytes) move before
    the row, in reverse block order, and its 192 bytes of quants (ql, then qh) follow the pointer
    (kernels/quants.h deq32_q6_k: block c's quants at pointer + 192 c, its scales 18 (c + 1) bytes
    before the pointer, d just after them). Same bytes per row; rows of a multiple of 1024 elements
    keep their quants 8-byte aligned (GGML's 210-byte blocks are 2-aligned)."""
    return _aux_before_quants(raw, 210, slice(192, None), slice(0, 192))


def _aux_before_quants(raw: np.ndarray, block: int, aux: slice, quants: slice):
    """Rows of `block`-byte blocks rearranged as every block's `aux` bytes in reverse block order,
    then every block's `quants` bytes; and the offset of the quants (the row pointer)."""
    n, row_bytes = raw.shape
    blocks = raw.reshape(n, row_bytes // block, block)
    head = np.ascontiguousarray(blocks[:, ::-1, aux]).reshape(n, -1)
    return np.concatenate([head, blocks[:, :, quants].reshape(n, -1)], axis=1), head.shape[1]


def mxfp4_rows(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """MXFP4 rows [n, 17 * blocks] as the kernels read them on the device, and the offset of
    the first row's pointer into them: each block's E8M0 exponent moves before the row, in
    reverse block order, and its 16 bytes of codes follow the pointer (kernels/quants.h
    deq32_mxfp4). The exponents are padded to 16 bytes in front, so that every row's codes
    load as aligned 16-byte words: rows grow by under 16 bytes (mxfp4_row_bytes)."""
    n, row_bytes = raw.shape
    blocks = row_bytes // 17
    head = mxfp4_row_bytes(32 * blocks) - 16 * blocks
    b = raw.reshape(n, blocks, 17)
    out = np.zeros((n, head + 16 * blocks), np.uint8)
    out[:, head - blocks : head] = b[:, ::-1, 0]
    out[:, head:] = b[:, :, 1:].reshape(n, -1)
    return out, head


def mxfp4_row_bytes(k: int) -> int:
    """Bytes of an MXFP4 row of k elements on the device (mxfp4_rows)."""
    blocks = k // 32
    return -(-blocks // 16) * 16 + 16 * blocks


_DEVICE_ROWS = {"Q8_0": q8_0_rows, "Q6_K": q6_k_rows, "MXFP4": mxfp4_rows}


def device_nbytes(type_name: str, shape: tuple[int, ...], nbytes: int) -> int:
    """Bytes a matrix of GGUF `shape` (row length first) takes on the device."""
    if type_name != "MXFP4":
        return nbytes
    return mxfp4_row_bytes(shape[0]) * (int(np.prod(shape)) // shape[0])


def device_rows(type_name: str, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """A matrix's bytes [n, row_bytes] as uploaded for `type_name`, and where its row 0 starts
    in them (the pointer the kernels get is upload address + that offset)."""
    rows = _DEVICE_ROWS.get(type_name)
    return rows(raw) if rows else (raw, 0)


@dataclass(frozen=True)
class Placed:
    """Where one weight lives in the arena."""

    ptr: int
    type: str  # GGML type as stored ("F32" for widened vectors)
    k: int  # row length (elements)
    n: int  # rows
    row_bytes: int

    @property
    def nbytes(self) -> int:
        """The matrix's bytes as placed (rows x row bytes)."""
        return self.n * self.row_bytes


def layout(spec: ModelSpec, gguf: GGUFFile) -> tuple[dict[str, tuple[int, bool]], int]:
    """Offset of every weight in the arena, with whether it is a vector (a norm weight or a
    bias: `forge.models.weights`), and the arena's total size."""
    offsets, at = {}, 0
    for name, weight in model_weights(spec).items():
        info = gguf.tensors[name]
        vector = weight.kind == "vector"
        offsets[name] = at, vector
        size = device_nbytes(info.type, tuple(info.shape), info.nbytes)
        at += align(info.n_elements * 4 if vector else size)
    return offsets, at


def preflight(rt: Runtime, need: dict[str, int]) -> None:
    """Raise OutOfMemoryError, with the numbers, when `need` does not fit the free memory."""
    free = rt.free_memory()
    margin = max(MARGIN_MIN, int(MARGIN_FRACTION * rt.props.memory_total))
    total = sum(need.values())
    if total + margin > free:
        parts = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in need.items())
        raise OutOfMemoryError(
            f"the model needs {total / 2**20:.0f} MiB on {rt.props.name} ({parts}) plus a "
            f"{margin / 2**20:.0f} MiB safety margin, but only {free / 2**20:.0f} MiB are free"
        )


class WeightArena:
    """Uploads a model's weights into one allocation; `placed[name]` says where each one is."""

    def __init__(
        self,
        rt: Runtime,
        spec: ModelSpec,
        gguf: GGUFFile,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.rt = rt
        offsets, self.nbytes = layout(spec, gguf)
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        self.placed: dict[str, Placed] = {}
        try:
            for i, (name, (off, vector)) in enumerate(offsets.items()):
                info = gguf.tensors[name]
                ptr = self.buffer.ptr + off
                if vector:
                    data = vector_f32(gguf, name)
                    self.placed[name] = Placed(ptr, "F32", data.size, 1, data.size * 4)
                    rt.copy_to_device(ptr, data)
                else:
                    data, at = device_rows(info.type, gguf.raw(name))
                    rows = data.shape[0]
                    self.placed[name] = Placed(ptr + at, info.type, info.shape[0], rows,
                                               data.shape[1])  # fmt: skip
                    rt.copy_to_device(ptr, data)
                if progress:
                    progress(i + 1, len(offsets))
        except BaseException:
            self.close()
            raise

    def address(self, name: str) -> int:
        """Where a weight starts on the device, 0 when the model has no weight of that name
        (the kernels' "absent" for norm weights and biases)."""
        placed = self.placed.get(name)
        return placed.ptr if placed is not None else 0

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None
