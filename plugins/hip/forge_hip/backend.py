"""The `hip` backend: HIP kernels on AMD (hip-python) or NVIDIA (cuda-python) GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from forge.backend import Backend, Placement, Runner
from forge.devices import BackendProbe
from forge_hip.probe import probe_amd, probe_nvidia

if TYPE_CHECKING:
    from forge.gguf import GGUFFile
    from forge.kernels import KernelTable
    from forge.kv_cache import KvTypes
    from forge.models.spec import ModelSpec
    from forge.sharding import ShardPlan

GPU_SCORE = 100  # above cpu_simd's 10: a usable GPU always wins `backend = "auto"`


class HipBackend(Backend):
    """Runs models on one GPU, or split over several (tensor parallelism); AMD devices are
    listed before NVIDIA ones."""

    name = "hip"
    description = "HIP kernels on AMD (ROCm, hip-python) and NVIDIA (CUDA, cuda-python) GPUs"

    def probe(self) -> BackendProbe:
        try:
            platforms = [probe_amd(), probe_nvidia()]
        except Exception as exc:  # the probes catch their own failures; this is a last guard
            return BackendProbe(False, f"probe failed: {exc}", details=(("error", str(exc)),))
        devices = tuple(d for p in platforms for d in p.devices)
        details = tuple(
            (
                p.platform,
                p.reason
                or f"{len(p.devices)} usable device(s): "
                + ", ".join(f"{d.name} ({d.arch})" for d in p.devices),
            )
            for p in platforms
        )
        if devices:
            return BackendProbe(True, "", devices, GPU_SCORE, details)
        reason = "; ".join(f"{p.platform}: {p.reason}" for p in platforms)
        unsupported = tuple(d for p in platforms for d in p.unsupported)
        return BackendProbe(False, reason, unsupported, 0, details)

    def open_runner(
        self,
        spec: ModelSpec,
        gguf: GGUFFile,
        kernels: KernelTable,
        *,
        device: int = 0,
        progress: Callable[[int, int], None] | None = None,
        n_ctx: int | None = None,
        kv_types: KvTypes | None = None,
        shard_plan: ShardPlan | None = None,
        placement: Placement | None = None,
        max_seqs: int = 1,
    ) -> Runner:
        """Place the model on GPU `device` (raises OutOfMemoryError with the numbers, having
        freed what it took, when it does not fit); with `shard_plan` (tensor_parallel > 1),
        split over the GPUs of `placement`, one worker process each. `max_seqs`: sequences the
        preflight sizes the sliding-window pools for (server.max_batch)."""
        if shard_plan is not None and shard_plan.world > 1:
            from forge_hip.tp_runner import TensorParallelRunner

            return TensorParallelRunner(spec, gguf, kernels, shard_plan=shard_plan,
                                        placement=placement, progress=progress, n_ctx=n_ctx,
                                        kv_types=kv_types)  # fmt: skip
        from forge_hip.runner import HipRunner

        return HipRunner(spec, gguf, kernels, device=device, progress=progress, n_ctx=n_ctx,
                         kv_types=kv_types, max_seqs=max_seqs)  # fmt: skip

    def memory_needed(
        self,
        spec: ModelSpec,
        gguf: GGUFFile,
        n_ctx: int,
        kv_types: KvTypes | None = None,
        max_seqs: int = 1,
    ) -> dict[str, int]:
        from forge_hip.capacity import memory_needed

        return memory_needed(spec, gguf, n_ctx, kv_types, max_seqs)
