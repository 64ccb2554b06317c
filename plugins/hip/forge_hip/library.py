"""The kernels of kernels/*.hip by name, with their argument signatures, compiled on first use.

Signature letters (see runtime.base): p pointer, i int32, u uint32, q int64, f float32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from forge.errors import UsageError
from forge_hip.runtime.base import Kernel, Runtime
from forge_hip.sources import load_source

# GGML type name -> kernel suffix, for matvec_* and embed_*.
TYPE_SUFFIX = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
    "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k",
    "Q5_K": "q5_k", "Q6_K": "q6_k",
}  # fmt: skip

MVQ_VARIANTS = ("r1", "r2", "r4", "r8", "r16", "r32", "gen")  # mmv.hip's mvq_* kernel suffixes
ATT_DECODE_WIDTHS = (64, 128, 256, 512)  # attention.hip's attn_decode_w<W>: widest head each

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
    "qk_rope_store": ("attention.hip", "pppppppppiiiiiifffi"),
    "attn_rows": ("attention.hip", "ppppppppppiiiifii"),
    **{f"attn_prefill_{d}": ("attn_prefill.hip", "pppppppiiiiiifii") for d in (64, 128, 256)},
    "attn_decode": ("attention.hip", "ppppppppppppppp" + "iiiiifffifii"),
    **{
        f"attn_decode_w{w}": ("attention.hip", "ppppppppppppppp" + "iiiiifffifii")
        for w in ATT_DECODE_WIDTHS
    },
    "sample_rows": ("sampling.hip", "pipipppp"),
    "mv_multi": ("linear.hip", "pi"),
    "mv_glu": ("linear.hip", "pii"),
    "mm_tiled": ("linear.hip", "pii"),
    **{f"mvq_multi_{v}": ("mmv.hip", "piiiipiiipi") for v in MVQ_VARIANTS},
    **{f"mvq_glu_{v}": ("mmv.hip", "piiipiiipii") for v in MVQ_VARIANTS},
    "mvq_quant": ("mmv.hip", "ppiii"),
    "mvq_multi_r1n": ("mmv.hip", "piiiipiiipi" + "pppppf"),  # + add_norm's (mmv.hip MvqNorm)
    "mvq_glu_r1n": ("mmv.hip", "piiipiiipii" + "pppppf"),
    # add_norm of R rows writing x quantized for the decode product that reads it (xg)
    "add_norm_quant": ("mmv.hip", "ppppppiif"),
    **{f"mmq_multi_m{mt}": ("mmq.hip", "piiiipiiiii") for mt in (1, 2)},
    **{f"mmq_glu_m{mt}": ("mmq.hip", "piiipiiiiii") for mt in (1, 2)},
    "act_half": ("gemm.hip", "ppii"),
    "gemm_m128": ("gemm.hip", "pii"),
    "gemm_m64": ("gemm.hip", "pii"),
    "add_norm": ("layer.hip", "pppppif"),
    "gather_rows": ("layer.hip", "pppi"),
    "feed_ids": ("layer.hip", "pppi"),
    "add_bias": ("layer.hip", "ppi"),
    "act_round": ("layer.hip", "ppii"),
}

# Type ids of linear.hip's descriptors (its T_* defines), in FORGE_WEIGHT_TYPES order.
TYPE_IDS = {name: i for i, name in enumerate(TYPE_SUFFIX)}

# act_round's mode per weight type: how llama.cpp rounds the activations it multiplies by them.
ROUND_MODE = {"F32": 0, "F16": 3, "BF16": 4, "Q4_0": 1, "Q4_1": 1, "Q5_0": 1, "Q5_1": 1,
              "Q8_0": 1, "Q2_K": 2, "Q3_K": 2, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2}  # fmt: skip


@dataclass(frozen=True)
class HipKernel:
    """A kernel registered through `forge_register_kernels` for backend "hip": which function of
    which source, with its argument signature. `directory` (None: forge's kernels/) lets a third
    party ship its own source. A "matmul" kernel other than the built-in one must follow
    matvec.hip's contract: (W, x, y, K, N) with signature "pppii", y[b, n] = x[b] . W[n],
    block = 4 warps, grid = (ceil(N / 4), rows)."""

    source: str
    function: str
    signature: str
    directory: str | None = None


# The built-in matmul: multi-matrix descriptor kernels of linear.hip (mv_multi, mv_glu, mm_tiled).
BUILTIN_MATMUL = HipKernel("linear.hip", "mv_multi", "pi")

# op -> built-in kernel, for the ops that take no weights.
BUILTIN_OPS = {
    name: HipKernel(KERNELS[name][0], name, KERNELS[name][1])
    for name in ("add_norm", "qk_rope_store", "attn_rows", "attn_decode", "gather_rows",
                 "add_bias", "act_round", "argmax", "sample_rows", "geglu", "swiglu")
}  # fmt: skip


def register_builtin(register) -> None:  # noqa: ANN001
    """Register the built-in hip kernels with a `forge_register_kernels` `register` callable."""
    for type_name, suffix in TYPE_SUFFIX.items():
        register("hip", "matmul", type_name, BUILTIN_MATMUL)
        embed = f"embed_{suffix}"
        register("hip", "embed", type_name, HipKernel(KERNELS[embed][0], embed, KERNELS[embed][1]))
    for op, kernel in BUILTIN_OPS.items():
        register("hip", op, "*", kernel)


def attn_decode_width(d: int, dv: int) -> int:
    """The attn_decode_w<W> kernel for heads of d (and dv) elements: the narrowest W that holds
    both (attention.hip's ATT_LAYOUT thresholds)."""
    return next(w for w in ATT_DECODE_WIDTHS if max(d, dv) <= w)


ATT_THREADS = 256  # block size of attention.hip's attn_rows / attn_decode (at most 256)
ATT_MAX_D = 512  # attention.hip's LAYER_MAX_D: largest head dimension
SAMPLE_THREADS = 1024  # sampling.hip's SMP_THREADS: sample_rows' block size
SAMPLE_PARTS = 32  # most blocks that share the max pass over one row of logits
SAMPLE_SLICE = 8192  # fewest logits per block of that pass


def sample_parts(n_vocab: int, rows: int, compute_units: int) -> int:
    """Blocks per row of sample_rows: enough to spread the max pass over the device (one block
    reads a 262144-logit row in ~30 us on an H200, latency-bound), without slices under
    SAMPLE_SLICE logits or more blocks than two per compute unit over all rows."""
    return max(1, min(SAMPLE_PARTS, n_vocab // SAMPLE_SLICE, 2 * compute_units // max(1, rows)))


class KernelLibrary:
    """Compiles each source once per runtime (through its on-disk cache) and hands out kernels."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._modules: dict[str, object] = {}
        self._kernels: dict[str, Kernel] = {}

    def resolve(self, desc: HipKernel) -> Kernel:
        """The loaded kernel a registered descriptor names (compiled on first use)."""
        key = f"{desc.directory or ''}:{desc.source}:{desc.function}"
        if key in self._kernels:
            return self._kernels[key]
        mod_key = f"{desc.directory or ''}:{desc.source}"
        if mod_key not in self._modules:
            binary = self.runtime.compile(load_source(desc.source, desc.directory), desc.source)
            self._modules[mod_key] = self.runtime.load(binary)
        kernel = self.runtime.function(self._modules[mod_key], desc.function, desc.signature)
        if desc.directory is None:  # forge's own kernels all start with FORGE_GRID_WAIT()
            kernel = replace(kernel, overlaps=True)
        self._kernels[key] = kernel
        return kernel

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
        kernel = replace(kernel, overlaps=True)
        self._kernels[name] = kernel
        return kernel
