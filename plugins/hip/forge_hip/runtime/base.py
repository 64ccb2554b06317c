"""The platform-neutral device runtime interface that everything above forge_hip.runtime uses.

A `Runtime` is one GPU seen through one platform's API (AMD through hip-python, NVIDIA through
cuda-python). Device memory is a plain integer address; streams, events, modules, functions and
graphs are opaque handles owned by the runtime. Kernel arguments are packed by `pack_args` from a
signature string, so the same launch code serves both platforms.
"""

from __future__ import annotations

import ctypes
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from forge.errors import ForgeRuntimeError, UsageError

# One character per kernel parameter: p pointer, i int32, u uint32, q int64, f float32.
_ARG_TYPES = {
    "p": ctypes.c_uint64,
    "i": ctypes.c_int32,
    "u": ctypes.c_uint32,
    "q": ctypes.c_int64,
    "f": ctypes.c_float,
}


@dataclass(frozen=True)
class DeviceProps:
    """What the runtime knows about its device."""

    name: str  # "NVIDIA H200", "AMD Instinct MI210"
    arch: str  # "sm_90", "gfx90a"
    memory_total: int  # bytes
    memory_free: int  # bytes free when the runtime opened
    compute_units: int  # multiprocessors (NVIDIA) or compute units (AMD)
    warp_size: int  # 32 or 64
    compiler: str  # run-time compiler and its version, part of the kernel cache key


class ArgPack:
    """Kernel arguments laid out as the `void**` array both platforms' launch calls take.

    Holds the ctypes values alive for as long as the pack lives: graph capture copies them at
    launch, so a pack may be dropped once the launch (or capture) call has returned.
    """

    def __init__(self, signature: str, args: Sequence[Any]):
        if len(signature) != len(args):
            raise UsageError(
                f"kernel signature {signature!r} wants {len(signature)} arguments, got {len(args)}"
            )
        try:
            self.values = [_ARG_TYPES[c](_as_scalar(a)) for c, a in zip(signature, args)]
        except KeyError as exc:
            raise UsageError(
                f"unknown kernel argument type {exc.args[0]!r} in {signature!r}"
            ) from None
        self.pointers = (ctypes.c_void_p * max(1, len(args)))(
            *[ctypes.addressof(v) for v in self.values]
        )

    @property
    def address(self) -> int:
        """Address of the `void*` array."""
        return ctypes.addressof(self.pointers)


def _as_scalar(value: Any) -> int | float:
    if isinstance(value, DeviceBuffer):
        return value.ptr
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class DeviceBuffer:
    """A device allocation: its address and size. Freed through its runtime."""

    ptr: int
    nbytes: int


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel function and the signature its arguments are packed with. `overlaps`: its
    first statement is forge_hip.h's FORGE_GRID_WAIT(), so it may be launched to overlap the end of
    the kernel before it (every kernel of forge's kernels/; not third-party ones). `shared`: the
    dynamic shared memory (bytes) every launch of it asks for (`Runtime.reserve_shared`)."""

    handle: Any
    name: str
    signature: str
    overlaps: bool = False
    shared: int = 0


class Runtime(ABC):
    """One device of one GPU platform."""

    platform: str  # "rocm" or "cuda"
    props: DeviceProps

    # memory
    @abstractmethod
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate device memory; raises OutOfMemoryError when it does not fit."""

    @abstractmethod
    def free(self, buf: DeviceBuffer) -> None:
        """Free an allocation (safe to call twice)."""

    @abstractmethod
    def copy_to_device(self, dst: DeviceBuffer | int, src: np.ndarray, stream: Any = None) -> None:
        """Copy a contiguous host array to device memory (synchronous when stream is None)."""

    @abstractmethod
    def copy_to_host(self, dst: np.ndarray, src: DeviceBuffer | int, stream: Any = None) -> None:
        """Copy device memory into a contiguous host array (synchronous when stream is None)."""

    @abstractmethod
    def copy_device(
        self, dst: DeviceBuffer | int, src: DeviceBuffer | int, nbytes: int, stream: Any = None
    ) -> None:
        """Device-to-device copy."""

    @abstractmethod
    def memset(self, dst: DeviceBuffer | int, byte: int, nbytes: int, stream: Any = None) -> None:
        """Fill `nbytes` with one byte value."""

    @abstractmethod
    def free_memory(self) -> int:
        """Bytes of device memory free now."""

    # streams and events
    @abstractmethod
    def stream(self) -> Any:
        """Create a stream."""

    @abstractmethod
    def synchronize(self, stream: Any = None) -> None:
        """Wait for a stream (or the whole device when None)."""

    @abstractmethod
    def event(self) -> Any:
        """Create a timing event."""

    @abstractmethod
    def record(self, event: Any, stream: Any = None) -> None:
        """Record an event on a stream."""

    @abstractmethod
    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events (waits for `end`)."""

    @abstractmethod
    def wait(self, event: Any) -> None:
        """Block until the work recorded before `event` on its stream is done."""

    # page-locked host memory: a copy between it and the device on a stream returns at once
    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory as a uint8 array of `nbytes`."""
        n = max(1, int(nbytes))
        ptr = self._host_malloc(n)
        return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(int(ptr)))

    @abstractmethod
    def _host_malloc(self, nbytes: int) -> int:
        """The address of `nbytes` (> 0) of page-locked host memory."""

    @abstractmethod
    def free_host(self, array: np.ndarray) -> None:
        """Free what `alloc_host` returned (the array must not be used afterwards)."""

    # compilation and launch
    @abstractmethod
    def compile(self, source: str, name: str, flags: Sequence[str] = ()) -> bytes:
        """Compile one self-contained source for this device; returns the code object."""

    @abstractmethod
    def load(self, binary: bytes) -> Any:
        """Load a code object; returns a module handle."""

    @abstractmethod
    def function(self, module: Any, name: str, signature: str) -> Kernel:
        """Look up an `extern "C"` kernel in a loaded module."""

    def reserve_shared(self, kernel: Kernel, nbytes: int) -> Kernel:
        """`kernel` launched with `nbytes` of dynamic shared memory, allowed past the platform's
        default cap (NVIDIA: 48 KiB) where the device has that much."""
        raise ForgeRuntimeError(f"{self.platform}: no dynamic shared memory for {kernel.name}")

    @abstractmethod
    def launch(
        self,
        kernel: Kernel,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
        shared: int | None = None,
        stream: Any = None,
        overlap: bool = False,
    ) -> None:
        """Launch a kernel asynchronously on `stream` with `shared` bytes of dynamic shared
        memory (None: the kernel's own `shared`). `overlap` (for kernels that `overlaps`):
        let it start before the previous kernel on the stream completes where the platform can
        (NVIDIA sm_90+ programmatic dependent launch); elsewhere a plain launch."""

    # graphs
    @abstractmethod
    def begin_capture(self, stream: Any) -> None:
        """Start recording the work issued on `stream` into a graph instead of running it."""

    @abstractmethod
    def end_capture(self, stream: Any) -> Any:
        """Stop recording; returns an executable (instantiated) graph."""

    @abstractmethod
    def replay(self, graph: Any, stream: Any) -> None:
        """Launch an executable graph on `stream`."""

    @abstractmethod
    def bind(self) -> None:
        """Make this device current for the calling thread (GPU APIs keep it per thread: a
        server runs forward passes on a worker thread, not the one that loaded the model)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the runtime holds (contexts, modules). Safe to call twice."""


def dims(v: Sequence[int]) -> tuple[int, int, int]:
    """A 1-3 element grid/block shape as (x, y, z)."""
    t = tuple(int(x) for x in v) + (1, 1, 1)
    if len(v) == 0 or len(v) > 3 or min(t[:3]) < 1:
        raise UsageError(f"launch dimensions must be 1-3 positive ints, got {tuple(v)}")
    return t[0], t[1], t[2]


def address(x: DeviceBuffer | int) -> int:
    return x.ptr if isinstance(x, DeviceBuffer) else int(x)
