"""Expert matrices for the GPU tests of the mixture-of-experts kernels: random GGML weights of E
experts placed as the arena places them, with float64 references."""

from __future__ import annotations

import numpy as np
from forge_hip.arena import device_rows
from forge_hip.library import TYPE_IDS

from tests.support.mvq_cases import random_weights


def moe_act(g: np.ndarray, u: np.ndarray, act: int, alpha: float, limit: float) -> np.ndarray:
    """glu_act.h's moe_act in float64: 0 SiLU(g) u, 2 gpt-oss's clamped SwiGLU."""
    with np.errstate(over="ignore"):  # (exp of large negative products: inf, the output 0)
        if act == 2:
            g = np.minimum(g, limit)
            u = np.clip(u, -limit, limit)
            return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)
        return g / (1.0 + np.exp(-g)) * u


class Experts:
    """n_expert experts' matrices [n_expert N, K] of one type on the device (expert e's rows
    after expert e - 1's, as the arena places them), their float64 values and biases."""

    def __init__(self, dev, rng, n_expert: int, type_name: str, n: int, k: int, bias: bool):
        self.type, self.n, self.k = type_name, n, k
        raw, values = random_weights(rng, type_name, n_expert * n, k)
        self.values = values.reshape(n_expert, n, k)
        data, at = device_rows(type_name, raw)
        self.ptr, self.row_bytes = dev.put(data).ptr + at, data.shape[1]
        self.bias = rng.standard_normal((n_expert, n)).astype(np.float32) if bias else None
        self.bias_ptr = dev.put(self.bias).ptr if bias else 0

    def desc(self, y: int) -> list[int]:
        """Expert 0's descriptor (linear.hip's layout) writing y."""
        return [self.ptr, 0, y, self.bias_ptr, TYPE_IDS[self.type], self.k, self.n,
                self.row_bytes]  # fmt: skip

    def apply(self, e: int, x: np.ndarray) -> np.ndarray:
        """Expert e's product of x in float64, with its bias."""
        out = x.astype(np.float64) @ self.values[e].T
        return out + self.bias[e] if self.bias is not None else out
