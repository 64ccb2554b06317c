"""The AMD platform: HIP runtime and hipRTC through hip-python (`from hip import hip, hiprtc`).

Never run against an AMD GPU in this project (none is available): compilation through hipRTC is
exercised in tests (it needs no device), the rest mirrors the NVIDIA runtime call for call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from forge.errors import ForgeRuntimeError, OutOfMemoryError
from forge_hip.rocm_libs import install_resolver
from forge_hip.runtime.base import (
    ArgPack,
    DeviceBuffer,
    DeviceProps,
    Kernel,
    Runtime,
    address,
    dims,
)
from forge_hip.runtime.cache import cached_compile


def _hip():
    install_resolver()
    from hip import hip

    return hip


def _hiprtc():
    install_resolver()
    from hip import hiprtc

    return hiprtc


def check(result: Any, what: str = "HIP call") -> Any:
    """Unwrap a hip-python result `(status, *values)`; raise a typed error on failure.

    Returns None, the single value, or a tuple of values.
    """
    status, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(status) != 0:
        name = getattr(status, "name", str(status))
        msg = f"{what} failed: {name}"
        if name in ("hipErrorOutOfMemory", "hipErrorMemoryAllocation"):
            raise OutOfMemoryError(msg)
        raise ForgeRuntimeError(msg)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def compiler_version() -> str:
    major, minor = check(_hiprtc().hiprtcVersion(), "hiprtcVersion")
    runtime = check(_hip().hipRuntimeGetVersion(), "hipRuntimeGetVersion")
    return f"hiprtc-{major}.{minor}-hip-{runtime}"


def compile_source(source: str, name: str, arch: str, flags: Sequence[str] = ()) -> bytes:
    """Compile with hipRTC to a code object for `arch` ("gfx90a"). Needs no device."""
    rtc = _hiprtc()
    prog = check(
        rtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, [], []), "hiprtcCreateProgram"
    )
    try:
        opts = [f"--offload-arch={arch}".encode(), b"-O3"] + [f.encode() for f in flags]
        status = rtc.hiprtcCompileProgram(prog, len(opts), opts)[0]
        size = check(rtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        log = bytearray(size)
        if size:
            check(rtc.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
        if int(status) != 0:
            raise ForgeRuntimeError(
                f"hipRTC failed to compile {name} for {arch}:\n{log.decode(errors='replace')}"
            )
        size = check(rtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(size)
        check(rtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        return bytes(code)
    finally:
        # hipRTC takes a pointer to the program handle here, not the handle itself
        holder = ctypes.c_void_p(int(prog))
        rtc.hiprtcDestroyProgram(ctypes.addressof(holder))


class HipRuntime(Runtime):
    """One AMD GPU."""

    platform = "rocm"

    def __init__(self, index: int = 0):
        self._hip = hip = _hip()
        check(hip.hipSetDevice(index), "hipSetDevice")
        self._index = index
        self._modules: list[Any] = []
        self._closed = False
        self.props = self._read_props()

    def _read_props(self) -> DeviceProps:
        hip = self._hip
        p = hip.hipDeviceProp_t()
        check(hip.hipGetDeviceProperties(p, self._index), "hipGetDeviceProperties")
        free, total = check(hip.hipMemGetInfo(), "hipMemGetInfo")
        return DeviceProps(
            name=_text(p.name),
            arch=_text(p.gcnArchName).split(":", 1)[0],  # drop feature flags (":xnack-")
            memory_total=int(total),
            memory_free=int(free),
            compute_units=int(p.multiProcessorCount),
            warp_size=int(p.warpSize),
            compiler=compiler_version(),
        )

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = check(self._hip.hipMalloc(max(1, int(nbytes))), f"hipMalloc({nbytes} bytes)")
        return DeviceBuffer(int(ptr), int(nbytes))

    def free(self, buf: DeviceBuffer) -> None:
        if buf.ptr:
            check(self._hip.hipFree(buf.ptr), "hipFree")
            buf.ptr = 0

    def _copy(self, dst: int, src: int, nbytes: int, kind: str, stream) -> None:
        k = getattr(self._hip.hipMemcpyKind, kind)
        if stream is None:
            check(self._hip.hipMemcpy(dst, src, nbytes, k), "hipMemcpy")
        else:
            check(self._hip.hipMemcpyAsync(dst, src, nbytes, k, stream), "hipMemcpyAsync")

    def copy_to_device(self, dst, src: np.ndarray, stream=None) -> None:
        src = np.ascontiguousarray(src)
        self._copy(address(dst), src.ctypes.data, src.nbytes, "hipMemcpyHostToDevice", stream)

    def copy_to_host(self, dst: np.ndarray, src, stream=None) -> None:
        if not dst.flags.c_contiguous:
            raise ForgeRuntimeError("copy_to_host needs a C-contiguous destination array")
        self._copy(dst.ctypes.data, address(src), dst.nbytes, "hipMemcpyDeviceToHost", stream)

    def copy_device(self, dst, src, nbytes: int, stream=None) -> None:
        self._copy(address(dst), address(src), nbytes, "hipMemcpyDeviceToDevice", stream)

    def memset(self, dst, byte: int, nbytes: int, stream=None) -> None:
        if stream is None:
            check(self._hip.hipMemset(address(dst), byte & 0xFF, nbytes), "hipMemset")
        else:
            check(
                self._hip.hipMemsetAsync(address(dst), byte & 0xFF, nbytes, stream),
                "hipMemsetAsync",
            )

    def free_memory(self) -> int:
        return int(check(self._hip.hipMemGetInfo(), "hipMemGetInfo")[0])

    def stream(self):
        return check(self._hip.hipStreamCreate(), "hipStreamCreate")

    def synchronize(self, stream=None) -> None:
        if stream is None:
            check(self._hip.hipDeviceSynchronize(), "hipDeviceSynchronize")
        else:
            check(self._hip.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def event(self):
        return check(self._hip.hipEventCreate(), "hipEventCreate")

    def record(self, event, stream=None) -> None:
        check(self._hip.hipEventRecord(event, stream), "hipEventRecord")

    def elapsed_ms(self, start, end) -> float:
        self.wait(end)
        return float(check(self._hip.hipEventElapsedTime(start, end), "hipEventElapsedTime"))

    def wait(self, event) -> None:
        check(self._hip.hipEventSynchronize(event), "hipEventSynchronize")

    def _host_malloc(self, nbytes: int) -> int:
        return int(check(self._hip.hipHostMalloc(nbytes, 0), f"hipHostMalloc({nbytes} bytes)"))

    def free_host(self, array: np.ndarray) -> None:
        check(self._hip.hipHostFree(array.ctypes.data), "hipHostFree")

    def compile(self, source: str, name: str, flags: Sequence[str] = ()) -> bytes:
        arch = self.props.arch
        return cached_compile(
            source,
            arch,
            self.props.compiler,
            flags,
            lambda: compile_source(source, name, arch, flags),
        )

    def load(self, binary: bytes):
        module = check(self._hip.hipModuleLoadData(binary), "hipModuleLoadData")
        self._modules.append(module)
        return module

    def function(self, module, name: str, signature: str) -> Kernel:
        fn = check(
            self._hip.hipModuleGetFunction(module, name.encode()), f"hipModuleGetFunction({name})"
        )
        return Kernel(fn, name, signature)

    def launch(
        self, kernel: Kernel, grid, block, args, shared=None, stream=None, overlap=False
    ) -> None:
        shared = kernel.shared if shared is None else shared
        pack = ArgPack(kernel.signature, args)
        g, b = dims(grid), dims(block)
        check(
            self._hip.hipModuleLaunchKernel(
                kernel.handle, *g, *b, shared, stream, pack.address, None
            ),
            f"launch {kernel.name}",
        )

    def begin_capture(self, stream) -> None:
        mode = self._hip.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal
        check(self._hip.hipStreamBeginCapture(stream, mode), "hipStreamBeginCapture")

    def end_capture(self, stream):
        graph = check(self._hip.hipStreamEndCapture(stream), "hipStreamEndCapture")
        try:
            return check(self._hip.hipGraphInstantiate(graph, None, None, 0), "hipGraphInstantiate")
        finally:
            self._hip.hipGraphDestroy(graph)

    def replay(self, graph, stream) -> None:
        check(self._hip.hipGraphLaunch(graph, stream), "hipGraphLaunch")

    def bind(self) -> None:
        check(self._hip.hipSetDevice(self._index), "hipSetDevice")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for m in self._modules:
            self._hip.hipModuleUnload(m)
        self._modules.clear()


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)
