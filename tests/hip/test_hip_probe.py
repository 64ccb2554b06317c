"""The hip backend's probe: the real one here, and every failure reason through fake platforms."""

from __future__ import annotations

import ctypes.util
import sys
import types
from enum import IntEnum

import pytest
from forge_hip import HipBackend
from forge_hip import probe as probe_mod
from forge_hip.rocm_libs import resolve

from forge.plugins import PluginManager


def _hip_runtime_loadable() -> bool:
    try:
        import hip  # noqa: F401
    except ImportError:
        return False
    return bool(resolve("amdhip64", "libamdhip64.so") and ctypes.util.find_library("amdhip64"))


@pytest.mark.skipif(
    not _hip_runtime_loadable(), reason="hip-python or libamdhip64 missing (CI installs both)"
)
def test_real_amd_probe_reports_no_device_not_an_import_error():
    found = probe_mod.probe_amd()
    assert found.devices == []
    assert found.reason.startswith("no device"), found.reason
    assert "hipErrorNoDevice" in found.reason


def test_real_probe_never_raises_and_names_both_platforms():
    result = HipBackend().probe()
    keys = [k for k, _ in result.details]
    assert keys == ["amd", "nvidia"]
    if not result.available:
        assert "amd: " in result.reason and "nvidia: " in result.reason
        assert result.score == 0


def test_plugin_registers_hip_backend_through_the_manager():
    pm = PluginManager.create(defaults=("forge_hip.plugin",), entrypoints=False)
    assert pm.backends["hip"] is HipBackend
    assert not pm.load_errors


# --- fake AMD platform -----------------------------------------------------------------------


class HipErr(IntEnum):
    hipSuccess = 0
    hipErrorNoDevice = 100


def fake_hip(count=1, arch="gfx90a:sramecc+:xnack-", fail_load=False, status=HipErr.hipSuccess):
    hip = types.SimpleNamespace()

    def get_count():
        if fail_load:
            raise RuntimeError("failed to dlopen 'b'libamdhip64.so'': cannot open shared object")
        return (status, count)

    class Props:
        name = b"AMD Instinct MI210"
        gcnArchName = arch.encode()
        multiProcessorCount = 104
        warpSize = 64

    hip.hipGetDeviceCount = get_count
    hip.hipDeviceProp_t = Props
    hip.hipGetDeviceProperties = lambda p, i: (HipErr.hipSuccess,)
    hip.hipSetDevice = lambda i: (HipErr.hipSuccess,)
    hip.hipMemGetInfo = lambda: (HipErr.hipSuccess, 60 << 30, 64 << 30)
    return hip


@pytest.fixture
def no_nvidia(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)


def install_hip(monkeypatch, hip):
    pkg = types.ModuleType("hip")
    pkg.hip = hip
    monkeypatch.setitem(sys.modules, "hip", pkg)
    monkeypatch.setitem(sys.modules, "hip.hip", hip)


def test_amd_package_missing(monkeypatch, no_nvidia):
    monkeypatch.setitem(sys.modules, "hip", None)
    result = HipBackend().probe()
    assert not result.available
    assert dict(result.details)["amd"].startswith("hip-python not installed")
    assert dict(result.details)["nvidia"].startswith("cuda-python not installed")


def test_amd_library_missing(monkeypatch, no_nvidia):
    install_hip(monkeypatch, fake_hip(fail_load=True))
    assert probe_mod.probe_amd().reason.startswith("libamdhip64.so not found")


def test_amd_no_device(monkeypatch, no_nvidia):
    install_hip(monkeypatch, fake_hip(count=0, status=HipErr.hipErrorNoDevice))
    assert probe_mod.probe_amd().reason.startswith("no device")


def test_amd_unsupported_arch(monkeypatch, no_nvidia):
    install_hip(monkeypatch, fake_hip(arch="gfx803"))
    result = HipBackend().probe()
    assert not result.available
    assert "amd: gfx803 not supported" in result.reason
    assert [d.arch for d in result.devices] == ["gfx803"]


def test_amd_device_found(monkeypatch, no_nvidia):
    install_hip(monkeypatch, fake_hip())
    result = HipBackend().probe()
    assert result.available and result.score == 100 and result.reason == ""
    (dev,) = result.devices
    assert (dev.platform, dev.arch, dev.compute_units) == ("rocm", "gfx90a", 104)
    assert (dev.memory_total, dev.memory_free) == (64 << 30, 60 << 30)
    assert dev.supports("matmul", "Q4_K") and dev.supports("matmul", "Q5_0")
    assert "1 usable device(s): AMD Instinct MI210 (gfx90a)" in dict(result.details)["amd"]


# --- fake NVIDIA platform --------------------------------------------------------------------


class CuErr(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100


def install_cuda(monkeypatch, cc=(9, 0), count=1, init=CuErr.CUDA_SUCCESS, missing=False):
    drv = types.ModuleType("cuda.bindings.driver")
    attrs = {
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": cc[0],
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": cc[1],
        "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132,
    }
    drv.CUdevice_attribute = types.SimpleNamespace(**{k: k for k in attrs})

    def cu_init(flags):
        if missing:
            raise RuntimeError('"cuda" is an NVIDIA driver library; libcuda.so.1 not found')
        return (init,)

    ok = CuErr.CUDA_SUCCESS
    drv.cuInit = cu_init
    drv.cuDeviceGetCount = lambda: (ok, count)
    drv.cuDeviceGet = lambda i: (ok, i)
    drv.cuDeviceGetAttribute = lambda a, d: (ok, attrs[a])
    drv.cuDeviceGetName = lambda n, d: (ok, b"NVIDIA H200\0\0")
    drv.cuDeviceTotalMem = lambda d: (ok, 140 << 30)
    drv.cuDevicePrimaryCtxRetain = lambda d: (ok, "ctx")
    drv.cuDevicePrimaryCtxRelease = lambda d: (ok,)
    drv.cuCtxSetCurrent = lambda c: (ok,)
    drv.cuMemGetInfo = lambda: (ok, 139 << 30, 140 << 30)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = drv
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)


def test_nvidia_library_missing(monkeypatch):
    install_cuda(monkeypatch, missing=True)
    assert probe_mod.probe_nvidia().reason == "libcuda.so not found (no NVIDIA driver installed)"


def test_nvidia_no_device(monkeypatch):
    install_cuda(monkeypatch, init=CuErr.CUDA_ERROR_NO_DEVICE)
    assert probe_mod.probe_nvidia().reason.startswith("no device")


def test_nvidia_unsupported_arch(monkeypatch):
    install_cuda(monkeypatch, cc=(6, 1))
    found = probe_mod.probe_nvidia()
    assert found.devices == [] and found.reason.startswith("sm_61 not supported")


def test_nvidia_device_found(monkeypatch):
    monkeypatch.setitem(sys.modules, "hip", None)
    install_cuda(monkeypatch)
    result = HipBackend().probe()
    assert result.available and result.score == 100
    (dev,) = result.devices
    assert (dev.name, dev.platform, dev.arch, dev.compute_units) == (
        "NVIDIA H200",
        "cuda",
        "sm_90",
        132,
    )
    assert dev.memory_free == 139 << 30
    assert dict(result.details)["amd"].startswith("hip-python not installed")
