"""One rank of a tensor-parallel group, in its own worker process (`forge.workers`): it opens its
GPU, meets the other ranks (`forge.rendezvous`: rank 0 hands out the NCCL/RCCL group id), loads
only its part of the weights (`forge.shard_view`) into a `HipRunner` whose plan holds the
collectives (`forge_hip.sharded_plan`), then runs the runner calls the parent sends
(`forge_hip.tp_runner`) until told to stop. Every rank runs every call; rank 0's result is the
answer (the others' would be the same: every rank picks from the same gathered logits).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from functools import partial
from typing import Any

from forge.errors import ForgeError
from forge.kernels import KernelTable
from forge.kv_cache import KvTypes
from forge.models.spec import ModelSpec
from forge.rendezvous import Rendezvous
from forge.shard_view import ShardView, rank_spec
from forge.sharding import ShardPlan
from forge.workers import note, reply, serve

# the runner calls a parent may send (forge_hip.tp_runner), with whether every rank's answer
# is wanted (else rank 0's: the others answer None, keeping logits off the pipes)
CALLS = {"allocate_kv": False, "forward": False, "forward_argmax": False,
         "forward_sample": False, "prepare_batches": False, "memory_estimate": True}  # fmt: skip
# seconds rank 0 waits for the others: on one host they start together; ranks on other hosts
# may connect up to tp_runner.ACCEPT_TIMEOUT (300 s) after the engine started its own
RENDEZVOUS_TIMEOUT = 360.0
PEER_CHECK_S = 1.0  # how often a rank on another host asks NCCL whether a peer is lost


def run_rank(rank: int, world: int, conn: Any, path: str, spec: ModelSpec,
             kernels: KernelTable, plan: ShardPlan, devices: Any, n_ctx: int | None,
             kv_types: KvTypes | None, master: tuple[str, int],
             watch_peers: bool = False) -> None:  # fmt: skip
    """A worker's life: load rank `rank`'s part of the model at `path` on GPU `devices[rank]`
    (a list, or a mapping for ranks on another host), answer "ready" (or the ForgeError that
    stopped it), then serve runner calls. `watch_peers` (ranks on another host than the
    engine's): a peer the communicator reports lost ends this process (`_end_on_peer_loss`)."""
    from forge.gguf import open_gguf
    from forge_hip.collectives import Communicator
    from forge_hip.runner import HipRunner
    from forge_hip.runtime import open_runtime
    from forge_hip.sharded_plan import ShardedPlan

    rt = comm = runner = None
    try:
        rt = open_runtime(None, devices[rank])
        meet = Rendezvous(master[0], master[1], rank, world, RENDEZVOUS_TIMEOUT)
        group = meet.share(Communicator.unique_id(rt.platform) if rank == 0 else None)
        comm = Communicator(rt.platform, group, world, rank)
        if watch_peers:
            threading.Thread(target=_end_on_peer_loss, args=(comm,), daemon=True).start()
        gguf = open_gguf(path)
        progress = (lambda done, total: note(conn, (done, total))) if rank == 0 else None
        runner = HipRunner(rank_spec(spec, plan, rank), ShardView(gguf, spec, plan, rank),
                           kernels, device=devices[rank], progress=progress, n_ctx=n_ctx,
                           runtime=rt, kv_types=kv_types, max_seqs=None,  # (no window pools)
                           plan=partial(ShardedPlan, comm=comm, vocab=plan.vocab))  # fmt: skip
    except ForgeError as err:
        _close(runner, comm, rt)
        reply(conn, error=err)
        return
    reply(conn, {"device": rt.props.name, "nccl": comm.version()})
    try:
        serve(conn, partial(_call, runner, rank))
    finally:
        _close(runner, comm, rt)


def _end_on_peer_loss(comm: Any) -> None:
    """A watchdog thread: once NCCL reports an asynchronous error (a peer or its host gone),
    abort the communicator and end this process. A rank on another host than the engine's
    needs it: blocked inside a collective whose peer vanished, it never reads the closed
    connection that would otherwise end it."""
    while (error := comm.async_error()) is None:
        time.sleep(PEER_CHECK_S)
    print(f"forge rank {comm.rank}: {error}; ending", file=sys.stderr, flush=True)
    comm.close(abort=True)
    os._exit(1)


def _call(runner: Any, rank: int, message: tuple[str, tuple]) -> Any:
    name, args = message
    if name not in CALLS:
        raise ForgeError(f"a tensor-parallel rank runs no {name!r}")
    value = getattr(runner, name)(*args)
    return value if rank == 0 or CALLS[name] else None


def _close(runner: Any, comm: Any, rt: Any) -> None:
    if runner is not None:
        runner.steps.settle()
        runner.plan.close()
        runner.close()
    if comm is not None:
        comm.close()
    if rt is not None:
        rt.close()
