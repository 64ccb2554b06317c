"""Device runtimes, one per GPU platform, behind the interface of `forge_hip.runtime.base`."""

from __future__ import annotations

from forge.errors import BackendUnavailableError
from forge_hip.runtime.base import Runtime


def open_runtime(platform: str | None = None, index: int = 0) -> Runtime:
    """Open device `index` of `platform` ("rocm" or "cuda"); None takes the first that has one."""
    from forge_hip.probe import probe_amd, probe_nvidia

    reasons = []
    for name, probe in (("rocm", probe_amd), ("cuda", probe_nvidia)):
        if platform not in (None, name):
            continue
        found = probe()
        if found.devices:
            if name == "rocm":
                from forge_hip.runtime.amd import HipRuntime

                return HipRuntime(found.devices[min(index, len(found.devices) - 1)].index)
            from forge_hip.runtime.nvidia import CudaRuntime

            return CudaRuntime(found.devices[min(index, len(found.devices) - 1)].index)
        reasons.append(f"{found.platform}: {found.reason}")
    raise BackendUnavailableError("hip", "; ".join(reasons) or f"unknown platform {platform!r}")
