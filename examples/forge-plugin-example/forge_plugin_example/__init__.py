"""An example forge plugin: a backend, a sampler stage and a higher-priority kernel.

Everything goes through forge's public hooks; the entry point in pyproject.toml is the only
thing that makes forge load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import forge
from forge.backend import Backend, Runner
from forge.devices import BackendProbe
from forge.errors import BackendUnavailableError

FORGE_HOOK_API = 1  # the hook API version this plugin was written for

UNAVAILABLE_REASON = "no remote endpoint configured (this example never has one)"


class ExampleRemoteBackend(Backend):
    """A backend that would run models on a remote server; here it is never available."""

    name = "example_remote"
    description = "example third-party backend (always unavailable)"

    def probe(self) -> BackendProbe:
        # a high score: it would win "auto" if it were available, so selection must check that
        return BackendProbe(available=False, reason=UNAVAILABLE_REASON, score=1000)

    def open_runner(self, spec: Any, gguf: Any, kernels: Any, *, device: int = 0, **kw) -> Runner:
        raise BackendUnavailableError(self.name, UNAVAILABLE_REASON)


class InvertStage:
    """Negate every finite logit: the most likely token becomes the least likely."""

    def __call__(self, logits: np.ndarray, ctx: Any) -> np.ndarray:
        finite = np.isfinite(logits)
        logits[finite] = -logits[finite]
        return logits


def invert_factory(params: Any) -> InvertStage:
    return InvertStage()


class CountingF32Matmul:
    """y = x @ W.T for float32 weights, counting how often it runs.

    Follows the cpu_simd matmul contract: ``prepare(raw, info)`` once per weight at load
    (raw: uint8 [rows, row_bytes]) and ``kernel(x, prepared)`` per product (x: float32 [n, in]).
    """

    def __init__(self) -> None:
        self.prepare_calls = 0
        self.calls = 0

    def prepare(self, raw: np.ndarray, info: Any) -> np.ndarray:
        self.prepare_calls += 1
        return np.ascontiguousarray(raw).view(np.float32).reshape(raw.shape[0], -1)

    def __call__(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(x, dtype=np.float32) @ w.T


MATMUL = CountingF32Matmul()


@forge.hookimpl
def forge_register_backends(register) -> None:  # noqa: ANN001
    register(ExampleRemoteBackend)


@forge.hookimpl
def forge_register_samplers(register) -> None:  # noqa: ANN001
    register("example_invert", invert_factory)


@forge.hookimpl
def forge_register_kernels(register) -> None:  # noqa: ANN001
    register("cpu_simd", "matmul", "F32", MATMUL, priority=10)
