"""The NVIDIA platform: CUDA driver API and NVRTC through cuda-python (`cuda.bindings`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from forge.errors import ForgeRuntimeError, OutOfMemoryError
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


def _driver():
    from cuda.bindings import driver

    return driver


def check(result: Any, what: str = "CUDA call") -> Any:
    """Unwrap a cuda-python result tuple `(status, *values)`; raise a typed error on failure.

    Returns None, the single value, or a tuple of values.
    """
    status, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(status) != 0:
        name = getattr(status, "name", str(status))
        msg = f"{what} failed: {name}"
        if name in ("CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation"):
            raise OutOfMemoryError(msg)
        raise ForgeRuntimeError(msg)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def compiler_version() -> str:
    from cuda.bindings import nvrtc

    major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc-{major}.{minor}"


def compile_source(source: str, name: str, arch: str, flags: Sequence[str] = ()) -> bytes:
    """Compile with NVRTC to a CUBIN for `arch` ("sm_90"). Raises ForgeRuntimeError with the log."""
    from cuda.bindings import nvrtc

    prog = check(
        nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram"
    )
    try:
        opts = [f"--gpu-architecture={arch}".encode()] + [f.encode() for f in flags]
        status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if int(status) != 0:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise ForgeRuntimeError(
                f"NVRTC failed to compile {name} for {arch}:\n{log.decode(errors='replace')}"
            )
        size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


class CudaRuntime(Runtime):
    """One NVIDIA GPU, through its primary context."""

    platform = "cuda"

    def __init__(self, index: int = 0):
        drv = _driver()
        self._drv = drv
        check(drv.cuInit(0), "cuInit")
        self._dev = check(drv.cuDeviceGet(index), "cuDeviceGet")
        self._ctx = check(drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        self._modules: list[Any] = []
        self._closed = False
        self.props = self._read_props()
        # Programmatic dependent launch (sm_90+): a launch may overlap the previous kernel's end.
        self._pdl = int(self.props.arch.removeprefix("sm_")) >= 90
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        self._pdl_attr = attr

    def _attr(self, attr: str) -> int:
        a = getattr(self._drv.CUdevice_attribute, attr)
        return int(check(self._drv.cuDeviceGetAttribute(a, self._dev), "cuDeviceGetAttribute"))

    def _read_props(self) -> DeviceProps:
        drv = self._drv
        name = check(drv.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        major = self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = self._attr("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        free, total = check(drv.cuMemGetInfo(), "cuMemGetInfo")
        return DeviceProps(
            name=name.split(b"\0", 1)[0].decode(errors="replace"),
            arch=f"sm_{major}{minor}",
            memory_total=int(total),
            memory_free=int(free),
            compute_units=self._attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            warp_size=self._attr("CU_DEVICE_ATTRIBUTE_WARP_SIZE"),
            compiler=compiler_version(),
        )

    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = check(self._drv.cuMemAlloc(max(1, int(nbytes))), f"cuMemAlloc({nbytes} bytes)")
        return DeviceBuffer(int(ptr), int(nbytes))

    def free(self, buf: DeviceBuffer) -> None:
        if buf.ptr:
            check(self._drv.cuMemFree(buf.ptr), "cuMemFree")
            buf.ptr = 0

    def copy_to_device(self, dst, src: np.ndarray, stream=None) -> None:
        src = np.ascontiguousarray(src)
        if stream is None:
            check(self._drv.cuMemcpyHtoD(address(dst), src.ctypes.data, src.nbytes), "cuMemcpyHtoD")
        else:
            check(
                self._drv.cuMemcpyHtoDAsync(address(dst), src.ctypes.data, src.nbytes, stream),
                "cuMemcpyHtoDAsync",
            )

    def copy_to_host(self, dst: np.ndarray, src, stream=None) -> None:
        if not dst.flags.c_contiguous:
            raise ForgeRuntimeError("copy_to_host needs a C-contiguous destination array")
        if stream is None:
            check(self._drv.cuMemcpyDtoH(dst.ctypes.data, address(src), dst.nbytes), "cuMemcpyDtoH")
        else:
            check(
                self._drv.cuMemcpyDtoHAsync(dst.ctypes.data, address(src), dst.nbytes, stream),
                "cuMemcpyDtoHAsync",
            )

    def copy_device(self, dst, src, nbytes: int, stream=None) -> None:
        check(
            self._drv.cuMemcpyDtoDAsync(address(dst), address(src), nbytes, stream or 0),
            "cuMemcpyDtoDAsync",
        )
        if stream is None:
            self.synchronize()

    def memset(self, dst, byte: int, nbytes: int, stream=None) -> None:
        check(
            self._drv.cuMemsetD8Async(address(dst), byte & 0xFF, nbytes, stream or 0),
            "cuMemsetD8Async",
        )
        if stream is None:
            self.synchronize()

    def free_memory(self) -> int:
        return int(check(self._drv.cuMemGetInfo(), "cuMemGetInfo")[0])

    def stream(self):
        flags = self._drv.CUstream_flags.CU_STREAM_NON_BLOCKING
        return check(self._drv.cuStreamCreate(flags), "cuStreamCreate")

    def synchronize(self, stream=None) -> None:
        if stream is None:
            check(self._drv.cuCtxSynchronize(), "cuCtxSynchronize")
        else:
            check(self._drv.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def event(self):
        return check(self._drv.cuEventCreate(0), "cuEventCreate")

    def record(self, event, stream=None) -> None:
        check(self._drv.cuEventRecord(event, stream or 0), "cuEventRecord")

    def elapsed_ms(self, start, end) -> float:
        self.wait(end)
        return float(check(self._drv.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    def wait(self, event) -> None:
        check(self._drv.cuEventSynchronize(event), "cuEventSynchronize")

    def _host_malloc(self, nbytes: int) -> int:
        return int(check(self._drv.cuMemHostAlloc(nbytes, 0), f"cuMemHostAlloc({nbytes} bytes)"))

    def free_host(self, array: np.ndarray) -> None:
        check(self._drv.cuMemFreeHost(array.ctypes.data), "cuMemFreeHost")

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
        module = check(self._drv.cuModuleLoadData(binary), "cuModuleLoadData")
        self._modules.append(module)
        return module

    def function(self, module, name: str, signature: str) -> Kernel:
        fn = check(
            self._drv.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})"
        )
        return Kernel(fn, name, signature)

    def reserve_shared(self, kernel: Kernel, nbytes: int) -> Kernel:
        attr = self._drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        status = self._drv.cuFuncSetAttribute(kernel.handle, attr, nbytes)
        check(status, f"{kernel.name}: {nbytes} bytes of dynamic shared memory")
        return replace(kernel, shared=nbytes)

    def launch(
        self, kernel: Kernel, grid, block, args, shared=None, stream=None, overlap=False
    ) -> None:
        shared = kernel.shared if shared is None else shared
        pack = ArgPack(kernel.signature, args)
        g, b = dims(grid), dims(block)
        if overlap and self._pdl:
            drv = self._drv
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
            cfg.sharedMemBytes = shared
            cfg.hStream = stream or 0
            cfg.attrs = [self._pdl_attr]
            cfg.numAttrs = 1
            status = drv.cuLaunchKernelEx(cfg, kernel.handle, pack.address, 0)
            check(status, f"launch {kernel.name}")
            return
        check(
            self._drv.cuLaunchKernel(kernel.handle, *g, *b, shared, stream or 0, pack.address, 0),
            f"launch {kernel.name}",
        )

    def begin_capture(self, stream) -> None:
        mode = self._drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(self._drv.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")

    def end_capture(self, stream):
        graph = check(self._drv.cuStreamEndCapture(stream), "cuStreamEndCapture")
        try:
            return check(self._drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            self._drv.cuGraphDestroy(graph)

    def replay(self, graph, stream) -> None:
        check(self._drv.cuGraphLaunch(graph, stream), "cuGraphLaunch")

    def bind(self) -> None:
        check(self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for m in self._modules:
            self._drv.cuModuleUnload(m)
        self._modules.clear()
        self._drv.cuDevicePrimaryCtxRelease(self._dev)
