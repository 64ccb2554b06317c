"""A `forge serve` subprocess on a free loopback port, for the server tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx

from forge.rendezvous import free_port

MODEL = "llama-f32"
N_CTX = 1024


class Server:
    """A `forge serve` subprocess; `url` once /ready says 200 (or, with `until="failed"`, once
    it says the model failed to load)."""

    def __init__(self, model_path, tmp_path, *args, env=None, until="ready"):
        self.port = free_port()
        self.key = (env or {}).get("FORGE_API_KEY")  # sent by `metrics`
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (tmp_path / f"server-{self.port}.log").open("w+")
        cmd = [sys.executable, "-m", "forge", "serve", str(model_path), "--port", str(self.port),
               "--n-ctx", str(N_CTX), "--backend", "cpu_simd", *args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).json()["status"] == until:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not {until} in 60 s: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def metrics(self) -> dict[str, float]:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=5).text
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-z_]+(?:\{[^}]*\})?) ([-+0-9.e]+|NaN)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
