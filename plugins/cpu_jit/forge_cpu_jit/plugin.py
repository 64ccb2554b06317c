"""The cpu_jit plugin: compiled matmul kernels for the `cpu_simd` backend, through the kernel hook.

It registers one kernel object (`forge_cpu_jit.kernel.JitMatmul`) for op "matmul" of backend
"cpu_simd" on every weight type it computes, at `PRIORITY` (above the built-in NumPy kernel's 0),
exactly as a third-party kernel plugin would: `forge kernels` shows them winning, and the config key
``kernels = "builtin"`` (``FORGE_KERNELS=builtin``) makes cpu_simd run its own NumPy kernels.
Registering imports nothing heavy; numba is imported when a model's weights are prepared, and if
it is missing or a kernel fails to compile forge says so once and the NumPy kernel runs.
The "rms_norm", "rope", "gelu_tanh" and "silu" ops (`rowwise_op.py`) register above NumPy's:
their results are NumPy's, bit for bit. The "attention" and "decode_attention" ops
(`attention_op.py`) register below NumPy's and are marked batch invariant: the config key
``batch_invariant = true`` runs them.
"""

from __future__ import annotations

import forge
from forge_cpu_jit.attention_op import CompiledAttention, CompiledDecodeAttention
from forge_cpu_jit.kernel import TYPES, JitMatmul
from forge_cpu_jit.rowwise_op import CompiledGeluTanh, CompiledRmsNorm, CompiledRope, CompiledSilu

FORGE_HOOK_API = forge.HOOK_API_VERSION
PRIORITY = 10
INVARIANT_PRIORITY = -10

_KERNEL = JitMatmul()  # one object for every type: weights of different types can be fused


@forge.hookimpl
def forge_register_kernels(register) -> None:  # noqa: ANN001
    for weight_type in TYPES:
        register("cpu_simd", "matmul", weight_type, _KERNEL, priority=PRIORITY)
    # bit-identical to NumPy's ops, faster: above them
    register("cpu_simd", "rms_norm", "*", CompiledRmsNorm(), priority=PRIORITY)
    register("cpu_simd", "rope", "*", CompiledRope(), priority=PRIORITY)
    register("cpu_simd", "gelu_tanh", "*", CompiledGeluTanh(), priority=PRIORITY)
    register("cpu_simd", "silu", "*", CompiledSilu(), priority=PRIORITY)
    # compiled attention, each row reduced in a fixed order: below NumPy's (0), chosen by the
    # config key batch_invariant (its objects say `batch_invariant = True`)
    register("cpu_simd", "attention", "*", CompiledAttention(), priority=INVARIANT_PRIORITY)
    register("cpu_simd", "decode_attention", "*", CompiledDecodeAttention(),
             priority=INVARIANT_PRIORITY)  # fmt: skip
