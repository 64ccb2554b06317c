"""How the ranks of one tensor-parallel run find each other, as torchrun's: a master address
and port, each rank's number and the world size (flags or MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE). Rank 0 listens and hands every other rank one blob (NCCL's unique id) over TCP;
the others connect, retrying until the master is up. Errors name the rank and what went wrong;
nothing waits longer than `timeout` seconds.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass

from forge.errors import UsageError

_LEN = struct.Struct("!I")
_MAX_MESSAGE = 1 << 16
_GIVEN, _REFUSED = b"\x00", b"\x01"  # first byte of rank 0's reply


class RendezvousError(UsageError):
    """The ranks could not meet: which rank, where, and why."""


@dataclass(frozen=True)
class Rendezvous:
    """Where rank `rank` of `world` meets the others."""

    master_addr: str
    master_port: int
    rank: int
    world: int
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise RendezvousError(f"rank {self.rank} is not in 0..{self.world - 1} (world size)")
        if not 0 < self.master_port < 65536:
            raise RendezvousError(f"master port {self.master_port} is not in 1..65535")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, timeout: float = 60.0):
        """The rendezvous torchrun's variables describe (MASTER_ADDR, MASTER_PORT, RANK,
        WORLD_SIZE); RendezvousError naming a missing or malformed one."""
        env = os.environ if environ is None else environ
        values = {}
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            if not env.get(key):
                raise RendezvousError(f"{key} is not set: a multi-host run needs MASTER_ADDR, "
                                      "MASTER_PORT, RANK and WORLD_SIZE")  # fmt: skip
            values[key] = env[key]
        try:
            port, rank, world = (int(values[k]) for k in ("MASTER_PORT", "RANK", "WORLD_SIZE"))
        except ValueError:
            raise RendezvousError(
                "MASTER_PORT, RANK and WORLD_SIZE must be integers, got "
                f"{values['MASTER_PORT']!r}, {values['RANK']!r}, {values['WORLD_SIZE']!r}"
            ) from None
        return cls(values["MASTER_ADDR"], port, rank, world, timeout)

    def share(self, blob: bytes | None = None) -> bytes:
        """Rank 0 gives `blob` to every other rank and returns it once all have it; the others
        return what rank 0 gave."""
        if self.rank == 0:
            if blob is None:
                raise RendezvousError("rank 0 has nothing to share")
            self._serve(blob)
            return blob
        return self._fetch()

    def _serve(self, blob: bytes) -> None:
        deadline = time.monotonic() + self.timeout
        waiting = set(range(1, self.world))
        with socket.create_server((self.master_addr, self.master_port), reuse_port=False) as srv:
            while waiting:
                srv.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    conn, peer = srv.accept()
                except TimeoutError:
                    raise RendezvousError(
                        f"rank 0 at {self.master_addr}:{self.master_port}: ranks "
                        f"{sorted(waiting)} did not connect within {self.timeout:g} s"
                    ) from None
                with conn:
                    conn.settimeout(max(deadline - time.monotonic(), 0.001))
                    try:
                        hello = _receive_json(conn, f"a peer at {peer[0]}")
                        problem = self._check(hello, waiting)
                        _send(conn, _REFUSED + problem.encode() if problem else _GIVEN + blob)
                    except (RendezvousError, OSError):
                        continue  # not a forge rank, or one that left: keep waiting for ranks
                    if not problem:
                        waiting.discard(hello["rank"])

    def _check(self, hello: dict, waiting: set[int]) -> str:
        rank, world = hello.get("rank"), hello.get("world")
        if world != self.world:
            return f"rank {rank} says world size {world}, rank 0 says {self.world}"
        if rank not in waiting:
            return f"rank {rank} connected twice or is not in 1..{self.world - 1}"
        return ""

    def _fetch(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        where = f"{self.master_addr}:{self.master_port}"
        while True:
            try:
                left = max(deadline - time.monotonic(), 0.001)
                with socket.create_connection((self.master_addr, self.master_port), left) as conn:
                    conn.settimeout(left)
                    _send(conn, json.dumps({"rank": self.rank, "world": self.world}).encode())
                    reply = _receive(conn, f"rank 0 at {where}")
            except OSError as err:  # refused (not up yet), reset, timed out, unknown host
                if time.monotonic() >= deadline:
                    raise RendezvousError(
                        f"rank {self.rank}: rank 0 at {where} did not answer within "
                        f"{self.timeout:g} s ({err})"
                    ) from None
                time.sleep(0.1)
                continue
            if reply[:1] != _GIVEN:
                raise RendezvousError(f"rank 0 refused rank {self.rank}: "
                                      f"{reply[1:].decode(errors='replace')}")  # fmt: skip
            return reply[1:]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` that nothing listens on now (for ranks meeting on this host)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _send(conn: socket.socket, data: bytes) -> None:
    conn.sendall(_LEN.pack(len(data)) + data)


def _receive(conn: socket.socket, who: str) -> bytes:
    head = _exactly(conn, _LEN.size, who)
    (size,) = _LEN.unpack(head)
    if size > _MAX_MESSAGE:
        raise RendezvousError(f"{who} sent a {size}-byte message (most {_MAX_MESSAGE})")
    return _exactly(conn, size, who)


def _receive_json(conn: socket.socket, who: str) -> dict:
    try:
        hello = json.loads(_receive(conn, who))
    except (ValueError, UnicodeDecodeError):
        raise RendezvousError(f"{who} sent something that is not a forge rank's hello") from None
    if not isinstance(hello, dict):
        raise RendezvousError(f"{who} sent something that is not a forge rank's hello")
    return hello


def _exactly(conn: socket.socket, n: int, who: str) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise RendezvousError(f"{who} closed the connection mid-message")
        data += chunk
    return data
