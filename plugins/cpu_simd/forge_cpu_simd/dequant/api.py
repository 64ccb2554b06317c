"""Dequantize GGUF tensor bytes to float32: validation, chunking and threading around the decoders.

Work is cut into chunks of about `CHUNK_WEIGHTS` weights so that the uint8 temporaries of a chunk
stay in cache, and the chunks of a large tensor are spread over a thread pool: NumPy releases the
GIL inside its loops, so the threads run on all cores.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from forge.errors import GGUFFormatError, UnsupportedModelError, UsageError
from forge.gguf.types import block_geometry
from forge_cpu_simd.dequant import kquants, legacy, mxfp4, simple

Decoder = Callable[[np.ndarray, np.ndarray], None]

DECODERS: dict[str, Decoder] = {
    "F32": simple.decode_f32, "F16": simple.decode_f16, "BF16": simple.decode_bf16,
    "Q4_0": legacy.decode_q4_0, "Q4_1": legacy.decode_q4_1, "Q5_0": legacy.decode_q5_0,
    "Q5_1": legacy.decode_q5_1, "Q8_0": legacy.decode_q8_0,
    "Q2_K": kquants.decode_q2_k, "Q3_K": kquants.decode_q3_k, "Q4_K": kquants.decode_q4_k,
    "Q5_K": kquants.decode_q5_k, "Q6_K": kquants.decode_q6_k,
    "MXFP4": mxfp4.decode_mxfp4,
}  # fmt: skip

CHUNK_WEIGHTS = 1 << 18  # weights per decoder call: temporaries of ~1-3 MB, about an L2
PARALLEL_MIN_WEIGHTS = 2 * CHUNK_WEIGHTS  # one chunk is not worth a thread hand-off
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_threads(), thread_name_prefix="forge-dequant")
        return _pool


def _decoder(type_name: str) -> tuple[Decoder, int, int]:
    decoder = DECODERS.get(type_name)
    if decoder is None:
        raise UnsupportedModelError(
            f"weight type {type_name!r} cannot be dequantized by the cpu_simd backend "
            f"(supported: {', '.join(DECODERS)})"
        )
    block, block_bytes = block_geometry(type_name)
    return decoder, block, block_bytes


def _check_raw(raw: np.ndarray, type_name: str, row_len: int, block: int, block_bytes: int) -> None:
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        what = (
            f"{raw.dtype} array of shape {raw.shape}" if isinstance(raw, np.ndarray) else type(raw)
        )
        raise GGUFFormatError(f"{type_name} tensor data must be a 2-D uint8 array, got {what}")
    if row_len <= 0 or row_len % block:
        raise GGUFFormatError(
            f"{type_name} row length {row_len} is not a positive multiple of its block size {block}"
        )
    if raw.shape[1] != row_len // block * block_bytes:
        raise GGUFFormatError(
            f"{type_name} rows of {row_len} weights take {row_len // block * block_bytes} bytes, "
            f"but the data has rows of {raw.shape[1]} bytes"
        )


def _check_out(out: np.ndarray, rows: int, row_len: int) -> None:
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.float32
        or out.shape != (rows, row_len)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise UsageError(
            f"out must be a writeable C-contiguous float32 array of shape {(rows, row_len)}"
        )


def dequantize(
    raw: np.ndarray,
    type_name: str,
    row_len: int,
    *,
    out: np.ndarray | None = None,
    parallel: bool = True,
) -> np.ndarray:
    """Decode a tensor's bytes to float32.

    raw: uint8 [rows, row_bytes], as `GGUFFile.raw` returns it (read-only views are fine).
    type_name: GGML type name, e.g. "Q4_K". row_len: weights per row (the tensor's shape[0]).
    out: optional preallocated float32 [rows, row_len] (C-contiguous) to write into.
    parallel: spread large tensors over all cores.
    Returns float32 [rows, row_len] (`out` when given). Raises `UnsupportedModelError` for a type
    without a decoder, `GGUFFormatError` when raw's shape does not fit the type and row length,
    `UsageError` for a bad `out`.
    """
    decoder, block, block_bytes = _decoder(type_name)
    _check_raw(raw, type_name, row_len, block, block_bytes)
    rows = raw.shape[0]
    if out is None:
        out = np.empty((rows, row_len), np.float32)
    else:
        _check_out(out, rows, row_len)
    if rows == 0:
        return out
    blocks = np.ascontiguousarray(raw).reshape(-1, block_bytes)
    weights = out.reshape(-1, block)
    step = max(1, CHUNK_WEIGHTS // block)
    spans = [(s, min(s + step, len(blocks))) for s in range(0, len(blocks), step)]

    def run(span: tuple[int, int]) -> None:
        decoder(blocks[span[0] : span[1]], weights[span[0] : span[1]])

    if parallel and len(spans) > 1 and out.size >= PARALLEL_MIN_WEIGHTS and _threads() > 1:
        for _ in _get_pool().map(run, spans):
            pass
    else:
        for span in spans:
            run(span)
    return out


def dequantize_rows(
    raw: np.ndarray, type_name: str, row_len: int, start: int, stop: int, **kwargs
) -> np.ndarray:
    """Decode rows [start, stop) of a tensor: float32 [stop - start, row_len].

    Takes the keyword arguments of `dequantize`. Raises `UsageError` for an out-of-range span.
    """
    rows = raw.shape[0] if isinstance(raw, np.ndarray) and raw.ndim == 2 else None
    if rows is not None and not 0 <= start <= stop <= rows:
        raise UsageError(f"row span [{start}, {stop}) is outside the tensor's {rows} rows")
    return dequantize(raw[start:stop], type_name, row_len, **kwargs)


def iter_row_chunks(
    raw: np.ndarray, type_name: str, row_len: int, rows_per_chunk: int, **kwargs
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (first row, float32 [<= rows_per_chunk, row_len]) over a tensor, in order.

    Each chunk is a fresh array, so only one chunk's worth of float32 is alive at a time if the
    caller drops it before taking the next. Takes the keyword arguments of `dequantize`.
    """
    if rows_per_chunk <= 0:
        raise UsageError(f"rows_per_chunk must be positive, got {rows_per_chunk}")
    _, block, block_bytes = _decoder(type_name)
    _check_raw(raw, type_name, row_len, block, block_bytes)
    for start in range(0, raw.shape[0], rows_per_chunk):
        yield start, dequantize(raw[start : start + rows_per_chunk], type_name, row_len, **kwargs)
