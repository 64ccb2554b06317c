"""Helpers for GPU tests: device buffers with poisoned outputs, relative error, runners of the
golden models."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forge.gguf import open_gguf
from forge.models import build_spec
from forge.plugins import get_plugin_manager

# A "matmul" kernel for every weight type, shipped as a third-party plugin would ship it.
THIRD_PARTY_KERNELS = str(Path(__file__).resolve().parent / "third_party_kernels")


class Dev:
    """Small helpers over the runtime for tests: upload, poisoned outputs, download."""

    def __init__(self, rt):
        self.rt = rt
        self.bufs = []

    def put(self, arr: np.ndarray):
        arr = np.ascontiguousarray(arr)
        buf = self.rt.alloc(arr.nbytes)
        self.rt.copy_to_device(buf, arr)
        self.bufs.append(buf)
        return buf

    def put_rows(self, type_name: str, raw: np.ndarray) -> int:
        """Upload weight rows as the arena does (forge_hip.arena.device_rows); the row-0 pointer."""
        from forge_hip.arena import device_rows

        data, at = device_rows(type_name, raw)
        return self.put(data).ptr + at

    def poisoned(self, nbytes: int):
        """An output buffer full of 0xFF bytes: NaN as float32, -1 as int32."""
        buf = self.rt.alloc(nbytes)
        self.rt.memset(buf, 0xFF, nbytes)
        self.bufs.append(buf)
        return buf

    def get(self, buf, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.rt.synchronize()
        self.rt.copy_to_host(out, buf)
        return out

    def free(self):
        for b in self.bufs:
            self.rt.free(b)
        self.bufs.clear()


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref||, NaN when anything is not finite (so it never passes)."""
    out = np.asarray(out, np.float64)
    if not np.isfinite(out).all():
        return float("nan")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def add_norm_ref(x, o, w_post, w_next, eps):
    """add_norm in float64 over rows of x [R, K]: (x + rmsnorm(o) * w_post when w_post, x + o
    when only o, x when neither; rmsnorm(that) * w_next)."""

    def rms(v):
        return v / np.sqrt((v**2).mean(axis=1, keepdims=True) + eps)

    x64 = np.asarray(x, np.float64)
    if o is not None:
        o64 = np.asarray(o, np.float64)
        x64 = x64 + (rms(o64) * w_post if w_post is not None else o64)
    return x64, rms(x64) * w_next


def golden_model(golden_dir, name):
    path = str(golden_dir / "models" / name)
    gguf = open_gguf(path)
    return path, gguf, build_spec(gguf)


def golden_runner(rt, golden_dir, name, kernels=None):
    from forge_hip.runner import HipRunner

    _, gguf, spec = golden_model(golden_dir, name)
    runner = HipRunner(spec, gguf, kernels or get_plugin_manager().kernels, runtime=rt)
    # the same float math on every path: tight comparisons
    runner.plan.products.round_prefill = False
    runner.allocate_kv(64, 16)
    return runner
