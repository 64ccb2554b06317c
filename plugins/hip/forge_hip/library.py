"""The kernels of kernels/*.hip by name, compiled on first use; their argument signatures come
from their declarations (`forge_hip.contract`).

Signature letters (see runtime.base): p pointer, i int32, u uint32, q int64, f float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from forge.errors import UsageError
from forge.kv_cache import KvFormat
from forge_hip.contract import constants, kernel_signatures
from forge_hip.runtime.base import Kernel, Runtime
from forge_hip.sources import load_source

# GGML type name -> kernel suffix of embed_*.
TYPE_SUFFIX = {
    "F32": "f32", "F16": "f16", "BF16": "bf16", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0",
    "Q5_1": "q5_1", "Q8_0": "q8_0", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k",
    "Q5_K": "q5_k", "Q6_K": "q6_k",
}  # fmt: skip

MVQ_VARIANTS = ("r1", "r2", "r4", "r8", "r16", "r32", "gen")  # mmv.hip's mvq_* kernel suffixes
MOE_VARIANTS = ("r1", "r8", "gen", "mma")  # moe.hip's moe_glu_* / moe_down_* suffixes
MOE_TYPED_R1 = ("MXFP4", "Q4_K", "Q6_K", "Q8_0")  # moe.hip's moe_*_r1_<type, lower case>
MOE_GEMM_ROWS = (64, 128)  # moe_gemm.hip's moe_gemm_{glu,down}_m<BM>: pairs per tile
ATT_DECODE_WIDTHS = (64, 128, 256, 512)  # attention.hip's attn_decode_w<W>: widest head each
ATT_DECODE_GROUP = 4  # attn_decode_w<W>_g4: query heads per block sharing their K/V reads
PREFILL_WIDTHS = (64, 128, 256)  # attn_prefill_<DP>: head dims padded to DP


class _Kernels(Mapping):
    """Kernel name -> (source file, signature), read from the kernels' own declarations
    (`forge_hip.contract.kernel_signatures`) on first use."""

    def __getitem__(self, name: str) -> tuple[str, str]:
        return kernel_signatures()[name]

    def __iter__(self):
        return iter(kernel_signatures())

    def __len__(self) -> int:
        return len(kernel_signatures())


KERNELS: Mapping[str, tuple[str, str]] = _Kernels()

EXPERT_TYPES = ("MXFP4",)  # types moe.hip's expert products read and no other kernel does

# Type ids of the matrix descriptors (contract.h's T_* defines).
TYPE_IDS = {name: constants()[f"T_{name}"] for name in (*TYPE_SUFFIX, *EXPERT_TYPES)}

# act_round's mode per weight type: how llama.cpp rounds the activations it multiplies by them.
ROUND_MODE = {"F32": 0, "F16": 3, "BF16": 4, "Q4_0": 1, "Q4_1": 1, "Q5_0": 1, "Q5_1": 1,
              "Q8_0": 1, "Q2_K": 2, "Q3_K": 2, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2,
              "MXFP4": 1}  # fmt: skip


@dataclass(frozen=True)
class HipKernel:
    """A kernel registered through `forge_register_kernels` for backend "hip": which function of
    which source. `directory` (None: forge's kernels/) lets a third party ship its own source,
    which may include forge's headers (forge_hip.h, contract.h, quants.h). `signature` (None:
    read from the function's FORGE_KERNEL declaration) in runtime.base's letters. What each op's
    kernel takes is documented in `forge_hip.plugin`."""

    source: str
    function: str
    signature: str | None = None
    directory: str | None = None


# The built-in matmul: multi-matrix descriptor kernels of linear.hip (mv_multi, mv_glu, mm_tiled).
BUILTIN_MATMUL = HipKernel("linear.hip", "mv_multi")

# op -> built-in kernel, for the ops that take no weights ("attn_decode": the widest layout;
# the plan takes the narrowest that holds the model's heads).
BUILTIN_OPS = {
    **{name: HipKernel(source, name)
       for source, names in (("layer.hip", ("add_norm", "gather_rows", "add_bias", "act_round")),
                             ("attention.hip", ("qk_rope_store", "attn_rows")),
                             ("sampling.hip", ("sample_rows",)),
                             ("elementwise.hip", ("geglu", "swiglu")))
       for name in names},
    "attn_decode": HipKernel("attention.hip", f"attn_decode_w{ATT_DECODE_WIDTHS[-1]}"),
}  # fmt: skip


def plan_kernels() -> set[str]:
    """Every kernel the launch plan can launch (forge_hip.plan, .products, .experts,
    .sharded_plan): the kernel sources declare exactly these (tests/hip/test_contract.py)."""
    mvq = [f"mvq_{k}_{v}" for k in ("multi", "glu") for v in (*MVQ_VARIANTS, "r1n")]
    return {
        *(k.function for k in BUILTIN_OPS.values()),
        *(f"embed_{s}" for s in TYPE_SUFFIX.values()),
        *mvq, "mvq_quant", "add_norm_quant",
        *(f"mmq_{k}_m{mt}" for k in ("multi", "glu") for mt in (1, 2)),
        "mv_multi", "mv_glu", "mm_tiled", "act_half", "gemm_m64", "gemm_m128", "feed_ids",
        "mask_logits", "unshard_rows",
        *(f"attn_decode_w{w}" for w in ATT_DECODE_WIDTHS),
        *(f"attn_decode_w{w}_g{ATT_DECODE_GROUP}" for w in ATT_DECODE_WIDTHS[:-1]),
        *(f"attn_decode_tc{d}{sfx}" for d in TCD_HEAD_DIMS for sfx in TCD_FORMATS.values()),
        *(f"attn_prefill_{q}{d}" for q in ("", "q") for d in (64, 128, 256)),
        "moe_route", "moe_topk", "moe_quant", "moe_combine", "moe_router",
        *(f"moe_{k}_{v}" for k in ("glu", "down") for v in MOE_VARIANTS),
        *(f"moe_{k}_r1_{s}" for k in ("glu", "down") for s in map(str.lower, MOE_TYPED_R1)),
        *(f"moe_gemm_{k}_m{bm}" for k in ("glu", "down") for bm in MOE_GEMM_ROWS),
    }  # fmt: skip


def register_builtin(register) -> None:  # noqa: ANN001
    """Register the built-in hip kernels with a `forge_register_kernels` `register` callable."""
    for type_name, suffix in TYPE_SUFFIX.items():
        register("hip", "matmul", type_name, BUILTIN_MATMUL)
        register("hip", "embed", type_name, HipKernel("embed.hip", f"embed_{suffix}"))
    for op, kernel in BUILTIN_OPS.items():
        register("hip", op, "*", kernel)


def attn_decode_width(d: int, dv: int) -> int:
    """The attn_decode_w<W> kernel for heads of d (and dv) elements: the narrowest W that holds
    both (attention.hip's ATT_LAYOUT thresholds)."""
    return next(w for w in ATT_DECODE_WIDTHS if max(d, dv) <= w)


def attn_decode_kernel(d: int, dv: int, n_head: int, n_head_kv: int) -> tuple[str, int]:
    """The built-in decode attention for these heads and the query heads one of its blocks
    takes: attn_decode_w<W>_g4 (4 heads of a KV head per block) when KV heads are shared and
    a grouped layout holds the heads, else attn_decode_w<W> (one head per block)."""
    width = attn_decode_width(d, dv)
    if n_head > n_head_kv and width in ATT_DECODE_WIDTHS[:-1]:
        return f"attn_decode_w{width}_g{ATT_DECODE_GROUP}", ATT_DECODE_GROUP
    return f"attn_decode_w{width}", 1


def attn_decode_blocks(n_head: int, n_head_kv: int, group: int) -> int:
    """attn_decode blocks per row and split for blocks of `group` query heads of one KV head
    (1: one block per query head): ceil(heads a KV head serves / group) per KV head."""
    return n_head_kv * -(-(n_head // n_head_kv) // group)


ATT_THREADS = constants()["ATT_THREADS"]  # attn_rows / attn_decode blocks
TCD_THREADS = constants()["TCD_THREADS"]  # attn_decode_tc blocks
TCD_BK = constants()["TCD_BK"]  # attn_decode_tc's key tiles (cache blocks hold at least one)
TCD_HEAD_DIMS = (64, 128)  # attn_decode_tc's head sizes (attn_decode_tc64, attn_decode_tc128)
TCD_FORMATS = {KvFormat.F16: "", KvFormat.Q8_0: "_q8"}  # caches attn_decode_tc reads: name suffix


def tcd_shared_bytes(d: int, kv: KvFormat, directory: str | None = None) -> int:
    """Dynamic shared memory of attn_decode_tc for heads of d over a `kv` cache (contract.h's
    TCD_SMEM_<d> / TCD_SMEM_Q8_<d>, of `directory`'s sources when given)."""
    return constants(directory)[f"TCD_SMEM{TCD_FORMATS[kv].upper()}_{d}"]


def ap_shared_bytes(dp: int, quantized: bool, directory: str | None = None) -> int:
    """Dynamic shared memory of attn_prefill_<dp> (attn_prefill_q<dp>: Q8_0 / Q4_0 caches) on
    NVIDIA (contract.h's AP_SMEM_<dp> / AP_SMEM_Q<dp>, of `directory`'s sources when given)."""
    return constants(directory)[f"AP_SMEM_{'Q' if quantized else ''}{dp}"]


# Kernels that take dynamic shared memory on NVIDIA, and how much: attn_decode_tc's K/V rings
# (their AMD build is empty and never launched), attn_prefill's tensor-core ring (static shared
# memory on AMD, where it is the SIMT path's).
NV_DYNAMIC_SHARED = {
    **{f"attn_decode_tc{d}{sfx}": tcd_shared_bytes(d, kv)
       for d in TCD_HEAD_DIMS for kv, sfx in TCD_FORMATS.items()},
    **{f"attn_prefill_{'q' if q else ''}{dp}": ap_shared_bytes(dp, q)
       for dp in PREFILL_WIDTHS for q in (False, True)},
}  # fmt: skip


def attn_decode_tc_kernel(d: int, dv: int, n_head: int, n_head_kv: int, arch: str,
                          kv: KvFormat) -> str | None:  # fmt: skip
    """The tensor-core decode attention for these heads (attn_decode_tc.hip: a float16 or
    Q8_0 cache, head sizes 64 or 128, at most TCD_MAX_GROUP query heads a KV head), else None.
    Only on sm_90 (H100/H200), where it was measured: its 104 KB of dynamic shared memory for
    heads of 128 (and 10.5 KB static, the fused form's prologue) do not fit a block of
    sm_86/sm_89 parts, and sm_80 holds one block an SM, not the two the plan's splits count on
    (sm_90 holds two with 1 KB to spare)."""
    group = n_head // n_head_kv
    fits = d == dv and d in TCD_HEAD_DIMS and n_head % n_head_kv == 0
    if arch != "sm_90" or kv not in TCD_FORMATS or not fits:
        return None
    name = f"attn_decode_tc{d}{TCD_FORMATS[kv]}"
    return name if group <= constants()["TCD_MAX_GROUP"] else None


ATT_MAX_D = constants()["LAYER_MAX_D"]  # largest head dimension of the attention kernels
SAMPLE_THREADS = constants()["SMP_THREADS"]  # sample_rows' block size


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
        signature = desc.signature or self._declared(desc)
        kernel = self.runtime.function(self._modules[mod_key], desc.function, signature)
        if desc.directory is None:  # forge's own kernels all start with FORGE_GRID_WAIT()
            kernel = replace(kernel, overlaps=True)
        kernel = self._with_shared(kernel)
        self._kernels[key] = kernel
        return kernel

    @staticmethod
    def _declared(desc: HipKernel) -> str:
        found = kernel_signatures(desc.directory).get(desc.function)
        if found is None:
            where = desc.directory or "forge's kernels"
            raise UsageError(f"no FORGE_KERNEL {desc.function!r} declared in {where}")
        return found[1]

    def get(self, name: str) -> Kernel:
        if name in self._kernels:
            return self._kernels[name]
        if name not in kernel_signatures():
            raise UsageError(f"unknown kernel {name!r}")
        source, signature = KERNELS[name]
        if source not in self._modules:
            binary = self.runtime.compile(load_source(source), source)
            self._modules[source] = self.runtime.load(binary)
        kernel = self.runtime.function(self._modules[source], name, signature)
        kernel = self._with_shared(replace(kernel, overlaps=True))
        self._kernels[name] = kernel
        return kernel

    def _with_shared(self, kernel: Kernel) -> Kernel:
        """`kernel` with the dynamic shared memory it takes on this platform (NV_DYNAMIC_SHARED)."""
        if self.runtime.platform == "cuda" and kernel.name in NV_DYNAMIC_SHARED:
            return self.runtime.reserve_shared(kernel, NV_DYNAMIC_SHARED[kernel.name])
        return kernel
