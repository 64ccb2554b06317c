"""Ranks on other hosts (forge.remote_ranks, forge.workers' attached channels), with the
"other host" a process on this one: a rank connects with the shared key and then serves the
engine's requests like a local rank; a peer without the key or naming a wrong rank is turned
away; a rank whose host goes away ends the group, naming it."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from forge.errors import UsageError
from forge.remote_ranks import accept_ranks, connect_rank, tp_key
from forge.rendezvous import free_port
from forge.workers import WorkerFailed, WorkerGroup, serve

KEY = b"a shared secret of the group"


def _local_echo(rank, world, conn):
    serve(conn, lambda m: (rank, m))


def _remote_echo(port, rank, key):
    conn = connect_rank("127.0.0.1", port, rank, key, 20.0)
    serve(conn, lambda m: (rank, m))


def _start(target, *args):
    p = mp.get_context("spawn").Process(target=target, args=args, daemon=True)
    p.start()
    return p


def test_a_rank_on_another_host_serves_like_a_local_one():
    port = free_port()
    remote = _start(_remote_echo, port, 1, KEY)
    group = WorkerGroup(_local_echo, 2, channels=True, local=1)
    try:
        group.attach(accept_ranks("127.0.0.1", port, range(1, 2), KEY, 20.0))
        group.request("hi")
        assert group.replies() == [(0, "hi"), (1, "hi")]
        remote.kill()  # its host goes away
        remote.join()
        with pytest.raises(WorkerFailed, match="rank 1 on another host"):
            for _ in range(3):  # a socket may take the first message
                group.request("hi")
                group.replies()
    finally:
        group.stop()
        remote.kill()


def test_peers_without_the_key_or_naming_a_wrong_rank_are_turned_away():
    port = free_port()
    intruder = _start(_remote_echo, port, 1, b"not the group's secret!")
    wrong = _start(_remote_echo, port, 3, KEY)
    try:
        t0 = time.monotonic()
        with pytest.raises(UsageError, match=r"ranks \[1\] did not connect .* within 3 s"):
            accept_ranks("127.0.0.1", port, range(1, 2), KEY, 3.0)
        assert time.monotonic() - t0 < 10
        wrong.join(10)
        assert wrong.exitcode == 1  # told "refused": its UsageError ended it
        intruder.join(10)
        assert intruder.exitcode == 1  # "holds another FORGE_TP_KEY"
    finally:
        intruder.kill()
        wrong.kill()


def test_an_engine_that_never_answers_and_a_missing_key_are_named(monkeypatch):
    with pytest.raises(UsageError, match=r"rank 2: the engine at 127\.0\.0\.1:\d+ did not answer"):
        connect_rank("127.0.0.1", free_port(), 2, KEY, 0.5)
    monkeypatch.delenv("FORGE_TP_KEY", raising=False)
    with pytest.raises(UsageError, match="FORGE_TP_KEY"):
        tp_key()
    monkeypatch.setenv("FORGE_TP_KEY", "short")
    with pytest.raises(UsageError, match="at least 16"):
        tp_key()


def test_a_silent_peer_does_not_hold_up_the_others(monkeypatch):
    import socket
    import threading

    monkeypatch.setattr("forge.remote_ranks.HANDSHAKE_TIMEOUT", 0.5)
    port, got = free_port(), []
    waiting = threading.Thread(
        target=lambda: got.append(accept_ranks("127.0.0.1", port, range(1, 2), KEY, 20.0))
    )
    waiting.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            silent = socket.create_connection(("127.0.0.1", port))  # connects, says nothing
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    remote = _start(_remote_echo, port, 1, KEY)
    try:
        waiting.join(15)
        assert got and list(got[0]) == [1]
        got[0][1].close()
    finally:
        silent.close()
        remote.kill()
