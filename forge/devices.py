"""Capability structs that backends report from their probes (modelled on ggml-backend's props)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceInfo:
    """One device a backend can run on."""

    name: str  # human-readable name, e.g. "NVIDIA H200" or "AMD EPYC (2 cores)"
    platform: str  # "cpu", "cuda" or "rocm"
    arch: str  # "x86_64-avx2", "sm_90", "gfx1100", ...
    memory_total: int = 0  # bytes of memory the device owns (system RAM for the CPU)
    memory_free: int = 0  # bytes free at probe time
    compute_units: int = 0  # CPU cores, GPU multiprocessors / compute units
    flags: frozenset[str] = field(
        default_factory=frozenset
    )  # "graphs", "f16", "bf16", "int8_dot", SIMD features
    ops: frozenset[str] = field(
        default_factory=frozenset
    )  # op names it executes ("matmul", "rms_norm", ...)
    weight_types: frozenset[str] = field(
        default_factory=frozenset
    )  # GGML type names ("Q4_K", "F16", ...)
    index: int = 0  # index among the backend's devices

    def supports(self, op: str, weight_type: str | None = None) -> bool:
        """Whether this device runs `op`, and, when given, on weights of `weight_type`."""
        if op not in self.ops:
            return False
        return weight_type is None or weight_type in self.weight_types


@dataclass(frozen=True)
class BackendProbe:
    """What a backend's probe found. Probes never raise: failures become `available=False`."""

    available: bool  # whether the backend can run a model here now
    reason: str = ""  # why not (empty when available); names the missing piece precisely
    devices: tuple[DeviceInfo, ...] = ()  # devices found (may be non-empty even if unavailable)
    score: int = 0  # preference among available backends for `backend = "auto"`; higher wins
    details: tuple[tuple[str, str], ...] = ()  # extra (key, value) facts, e.g. per-platform reasons
