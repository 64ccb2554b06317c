"""The launch plan of one forward pass: which kernels run, in which order, over which buffers.

Every matrix product goes through a descriptor (linear.hip) held in device memory, so Q/K/V and
gate/up run as one launch each even when their weight types differ. Per layer and step:
  qkv matmul, attention (decode: one launch doing Q/K norm + RoPE, the KV store and split
  attention with its merge; else qk-norm + RoPE + KV store, then attention), output projection,
  add + norm, gate/up matmul with the activation fused (decode), down projection, add + norm.
After the last layer: output projection, then (decode, or when ids are asked for) one token per
row picked on the device (sampling.hip: argmax or the top-k/top-p/min-p/temperature draw).
Kernels come from the kernel table: a third-party "matmul" kernel for a weight type replaces the
fused descriptor launches for the matrices of that type (see `forge_hip.library.HipKernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forge.kernels import KernelTable
from forge.models.spec import ModelSpec
from forge_hip.arena import Placed, WeightArena
from forge_hip.executor import Launcher
from forge_hip.library import (
    ATT_THREADS,
    BUILTIN_MATMUL,
    BUILTIN_OPS,
    ROUND_MODE,
    SAMPLE_THREADS,
    TYPE_IDS,
    KernelLibrary,
    attn_decode_width,
    sample_parts,
)
from forge_hip.workspace import PART_ROWS, Workspace

MV_MAX_ROWS = 8  # up to this many rows a matmul runs as matrix-vector products (see mvq_max_rows)
MV_WARPS = 4  # linear.hip's MV_WARPS
GEMM_N = 128  # gemm.hip's GB_N: weight rows per tensor-core tile
GEMM_THREADS = 256
ROPE_THREADS = 128
NORM_THREADS = 256
ADD_NORM_PER = 32  # layer.hip's AN_PER: elements of a row per thread of add_norm


def qk_rope_blocks(n_head: int, n_head_kv: int, threads: int, warp: int) -> int:
    """attention.hip's qk_rope_store grid width for blocks of `threads`: one block per
    threads / warp of a row's Q and K heads (one head per warp), then one per V head."""
    per = threads // warp
    return -(-(n_head + n_head_kv) // per) + n_head_kv


def add_norm_threads(n: int, warp: int) -> int:
    """add_norm's block for rows of n: the fewest warps that hold the row in registers (one warp
    up to 1024 elements on NVIDIA, where its sums need no barrier)."""
    return warp * -(-n // (warp * ADD_NORM_PER))


# Decode products (mmv.hip): int8 activations rounded like llama.cpp's, integer dot products.
MVQ_THREADS = 256  # block size of the mvq_* kernels
MVQ_SMEM = {1: 20480, 2: 40960, 4: 40960, 8: 40960, 16: 40960, 32: 40960}  # mmv.hip's MvqSmem
MVQ_GEN = {"Q2_K", "Q3_K"}  # types only the mvq_*_gen kernels decode
# Most rows of a decode product (mmv.hip) when every type has integer units (not MVQ_GEN, not
# float): weights are read once for all rows. Other types: MV_MAX_ROWS, then the gemm path.
MVQ_MAX_ROWS = 32
# ... and past MV_MAX_ROWS only while rows x (multiply-adds per row of x) stays under this: the
# int8 dot products cost about linearly in rows, gemm.hip's tiles hardly (H200, gemma3 twin, us
# mvq / gemm: head 262144x640 at 16 rows 532 / 253; gate_up 2x2048x640 at 16 rows 19 / 26, at 32
# rows 35 / 26; down 640x2048 at 32 rows 37 / 64; qkv 1536x640 at 32 rows 21 / 21). Those were
# the r16/r32 kernels; with x's rows split over r8 blocks (MVQ_SPLIT) the gemma3 twin's gate/up
# at 32 rows is cheaper on them too (whole decode step 2.85 -> 2.79 ms with 128M instead of 56M:
# its gemm, act_half and geglu launches 1.21 ms -> mvq_glu_r8 0.86 ms in event timings).
MVQ_MAX_WORK = 128 << 20
# mmv.hip's kernel rows (RM): a product takes the smallest that holds its rows.
MVQ_RM = (1, 2, 4, 8, 16, 32)
MVQ_NORM_K = 1024  # mmv.hip's MVQ_NORM_K: longest row the *_r1n kernels norm themselves
ANQ_K = 8192  # mmv.hip's ANQ_K: longest row add_norm_quant takes (512 threads)
# add_norm_quant gives each warp one 256-element task while that takes at most this many warps,
# else two. H200, tg128 alternated: gemma3 twin (K 640: 3 warps instead of 2) 1,760-1,764 ->
# 1,791-1,793 tok/s; llama-8B twin (K 4096: 16 warps instead of 8) 395.3-395.8 -> 394.2-394.4.
ANQ_ONE_TASK_WARPS = 8
MVQ_QUANT_TASKS = 32  # most 256-element pieces of x a block quantizes itself (4 per warp)
# mmv.hip's flags: L2 prefetch of each block's first rows only. Prefetching 1-3 row groups ahead
# (flags 3, 5, 7) was slower on 9 of the 10 products of the two twins (H200, mvq_sweep.py).
MVQ_FLAGS = 1
# ... and only for launches whose matrices hold at most this many bytes. In a big product the
# blocks' first rows are much of the matrix (llama-8B down: 448 blocks of 8 rows of 11.8 KB, all
# of its 48 MB), so the prefetch reads it twice and the second read misses L2 anyway. H200,
# llama-8B twin, every product over this limit: graph step 2,927 -> 2,836 us, tg128 349.5 ->
# 360.1 tok/s; gemma3 twin (all products under it but the head) unchanged, 1,687 tok/s.
MVQ_PREFETCH_BYTES = 8 << 20


def l2_prefetch_pays(mats: list) -> bool:
    """Whether a product launch over `mats` (Placed) moves its blocks' first weights into L2
    before the grid wait: only at most MVQ_PREFETCH_BYTES (mmv.hip's flags bit 0, mmq.hip's pf)."""
    return sum(p.nbytes for p in mats) <= MVQ_PREFETCH_BYTES


# Elements per "unit" as mvq_lanes counts them: mmv.h's units (one lane's share of a step),
# except Q4_K and Q6_K, counted at 32 and 16 elements though their units now hold 64 and 32: the
# lane rules were measured with those counts, and the H100 A/B of the wider units keeps them
# (mvq_sweep: gemma3 down, Q6_K, 6.48 us with 16 lanes vs 4.64 with 32; llama-8B q/k/v 15.8 vs
# 14.6; llama-8B wo 9.8 vs 10.2; gate/up equal).
MVQ_UNIT = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 16, "Q4_1": 16, "Q5_0": 16, "Q5_1": 16,
            "Q8_0": 16, "Q2_K": 32, "Q3_K": 32, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16}  # fmt: skip


def mvq_max_rows(types: list[str], work: int = 0, max_work: int = MVQ_MAX_WORK) -> int:
    """Most rows the plan gives the mvq kernels for matrices of `types` sharing x, `work` their
    multiply-adds per row of x (the sum of N x K); more rows take the gemm path."""
    if MVQ_GEN & set(types) or any(ROUND_MODE[t] not in (1, 2) for t in types):
        return MV_MAX_ROWS
    return max(MV_MAX_ROWS, min(MVQ_MAX_ROWS, max_work // max(work, 1)))


def mvq_variant(types: list[str], rows: int) -> tuple[str, int]:
    """(kernel suffix, its rows per pass RM) of the mvq kernels for matrices of `types` and
    `rows` <= mvq_max_rows(types) rows; rows over RM run in chunks of RM (mmv.hip)."""
    if MVQ_GEN & set(types):
        return "gen", 8
    rm = next((r for r in MVQ_RM if r >= rows), MVQ_RM[-1])
    return f"r{rm}", rm


def mvq_need(types: list[str]) -> int:
    """Quantized copies of x the types read: bit 0 blocks of 32 (Q8_0-like), bit 1 of 256."""
    return sum({1: 1, 2: 2}.get(m, 0) for m in {ROUND_MODE[t] for t in types})


def mvq_xbytes(need: int, rows: int, k: int) -> int:
    """Bytes of the quantized copies of x: int8 values plus an 8-byte {scale, sum} per 32."""
    return bin(need).count("1") * (rows * k + rows * k // 4)


def mvq_global_x(need: int, rows: int, k: int, rm: int) -> bool:
    """Whether x is quantized once into global memory (mvq_quant, one launch more) instead of by
    every block into its shared memory: when it does not fit there, or when it would take each
    block's warps more than a few rounds of 256 elements (long rows: every block waits for them)."""
    tasks = rows * -(-k // 256)
    if rows > MV_MAX_ROWS:  # H200 gemma3 twin, 16-32 rows: in-block 5-45% faster where it fits
        return bool(need) and mvq_xbytes(need, rows, k) > MVQ_SMEM[rm]
    return bool(need) and (mvq_xbytes(need, rows, k) > MVQ_SMEM[rm] or tasks > MVQ_QUANT_TASKS)


# mmv.hip's MVQ_SPLIT_RM: its kernels of this many rows can split x's rows over blocks (gridDim.y).
MVQ_SPLIT_RM = 8
# Whether decode products of more rows than that split them so (Plan.mvq_split). H200, gemma3
# twin, decode step at 16 / 32 rows: 2.16 -> 1.56 / 2.86 -> 2.39 ms (r16/r32 kernels with one
# block per row group -> r8 kernels with 2 / 4); the step's mvq_multi launches 2.04 -> 1.58 ms.
MVQ_SPLIT = True


# mmq.hip: products of MMQ_MIN_ROWS .. MMQ_MAX_ROWS rows on int8 tensor cores, for these
# types (the others stay on mmv.hip / gemm.hip). H200, gemma3 twin, 32-row step: the mvq r8 kernels'
# dp4a work grows with every row (products 2.3 of 3.8 ms in event timings, session 8). From 2
# rows on (session 9): 2 / 4 / 8-row steps 0.93 / 1.16 / 1.23 -> 0.91 / 0.92 / 0.96 ms; one row
# stays on mmv.hip (its quantized x in registers, no tile padding).
MMQ_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}
MMQ_MIN_ROWS = 2
# Up to MMQ_LAUNCH_ROWS rows per launch (mmq_shape), more: one launch per 64, each reading the
# weights again. 65..MMQ_MAX_ROWS rows only for products whose matrices (at most
# MMQ_REREAD_BYTES) the later launches find in L2: there gemm.hip's 64-row tiles leave a small
# model's SMs idle. H200, gemma3 twin, a server's mixed pass (31 decode rows and a 40 / 60 /
# 97-token prompt) 6.77 / 6.75 / 6.98 ms -> 2.63 / 2.78 / 3.54 ms with these products on mmq.hip
# (then 32 rows per launch) and attention on attn_rows (ATT_ROWS_MAX) up to 128 rows.
MMQ_MAX_ROWS = 128
MMQ_LAUNCH_ROWS = 64
MMQ_REREAD_BYTES = 8 << 20
MMQ_WARPS = 8  # mmq.hip's MMQ_WARPS: 32-lane warps per block (256 threads)
# mmq.hip's pf: each block moves its first item's weights into L2 before the grid wait. H200,
# gemma3 twin, one step in the replayed graph: 32 rows 1,234 -> 1,191 us, 8 rows 934 -> 881, 31
# decode rows and a 20-token prompt 1,443 -> 1,399. Moving the item after next into L2 as each
# starts cost the output head (154 -> 175 us at 32 rows), so later items are not prefetched. As
# for mmv.hip, only launches of at most MVQ_PREFETCH_BYTES prefetch (l2_prefetch_pays): the
# first items of a large matrix's blocks would fill L2 (the head was the same either way).
MMQ_PREFETCH = True
MMQ_BLOCKS_PER_CU = 2  # mmq blocks resident per compute unit (mmq.hip's __launch_bounds__)


def mmq_shape(rows: int) -> tuple[int, int]:
    """(MT, halves) of an mmq launch over `rows` rows: the mmq_*_m<MT> kernel (MT m16 tiles of x
    rows per warp) and its blocks over x's rows (gridDim.y, 16 MT rows each): m1 up to 16 rows,
    m1 over two 16-row halves up to 32, m2 over two 32-row halves up to MMQ_LAUNCH_ROWS. H100,
    gemma3 twin, replayed graphs (the same bits each way): a 32-row decode step 1,185-1,197 us
    with one m2 launch per product -> 1,105-1,107 with m1 halves (four m1 halves for 51 rows:
    1,563 -> 1,635, so m2 stays above 32); the halves replaced 64-row m4 kernels (one block per
    SM, their registers): 31 decode rows + a 20-token prompt 1,574-1,598 -> 1,351 us, a 51-row
    decode step 1,765 -> 1,566. Two m2 launches of 32 rows instead: 1,874-1,887."""
    if rows <= 32:
        return 1, -(-rows // 16)
    return 2, -(-rows // 32)


MMQ_CHUNK = {"Q4_K": 64, "Q5_K": 64, "Q6_K": 128}  # elements per chunk a warp takes (else 32)


def mmq_ks(k: int, types: list[str], ns: list[int], compute_units: int, halves: int = 1) -> int:
    """Warps of an mmq block that split one row group's chunks (the rest take other row groups):
    the fewest that give MMQ_BLOCKS_PER_CU blocks per compute unit over the launch's row halves,
    at most one per chunk of the shortest-chunked type. Fewer warps per row group read x less
    often; more fill the GPU when N is small."""
    chunks = min(k // MMQ_CHUNK.get(t, 32) for t in types)
    best = 1
    for ks in (1, 2, 4, 8):
        if ks > max(chunks, 1):
            break
        best = ks
        if mmq_items(ns, ks) * halves >= MMQ_BLOCKS_PER_CU * compute_units:
            break
    return best


def even_grid(items: int, most: int) -> int:
    """As few blocks (at most `most`) as give each the same share of `items` (blocks loop)."""
    return -(-items // -(-items // most))


def mmq_items(ns: list[int], ks: int) -> int:
    """Row groups of an mmq launch over matrices of ns rows: 16 rows per warp, MMQ_WARPS / ks
    warps' worth per group."""
    rows = 16 * (MMQ_WARPS // ks)
    return sum(-(-n // rows) for n in ns)


# Decode steps of several rows: attention splits over the KV length only while rows x heads x
# splits stay within this many blocks per compute unit (at least one split). Rows and heads fill
# the GPU by themselves, an attn_decode block takes a whole SM (its registers), and a split past
# the context's length still costs a block start. H200, gemma3 twin, 32 rows at 130 positions:
# up to 16 splits (2,048 blocks): attention 457 us per step in the replayed graph; 2 blocks per
# CU (2 splits) 378 us; 1 (one split, 128 blocks) 218 us.
ATT_FILL = 1
# Passes of prompt rows (or prompt and decode rows together) up to this many rows run attention
# with attn_rows (blocks per head and row, splits over the KV length) instead of
# attn_prefill.hip, whose blocks of 64 (token, head) pairs leave most SMs idle for a short
# prompt (H200, gemma3 twin, 31 decode rows and a 20-token prompt: 18 launches, 1.96 ms; with a
# 40-token prompt, the whole pass 3.51 ms with attn_rows against 6.77 with attn_prefill).
ATT_ROWS_MAX = 128

MVQ_LONG_N = 65536  # matrices of at least this many rows (output heads) fill the GPU at any lanes
# One-row gated products with 64 units or more per row (as mvq_lanes counts them) take this many
# lanes where that still gives MVQ_PAIR_FILL blocks per compute unit: each lane runs a long
# stretch of both rows before the lanes' sums meet. llama-8B gate/up (Q4_K, 2 x 14336 x 4096, 32
# lanes by the general rule), tg128 of the replayed step on an H100: 321.3-321.8 -> 326.0-326.7
# tok/s (16 lanes 324.8-325.9, 4 lanes 320.1-320.3); the product alone (H200) 27.7 -> 24.4 us.
# Fewer lanes lost for the non-gated products (16 for q/k/v, wo or down: -0.3% to -6%).
MVQ_PAIR_LANES = 8
MVQ_PAIR_FILL = 3


def anq_threads(k: int) -> int:
    """add_norm_quant's block for rows of k (ANQ_ONE_TASK_WARPS)."""
    tasks = -(-k // 256)
    return 32 * (tasks if tasks <= ANQ_ONE_TASK_WARPS else -(-tasks // 2))


def mvq_lanes(
    types: list[str], k: int, rows: int = 1, n: int = 0, pair: bool = False, cus: int = 0
) -> int:
    """Lanes per weight row of matrices with `n` rows: 32 for rows of 128 units or more, 16 down
    to 32 units, then at least 2 units per lane. Past MV_MAX_ROWS rows, 32 for any multiple of
    32 units (twice the row groups: gemma3 wo, 32 Q4_K units, 16 / 32 rows 13.8 -> 9.4 / 24.1 ->
    14.4 us). Matrices of MVQ_LONG_N rows or more with 32-127 units keep every lane at one whole
    step of units or more (MVQ_STEP, 4), since their rows alone fill the GPU: the gemma3 head, 40
    Q8_0 units, 84.8 us with 16 lanes (2-3 units, all in the unit-by-unit tail) vs 60.0 with 8
    (H200, split Q8_0 rows). Such heads with 128 units or more take 16 lanes: the llama-8B head,
    Q6_K, 4096 x 128256, 161-164 -> 151-152 us in the decode step (H200, 32 lanes before; 8
    lanes: tg128 +0.2% on an H200, -0.2% on an H100). `pair` (a gated product, gate and up rows
    per lane) with `cus` compute units: see MVQ_PAIR_LANES."""
    units = min(k // MVQ_UNIT[t] for t in types)
    if units >= 128 and rows == 1 and n >= MVQ_LONG_N:
        return 16
    pair_rows = MVQ_THREADS // MVQ_PAIR_LANES  # rows per block at MVQ_PAIR_LANES
    if pair and rows == 1 and units >= 64 and n >= MVQ_PAIR_FILL * cus * pair_rows > 0:
        return MVQ_PAIR_LANES
    if units >= 128 or (rows > MV_MAX_ROWS and units >= 32 and units % 32 == 0):
        return 32
    if units >= 32:
        long_head = rows == 1 and n >= MVQ_LONG_N and units < 64
        return 8 if long_head else 16
    g = 4
    while 2 * (2 * g) <= units:
        g *= 2
    return g


@dataclass
class Fused:
    """The add_norm making a decode product's x, left to that product's launch: suffix "n"
    (one row), computed by the product's mmv.hip kernel (args: MvqNorm's xin, o, w_post,
    w_next, xout, eps); "q", launched just before it as add_norm_quant, which also quantizes x
    into ws.xq for it (args: x, o, w_post, w_next, eps)."""

    suffix: str
    args: list


class Plan:
    """Resolves the kernels of a model and enqueues the launches of a forward pass."""

    def __init__(
        self,
        spec: ModelSpec,
        kernels: KernelTable,
        lib: KernelLibrary,
        arena: WeightArena,
        ws: Workspace,
        launch: Launcher,
        warp: int,
    ):
        self.spec, self.lib, self.arena, self.ws, self.launch = spec, lib, arena, ws, launch
        self.warp = warp
        self.round_prefill = True  # prefill products round activations like llama.cpp's
        self.gemm_rows: int | None = None  # token rows per gemm.hip tile (64/128); None: by size
        self.mvq_lanes: int | None = None  # lanes per row of decode products; None: mvq_lanes()
        self.mvq_blocks = 4  # decode products: at most this many blocks per compute unit
        self.mvq_flags = MVQ_FLAGS  # mmv.hip's L2 prefetch flags
        # decode products of more than MVQ_SPLIT_RM rows: blocks of MVQ_SPLIT_RM rows of x each
        self.mvq_split = MVQ_SPLIT
        self.mvq_max_work = MVQ_MAX_WORK  # mvq_max_rows()
        # one-row products: the add_norm making x also quantizes it for them (add_norm_quant,
        # norm_quantizable); without that, the products compute it themselves (mvq_*_r1n,
        # norm_fusable) where they can
        self.quant_norm = True
        self.quant_norm_rows = MMQ_LAUNCH_ROWS  # ... in steps of at most this many rows
        self.fuse_norm = True
        self.mmq = True  # products of MMQ_MIN_ROWS .. MMQ_MAX_ROWS rows on mmq.hip
        self.mmq_prefetch = MMQ_PREFETCH  # mmq.hip's pf (launches up to MVQ_PREFETCH_BYTES)
        self.att_fill = ATT_FILL  # many-row decode attention: splits within this many blocks per CU
        self.att_rows_max = ATT_ROWS_MAX  # prefill passes up to this many rows: attn_rows
        self._head_norm: Fused | None = None  # the last add_norm, left to output()
        w = arena.placed
        embd = w["token_embd.weight"]
        self.k_embed = lib.resolve(kernels.require("hip", "embed", embd.type).impl)
        self.op = {op: lib.resolve(kernels.require("hip", op).impl) for op in BUILTIN_OPS}
        if kernels.require("hip", "attn_decode").impl == BUILTIN_OPS["attn_decode"]:
            # the built-in one for these heads only: that layout's registers, not the widest's
            width = attn_decode_width(spec.head_dim, spec.head_dim_v)
            self.op["attn_decode"] = lib.get(f"attn_decode_w{width}")
        self.mv_multi, self.mv_glu = lib.get("mv_multi"), lib.get("mv_glu")
        self.mm_tiled = lib.get("mm_tiled")
        self.feed_ids = lib.get("feed_ids")
        self.descs: list[list[int]] = []
        self.mats: list[tuple[Placed, object]] = []  # per descriptor: weight, its matmul impl
        self.layers = []
        for i in range(spec.n_layer):
            p = f"blk.{i}."
            bias = {x: w[f"{p}attn_{x}.bias"].ptr if spec.attention.qkv_bias else 0 for x in "qkv"}
            layer = {
                "qkv": self._add([(p + "attn_q.weight", ws.h, ws.q, bias["q"]),
                                  (p + "attn_k.weight", ws.h, ws.k, bias["k"]),
                                  (p + "attn_v.weight", ws.h, ws.v, bias["v"])], kernels),
                "wo": self._add([(p + "attn_output.weight", ws.attn, ws.o, 0)], kernels),
                "gate_up": self._add([(p + "ffn_gate.weight", ws.h, ws.g, 0),
                                      (p + "ffn_up.weight", ws.h, ws.u, 0)], kernels),
                "down": self._add([(p + "ffn_down.weight", ws.g, ws.o, 0)], kernels),
                "attn_norm": w[p + "attn_norm.weight"].ptr,
                "ffn_norm": w[p + "ffn_norm.weight"].ptr,
            }  # fmt: skip
            for key, stem in (
                ("q_norm", "attn_q_norm"),
                ("k_norm", "attn_k_norm"),
                ("post_attn", "post_attention_norm"),
                ("post_ffn", "post_ffw_norm"),
            ):
                layer[key] = w[p + stem + ".weight"].ptr if p + stem + ".weight" in w else 0
            self.layers.append(layer)  # fmt: skip
        out = "token_embd.weight" if spec.tied_output else "output.weight"
        self.out_h = self._add([(out, ws.h, ws.logits, 0)], kernels)
        self.out_g = self._add([(out, ws.hg, ws.logits, 0)], kernels)
        self.embd = embd
        self.output_norm = w["output_norm.weight"].ptr
        table = np.asarray(self.descs, dtype=np.int64)
        lib.runtime.copy_to_device(ws.descs, table)
        # Prefill products read activations rounded like llama.cpp's (golden-close logits).
        for row, (p, _) in zip(table, self.mats):
            mode = ROUND_MODE[p.type]
            row[1] = ws.ptr[f"r{mode}"] if mode else row[1]
        lib.runtime.copy_to_device(ws.descs_p, table)

    def _add(self, mats: list[tuple[str, int, int, int]], kernels: KernelTable) -> int:
        first = len(self.descs)
        for name, x, y, bias in mats:
            p = self.arena.placed[name]
            impl = kernels.require("hip", "matmul", p.type).impl
            self.descs.append([p.ptr, x, y, bias, TYPE_IDS[p.type], p.k, p.n, p.row_bytes])
            self.mats.append((p, impl))
        return first

    # -- matrix products --------------------------------------------------------------------------
    def matmul(self, first: int, count: int, rows: int, norm: Fused | None = None) -> None:
        """Products of descriptors first .. first + count - 1 over `rows` rows of their x; with
        `norm` (norm_fusable or norm_quantizable), the add_norm making x runs with the
        product's launch as it describes."""
        mats = self.mats[first : first + count]
        if all(impl == BUILTIN_MATMUL for _, impl in mats):
            if self._mmq_fits(first, count, rows):
                self._mmq(first, count, rows, norm=norm)
            elif rows <= self._mv_rows(first, count):
                self._matvec(first, count, rows, norm=norm)
            else:
                self._gemm(first, count, rows)
            return
        for j, (p, impl) in enumerate(mats):  # a replaced kernel: one launch per matrix
            _, x, y, bias = self.descs[first + j][:4]
            kernel = self.lib.resolve(impl)
            self.launch(kernel, (-(-p.n // MV_WARPS), rows), (MV_WARPS * self.warp,),
                        [p.ptr, x, y, p.k, p.n])  # fmt: skip
            if bias:
                self.launch(self.op["add_bias"], (rows,), (NORM_THREADS,), [y, bias, p.n])

    def _mv_rows(self, first: int, count: int) -> int:
        """Most rows descriptors first .. first + count - 1 run as decode products (_matvec)."""
        if not self.round_prefill:
            return MV_MAX_ROWS
        mats = [p for p, _ in self.mats[first : first + count]]
        return mvq_max_rows([p.type for p in mats], sum(p.n * p.k for p in mats), self.mvq_max_work)

    def _mmq_fits(self, first: int, count: int, rows: int) -> bool:
        """Whether descriptors first .. first + count - 1 over `rows` rows run on mmq.hip."""
        mats = self.mats[first : first + count]
        ours = all(impl == BUILTIN_MATMUL and p.type in MMQ_TYPES for p, impl in mats)
        if not (self.mmq and self.round_prefill and MMQ_MIN_ROWS <= rows <= MMQ_MAX_ROWS and ours):
            return False
        return rows <= MMQ_LAUNCH_ROWS or sum(p.nbytes for p, _ in mats) <= MMQ_REREAD_BYTES

    def _mmq(
        self, first: int, count: int, rows: int, act: int | None = None, norm: Fused | None = None
    ) -> None:
        """Products of 2..MMQ_MAX_ROWS rows on int8 tensor cores (mmq.hip): per MMQ_LAUNCH_ROWS
        rows, x quantized once by mvq_quant (or, with `norm` "q", by the add_norm making it:
        one launch), as the decode products round it, then one launch over the matrices (or
        the gated pair) writing those rows of y."""
        mats = [p for p, _ in self.mats[first : first + count]]
        types = [p.type for p in mats]
        k, need = mats[0].k, mvq_need(types)
        ns = [p.n for p in (mats[:1] if act is not None else mats)]
        cus, descs = self.lib.runtime.props.compute_units, self.ws.descs
        pf = int(self.mmq_prefetch and l2_prefetch_pays(mats))
        for r0 in range(0, rows, MMQ_LAUNCH_ROWS):
            n = min(MMQ_LAUNCH_ROWS, rows - r0)
            if norm is not None and norm.suffix == "q":  # (norm_quantizable: one launch)
                xg = self._add_norm_quant(norm, rows, k, need)
            else:
                xg = self._quantize_x(self.descs[first][1] + 4 * r0 * k, k, n, need)
            mt, halves = mmq_shape(n)
            ks = mmq_ks(k, types, ns, cus, halves)
            items = mmq_items(ns, ks)
            grid = (even_grid(items, MMQ_BLOCKS_PER_CU * cus // halves), halves)
            tail = [k, need, items, ks]
            if act is None:
                self.launch(self.lib.get(f"mmq_multi_m{mt}"), grid, (MVQ_THREADS,),
                            [descs, first, count, n, r0, xg, *tail, pf])  # fmt: skip
            else:
                self.launch(self.lib.get(f"mmq_glu_m{mt}"), grid, (MVQ_THREADS,),
                            [descs, first, n, r0, xg, *tail, act, pf])  # fmt: skip

    def _add_norm_quant(self, norm: Fused, rows: int, k: int, need: int) -> int:
        """The add_norm of `norm` ("q") over `rows` rows, x quantized into ws.xq (add_norm_quant,
        mvq_quant's layout); ws.xq."""
        x, o, w_post, w_next, eps = norm.args
        self.launch(self.lib.get("add_norm_quant"), (rows,), (anq_threads(k),),
                    [x, o, w_post, w_next, 0, self.ws.xq, k, need, eps])  # fmt: skip
        return self.ws.xq

    def _quantize_x(self, x: int, k: int, rows: int, need: int) -> int:
        """x [rows, k] rounded to int8 once into ws.xq (mvq_quant, mmv.hip's layout); ws.xq."""
        tasks = rows * -(-k // 256)
        self.launch(self.lib.get("mvq_quant"), (-(-tasks // 8),), (MVQ_THREADS,),
                    [x, self.ws.xq, k, rows, need])  # fmt: skip
        return self.ws.xq

    def norm_fusable(self, first: int, count: int, rows: int) -> bool:
        """Whether the product of descriptors first .. first + count - 1 over `rows` rows can take
        over the add_norm that makes its x (mmv.hip's *_r1n kernels, computing the bits add_norm's
        one-warp launch would): one row, built-in integer kernels quantizing x in their blocks,
        rows of at most MVQ_NORM_K."""
        if not (self.fuse_norm and rows == 1 and self.round_prefill):
            return False  # (every prefill pass asks, per layer)
        mats = self.mats[first : first + count]
        types = [p.type for p, _ in mats]
        k = mats[0][0].k
        one_warp = add_norm_threads(k, self.warp) == self.warp  # the same bits as add_norm
        return (k <= MVQ_NORM_K and one_warp
                and all(impl == BUILTIN_MATMUL for _, impl in mats)
                and all(ROUND_MODE[t] in (1, 2) for t in types) and not MVQ_GEN & set(types)
                and not mvq_global_x(mvq_need(types), 1, k, 1))  # fmt: skip

    def norm_quantizable(self, first: int, count: int, rows: int) -> bool:
        """Whether the add_norm making the x of descriptors first .. first + count - 1 over
        `rows` rows runs as add_norm_quant, quantizing x for their launch (xg) where each of its
        blocks, or a mvq_quant launch, would quantize it: decode products of mmv.hip (int8
        types, not the gen kernels) or one launch of mmq.hip, rows of at most ANQ_K and steps
        of at most quant_norm_rows rows; the head only for one row (output() may gather a
        pass's rows). Its sums of squares run in another order than add_norm's, so h can
        differ in the last bits. H200, tg128 alternated in one process: llama-8B twin
        (separate add_norm before) 378.3-378.7 -> 397.8-398.2 tok/s, its q/k/v, gate/up and
        head blocks having spent ~2.4 us each quantizing x before reading a weight; gemma3
        twin (mvq_*_r1n before) 1,690-1,692 -> 1,761-1,764. H100, gemma3 twin, replayed steps
        of 2 / 8 / 16 / 32 rows (add_norm and mvq_quant before mmq.hip): 876 / 938 / 1,014 /
        1,130 -> 816 / 882 / 935 / 1,056 us; the hip server at 32 streams 15.60x / 15.83x ->
        16.32x / 16.34x."""
        if not (self.quant_norm and self.round_prefill and rows <= self.quant_norm_rows):
            return False
        if rows > 1 and first in (self.out_h, self.out_g):
            return False
        mats = self.mats[first : first + count]
        types = [p.type for p, _ in mats]
        if not (all(impl == BUILTIN_MATMUL for _, impl in mats) and mats[0][0].k <= ANQ_K):
            return False
        if self._mmq_fits(first, count, rows):
            return rows <= MMQ_LAUNCH_ROWS
        ints = all(ROUND_MODE[t] in (1, 2) for t in types) and not MVQ_GEN & set(types)
        return ints and rows <= self._mv_rows(first, count)

    def _matvec(
        self, first: int, count: int, rows: int, act: int | None = None, norm: Fused | None = None
    ) -> None:
        """Decode products (few rows) of descriptors first .. first + count - 1, which share x:
        mmv.hip with int8 activations rounded as prefill rounds them; without rounding
        (round_prefill off) linear.hip's float kernels. `act`: the gated product (gate, up) with
        that activation. `norm`: the add_norm making x, run with this launch (Fused)."""
        mats = [p for p, _ in self.mats[first : first + count]]
        ws = self.ws
        if not self.round_prefill:
            grid = (-(-max(p.n for p in mats) // MV_WARPS), rows, 1 if act is not None else count)
            args = [ws.descs, first] + ([act] if act is not None else [])
            kernel = self.mv_glu if act is not None else self.mv_multi
            self.launch(kernel, grid, (MV_WARPS * self.warp,), args)
            return
        types = [p.type for p in mats]
        k, x = mats[0].k, self.descs[first][1]
        suffix, rm = mvq_variant(types, rows)
        c = 1  # blocks per row group, each taking rm rows of x (mmv.hip's gridDim.y)
        if self.mvq_split and rows > MVQ_SPLIT_RM:
            suffix, rm = mvq_variant(types, MVQ_SPLIT_RM)
            c = -(-rows // rm)
        block_rows = min(rows, rm) if c > 1 else rows
        need = mvq_need(types)
        cus = self.lib.runtime.props.compute_units
        n = max(p.n for p in mats)
        g = self.mvq_lanes or mvq_lanes(types, k, block_rows, n, act is not None, cus)
        rb = MVQ_THREADS // g
        items = sum(-(-p.n // rb) for p in (mats[:1] if act is not None else mats))
        most = max(1, self.mvq_blocks * cus // c)
        grid = even_grid(items, most)
        if norm is not None and norm.suffix == "q":  # x quantized by add_norm
            xg, norm = self._add_norm_quant(norm, rows, k, need), None
        elif mvq_global_x(need, block_rows, k, rm):
            xg = self._quantize_x(x, k, rows, need)
        else:
            xg = 0
        flags = self.mvq_flags if l2_prefetch_pays(mats) else self.mvq_flags & ~1
        tail = [x, k, need, items, xg, flags]
        fused, extra = (norm.suffix, norm.args) if norm is not None else ("", [])
        if act is None:
            self.launch(self.lib.get(f"mvq_multi_{suffix}{fused}"), (grid, c), (MVQ_THREADS,),
                        [ws.descs, first, count, rows, g, *tail, *extra])  # fmt: skip
        else:
            self.launch(self.lib.get(f"mvq_glu_{suffix}{fused}"), (grid, c), (MVQ_THREADS,),
                        [ws.descs, first, rows, g, *tail, act, *extra])  # fmt: skip

    def _gemm(self, first: int, count: int, rows: int) -> None:
        """Prefill products (many rows) of descriptors first .. first + count - 1: on tensor cores
        (gemm.hip, 16-bit operands) when activations are rounded and no matrix is F32, else
        float32 SIMT tiles (mm_tiled)."""
        mats = self.mats[first : first + count]
        max_n = max(p.n for p, _ in mats)
        x, k = self.descs[first][1], mats[0][0].k
        if self.round_prefill and k % 32 == 0 and all(p.type != "F32" for p, _ in mats):
            for mode in sorted({ROUND_MODE[p.type] for p, _ in mats}):
                self.launch(self.lib.get("act_half"), (rows,), (NORM_THREADS,),
                            [x, self.ws.ptr[f"r{mode}"], k, mode])  # fmt: skip
            bm = self.gemm_rows or self._gemm_tile_rows(rows, [p.n for p, _ in mats])
            grid = (-(-rows // bm), -(-max_n // GEMM_N), count)
            self.launch(self.lib.get(f"gemm_m{bm}"), grid, (GEMM_THREADS,),
                        [self.ws.descs_p, first, rows])  # fmt: skip
            return
        modes = {ROUND_MODE[p.type] for p, _ in mats} if self.round_prefill else set()
        for mode in sorted(modes - {0}):
            self.launch(self.op["act_round"], (rows,), (NORM_THREADS,),
                        [x, self.ws.ptr[f"r{mode}"], k, mode])  # fmt: skip
        grid = (-(-max_n // 64), -(-rows // 64), count)
        descs = self.ws.descs_p if self.round_prefill else self.ws.descs
        self.launch(self.mm_tiled, grid, (256,), [descs, first, rows])

    def _gemm_tile_rows(self, rows: int, ns: list[int]) -> int:
        """128-row tiles (each weight decoded half as often) unless they leave over half of the
        compute units idle. H200, pp512: 8B twin qkv/wo/down 112/130/108 TFLOP/s with 128 rows
        (128-192 blocks) vs 103/131/92 with 64; gemma3-270m twin wo/down (20 blocks) 18/15 vs
        24/20."""
        blocks = -(-rows // 128) * sum(-(-n // GEMM_N) for n in ns)
        return 128 if 2 * blocks >= self.lib.runtime.props.compute_units else 64

    def glu(self, first: int, rows: int, norm: Fused | None = None) -> None:
        """g = act(h Wg^T) * (h Wu^T); `norm` as for matmul."""
        s, ws = self.spec, self.ws
        act = 1 if s.ffn.activation == "gelu_tanh" else 0
        fused = all(impl == BUILTIN_MATMUL for _, impl in self.mats[first : first + 2])
        if fused and self._mmq_fits(first, 2, rows):
            self._mmq(first, 2, rows, act, norm)
            return
        if fused and rows <= self._mv_rows(first, 2):
            self._matvec(first, 2, rows, act, norm)
            return
        self.matmul(first, 2, rows)
        n = rows * s.ffn.n_ff
        kernel = self.op["geglu" if act else "swiglu"]
        self.launch(kernel, (min(4096, -(-n // 256)),), (256,), [ws.g, ws.u, ws.g, n])

    def _prefill_attention(self, rows: int, meta, kv, i: int) -> bool:
        """Attention of `rows` prefill rows of layer i (after qk_rope_store) into ws.attn by
        attn_prefill.hip: blocks of 64 (token, query head) pairs of one KV head that share each
        K/V tile, flash-attention style. With a float16 cache and rounded prefill products
        (the layer's Q/K/V weights not F32), tensor cores on NVIDIA (Q and the probabilities
        rounded to float16, as llama.cpp's f16 K/V products round them); else float32 math
        (llama-f32 with an f16 cache: golden max 1.08e-3 rounded vs its 1e-3 bound). False,
        launching nothing, when the head sizes do not fit it (D over 256; tensor-core rows not a
        multiple of 8 values)."""
        s, ws = self.spec, self.ws
        d, dv = s.head_dim, s.head_dim_v
        dp = next((p for p in (64, 128, 256) if d <= p), None)  # the kernel's padded D
        qkv = self.layers[i]["qkv"]
        rounded = self.round_prefill and all(p.type != "F32" for p, _ in self.mats[qkv : qkv + 3])
        mode = (1 if rounded else 2) if kv.f16 else 0
        if dp is None or (mode == 1 and (d % 8 or dv % 8)):
            return False
        dvc = min(dp, 128)  # AP_DVC: output columns per block
        kc, vc = kv.layer(i)
        grid = (-(-rows * (s.n_head // s.n_head_kv) // 64), s.n_head_kv, -(-dv // dvc))
        self.launch(self.lib.get(f"attn_prefill_{dp}"), grid, (128,),
                    [ws.q, kc, vc, meta.bt, meta.btoff, meta.pos, ws.attn, rows, s.n_head,
                     s.n_head_kv, d, dv, kv.block_size, s.attn_scale,
                     s.layers[i].sliding_window or 0, mode])  # fmt: skip
        return True

    # -- the pass ---------------------------------------------------------------------------------
    def layers_pass(self, rows: int, splits: int, meta, kv, decode: bool = False) -> None:
        """Embedding, every layer, and the final norm (into ws.h) for `rows` token rows.

        `decode`: every row is the one new token of its own sequence (attention then runs as one
        fused launch per layer). `splits`: most splits of an attention over the KV length (the
        kernels use fewer for short contexts, one split needing no merge)."""
        s, ws, op, L = self.spec, self.ws, self.op, self.launch
        e = s.n_embd
        splits = max(1, min(splits, PART_ROWS // rows))
        if decode and rows > 1 and self.att_fill:
            cus = self.lib.runtime.props.compute_units
            splits = min(splits, max(1, self.att_fill * cus // (rows * s.n_head)))
        res = [ws.x, ws.x2]  # the residual stream; a fused add_norm writes the other buffer

        def add_norm(o, w_post, w_next, first, count):
            """x += post(o) (when o); h = norm(x) * w_next: launched, or left to the launch of
            the product of descriptors first .. first + count - 1 (norm_fusable,
            norm_quantizable), which it returns (Fused)."""
            if self.norm_quantizable(first, count, rows):
                return Fused("q", [res[0], o, w_post, w_next, s.rms_eps])
            if o and self.norm_fusable(first, count, rows):
                args = [res[0], o, w_post, w_next, res[1], s.rms_eps]
                res.reverse()
                return Fused("n", args)
            self._add_norm(rows, res[0], o, w_post, w_next)
            return None

        L(self.feed_ids, (1,), (NORM_THREADS,), [meta.ids, meta.feed, ws.am, rows])
        L(self.k_embed, (rows,), (NORM_THREADS,), [self.embd.ptr, meta.ids, ws.x, e, s.embed_scale])
        norm = add_norm(0, 0, self.layers[0]["attn_norm"], self.layers[0]["qkv"], 3)
        for i, (layer, ls) in enumerate(zip(self.layers, s.layers)):
            kc, vc = kv.layer(i)
            self.matmul(layer["qkv"], 3, rows, norm)
            rope = [s.rope_dim, int(s.rope_neox), ls.rope_base, 1.0 / ls.rope_scale, s.rms_eps]
            att = [kv.block_size, s.attn_scale, ls.sliding_window or 0, int(kv.f16)]
            if decode:
                L(op["attn_decode"], (s.n_head, rows, splits), (ATT_THREADS,),
                  [ws.q, ws.k, ws.v, layer["q_norm"], layer["k_norm"], meta.pos, meta.slots,
                   meta.bt, meta.btoff, kc, vc, ws.part_o, ws.part_ml, ws.att_cnt, ws.attn,
                   s.n_head_kv, s.head_dim, s.head_dim_v, *rope, *att])  # fmt: skip
            else:
                qk = qk_rope_blocks(s.n_head, s.n_head_kv, ROPE_THREADS, self.warp)
                L(op["qk_rope_store"], (qk, rows), (ROPE_THREADS,),
                  [ws.q, ws.k, ws.v, layer["q_norm"], layer["k_norm"], meta.pos, meta.slots, kc,
                   vc, s.n_head, s.n_head_kv, s.head_dim, s.head_dim_v, *rope,
                   int(kv.f16)])  # fmt: skip
                if rows <= self.att_rows_max or not self._prefill_attention(rows, meta, kv, i):
                    L(op["attn_rows"], (s.n_head, rows, splits), (ATT_THREADS,),
                      [ws.q, kc, vc, meta.bt, meta.btoff, meta.pos, ws.part_o, ws.part_ml,
                       ws.att_cnt, ws.attn, s.n_head_kv, s.head_dim, s.head_dim_v,
                       *att])  # fmt: skip
            self.matmul(layer["wo"], 1, rows)
            norm = add_norm(ws.o, layer["post_attn"], layer["ffn_norm"], layer["gate_up"], 2)
            self.glu(layer["gate_up"], rows, norm)
            self.matmul(layer["down"], 1, rows)
            if i + 1 < s.n_layer:
                nxt = self.layers[i + 1]
                norm = add_norm(ws.o, layer["post_ffn"], nxt["attn_norm"], nxt["qkv"], 3)
            else:  # the head's: output() decides whether it computes it (gathered rows or not)
                self._head_norm = add_norm(ws.o, layer["post_ffn"], self.output_norm, self.out_h, 1)

    def _add_norm(self, rows: int, x: int, o: int, w_post: int, w_next: int) -> None:
        """layer.hip's add_norm over `rows` rows: x += post(o) (when o), ws.h = norm(x) * w_next."""
        e = self.spec.n_embd
        self.launch(self.op["add_norm"], (rows,), (add_norm_threads(e, self.warp),),
                    [x, o, w_post, w_next, self.ws.h, e, self.spec.rms_eps])  # fmt: skip

    def output(self, rows: int, gather_idx: int | None, picks: tuple[int, int] | None) -> None:
        """Logits of `rows` rows of ws.h (gathered through `gather_idx` when given) into
        ws.logits; with `picks` = (sampling parameters, their field stride), one token per row
        into ws.am (parameter row i, or gather_idx[i] when gathering: see sampling.hip)."""
        ws, norm, self._head_norm = self.ws, self._head_norm, None
        if norm is not None and gather_idx is not None:  # the last add_norm, unfused after all
            self._add_norm(1, *norm.args[:4])  # (left only by one-row passes)
            norm = None
        if gather_idx is not None:
            L = self.launch
            L(self.op["gather_rows"], (rows,), (NORM_THREADS,),
              [ws.h, gather_idx, ws.hg, self.spec.n_embd])  # fmt: skip
        self.matmul(self.out_g if gather_idx is not None else self.out_h, 1, rows, norm)
        if picks is not None:
            params, stride = picks
            parts = sample_parts(self.spec.n_vocab, rows, self.lib.runtime.props.compute_units)
            self.launch(self.op["sample_rows"], (rows, parts), (SAMPLE_THREADS,),
                        [ws.logits, self.spec.n_vocab, params, stride, gather_idx or 0, ws.am,
                         ws.smp_part, ws.smp_cnt])  # fmt: skip
