"""Ranks of a tensor-parallel group on other hosts: the host that runs the engine listens
(`accept_ranks`) and every rank elsewhere connects to it (`connect_rank`), as torchrun's ranks
meet at a master address and port. The connection then carries what a local rank's pipe
carries (`forge.workers`): the engine's requests and the rank's answers.

Requests are pickles, so both ends prove they hold the same secret first (multiprocessing's
HMAC challenge): the key comes from `FORGE_TP_KEY`, set to the same value on every host. The
NCCL group's own meeting (`forge.rendezvous`, NCCL's bootstrap) is not authenticated: the
hosts belong on a trusted network, as NCCL's always do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

from forge.errors import UsageError

KEY_ENV = "FORGE_TP_KEY"
# TCP keepalive of a rank's connection: a host that vanishes (power, network) without closing
# it is noticed after about IDLE + INTERVAL * COUNT seconds, as a closed connection
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 10, 5, 3
HANDSHAKE_TIMEOUT = 10.0  # seconds a connecting peer has to prove the key and name its rank
LOCAL_ENV = "FORGE_TP_LOCAL_RANKS"


def local_ranks(world: int) -> int:
    """How many of `world` ranks run on this host (ranks 0..n-1): FORGE_TP_LOCAL_RANKS, else
    all; UsageError naming a value outside 1..world."""
    local = os.environ.get(LOCAL_ENV, "").strip()
    if not local:
        return world
    if not local.isdigit() or not 1 <= int(local) <= world:
        raise UsageError(f"{LOCAL_ENV} must be 1..{world} (tensor_parallel), got {local!r}")
    return int(local)


def tp_key() -> bytes:
    """The group's shared secret; UsageError when it is not set or too short."""
    key = os.environ.get(KEY_ENV, "")
    if len(key) < 16:
        raise UsageError(f"ranks on other hosts need {KEY_ENV}: the same secret of at least 16 "
                         "characters on every host")  # fmt: skip
    return key.encode()


def accept_ranks(host: str, port: int, ranks: range, key: bytes,
                 timeout: float) -> dict[int, Connection]:  # fmt: skip
    """Listen on host:port until every rank of `ranks` has connected (its hello checked);
    UsageError naming the missing ranks after `timeout` seconds. A peer without the key, or
    naming a rank not expected (or one already here), is turned away; the others keep
    waiting."""
    conns: dict[int, Connection] = {}
    deadline = time.monotonic() + timeout
    try:
        with socket.create_server((host, port)) as server:
            server.settimeout(1.0)
            while len(conns) < len(ranks):
                if time.monotonic() > deadline:
                    missing = sorted(set(ranks) - set(conns))
                    raise UsageError(f"ranks {missing} did not connect to {host}:{port} within "
                                     f"{timeout:g} s")  # fmt: skip
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                conn, rank = _greet(sock, key, ranks, conns)
                if conn is not None:
                    conns[rank] = conn
    except BaseException:
        for conn in conns.values():
            conn.close()
        raise
    return conns


def keep_alive(fd: int) -> None:
    """Turn on TCP keepalive (KEEPALIVE_*) on the socket behind file descriptor `fd`."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE),
                            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT)):  # fmt: skip
            if hasattr(socket, name):  # (Linux's names; other systems keep their defaults)
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _greet(sock: socket.socket, key: bytes, ranks: range, conns: dict):
    """(connection, rank) of a peer that proves it holds the key (both ways, as
    multiprocessing's Listener does) and names an expected rank; (None, None) otherwise. A
    peer silent for HANDSHAKE_TIMEOUT seconds is dropped (its socket shut down)."""
    sock.setblocking(True)
    keep_alive(sock.fileno())
    conn = Connection(os.dup(sock.fileno()))
    result: list = []

    def handshake() -> None:
        try:
            deliver_challenge(conn, key)
            answer_challenge(conn, key)
            hello = conn.recv()
            rank = hello.get("rank") if isinstance(hello, dict) else None
            if rank not in ranks or rank in conns:
                conn.send(("refused", f"expected ranks {ranks.start}..{ranks.stop - 1} once "
                                      f"each, got {hello!r}"))  # fmt: skip
                return
            conn.send(("welcome", rank))
            result.append(rank)
        except (AuthenticationError, OSError, EOFError):
            pass

    talk = threading.Thread(target=handshake, daemon=True)
    talk.start()
    talk.join(HANDSHAKE_TIMEOUT)
    if talk.is_alive():
        with contextlib.suppress(OSError):  # (the peer may have reset it meanwhile)
            sock.shutdown(socket.SHUT_RDWR)  # wakes the handshake's read
        talk.join()
    sock.close()
    if not result:
        conn.close()
        return None, None
    return conn, result[0]


def connect_rank(host: str, port: int, rank: int, key: bytes, timeout: float) -> Connection:
    """Rank `rank`'s connection to the engine's host, retried until `timeout`; UsageError
    naming the address when it never answers or turns this rank away."""
    deadline = time.monotonic() + timeout
    where = f"the engine at {host}:{port}"
    while True:
        try:
            conn = Client((host, port), authkey=key)
            break
        except AuthenticationError:
            raise UsageError(f"rank {rank}: {where} holds another {KEY_ENV}") from None
        except OSError as err:  # not listening yet, unreachable
            if time.monotonic() > deadline:
                raise UsageError(f"rank {rank}: {where} did not answer within {timeout:g} s "
                                 f"({err})") from None  # fmt: skip
            time.sleep(0.2)
    keep_alive(conn.fileno())
    try:
        conn.send({"rank": rank})
        verdict, detail = conn.recv()
    except (EOFError, OSError):
        conn.close()
        raise UsageError(f"rank {rank}: {where} closed the connection") from None
    if verdict != "welcome":
        conn.close()
        raise UsageError(f"the engine at {host}:{port} refused rank {rank}: {detail}")
    return conn
