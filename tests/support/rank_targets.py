"""Worker targets for the tensor-parallel process tests (importable by spawned processes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from forge.rendezvous import Rendezvous


def share_id(rank: int, world: int, port: int, out_dir: str) -> None:
    """Meet the other ranks on localhost:`port`; write the id rank 0 handed out."""
    blob = os.urandom(128) if rank == 0 else None
    got = Rendezvous("127.0.0.1", port, rank, world, timeout=20).share(blob)
    Path(out_dir, f"rank{rank}.bin").write_bytes(got)


def sleep_or_die(rank: int, world: int, dying: int, how: str, pid_dir: str) -> None:
    """Rank `dying` kills itself (`how` = "signal") or raises (`how` = "raise") once every
    rank has written its pid; the others sleep as if blocked in a collective."""
    # written whole, then renamed: the dying rank counts *.pid files, and a file it saw created
    # but not yet written would leave the test an empty pid once the group kills this rank
    Path(pid_dir, f"rank{rank}.tmp").write_text(str(os.getpid()))
    os.replace(Path(pid_dir, f"rank{rank}.tmp"), Path(pid_dir, f"rank{rank}.pid"))
    if rank != dying:
        time.sleep(120)
        return
    while len(list(Path(pid_dir).glob("*.pid"))) < world:
        time.sleep(0.01)
    if how == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("device lost")


def finish(rank: int, world: int) -> None:
    """End at once, successfully."""
