"""A plugin kernel with a higher priority replaces a built-in cpu_simd op, and is really used."""

from __future__ import annotations

import numpy as np
from forge_cpu_simd import ops

import forge
from forge.plugins import get_plugin_manager


class CountingNorm:
    """Throwaway plugin: an rms_norm kernel that counts its calls and delegates to NumPy."""

    def __init__(self) -> None:
        self.calls = 0

    def rms_norm(self, x, weight, eps):
        self.calls += 1
        return ops.rms_norm(x, weight, eps)

    @forge.hookimpl
    def forge_register_kernels(self, register):
        register("cpu_simd", "rms_norm", "*", self.rms_norm, priority=50)  # above cpu_jit


def test_higher_priority_op_kernel_is_used(golden_dir):
    plugin = CountingNorm()
    pm = get_plugin_manager()
    pm.register(plugin, "counting-norm")
    try:
        assert pm.kernels.get("cpu_simd", "rms_norm").plugin == "counting-norm"
        model = forge.load(str(golden_dir / "models" / "llama-f32.gguf"), backend="cpu_simd")
        logits = model.logits(model.tokenize("Once upon a time"))
    finally:
        pm.unregister("counting-norm")
    spec = model.spec
    # 2 norms per layer and the final norm, once per forward pass
    assert plugin.calls == 2 * spec.n_layer + 1
    assert np.isfinite(logits).all()
    assert pm.kernels.get("cpu_simd", "rms_norm").plugin != "counting-norm"
