"""The ranks of a tensor-parallel group that run on another host than the engine's:

  FORGE_TP_KEY=... python -m forge_hip.tp_host MODEL.gguf --master HOST:PORT --first-rank R
      --ranks N [--device D]

starts ranks R..R+N-1 on this host's GPUs D..D+N-1 (one worker process each, supervised as
the engine's host supervises its own: `forge.workers`). Each connects to the engine's host at
PORT + 1 (`forge.remote_ranks`), gets the split it runs, checks that MODEL here has the engine's
model's sizes and tensor table (names, types, shapes), and then serves the engine's requests
like a local rank (`forge_hip.tp_rank`). HOST:PORT are the engine's MASTER_ADDR and
MASTER_PORT. The ranks end when the engine closes their connections, or, blocked inside a
collective whose peer vanished, when NCCL reports the peer lost; one that fails ends the
engine's run, naming it.
"""

from __future__ import annotations

import argparse
import sys

from forge.errors import ForgeError, UsageError
from forge.remote_ranks import connect_rank, tp_key
from forge.workers import WorkerGroup, reply

CONNECT_TIMEOUT = 300.0  # seconds a rank keeps trying to reach the engine's host


def remote_rank(local: int, n_local: int, path: str, master: tuple[str, int], first: int,
                device: int, key: bytes) -> None:  # fmt: skip
    """One worker: rank first + local on GPU device + local."""
    from forge.gguf import open_gguf
    from forge.models import build_spec
    from forge_hip.tp_rank import run_rank

    rank = first + local
    conn = connect_rank(master[0], master[1] + 1, rank, key, CONNECT_TIMEOUT)
    try:
        _, spec, kernels, plan, _, n_ctx, kv_types, meet, table = conn.recv()
    except (EOFError, OSError):
        raise UsageError(f"rank {rank}: the engine closed the connection") from None
    try:
        gguf = open_gguf(path)
        if build_spec(gguf) != spec or tensor_table(gguf) != table:
            raise UsageError(f"rank {rank}: {path} is not the model the engine loaded (its "
                             "sizes, tensors or their types differ)")  # fmt: skip
    except ForgeError as err:  # the engine says why this rank did not start
        reply(conn, error=err)
        return
    devices = {rank: device + local}  # run_rank reads devices[rank]
    run_rank(
        rank,
        plan.world,
        conn,
        path,
        spec,
        kernels,
        plan,
        devices,
        n_ctx,
        kv_types,
        meet,
        watch_peers=True,
    )


def tensor_table(gguf) -> dict[str, tuple]:  # noqa: ANN001 - a GGUFFile
    """Every tensor's type, shape and size: what must match between the engine's file and a
    host's copy (the split and the kernels were chosen from the engine's)."""
    return {n: (t.type, tuple(t.shape), t.nbytes) for n, t in gguf.tensors.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m forge_hip.tp_host", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("model")
    ap.add_argument("--master", required=True, help="the engine's MASTER_ADDR:MASTER_PORT")
    ap.add_argument("--first-rank", type=int, required=True)
    ap.add_argument("--ranks", type=int, required=True, help="ranks on this host")
    ap.add_argument("--device", type=int, default=0, help="this host's first GPU")
    args = ap.parse_args(argv)
    try:
        host, _, port = args.master.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--master must be HOST:PORT, got {args.master!r}")
        if args.first_rank < 1 or args.ranks < 1:
            raise UsageError("--first-rank is at least 1 (rank 0 runs with the engine), "
                             "--ranks at least 1")  # fmt: skip
        key = tp_key()
        target = (args.model, (host, int(port)), args.first_rank, args.device, key)
        with WorkerGroup(remote_rank, args.ranks, target) as group:
            group.join()
    except ForgeError as err:
        print(f"forge_hip.tp_host: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
