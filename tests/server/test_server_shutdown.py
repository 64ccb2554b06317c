"""Stopping `forge serve` (forge.server.shutdown): a drain with a deadline, then exit 0; at the
deadline, open streams end with an error event; a second signal exits at once; a client that
stops reading cannot keep the process alive.

The model is llama-f32 rewritten with a 64k context, so a request for 60,000 tokens runs far
longer than the 1 s drain deadline used here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from gguf import GGUFValueType as V

from tests.support.gguf_factory import rewrite_gguf
from tests.support.server import MODEL, Server

pytest.importorskip("fastapi")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sends POSIX signals")

LONG_CTX = 65536
NO_EOS = {"2": -100}


@pytest.fixture(scope="module")
def long_model(golden_dir, tmp_path_factory):
    src = golden_dir / "models" / f"{MODEL}.gguf"
    dst = tmp_path_factory.mktemp("long") / f"{MODEL}.gguf"
    return rewrite_gguf(src, dst, set_kv=[("llama.context_length", LONG_CTX, V.UINT32, None)])


def _start(long_model, tmp_path, *args):
    return Server(long_model, tmp_path, "--n-ctx", str(LONG_CTX), *args)


def _endless(stream: bool) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Go on"}], "stream": stream,
            "temperature": 1, "logit_bias": NO_EOS, "max_tokens": 60000}  # fmt: skip


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


@contextlib.contextmanager
def _streaming(long_model, tmp_path, drain_timeout: str):
    """A server with that drain deadline, and the lines of an endless stream it is sending
    (the first one read); the server is stopped at the end."""
    srv = _start(long_model, tmp_path, "--drain-timeout", drain_timeout)
    try:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", srv.url + "/v1/chat/completions", json=_endless(True)) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: {")
            yield srv, lines
    finally:
        srv.stop()


def test_the_drain_deadline_ends_open_requests_with_an_error(long_model, tmp_path):
    with _streaming(long_model, tmp_path, "1") as (srv, lines):
        url = srv.url + "/v1/chat/completions"
        collected: list = []
        waiting = threading.Thread(target=lambda: collected.append(
            httpx.post(url, json=_endless(False), timeout=60)))  # fmt: skip
        waiting.start()
        time.sleep(0.3)  # (the second request is running too)
        srv.proc.send_signal(signal.SIGTERM)
        # refused from now on: the listening socket is closed (or closes under the new
        # connection), or the answer is 503
        try:
            late = httpx.post(url, json=_endless(False), timeout=10).status_code
        except httpx.TransportError:  # refused, or closed before it was read
            late = "refused"
        assert late in (503, "refused")
        rest = list(lines)
        waiting.join(60)
        events = [json.loads(x[6:]) for x in rest if x.startswith("data: {")]
        assert "error" in events[-1] and "within 1 s" in events[-1]["error"]["message"]
        assert "data: [DONE]" not in rest
        assert collected and collected[0].status_code == 500
        assert "within 1 s" in collected[0].json()["error"]["message"]
        assert _wait(srv.proc, 30) == 0
        assert "ended 2 request(s)" in srv.output()


def test_a_second_signal_exits_at_once(long_model, tmp_path):
    with _streaming(long_model, tmp_path, "600") as (srv, _):
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert srv.proc.poll() is None  # draining: the stream goes on
        srv.proc.send_signal(signal.SIGINT)
        assert _wait(srv.proc, 20) == 1  # the drain would take 600 s
        assert "stopping at once" in srv.output()


def test_a_client_that_stops_reading_does_not_keep_the_server_alive(long_model, tmp_path):
    with _streaming(long_model, tmp_path, "1") as (srv, _):  # never read after the first line
        time.sleep(1.0)  # the socket buffers fill
        srv.proc.send_signal(signal.SIGTERM)
        assert _wait(srv.proc, 30) == 0


def test_no_engine_process_outlives_the_server(long_model, tmp_path):
    srv = _start(long_model, tmp_path, "--drain-timeout", "0")
    children = []
    for task in os.listdir(f"/proc/{srv.proc.pid}/task"):
        with open(f"/proc/{srv.proc.pid}/task/{task}/children") as f:
            children += [int(p) for p in f.read().split()]
    assert children
    srv.proc.send_signal(signal.SIGTERM)
    assert _wait(srv.proc, 30) == 0
    srv.stop()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in children)
