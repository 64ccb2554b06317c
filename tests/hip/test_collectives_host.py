"""The NCCL layer's host side (forge_hip.collectives): the library is found (the cuda extra's
nvidia-nccl wheel), a group id is NCCL's whole 128 bytes (zero bytes included) and travels to
another rank unchanged; a missing library or a malformed id is a clear error."""

from __future__ import annotations

import multiprocessing as mp

import pytest
from forge_hip.collectives import UNIQUE_ID_BYTES, Communicator, load_library

from forge.errors import ForgeRuntimeError
from forge.rendezvous import Rendezvous


def _nccl():
    try:
        return load_library("cuda")
    except ForgeRuntimeError as err:
        pytest.skip(f"no NCCL library here: {err}")


def test_a_group_id_is_all_of_ncclUniqueId():
    _nccl()
    ids = {Communicator.unique_id("cuda") for _ in range(3)}
    assert len(ids) == 3 and all(len(i) == UNIQUE_ID_BYTES for i in ids)
    # a socket address is in it, zero bytes and all: a C string would stop at the first
    assert all(0 in i[:16] and any(i[i.index(0) + 1 :]) for i in ids)


def _fetch(port, queue):
    queue.put(Rendezvous("127.0.0.1", port, 1, 2, 20.0).share())


def test_the_group_id_reaches_the_other_rank_unchanged():
    from forge.rendezvous import free_port

    _nccl()
    uid, port = Communicator.unique_id("cuda"), free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    other = ctx.Process(target=_fetch, args=(port, queue))
    other.start()
    try:
        assert Rendezvous("127.0.0.1", port, 0, 2, 20.0).share(uid) == uid
        assert queue.get() == uid
    finally:
        other.join(10)


def test_missing_library_and_malformed_id_are_named(monkeypatch):
    monkeypatch.setenv("FORGE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    with pytest.raises(ForgeRuntimeError, match="needs NCCL.*tried: /nonexistent/libnccl.so.2"):
        load_library("cuda")
    with pytest.raises(ForgeRuntimeError, match="needs RCCL"):
        load_library("rocm")
    monkeypatch.delenv("FORGE_NCCL_LIBRARY")
    _nccl()
    with pytest.raises(ForgeRuntimeError, match="128 bytes, not 16"):
        Communicator("cuda", b"\0" * 16, 2, 0)
