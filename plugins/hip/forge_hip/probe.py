"""Find GPUs on both HIP platforms. Never raises: every failure becomes a precise reason.

Reasons name the missing piece: the Python package, the runtime library, a device, or an
architecture the kernels do not support.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from forge.devices import DeviceInfo

# Architectures the kernels are written and compiled for (wavefront 64 and 32 both handled).
AMD_ARCH = re.compile(r"^gfx(90[68a]|94[0-2]|103\d|110\d|115\d|120\d)$")
MIN_SM = 70  # warp-synchronous shuffles (__shfl_xor_sync) and independent thread scheduling

FLAGS = frozenset({"graphs", "f16", "bf16"})
# The op vocabulary of the kernel table for backend "hip" (forge_hip.plugin documents each).
OPS = frozenset(
    {
        "matmul",
        "embed",
        "add_norm",
        "qk_rope_store",
        "attn_rows",
        "attn_decode",
        "gather_rows",
        "add_bias",
        "act_round",
        "sample_rows",
        "geglu",
        "swiglu",
    }
)
WEIGHT_TYPES = frozenset(
    {
        "F32",
        "F16",
        "BF16",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
    }
)


@dataclass
class PlatformProbe:
    """What one platform found: usable devices, or why there are none."""

    platform: str  # "amd" or "nvidia"
    devices: list[DeviceInfo] = field(default_factory=list)
    reason: str = ""  # empty when at least one usable device was found
    unsupported: list[DeviceInfo] = field(default_factory=list)


def _device(name, platform, arch, total, free, cus, index) -> DeviceInfo:
    return DeviceInfo(
        name=name,
        platform=platform,
        arch=arch,
        memory_total=int(total),
        memory_free=int(free),
        compute_units=int(cus),
        flags=FLAGS,
        ops=OPS,
        weight_types=WEIGHT_TYPES,
        index=index,
    )


def _missing_library(exc: BaseException, lib: str) -> bool:
    text = str(exc)
    return (
        type(exc).__name__ == "DynamicLibNotFoundError"
        or lib in text
        or "cannot open shared object" in text
        or "not found" in text.lower()
    )


def probe_amd() -> PlatformProbe:
    """AMD GPUs through hip-python."""
    out = PlatformProbe("amd")
    try:
        from forge_hip.rocm_libs import install_resolver

        install_resolver()
        from hip import hip
    except ImportError as exc:
        out.reason = f"hip-python not installed ({exc})"
        return out
    except Exception as exc:  # a broken installation must not break probing
        out.reason = f"hip-python failed to import: {exc}"
        return out
    try:
        status, count = hip.hipGetDeviceCount()
    except Exception as exc:
        if _missing_library(exc, "libamdhip64"):
            out.reason = "libamdhip64.so not found (install ROCm or Debian's libamdhip64-dev)"
        else:
            out.reason = f"HIP runtime failed to load: {exc}"
        return out
    name = getattr(status, "name", str(status))
    if name == "hipErrorNoDevice" or (int(status) == 0 and count == 0):
        out.reason = f"no device (hipGetDeviceCount: {name}, 0 devices)"
        return out
    if int(status) != 0:
        out.reason = f"hipGetDeviceCount failed: {name}"
        return out
    for i in range(count):
        try:
            dev = _amd_device(hip, i)
        except Exception as exc:
            out.reason = f"device {i}: reading properties failed: {exc}"
            continue
        (out.devices if AMD_ARCH.match(dev.arch) else out.unsupported).append(dev)
    if not out.devices and not out.reason:
        archs = ", ".join(sorted({d.arch for d in out.unsupported}))
        out.reason = f"{archs} not supported"
    elif out.devices:
        out.reason = ""
    return out


def _amd_device(hip, index: int) -> DeviceInfo:
    from forge_hip.runtime.amd import _text, check

    p = hip.hipDeviceProp_t()
    check(hip.hipGetDeviceProperties(p, index), "hipGetDeviceProperties")
    check(hip.hipSetDevice(index), "hipSetDevice")
    free, total = check(hip.hipMemGetInfo(), "hipMemGetInfo")
    arch = _text(p.gcnArchName).split(":", 1)[0]
    return _device(_text(p.name), "rocm", arch, total, free, p.multiProcessorCount, index)


def probe_nvidia() -> PlatformProbe:
    """NVIDIA GPUs through cuda-python's driver bindings."""
    out = PlatformProbe("nvidia")
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        out.reason = f"cuda-python not installed ({exc})"
        return out
    except Exception as exc:
        out.reason = f"cuda-python failed to import: {exc}"
        return out
    try:
        status = driver.cuInit(0)[0]
    except Exception as exc:
        if _missing_library(exc, "libcuda"):
            out.reason = "libcuda.so not found (no NVIDIA driver installed)"
        else:
            out.reason = f"CUDA driver failed to load: {exc}"
        return out
    name = getattr(status, "name", str(status))
    if name == "CUDA_ERROR_NO_DEVICE":
        out.reason = "no device (cuInit: CUDA_ERROR_NO_DEVICE)"
        return out
    if int(status) != 0:
        out.reason = f"cuInit failed: {name}"
        return out
    try:
        count = _nvidia_devices(driver, out)
    except Exception as exc:
        out.reason = f"reading device properties failed: {exc}"
        return out
    if count == 0:
        out.reason = "no device (cuDeviceGetCount: 0 devices)"
    elif not out.devices:
        archs = ", ".join(sorted({d.arch for d in out.unsupported}))
        out.reason = f"{archs} not supported (needs sm_{MIN_SM} or newer)"
    return out


def _nvidia_devices(driver, out: PlatformProbe) -> int:
    from forge_hip.runtime.nvidia import check

    count = int(check(driver.cuDeviceGetCount(), "cuDeviceGetCount"))
    attr = driver.CUdevice_attribute
    for i in range(count):
        dev = check(driver.cuDeviceGet(i), "cuDeviceGet")

        def get(a, dev=dev):
            return int(check(driver.cuDeviceGetAttribute(getattr(attr, a), dev), a))

        major = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        raw = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = raw.split(b"\0", 1)[0].decode(errors="replace")
        total = int(check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))
        ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        try:
            check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            free, _ = check(driver.cuMemGetInfo(), "cuMemGetInfo")
        finally:
            driver.cuDevicePrimaryCtxRelease(dev)
        info = _device(
            name,
            "cuda",
            f"sm_{major}{minor}",
            total,
            free,
            get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
            i,
        )
        (out.devices if major * 10 + minor >= MIN_SM else out.unsupported).append(info)
    return count
