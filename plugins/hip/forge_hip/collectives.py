"""Collectives of a tensor-parallel group: NCCL on NVIDIA, RCCL on AMD, called through their
shared C API (RCCL keeps NCCL's names, types and enum values).

The library is the one a wheel or the system provides: `FORGE_NCCL_LIBRARY` when set, else on
NVIDIA the `nvidia-nccl` wheel's (the `cuda` extra) or the system's libnccl.so.2, on AMD
librccl.so. A thin ctypes layer over the C API rather than cupy.cuda.nccl: cupy is a second CUDA
runtime and array library, built per CUDA major version, for eight functions; and the C API gives
`ncclCommAbort` and `ncclCommGetAsyncError`, which a failing group needs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from forge.errors import ForgeRuntimeError

_SUCCESS, _IN_PROGRESS = 0, 7  # ncclResult_t
_FLOAT32 = 7  # ncclDataType_t ncclFloat32
_SUM = 0  # ncclRedOp_t ncclSum
UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]  # (c_char would stop at a 0)


def _candidates(platform: str) -> list[str]:
    env = os.environ.get("FORGE_NCCL_LIBRARY")
    if env:
        return [env]
    if platform == "rocm":
        return ["librccl.so.1", "librccl.so"]
    found = []
    try:
        import nvidia.nccl  # the nvidia-nccl-cu* wheel

        for base in nvidia.nccl.__path__:
            found += [str(p) for p in sorted(Path(base, "lib").glob("libnccl.so*"))]
    except ImportError:
        pass
    return found + ["libnccl.so.2", "libnccl.so"]


def load_library(platform: str) -> ctypes.CDLL:
    """The NCCL (platform "cuda") or RCCL ("rocm") library with its functions' signatures;
    ForgeRuntimeError naming where it looked when none loads."""
    tried = []
    for name in _candidates(platform):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as err:
            tried.append(f"{name} ({err})")
    else:
        what = "RCCL" if platform == "rocm" else "NCCL (pip install 'forge-llm[cuda]')"
        raise ForgeRuntimeError(f"tensor parallelism needs {what}; tried: " + "; ".join(tried))
    p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for fn, args in {
        "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
        "ncclCommInitRank": [ctypes.POINTER(p), i, _UniqueId, i],
        "ncclAllReduce": [p, p, size, i, i, p, p],
        "ncclAllGather": [p, p, size, i, p, p],
        "ncclCommAbort": [p],
        "ncclCommDestroy": [p],
        "ncclCommGetAsyncError": [p, ctypes.POINTER(i)],
        "ncclGetVersion": [ctypes.POINTER(i)],
    }.items():
        getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, i
    lib.ncclGetErrorString.argtypes, lib.ncclGetErrorString.restype = [i], ctypes.c_char_p
    return lib


def stream_handle(stream) -> int:  # noqa: ANN001 - a runtime's opaque stream
    """The raw cudaStream_t / hipStream_t of a runtime's stream object."""
    try:
        return int(stream)
    except TypeError:
        return int(stream.getPtr())


class Communicator:
    """This process's rank of a group of `world`; the buffers are device addresses of float32,
    the work is queued on the given stream (and captured into a graph when it is capturing)."""

    def __init__(self, platform: str, unique_id: bytes, world: int, rank: int):
        self._lib = load_library(platform)
        self.world, self.rank = world, rank
        self._comm = ctypes.c_void_p()
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ForgeRuntimeError(f"a group id has {UNIQUE_ID_BYTES} bytes, not {len(unique_id)}")
        uid = _UniqueId()
        ctypes.memmove(ctypes.byref(uid), unique_id, UNIQUE_ID_BYTES)
        self._check(self._lib.ncclCommInitRank(ctypes.byref(self._comm), world, uid, rank),
                    "ncclCommInitRank")  # fmt: skip

    @staticmethod
    def unique_id(platform: str) -> bytes:
        """A new group's id (rank 0 makes it; every rank passes it to the constructor)."""
        lib, uid = load_library(platform), _UniqueId()
        code = lib.ncclGetUniqueId(ctypes.byref(uid))
        if code != _SUCCESS:
            raise ForgeRuntimeError(
                f"ncclGetUniqueId failed: {lib.ncclGetErrorString(code).decode()}"
            )
        return bytes(uid.internal)

    def version(self) -> int:
        v = ctypes.c_int()
        self._check(self._lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def all_reduce(self, buf: int, count: int, stream) -> None:  # noqa: ANN001
        """buf[:count] = the sum over ranks of buf[:count] (in place)."""
        self._check(self._lib.ncclAllReduce(buf, buf, count, _FLOAT32, _SUM, self._comm,
                                            stream_handle(stream)), "ncclAllReduce")  # fmt: skip

    def all_gather(self, send: int, recv: int, count: int, stream) -> None:  # noqa: ANN001
        """recv[r * count : (r + 1) * count] = rank r's send[:count], on every rank."""
        self._check(self._lib.ncclAllGather(send, recv, count, _FLOAT32, self._comm,
                                            stream_handle(stream)), "ncclAllGather")  # fmt: skip

    def async_error(self) -> str | None:
        """The error a queued collective ran into (a peer gone, a network failure), or None."""
        code = ctypes.c_int()
        self._lib.ncclCommGetAsyncError(self._comm, ctypes.byref(code))
        if code.value in (_SUCCESS, _IN_PROGRESS):
            return None
        return self._lib.ncclGetErrorString(code.value).decode()

    def close(self, abort: bool = False) -> None:
        """Free the communicator; `abort` also cancels collectives still waiting for peers."""
        if self._comm:
            (self._lib.ncclCommAbort if abort else self._lib.ncclCommDestroy)(self._comm)
            self._comm = ctypes.c_void_p()

    def _check(self, code: int, what: str) -> None:
        if code not in (_SUCCESS, _IN_PROGRESS):
            text = self._lib.ncclGetErrorString(code).decode()
            raise ForgeRuntimeError(f"{what} failed on rank {self.rank} of {self.world}: {text}")
