"""`forge serve`'s engine process (forge.server.engine_process): the model runs in a child of
the HTTP process. What must hold when the child fails: a model the backend cannot load
ends forge serve with the reason; a child that dies ends every open request with an error
and the server answers 503 instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.server import MODEL, Server

pytest.importorskip("fastapi")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds processes through /proc")


def _engine_pid(server: Server) -> int:
    """The engine child of the server process (its only child besides multiprocessing's
    resource tracker, which runs `multiprocessing.resource_tracker`)."""
    for task in os.listdir(f"/proc/{server.proc.pid}/task"):
        with open(f"/proc/{server.proc.pid}/task/{task}/children") as f:
            for pid in f.read().split():
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    if b"spawn_main" in c.read():
                        return int(pid)
    raise AssertionError("no engine process")


def test_generation_runs_in_the_engine_process(golden_dir, tmp_path):
    server = Server(golden_dir / "models" / f"{MODEL}.gguf", tmp_path)
    try:
        engine = _engine_pid(server)
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        assert server.metrics()["forge_generated_tokens_total"] == 4
        os.kill(engine, signal.SIGKILL)  # the engine dies under the server
        deadline = time.monotonic() + 20
        while httpx.get(server.url + "/ready", timeout=5).status_code == 200:
            assert time.monotonic() < deadline, "/ready still says ready"
            time.sleep(0.05)
        ready = httpx.get(server.url + "/ready", timeout=5).json()
        assert ready["status"] == "failed" and "engine" in ready["error"]
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "failed"
    finally:
        server.stop()


def test_open_streams_end_with_an_error_when_the_engine_dies(golden_dir, tmp_path):
    server = Server(golden_dir / "models" / f"{MODEL}.gguf", tmp_path)
    try:
        body = {"model": MODEL, "prompt": "Tell me everything", "max_tokens": 900,
                "temperature": 1, "logit_bias": {"2": -100}, "stream": True}  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            first = next(lines)
            assert first.startswith("data: {")
            os.kill(_engine_pid(server), signal.SIGKILL)
            rest = list(lines)  # ends instead of hanging
        events = [json.loads(x[6:]) for x in rest if x.startswith("data: {")]
        assert "error" in events[-1] and "engine" in events[-1]["error"]["message"]
    finally:
        server.stop()


def test_a_model_the_backend_cannot_load_ends_forge_serve(golden_dir):
    """The front (HTTP) side opens the GGUF; the engine fails to load it on a backend this
    machine lacks: forge serve ends with the engine's reason and exit status 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    done = subprocess.run([sys.executable, "-m", "forge", "serve",
                           str(golden_dir / "models" / f"{MODEL}.gguf"), "--port", "0",
                           "--backend", "no-such-backend"], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 1
    assert "forge: error: the model failed to load:" in done.stderr
    assert "no-such-backend" in done.stderr and "Traceback" not in done.stderr


SLOW_LOAD = """
import os
import time

if os.environ.get("FORGE_TEST_LOAD_DELAY"):
    import forge.api

    _load = forge.api.load

    def _slow_load(*args, **kwargs):
        time.sleep(float(os.environ["FORGE_TEST_LOAD_DELAY"]))
        return _load(*args, **kwargs)

    forge.api.load = _slow_load
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # exited, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_engine_loads_ends_both_processes(golden_dir, tmp_path, sig):
    """Ctrl-C or SIGTERM before the model is in: the server exits at once (no drain to wait
    for) and its engine child, which ignores both signals, does not outlive it."""
    (tmp_path / "sitecustomize.py").write_text(SLOW_LOAD)
    env = {
        "FORGE_TEST_LOAD_DELAY": "60",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    server = Server(golden_dir / "models" / f"{MODEL}.gguf", tmp_path, env=env, until="loading")
    try:
        deadline = time.monotonic() + 30
        while True:  # /ready says "loading" from the start; the child is spawned just after
            try:
                engine = _engine_pid(server)
                break
            except AssertionError:
                assert time.monotonic() < deadline, "no engine process"
                time.sleep(0.05)
        server.proc.send_signal(sig)
        server.proc.wait(20)  # raises TimeoutExpired if the server hangs
        assert _gone(engine, 10), "the engine process outlived the server"
    finally:
        server.stop()


def test_drain_from_a_signal_handler_does_not_wait_for_the_pipe():
    """SIGTERM's handler runs drain() on the main thread, which may be inside a send holding
    the pipe's lock: drain only refuses new requests (stop() drains the child), at once."""
    import threading

    from forge.server.engine_process import EngineProcess

    class Pipe:
        def __init__(self):
            self.sent = []

        def send(self, message):
            self.sent.append(message)

    engine = EngineProcess.__new__(EngineProcess)  # the parts drain() uses, no child process
    engine._send_lock, engine._commands, engine._accepting = threading.Lock(), Pipe(), True

    def interrupted_send():
        with engine._send_lock:  # as if the signal came in the middle of a send
            engine.drain()

    t = threading.Thread(target=interrupted_send, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "drain() waited for the lock its own thread holds"
    assert not engine._accepting and engine._commands.sent == []


def test_token_events_cross_the_pipe_as_their_fields():
    """The child sends each TokenEvent as plain fields (cheap to pickle) and the parent rebuilds
    it: callbacks get events equal to the ones put, logprobs included, and Finished as is."""
    import threading
    from multiprocessing import Pipe

    from forge.generation import TokenEvent
    from forge.scheduler import Finished
    from forge.server.engine_process import EngineProcess, _Outbox

    read, write = Pipe(duplex=False)
    outbox = _Outbox(write, lambda: {"running": 1})
    sent = [TokenEvent(5, "hi", -0.25, [(5, -0.25), (7, -1.5)]), TokenEvent(6, ""),
            Finished("stop", 3, 2, None)]  # fmt: skip
    for message in sent:
        outbox.put(9, message)
    outbox.flush()
    kind, items, stats = read.recv()
    assert kind == "out" and stats == {"running": 1} and len(items) == 3
    assert all(type(x) in (int, str, float, list, type(None)) for x in items[0])
    got: list = []
    engine = EngineProcess.__new__(EngineProcess)  # _dispatch's state only, no child
    engine._callbacks, engine._lock = {9: got.append}, threading.Lock()
    engine._dispatch(items)
    assert got == sent and 9 not in engine._callbacks  # Finished ends the request
