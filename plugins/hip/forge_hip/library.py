"""The kernels of kernels/*.hip by name, with their argument signatures, compiled on first use.

Signature letters (see runtime.base): p pointer, i int32, u uint32, q int64, f float32.
"""

from __future__ import annotations

from forge.errors import UsageError
from forge_hip.runtime.base import Kernel, Runtime
from forge_hip.sources import load_source

# GGML type name -> kernel suffix, for matvec_* and embed_*.
TYPE_SUFFIX = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
    "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k",
    "Q5_K": "q5_k", "Q6_K": "q6_k",
}  # fmt: skip

KERNELS: dict[str, tuple[str, str]] = {
    **{f"matvec_{s}": ("matvec.hip", "pppii") for s in TYPE_SUFFIX.values()},
    **{f"embed_{s}": ("embed.hip", "pppif") for s in TYPE_SUFFIX.values()},
    "rms_norm": ("norm.hip", "pppif"),
    "rope_norm": ("rope.hip", "ppiiiff"),
    "rope_neox": ("rope.hip", "ppiiiff"),
    "geglu": ("elementwise.hip", "pppq"),
    "swiglu": ("elementwise.hip", "pppq"),
    "add": ("elementwise.hip", "pppq"),
    "mul": ("elementwise.hip", "pppq"),
    "scale": ("elementwise.hip", "ppfq"),
    "argmax": ("argmax.hip", "pip"),
    "kv_store": ("attention.hip", "pppppi"),
    "attn_decode_partial": ("attention.hip", "pppppppiiifi"),
    "attn_decode_combine": ("attention.hip", "pppii"),
}

ATT_THREADS = 128  # attention.hip's ATT_THREADS: attn_decode_partial's block size
ATT_MAX_D = 512  # attention.hip's ATT_MAX_D: largest head dimension


class KernelLibrary:
    """Compiles each source once per runtime (through its on-disk cache) and hands out kernels."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._modules: dict[str, object] = {}
        self._kernels: dict[str, Kernel] = {}

    def get(self, name: str) -> Kernel:
        if name in self._kernels:
            return self._kernels[name]
        if name not in KERNELS:
            raise UsageError(f"unknown kernel {name!r}")
        source, signature = KERNELS[name]
        if source not in self._modules:
            binary = self.runtime.compile(load_source(source), source)
            self._modules[source] = self.runtime.load(binary)
        kernel = self.runtime.function(self._modules[source], name, signature)
        self._kernels[name] = kernel
        return kernel
