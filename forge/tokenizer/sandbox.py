"""Rendering untrusted chat templates with a bounded cost.

A chat template comes from the model file: Jinja's sandbox stops it from reaching Python
internals, but not from looping for hours or doubling a string until memory runs out, and a
Python thread cannot be interrupted while it does. So templates render in worker processes
(`forge/tokenizer/_template_worker.py`): each render gets a time budget (past it the worker is
killed), a memory budget (an address-space limit in the worker) and an output cap; a worker that
broke a limit is discarded and a fresh one starts on demand. Workers are reused between renders
(one costs ~0.1 s to start), at most `max_workers` at once, and end with this process.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from forge.errors import ModelError, UsageError

TIME_LIMIT_S = 1.0  # one render, compilation included
MEMORY_LIMIT = 64 << 20  # address space a render may add to the worker's
MIN_OUTPUT = 1 << 20  # output characters always allowed; more in proportion to the input
START_TIMEOUT_S = 60.0  # a worker starting on a loaded machine
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_template_worker.py")


class _Broken(Exception):
    """The worker broke a limit or the protocol: discard it."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            reply = self._receive(time.monotonic() + START_TIMEOUT_S)
        except _Broken as e:
            self.kill()
            raise ModelError(f"the chat template worker did not start: {e}") from None
        if reply != {"ready": True}:
            self.kill()
            raise ModelError("the chat template worker did not start")

    def ask(self, request: bytes, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write(struct.pack(">I", len(request)) + request)
            self.proc.stdin.flush()
        except OSError:
            raise _Broken(f"it exited (status {self.proc.poll()})") from None
        return self._receive(deadline)

    def _receive(self, deadline: float) -> Any:
        (n,) = struct.unpack(">I", self._read(4, deadline))
        try:
            return json.loads(self._read(n, deadline))
        except ValueError:
            raise _Broken("it sent an unreadable reply") from None

    def _read(self, n: int, deadline: float) -> bytes:
        fd, chunks, got = self.proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Broken("timeout")
            chunk = os.read(fd, n - got)
            if not chunk:
                raise _Broken(f"it exited (status {self.proc.wait()})")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        """End the process now and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class TemplateSandbox:
    """Renders Jinja chat templates in worker processes with time, memory and output limits.
    Thread-safe; `close()` ends the workers (also done at exit)."""

    def __init__(self, time_limit: float = TIME_LIMIT_S, memory_limit: int = MEMORY_LIMIT,
                 max_workers: int = 4):  # fmt: skip
        self.time_limit, self.memory_limit = time_limit, memory_limit
        self.max_workers = max_workers
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        atexit.register(self.close)

    def render(self, template: str, variables: dict[str, Any]) -> str:
        """`template` rendered with `variables` (JSON-compatible values). Raises ModelError
        naming the limit the template broke, or why it failed."""
        try:
            payload = json.dumps(variables)
        except (TypeError, ValueError) as e:
            raise UsageError(f"chat template variables must be JSON values: {e}") from None
        request = json.dumps({
            "template": template, "variables": json.loads(payload),
            "max_output": MIN_OUTPUT + 2 * len(payload),
            "memory": self.memory_limit + 8 * len(payload) + 4 * len(template),
        }).encode("ascii")  # fmt: skip
        worker = self._acquire()
        try:
            reply = worker.ask(request, self.time_limit)
        except _Broken as e:
            self._discard(worker)
            if str(e) == "timeout":
                raise ModelError(f"the chat template did not finish rendering within "
                                 f"{self.time_limit:g} s (stopped)") from None  # fmt: skip
            raise ModelError(f"the chat template worker failed: {e}") from None
        if reply.get("error") == "memory":
            self._discard(worker)  # what it allocated may still be mapped
        else:
            self._release(worker)
        return _text(reply, self.memory_limit)

    def _acquire(self) -> _Worker:
        with self._cond:
            while not self._idle and self._count >= self.max_workers:
                self._cond.wait()
            if self._closed:
                raise ModelError("the chat template sandbox is closed")
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                worker.kill()
                self._count -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def close(self) -> None:
        """End the idle workers now; busy ones end when their render returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()
        atexit.unregister(self.close)


def _text(reply: dict, memory_limit: int) -> str:
    if "text" in reply:
        return reply["text"]
    kind, message = reply.get("error"), reply.get("message", "")
    if kind == "raised":
        raise ModelError(f"the chat template rejected the conversation: {message}")
    if kind == "compile":
        raise ModelError(f"the chat template does not compile: {message}")
    if kind == "memory":
        raise ModelError(f"the chat template needed more than {memory_limit >> 20} MiB while "
                         f"{message} (stopped)")  # fmt: skip
    if kind == "output":
        raise ModelError(f"the chat template's output has {message} (stopped)")
    raise ModelError(f"the chat template failed to render: {message}")


_default: TemplateSandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> TemplateSandbox:
    """The process's shared sandbox (created on first use)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = TemplateSandbox()
        return _default
