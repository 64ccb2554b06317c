"""Ranks meeting over TCP as torchrun's do (two real processes on one host), the errors when
they cannot, and worker supervision: a worker that dies or fails ends the group in seconds,
naming the rank and cause, with no process left behind."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from forge.rendezvous import Rendezvous, RendezvousError, free_port
from forge.workers import WorkerFailed, WorkerGroup
from tests.support import rank_targets


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_share_rank_zeros_id(tmp_path):
    port = free_port()
    with WorkerGroup(rank_targets.share_id, 2, (port, str(tmp_path))) as group:
        assert group.join(timeout=60)
    ids = [(tmp_path / f"rank{r}.bin").read_bytes() for r in (0, 1)]
    assert len(ids[0]) == 128 and ids[0] == ids[1]


def _in_thread(fn):
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as err:
            result["error"] = err

    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_a_rank_with_another_world_size_is_refused_by_name():
    port = free_port()
    master, got = _in_thread(lambda: Rendezvous("127.0.0.1", port, 0, 2, timeout=3).share(b"id"))
    with pytest.raises(RendezvousError, match="rank 1 says world size 3, rank 0 says 2"):
        Rendezvous("127.0.0.1", port, 1, 3, timeout=3).share()
    assert Rendezvous("127.0.0.1", port, 1, 2, timeout=3).share() == b"id"
    master.join()
    assert got == {"value": b"id"}


def test_a_stray_connection_does_not_disturb_the_ranks():
    port = free_port()
    master, got = _in_thread(lambda: Rendezvous("127.0.0.1", port, 0, 2, timeout=5).share(b"x"))
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port)) as stray:
        stray.sendall(b"\x00\x00\x00\x05hello")
    assert Rendezvous("127.0.0.1", port, 1, 2, timeout=5).share() == b"x"
    master.join()
    assert got == {"value": b"x"}


def test_missing_ranks_and_a_missing_master_are_named_within_the_timeout():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"ranks \[1, 2\] did not connect within 0.5 s"):
        Rendezvous("127.0.0.1", port, 0, 3, timeout=0.5).share(b"id")
    with pytest.raises(RendezvousError, match=f"rank 2: rank 0 at 127.0.0.1:{port} did not answer"):
        Rendezvous("127.0.0.1", port, 2, 3, timeout=0.5).share()
    assert time.monotonic() - start < 5


def test_from_env_reads_torchruns_variables_and_names_a_bad_one():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"}
    r = Rendezvous.from_env(env)
    assert (r.master_addr, r.master_port, r.rank, r.world) == ("10.0.0.1", 29500, 3, 4)
    with pytest.raises(RendezvousError, match="WORLD_SIZE is not set"):
        Rendezvous.from_env({k: v for k, v in env.items() if k != "WORLD_SIZE"})
    with pytest.raises(RendezvousError, match="must be integers, got '29500', 'three'"):
        Rendezvous.from_env(env | {"RANK": "three"})
    with pytest.raises(RendezvousError, match=r"rank 4 is not in 0..3"):
        Rendezvous.from_env(env | {"RANK": "4"})
    with pytest.raises(RendezvousError, match="master port 70000"):
        Rendezvous.from_env(env | {"MASTER_PORT": "70000"})


@pytest.mark.parametrize(("how", "cause"), [
    ("signal", "rank 1 died: killed by SIGKILL"),
    ("raise", "rank 1 failed: RuntimeError: device lost"),
])  # fmt: skip
def test_a_failing_worker_ends_the_group_naming_rank_and_cause(tmp_path, how, cause):
    start = time.monotonic()
    group = WorkerGroup(rank_targets.sleep_or_die, 3, (1, how, str(tmp_path)))
    with pytest.raises(WorkerFailed, match=cause) as failed:
        group.join(timeout=60)
    assert failed.value.rank == 1
    assert time.monotonic() - start < 30  # spawn start-up included; the sleepers sleep 120 s
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(3)]
    assert not any(_alive(pid) for pid in pids), "a worker outlived the failed group"


def test_a_group_that_ends_well_joins_true():
    with WorkerGroup(rank_targets.finish, 2) as group:
        assert group.join(timeout=60)
        assert [p.exitcode for p in group.processes] == [0, 0]
