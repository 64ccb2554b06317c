"""Capability probing: the cpu_simd probe against /proc and NumPy, and the probe structs."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

import pytest
from forge_cpu_simd.plugin import CpuSimdBackend, simd_arch

from forge.devices import BackendProbe, DeviceInfo

LINUX = Path("/proc/cpuinfo").exists() and Path("/proc/meminfo").exists()


def proc_cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def test_cpu_simd_is_always_available_with_one_cpu_device():
    probe = CpuSimdBackend().probe()
    assert probe.available and probe.reason == "" and probe.score == 10
    (dev,) = probe.devices
    assert dev.platform == "cpu" and dev.index == 0
    assert dev.compute_units == len(os.sched_getaffinity(0))
    assert dev.supports("matmul", "Q4_K") and dev.supports("matmul", "Q5_0")
    assert not dev.supports("matmul", "IQ2_XXS")


@pytest.mark.skipif(not LINUX, reason="needs /proc/cpuinfo and /proc/meminfo")
def test_cpu_device_matches_proc():
    (dev,) = CpuSimdBackend().probe().devices
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines()
                 if ln.startswith("model name"))  # fmt: skip
    assert dev.name == model
    total_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemTotal:"))  # fmt: skip
    assert dev.memory_total == total_kb * 1024
    assert 0 < dev.memory_free <= dev.memory_total


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not LINUX,
                    reason="compares with x86 /proc/cpuinfo flags")  # fmt: skip
def test_simd_features_agree_with_the_kernel():
    """NumPy's view of the CPU (in flags and arch) matches what the kernel reports."""
    (dev,) = CpuSimdBackend().probe().devices
    flags = proc_cpu_flags()
    for numpy_name, proc_name in [("AVX2", "avx2"), ("AVX512F", "avx512f"), ("FMA3", "fma"),
                                  ("SSE42", "sse4_2"), ("F16C", "f16c")]:  # fmt: skip
        assert (numpy_name in dev.flags) == (proc_name in flags), numpy_name
    expected = ("avx512" if "avx512f" in flags else "avx2" if "avx2" in flags
                else "avx" if "avx" in flags else "sse4.2")  # fmt: skip
    assert dev.arch == f"x86_64-{expected}"


@pytest.mark.parametrize(
    ("features", "machine", "arch"),
    [({"AVX2", "AVX", "SSE42"}, "x86_64", "x86_64-avx2"),
     ({"AVX512F", "AVX2"}, "x86_64", "x86_64-avx512"),
     ({"SSE2"}, "x86_64", "x86_64-sse2"),
     ({"ASIMD", "NEON"}, "aarch64", "aarch64-neon"),
     ({"SVE", "ASIMD"}, "aarch64", "aarch64-sve"),
     (set(), "riscv64", "riscv64")],
)  # fmt: skip
def test_simd_arch_names_the_best_level(features, machine, arch):
    assert simd_arch(frozenset(features), machine) == arch


def test_probe_structs_are_frozen():
    dev = DeviceInfo("x", "cpu", "x86_64", ops=frozenset({"matmul"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        dev.name = "y"
    with pytest.raises(dataclasses.FrozenInstanceError):
        BackendProbe(True).available = False
    assert dev.supports("matmul") and not dev.supports("matmul", "F32")


def test_hip_probe_if_registered_reports_both_platforms():
    """Whatever the HIP plugin finds, its probe never raises and names each platform's state."""
    import warnings

    from forge.plugins import PluginManager, PluginWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        pm = PluginManager.create(entrypoints=False)
    if "hip" not in pm.backends:
        pytest.skip(f"forge_hip is not loadable here: {pm.load_errors.get('forge_hip.plugin')}")
    probe = pm.probe("hip")
    assert isinstance(probe, BackendProbe)
    if not probe.available:
        assert probe.reason
        assert len(probe.details) >= 2, "expected one (platform, reason) row per platform"
