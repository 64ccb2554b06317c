"""The attention part of the hip plan, per layer and step: the Q/K/V product, attention, the
output product (its bias when the model has one).

Decode steps run one fused launch (attention.hip's attn_decode: Q/K norm and RoPE, the KV
store, split attention and its merge), or (tuning knobs `tc_decode` / `tc_decode_q8`, NVIDIA,
float16 / Q8_0 cache) attn_decode_tc.hip's fused form (a KV head's query heads as the rows of
tensor-core tiles; it norms and rotates Q/K and stores K/V itself); other passes run
qk_rope_store, then attn_prefill.hip (many rows) or attn_rows. RoPE reads a per-layer frequency
table for YaRN and Llama 3.1 scaling (`forge.models.rope`'s frequencies, uploaded once into
ws.rope_freqs) and the base^(-2i/n) formula otherwise; gpt-oss's attention sinks join the
softmax in every attention kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forge.kv_cache import KvFormat
from forge.models.rope import FREQS_TENSOR, rope_frequencies
from forge.models.spec import ModelSpec
from forge_hip.contract import constants
from forge_hip.library import (
    PREFILL_WIDTHS,
    TCD_BK,
    TCD_THREADS,
    KernelLibrary,
    attn_decode_blocks,
    attn_decode_kernel,
    attn_decode_tc_kernel,
)
from forge_hip.products import Fused, Products
from forge_hip.runtime.base import Kernel
from forge_hip.tuning import qk_rope_blocks
from forge_hip.workspace import PART_ROWS, ROWS_SPLITS, Workspace

ROPE_THREADS = 128  # qk_rope_store blocks (4 warps on NVIDIA: 4 Q/K heads per block)
ATT_THREADS = constants()["ATT_THREADS"]
AP_THREADS = constants()["AP_THREADS"]
AP_TENSOR_CORES = constants()["AP_TENSOR_CORES"]
AP_MAX_SPLITS = constants()["AP_MAX_SPLITS"]
AP_ROWS = constants()["AP_ROWS"]  # attn_prefill.hip: (token, query head) pairs per block
TENSOR_CORE_FORMATS = (KvFormat.F16, KvFormat.Q8_0, KvFormat.Q4_0)  # attn_prefill's mma path
TABLE_KINDS = ("yarn", "llama3")  # RoPE scalings the kernels read as a frequency table


@dataclass(frozen=True)
class AttentionLaunches:
    """One layer's attention part: its descriptors and vector weights (0: absent)."""

    norm: int  # attn_norm.weight: the add_norm making its input
    qkv: int  # first of the Q, K, V descriptors
    wo: int  # the output product's descriptor
    q_norm: int
    k_norm: int
    post_norm: int
    sinks: int = 0  # attn_sinks.weight
    rope_freqs: int = 0  # the layer's RoPE frequencies (0: base^(-2i / rope_dim))
    mscale: float = 1.0  # RoPE's cos/sin magnitude (YaRN)


def rope_table(spec: ModelSpec, layer: int, factors: np.ndarray | None) -> np.ndarray | None:
    """float32 [rope_dim / 2] per-pair frequencies of a layer whose RoPE scaling the kernels
    read as a table (None: the kernels' own formula, also for linear scaling)."""
    ls = spec.layers[layer]
    if ls.rope.kind not in TABLE_KINDS:
        return None
    f = rope_frequencies(spec.rope_dim, ls.rope_base, ls.rope, factors)
    return f.astype(np.float32)


class Attentions:
    """Descriptors and launches of the attention parts of one model."""

    def __init__(self, spec: ModelSpec, products: Products, lib: KernelLibrary, ws: Workspace,
                 op: dict, warp: int, builtin_decode: bool = True):  # fmt: skip
        """`builtin_decode`: op["attn_decode"] is the built-in kernel, so the layout and head
        grouping made for these heads replace it (its registers, not the widest's)."""
        self.spec, self.products, self.lib, self.ws, self.op = spec, products, lib, ws, op
        self.warp = warp
        self.decode_group = 1  # query heads per attn_decode block (sharing K/V reads)
        if builtin_decode:
            name, self.decode_group = attn_decode_kernel(spec.head_dim, spec.head_dim_v,
                                                         spec.n_head, spec.n_head_kv)  # fmt: skip
            op["attn_decode"] = lib.get(name)
        self._builtin, self._tc_kernels = builtin_decode, {}
        self._tables = self._upload_tables()

    def decode_blocks(self) -> int:
        """attn_decode blocks per row and split: one per query head, or per group of
        `decode_group` query heads of one KV head."""
        return attn_decode_blocks(self.spec.n_head, self.spec.n_head_kv, self.decode_group)

    def tc_decode_kernel(self, kv) -> Kernel | None:  # noqa: ANN001 - a KvCache
        """attn_decode_tc for decode steps over this cache where the `tc_decode` knob asks for it
        (and for a Q8_0 cache `tc_decode_q8` too) and it applies (NVIDIA, float16 or Q8_0,
        blocks of TCD_BK positions or more: `attn_decode_tc_kernel`), else None (attn_decode).
        Only while attn_decode is forge's own: like attn_decode, its fused form then also does
        qk_rope_store's work in decode steps (a plugin's qk_rope_store runs for other passes)."""
        key = (kv.format, kv.block_size)  # (a runner's cache may be allocated again)
        if key not in self._tc_kernels:
            s, name, tune = self.spec, None, self.products.tune
            wanted = tune.tc_decode and (kv.format is not KvFormat.Q8_0 or tune.tc_decode_q8)
            if self._builtin and wanted and kv.block_size >= TCD_BK:
                arch = self.lib.runtime.props.arch
                name = attn_decode_tc_kernel(s.head_dim, s.head_dim_v, s.n_head, s.n_head_kv,
                                             arch, kv.format)  # fmt: skip
            self._tc_kernels[key] = self.lib.get(name) if name else None
        return self._tc_kernels[key]

    def decode_splits(self, kv, rows: int, fill: int) -> int:  # noqa: ANN001 - a KvCache
        """Most splits of a decode step's attention: as many as keep `fill` blocks per compute
        unit of attn_decode (attn_decode_tc holds two a unit: twice that); one row of the
        per-head attn_decode keeps ROWS_SPLITS, the count measured best for it."""
        cus = self.lib.runtime.props.compute_units
        if self.tc_decode_kernel(kv) is not None:
            return max(1, 2 * fill * cus // (rows * self.spec.n_head_kv))
        if rows == 1 and self.decode_group == 1:
            return ROWS_SPLITS
        return max(1, fill * cus // (rows * self.decode_blocks()))

    def _upload_tables(self) -> dict[int, int]:
        """Layer -> device address of its frequency table (layers with one)."""
        s, arena, rt = self.spec, self.products.arena, self.lib.runtime
        factors = None
        if any(layer.rope.kind == "llama3" for layer in s.layers):
            placed = arena.placed[FREQS_TENSOR]
            factors = np.empty(placed.k, np.float32)
            rt.copy_to_host(factors, placed.ptr)
        at, width = {}, 4 * (s.rope_dim // 2)
        for i in range(s.n_layer):
            table = rope_table(s, i, factors)
            if table is not None:
                at[i] = self.ws.rope_freqs + i * width
                rt.copy_to_device(at[i], table)
        return at

    def part(self, i: int) -> AttentionLaunches:
        """Descriptors and weights of layer i's attention."""
        ws, v, p = self.ws, self.products.arena.address, f"blk.{i}."
        qkv = self.products.add([(p + f"attn_{x}.weight", ws.h, y, v(p + f"attn_{x}.bias"))
                                 for x, y in (("q", ws.q), ("k", ws.k), ("v", ws.v))])  # fmt: skip
        wo = self.products.add([(p + "attn_output.weight", ws.attn, ws.o,
                                 v(p + "attn_output.bias"))])  # fmt: skip
        ffn_norm = getattr(self.spec.ffn, "norm", "ffn_norm")  # (gpt-oss: post_attention_norm)
        post = v(p + "post_attention_norm.weight") if ffn_norm != "post_attention_norm" else 0
        rope = self.spec.layers[i].rope
        return AttentionLaunches(v(p + "attn_norm.weight"), qkv, wo, v(p + "attn_q_norm.weight"),
                                 v(p + "attn_k_norm.weight"), post, v(p + "attn_sinks.weight"),
                                 self._tables.get(i, 0), rope.mscale)  # fmt: skip

    def run(self, i: int, a: AttentionLaunches, rows: int, splits: int, meta, kv,
            decode: bool, norm: Fused | None) -> None:  # fmt: skip
        """Layer i's attention: ws.h (or the fused add_norm's) -> Q/K/V -> ws.attn -> ws.o.
        Batch-invariant products (`forge_hip.invariance`): attn_rows over one split, always."""
        s, ws, op, L = self.spec, self.ws, self.op, self.products.launch
        ls, inv = s.layers[i], self.products.invariant
        if inv:  # every row over its positions in one block: attn_rows, one split
            splits, decode = 1, False
        kc, vc = kv.layer(i)
        meta = meta.pool(kv.pool(i))  # the rows' slots and tables in the layer's block pool
        self.products.matmul(a.qkv, 3, rows, norm)
        rope = [s.rope_dim, int(s.rope_neox), ls.rope_base, 1.0 / ls.rope_scale, a.rope_freqs,
                a.mscale, s.rms_eps]  # fmt: skip
        att = [kv.block_size, s.attn_scale, ls.sliding_window or 0, kv.format_id]
        tc = self.tc_decode_kernel(kv) if decode else None
        if decode and tc is None:
            nq = self.decode_group
            L(op["attn_decode"], (self.decode_blocks(), rows, splits), (ATT_THREADS,),
              [ws.q, ws.k, ws.v, a.q_norm, a.k_norm, meta.pos, meta.slots, meta.bt, meta.btoff,
               kc, vc, ws.part_o, ws.part_ml, ws.att_cnt, ws.attn, s.n_head_kv, s.head_dim,
               s.head_dim_v, *rope, *att, a.sinks, *([s.n_head] if nq > 1 else [])])  # fmt: skip
        elif tc is None:
            qk = qk_rope_blocks(s.n_head, s.n_head_kv, ROPE_THREADS, self.warp)
            L(op["qk_rope_store"], (qk, rows), (ROPE_THREADS,),
              [ws.q, ws.k, ws.v, a.q_norm, a.k_norm, meta.pos, meta.slots, kc, vc, s.n_head,
               s.n_head_kv, s.head_dim, s.head_dim_v, *rope, kv.format_id])  # fmt: skip
        if tc is not None:  # (its fused form: Q/K norm and RoPE, the K/V store, attention)
            L(tc, (s.n_head_kv, rows, splits), (TCD_THREADS,),
              [ws.q, kc, vc, meta.bt, meta.btoff, meta.pos, ws.part_o, ws.part_ml, ws.att_cnt,
               ws.attn, s.n_head, s.n_head_kv, kv.block_size, s.attn_scale,
               ls.sliding_window or 0, a.sinks, ws.k, ws.v, a.q_norm, a.k_norm, meta.slots,
               *rope])  # fmt: skip
        elif not decode:
            short = rows <= self.products.tune.att_rows_max
            if short or inv or not self.prefill(i, a, rows, meta, kv):
                L(op["attn_rows"], (s.n_head, rows, splits), (ATT_THREADS,),
                  [ws.q, kc, vc, meta.bt, meta.btoff, meta.pos, ws.part_o, ws.part_ml,
                   ws.att_cnt, ws.attn, s.n_head_kv, s.head_dim, s.head_dim_v, *att,
                   a.sinks])  # fmt: skip
        self.products.matmul(a.wo, 1, rows)

    def prefill(self, i: int, a: AttentionLaunches, rows: int, meta, kv) -> bool:
        """Attention of `rows` prefill rows of layer i (after qk_rope_store; `meta`: the rows'
        PoolRows in the layer's block pool) into ws.attn by
        attn_prefill.hip: blocks of AP_ROWS (token, query head) pairs of one KV head that share each
        K/V tile, flash-attention style. With a float16 cache and rounded prefill products
        (the layer's Q/K/V weights not F32), tensor cores on NVIDIA (Q and the probabilities
        rounded to float16, as llama.cpp's f16 K/V products round them; a Q8_0 or Q4_0 cache's
        tiles converted to float16 as llama.cpp converts them); else float32 math (llama-f32
        with an f16 cache: golden max 1.08e-3 rounded vs its 1e-3 bound), also for bfloat16
        caches. Long key ranges are split over blocks as the GPU has room (`prefill_splits`),
        the last block of a tile merging the partials. False, launching nothing, when the head
        sizes do not fit it (D over 256; tensor-core rows not a multiple of 8 values)."""
        s, ws, pr = self.spec, self.ws, self.products
        d, dv = s.head_dim, s.head_dim_v
        dp = next((p for p in PREFILL_WIDTHS if d <= p), None)  # the kernel's padded D
        mats = pr.mats[a.qkv : a.qkv + 3]
        rounded = pr.round_prefill and all(p.type != "F32" for p, _ in mats)
        tensor_cores = rounded and kv.format in TENSOR_CORE_FORMATS
        mode = kv.format_id | (AP_TENSOR_CORES if tensor_cores else 0)  # the kernel's kv_mode
        if dp is None or (tensor_cores and (d % 8 or dv % 8)):
            return False
        kc, vc = kv.layer(i)
        blocks = prefill_blocks(rows, s.n_head, s.n_head_kv, dv, dp)
        splits = prefill_splits(rows, blocks[0] * blocks[1] * blocks[2],
                                self.lib.runtime.props.compute_units, pr.tune.ap_fill)  # fmt: skip
        kernel = f"attn_prefill_{'q' if kv.format.block > 1 else ''}{dp}"  # q: quantized caches
        pr.launch(self.lib.get(kernel), (*blocks[:2], blocks[2] * splits), (AP_THREADS,),
                  [ws.q, kc, vc, meta.bt, meta.btoff, meta.pos, ws.attn, rows, s.n_head,
                   s.n_head_kv, d, dv, kv.block_size, s.attn_scale,
                   s.layers[i].sliding_window or 0, mode, a.sinks, ws.part_o, ws.part_ml,
                   ws.att_cnt, splits])  # fmt: skip
        return True


def prefill_blocks(rows: int, n_head: int, n_head_kv: int, dv: int, dp: int) -> tuple[int, ...]:
    """attn_prefill's grid without splits: (tiles of AP_ROWS pairs, KV heads, Dv column blocks)."""
    return -(-rows * (n_head // n_head_kv) // AP_ROWS), n_head_kv, -(-dv // min(dp, 128))


def prefill_splits(rows: int, blocks: int, compute_units: int, fill: int) -> int:
    """Most parts attn_prefill cuts a long key range into: as many as keep the blocks within
    `fill` per compute unit (one wave), within the partials' (row, split) pairs (the kernel
    takes fewer for short ranges, one split writing its output directly)."""
    want = fill * compute_units // blocks
    return max(1, min(AP_MAX_SPLITS, PART_ROWS // rows, want))
