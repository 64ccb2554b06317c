"""Launch heuristics of the hip plan: how many blocks, lanes and rows each launch takes.

The rules are code; the numbers they rest on are data: `Tuning`'s knobs come from
forge_hip/tuned/default.json (each with what it was measured on), overridden by
forge_hip/tuned/<arch>.json when the sweep benchmark (benchmarks/mvq_sweep.py --tuning-out) has
written one for this device, then by a file named in $FORGE_HIP_TUNING. The measurement history
behind them is in benchmarks/gpu_notes.md. Sizes the kernels fix are not here: they come from
kernels/contract.h (`forge_hip.contract`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from forge.errors import ConfigError
from forge_hip.contract import constants
from forge_hip.library import ROUND_MODE

TUNED_DIR = Path(__file__).resolve().parent / "tuned"

_C = constants()
MVQ_THREADS = _C["MVQ_THREADS"]
MVQ_SPLIT_RM = _C["MVQ_SPLIT_RM"]
MMQ_WARPS = _C["MMQ_WARPS"]
ANQ_K = _C["ANQ_K"]
MVQ_NORM_K = _C["MVQ_NORM_K"]
AN_PER = _C["AN_PER"]
MVQ_SMEM = {rm: _C["MVQ_SMEM_R1" if rm == 1 else "MVQ_SMEM_RN"] for rm in (1, 2, 4, 8, 16, 32)}

MVQ_GEN = {"Q2_K", "Q3_K"}  # types only the mvq_*_gen kernels decode
MVQ_RM = (1, 2, 4, 8, 16, 32)  # mmv.hip's kernel rows (RM): a product takes the smallest that fits
MMQ_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}  # mmq.h's
MMQ_CHUNK = {"Q4_K": 64, "Q5_K": 64, "Q6_K": 128}  # elements per chunk a warp takes (else 32)
# Elements per "unit" as mvq_lanes counts them (the lane rules were measured with these counts).
MVQ_UNIT = {"F32": 1, "F16": 1, "BF16": 1, "Q4_0": 16, "Q4_1": 16, "Q5_0": 16, "Q5_1": 16,
            "Q8_0": 16, "Q2_K": 32, "Q3_K": 32, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16,
            "MXFP4": 16}  # fmt: skip


@dataclass(frozen=True)
class Tuning:
    """The knobs of the launch rules (default.json says what each is and what it rests on)."""

    mv_max_rows: int
    mvq_max_rows: int
    mvq_max_work: int
    mvq_blocks: int
    mvq_flags: int
    mvq_prefetch_bytes: int
    mvq_quant_tasks: int
    mvq_row_tasks: int
    mvq_split: bool
    mvq_long_n: int
    mvq_pair_lanes: int
    mvq_pair_fill: int
    anq_one_task_warps: int
    mmq_min_rows: int
    mmq_max_rows: int
    mmq_launch_rows: int
    mmq_reread_bytes: int
    mmq_prefetch: bool
    mmq_blocks_per_cu: int
    att_fill: int
    tc_decode: bool
    tc_decode_q8: bool
    att_rows_max: int
    ap_fill: int
    gemm_tile_fill: int
    sample_parts: int
    sample_slice: int
    pass_graph_rows: int
    decode_graph_rows: int


def _knobs(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        knobs = {k: v["value"] for k, v in data["knobs"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"tuning file {path}: {exc}") from None
    names = {f.name for f in fields(Tuning)}
    unknown = set(knobs) - names
    if unknown:
        raise ConfigError(f"tuning file {path}: unknown knobs {sorted(unknown)}")
    return knobs


@cache
def load_tuning(arch: str | None = None) -> Tuning:
    """The knobs for a device of `arch` ("sm_90", "gfx942"; None: the defaults)."""
    knobs = _knobs(TUNED_DIR / "default.json")
    device = TUNED_DIR / f"{arch}.json"
    if arch and device.exists():
        knobs.update(_knobs(device))
    if os.environ.get("FORGE_HIP_TUNING"):
        knobs.update(_knobs(Path(os.environ["FORGE_HIP_TUNING"])))
    return Tuning(**knobs)


DEFAULT = load_tuning()


def l2_prefetch_pays(mats: list, tune: Tuning = DEFAULT) -> bool:
    """Whether a product launch over `mats` (Placed) moves its blocks' first weights into L2
    before the grid wait: only at most mvq_prefetch_bytes (mmv.hip's flags bit 0, mmq.hip's
    pf); in a big product those first rows are much of the matrix, read twice."""
    return sum(p.nbytes for p in mats) <= tune.mvq_prefetch_bytes


def mvq_max_rows(types: list[str], work: int = 0, max_work: int | None = None,
                 tune: Tuning = DEFAULT) -> int:  # fmt: skip
    """Most rows the plan gives the mvq kernels for matrices of `types` sharing x, `work` their
    multiply-adds per row of x (the sum of N x K); more rows take the gemm path."""
    if MVQ_GEN & set(types) or any(ROUND_MODE[t] not in (1, 2) for t in types):
        return tune.mv_max_rows
    most = tune.mvq_max_work if max_work is None else max_work
    return max(tune.mv_max_rows, min(tune.mvq_max_rows, most // max(work, 1)))


def mvq_variant(types: list[str], rows: int) -> tuple[str, int]:
    """(kernel suffix, its rows per pass RM) of the mvq kernels for matrices of `types` and
    `rows` rows; rows over RM run in chunks of RM (mmv.hip)."""
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


def mvq_global_x(need: int, rows: int, k: int, rm: int, tune: Tuning = DEFAULT) -> bool:
    """Whether x is quantized once into global memory (mvq_quant, one launch more) instead of by
    every block into its shared memory: when it does not fit there, or (up to mv_max_rows rows)
    when it would take each block's warps more than mvq_quant_tasks pieces of 256 elements
    (one row: mvq_row_tasks). Both give the same bits (mmv_rows.h's mvq_quant8)."""
    tasks = rows * -(-k // 256)
    if rows > tune.mv_max_rows:
        return bool(need) and mvq_xbytes(need, rows, k) > MVQ_SMEM[rm]
    too_long = tasks > (tune.mvq_row_tasks if rows == 1 else tune.mvq_quant_tasks)
    return bool(need) and (mvq_xbytes(need, rows, k) > MVQ_SMEM[rm] or too_long)


def mvq_lanes(types: list[str], k: int, rows: int = 1, n: int = 0, pair: bool = False,
              cus: int = 0, tune: Tuning = DEFAULT) -> int:  # fmt: skip
    """Lanes per weight row of matrices with `n` rows: 32 for rows of 128 units or more, 16 down
    to 32 units, then at least 2 units per lane. Past mv_max_rows rows, 32 for any multiple of
    32 units. Matrices of mvq_long_n rows or more (output heads) fill the GPU by their rows: 16
    lanes from 128 units, 8 below 64 (every lane a whole step of units). `pair` (a gated
    product) with `cus` compute units: mvq_pair_lanes for long rows where that still leaves
    mvq_pair_fill blocks per compute unit."""
    units = min(k // MVQ_UNIT[t] for t in types)
    if units >= 128 and rows == 1 and n >= tune.mvq_long_n:
        return 16
    pair_rows = MVQ_THREADS // tune.mvq_pair_lanes  # rows per block at mvq_pair_lanes
    if pair and rows == 1 and units >= 64 and n >= tune.mvq_pair_fill * cus * pair_rows > 0:
        return tune.mvq_pair_lanes
    if units >= 128 or (rows > tune.mv_max_rows and units >= 32 and units % 32 == 0):
        return 32
    if units >= 32:
        long_head = rows == 1 and n >= tune.mvq_long_n and units < 64
        return 8 if long_head else 16
    g = 4
    while 2 * (2 * g) <= units:
        g *= 2
    return g


def anq_threads(k: int, tune: Tuning = DEFAULT) -> int:
    """add_norm_quant's block for rows of k: one 256-element task per warp while that takes at
    most anq_one_task_warps warps, else two."""
    tasks = -(-k // 256)
    return 32 * (tasks if tasks <= tune.anq_one_task_warps else -(-tasks // 2))


def add_norm_threads(n: int, warp: int) -> int:
    """add_norm's block for rows of n: the fewest warps that hold the row in registers (one warp
    up to 1024 elements on NVIDIA, where its sums need no barrier)."""
    return warp * -(-n // (warp * AN_PER))


def qk_rope_blocks(n_head: int, n_head_kv: int, threads: int, warp: int) -> int:
    """attention.hip's qk_rope_store grid width for blocks of `threads`: one block per
    threads / warp of a row's Q and K heads (one head per warp), then one per V head."""
    per = threads // warp
    return -(-(n_head + n_head_kv) // per) + n_head_kv


def mmq_shape(rows: int) -> tuple[int, int]:
    """(MT, halves) of an mmq launch over `rows` rows: the mmq_*_m<MT> kernel (MT m16 tiles of x
    rows per warp) and its blocks over x's rows (gridDim.y, 16 MT rows each): m1 up to 16 rows,
    m1 over two 16-row halves up to 32, m2 over two 32-row halves above."""
    if rows <= 32:
        return 1, -(-rows // 16)
    return 2, -(-rows // 32)


def mmq_items(ns: list[int], ks: int) -> int:
    """Row groups of an mmq launch over matrices of ns rows: 16 rows per warp, MMQ_WARPS / ks
    warps' worth per group."""
    rows = 16 * (MMQ_WARPS // ks)
    return sum(-(-n // rows) for n in ns)


def mmq_ks(k: int, types: list[str], ns: list[int], compute_units: int, halves: int = 1,
           tune: Tuning = DEFAULT) -> int:  # fmt: skip
    """Warps of an mmq block that split one row group's chunks (the rest take other row groups):
    the fewest that give mmq_blocks_per_cu blocks per compute unit over the launch's row halves,
    at most one per chunk of the shortest-chunked type. Fewer warps per row group read x less
    often; more fill the GPU when N is small."""
    chunks = min(k // MMQ_CHUNK.get(t, 32) for t in types)
    best = 1
    for ks in (1, 2, 4, 8):
        if ks > max(chunks, 1):
            break
        best = ks
        if mmq_items(ns, ks) * halves >= tune.mmq_blocks_per_cu * compute_units:
            break
    return best


def even_grid(items: int, most: int) -> int:
    """As few blocks (at most `most`) as give each the same share of `items` (blocks loop)."""
    return -(-items // -(-items // most))


def gemm_tile_rows(rows: int, ns: list[int], gb_n: int, cus: int, tune: Tuning = DEFAULT) -> int:
    """gemm.hip's token rows per tile: 128 (each weight decoded half as often) unless the tiles
    leave compute units idle (gemm_tile_fill), else 64."""
    blocks = -(-rows // 128) * sum(-(-n // gb_n) for n in ns)
    return 128 if tune.gemm_tile_fill * blocks >= cus else 64


def sample_parts(n_vocab: int, rows: int, compute_units: int, tune: Tuning = DEFAULT) -> int:
    """Blocks per row of sample_rows: enough to spread the max pass over the device, without
    slices under sample_slice logits or more blocks than two per compute unit over all rows."""
    most = min(tune.sample_parts, n_vocab // tune.sample_slice)
    return max(1, min(most, 2 * compute_units // max(1, rows)))
