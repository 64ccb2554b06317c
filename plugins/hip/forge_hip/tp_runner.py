"""TensorParallelRunner: a model split over several GPUs of this host (`forge.sharding`), one
worker process per GPU (`forge_hip.tp_rank`), as vLLM and SGLang run tensor parallelism.

To the engine it is a runner like any other: every call goes to every rank (the same batch,
the same sampling parameters) and rank 0's result comes back. Tokens are picked on the devices;
`start_sample` returns once the call is sent, so the engine's host work overlaps the ranks'
step. A rank that dies or fails ends the group within seconds with `forge.workers.WorkerFailed`
naming it; no worker outlives the runner. Ranks may also run on other hosts (`hosts`,
`forge_hip.tp_host`): they connect to this one, and NCCL carries the collectives between hosts.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from forge.backend import Placement, Runner, SeqBatch
from forge.errors import ForgeError, ForgeRuntimeError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.kv_cache import KvTypes
from forge.models.spec import ModelSpec
from forge.remote_ranks import accept_ranks, local_ranks, tp_key
from forge.rendezvous import Rendezvous, free_port
from forge.sharding import ShardPlan
from forge.workers import WorkerFailed, WorkerGroup
from forge_hip.tp_host import tensor_table
from forge_hip.tp_rank import run_rank
from forge_hip.workspace import ROW_CAP

LOCALHOST = "127.0.0.1"
ACCEPT_TIMEOUT = 300.0  # seconds the engine waits for the other hosts' ranks (under the
# local ranks' RENDEZVOUS_TIMEOUT, which starts at the same time)


def hosts(world: int) -> tuple[int, tuple[str, int]]:
    """(ranks on this host, the master address and port): all ranks and a free loopback port,
    unless FORGE_TP_LOCAL_RANKS names fewer; then the rest run on other hosts
    (`python -m forge_hip.tp_host`) and MASTER_ADDR / MASTER_PORT (this host's address) are
    where they meet."""
    local = local_ranks(world)
    if local == world:
        return world, (LOCALHOST, free_port(LOCALHOST))
    meet = Rendezvous.from_env({**os.environ, "RANK": "0", "WORLD_SIZE": str(world)})
    return local, (meet.master_addr, meet.master_port)


class TensorParallelRunner(Runner):
    samples_on_device = True
    prefill_chunk = ROW_CAP  # each rank's HipRunner takes its prompt pieces
    pass_rows = ROW_CAP  # (larger batches are cut: step_meta.chunks)

    def __init__(self, spec: ModelSpec, gguf: GGUFFile, kernels: KernelTable, *,
                 shard_plan: ShardPlan, placement: Placement,
                 progress: Callable[[int, int], None] | None = None, n_ctx: int | None = None,
                 kv_types: KvTypes | None = None):  # fmt: skip
        self.spec, self._placement = spec, placement
        self._pending: list | None = None  # a started step's answer, once read
        world, local, master = shard_plan.world, *hosts(shard_plan.world)
        devices = [s.device for s in placement.shards]
        load = (gguf.path, spec, kernels, shard_plan, devices, n_ctx, kv_types, master)
        self.group = WorkerGroup(run_rank, world, load, channels=True, local=local)
        try:
            if local < world:  # the other hosts' ranks connect to the port after the master's
                conns = accept_ranks(master[0], master[1] + 1, range(local, world), tp_key(),
                                     ACCEPT_TIMEOUT)  # fmt: skip
                for conn in conns.values():
                    conn.send((*load, tensor_table(gguf)))
                self.group.attach(conns)
            notes = (lambda p: progress(*p)) if progress else None
            self.ranks = self.group.replies(on_note=notes)  # per rank: its device and NCCL
        except BaseException:
            self.group.stop()
            raise

    def _call(self, name: str, *args) -> list:  # noqa: ANN002
        self._settle()
        self.group.request((name, args))
        return self.group.replies()

    def _settle(self) -> None:
        """Read the answers of the step `start_sample` started, if not read yet: its tokens,
        or its error, kept for its `tokens()`; a failed group's error is raised here too."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.append((None, self.group.replies()[0]))
            except WorkerFailed as err:
                pending.append((err, None))
                raise
            except ForgeError as err:  # this step's own error, for its tokens()
                pending.append((err, None))

    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        self._call("allocate_kv", n_blocks, block_size)

    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        return self._call("forward", batch)[0]

    def forward_argmax(self, batch: list[SeqBatch]) -> list[int]:
        return self._call("forward_argmax", batch)[0]

    def forward_sample(self, batch: list[SeqBatch], picks: list) -> list[int | None]:
        return self._call("forward_sample", batch, picks)[0]

    def start_sample(self, batch: list[SeqBatch], picks: list, feed: list[int] | None = None,
                     feed_from: Callable | None = None) -> Callable[[], list]:  # fmt: skip
        if feed is not None and any(f >= 0 for f in feed):
            raise NotImplementedError("a tensor-parallel runner cannot feed picked tokens")
        self._settle()
        self.group.request(("forward_sample", (batch, picks)))
        self._pending = done = []

        def tokens() -> list:
            if not done:
                if self._pending is not done:
                    raise ForgeRuntimeError("the runner was closed before this step's tokens "
                                            "were read")  # fmt: skip
                self._settle()
            error, value = done[0]
            if error is not None:
                raise error
            return value

        return tokens

    def prepare_batches(self, max_seqs: int) -> None:
        self._call("prepare_batches", max_seqs)

    def memory_estimate(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for part in self._call("memory_estimate"):
            for k, v in part.items():
                total[k] = total.get(k, 0) + v
        return total

    def close(self) -> None:
        group, self.group = getattr(self, "group", None), None
        if group is not None:
            try:
                self._pending = None
                group.request(None)
                group.join(5.0)
            except WorkerFailed:  # already ended (and reported) by a failure
                pass
            finally:
                group.stop()
