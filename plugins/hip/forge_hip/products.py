"""Matrix products of the hip plan: descriptors, the choice among the product paths, and which
add_norm a product's launch takes over.

Every matrix is a descriptor (contract.h's DESC_* fields) in a device table, so Q/K/V and
gate/up run as one launch each even when their weight types differ. A product over `rows` token
rows takes one of these paths:
- mmq.hip (int8 tensor cores): mmq_min_rows .. mmq_max_rows rows of the MMQ_TYPES;
- mmv.hip (int8 dot products, activations rounded like llama.cpp's): decode rows, up to
  mvq_max_rows(...) rows;
- gemm.hip (16-bit tensor cores), or linear.hip's float32 tiles (F32 weights, unrounded passes);
- a kernel a plugin registered for the weight type (one launch per matrix, matvec contract).
The add_norm making a decode product's x can run inside or just before its launch (`Fused`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from forge.kernels import KernelTable
from forge_hip.arena import Placed, WeightArena
from forge_hip.contract import constants
from forge_hip.executor import Launcher
from forge_hip.library import BUILTIN_MATMUL, ROUND_MODE, TYPE_IDS, KernelLibrary
from forge_hip.runtime.base import Kernel
from forge_hip.tuning import (
    ANQ_K,
    MMQ_TYPES,
    MVQ_GEN,
    MVQ_NORM_K,
    MVQ_SPLIT_RM,
    MVQ_THREADS,
    Tuning,
    add_norm_threads,
    anq_threads,
    even_grid,
    gemm_tile_rows,
    l2_prefetch_pays,
    mmq_items,
    mmq_ks,
    mmq_shape,
    mvq_global_x,
    mvq_lanes,
    mvq_max_rows,
    mvq_need,
    mvq_variant,
)
from forge_hip.workspace import Workspace

_C = constants()
MV_WARPS = _C["MV_WARPS"]
NARROW_N = 128  # float32 prefill products of at most this many outputs (routers) run per output
GEMM_N, GEMM_THREADS = _C["GB_N"], _C["GB_THREADS"]
NORM_THREADS = 256  # act_half / act_round / add_bias blocks (any size works)


# contract.h's descriptor fields: name -> int64 index in a descriptor
DESC = {f: _C[f"DESC_{f}"] for f in ("W", "X", "Y", "BIAS", "TYPE", "K", "N", "ROW_BYTES")}


def descriptor(p: Placed, x: int, y: int, bias: int) -> list[int]:
    """The DESC_LEN int64 words describing the product of weight `p` (x [R, p.k] -> y [R, p.n],
    bias address or 0)."""
    row = [0] * _C["DESC_LEN"]
    for field, value in zip(DESC, (p.ptr, x, y, bias, TYPE_IDS[p.type], p.k, p.n, p.row_bytes)):
        row[DESC[field]] = value
    return row


@dataclass
class Fused:
    """The add_norm making a decode product's x, left to that product's launch: suffix "n"
    (one row), computed by the product's mmv.hip kernel (args: MvqNorm's xin, o, w_post,
    w_next, xout, eps); "q", launched just before it as add_norm_quant, which also quantizes x
    into ws.xq for it (args: x, o, w_post, w_next, eps)."""

    suffix: str
    args: list


class Products:
    """The descriptor table of one model's matrices and the launches of their products.

    Switches for experiments and tests (the defaults are the plan's): `round_prefill` (prefill
    products round activations like llama.cpp's; off: float math everywhere), `mmq`,
    `quant_norm`, `fuse_norm`, `gemm_rows` / `mvq_lanes` (fixed instead of chosen), and `tune`
    (the launch knobs, `forge_hip.tuning`). `invariant`: the paths and reduction orders do not
    depend on the row count (`forge_hip.invariance`)."""

    invariant = False

    def __init__(self, kernels: KernelTable, ops: dict[str, Kernel], lib: KernelLibrary,
                 arena: WeightArena, ws: Workspace, launch: Launcher, warp: int,
                 tune: Tuning):  # fmt: skip
        """`ops`: the winning kernels of the non-matmul ops it launches (add_bias, act_round,
        geglu, swiglu)."""
        self.kernels, self.lib, self.arena, self.ws, self.launch = kernels, lib, arena, ws, launch
        self.op = ops
        self.warp, self.tune = warp, tune
        self.round_prefill = True
        self.gemm_rows: int | None = None  # token rows per gemm.hip tile (64/128); None: chosen
        self.mvq_lanes: int | None = None  # lanes per row of decode products; None: mvq_lanes()
        self.quant_norm = True  # the add_norm making x quantizes it too (norm_quantizable)
        self.quant_norm_rows = tune.mmq_launch_rows  # ... in steps of at most this many rows
        self.fuse_norm = True  # one-row products compute their add_norm (norm_fusable)
        self.mmq = True  # products of mmq_min_rows .. mmq_max_rows rows on mmq.hip
        self.descs: list[list[int]] = []
        self.mats: list[tuple[Placed, object]] = []  # per descriptor: weight, its matmul impl
        self.mv_multi, self.mv_glu = lib.get("mv_multi"), lib.get("mv_glu")
        self.mm_tiled = lib.get("mm_tiled")

    # -- the descriptor table ---------------------------------------------------------------------
    def add(self, mats: list[tuple[str, int, int, int]]) -> int:
        """Descriptors for weights (name, x, y, bias) sharing x; returns the first one's index."""
        first = len(self.descs)
        for name, x, y, bias in mats:
            p = self.arena.placed[name]
            impl = self.kernels.require("hip", "matmul", p.type).impl
            self.descs.append(descriptor(p, x, y, bias))
            self.mats.append((p, impl))
        return first

    def add_placed(self, mats: list[tuple[Placed, int, int, int]]) -> int:
        """Descriptors for weights already placed (the built-in kernels' only: expert
        matrices, forge_hip.experts); returns the first one's index."""
        first = len(self.descs)
        for p, x, y, bias in mats:
            self.descs.append(descriptor(p, x, y, bias))
            self.mats.append((p, BUILTIN_MATMUL))
        return first

    def upload(self) -> None:
        """The descriptor tables to the device: ws.descs, and ws.descs_p whose x is the
        activations rounded as llama.cpp rounds them for each type (prefill products)."""
        table = np.asarray(self.descs, dtype=np.int64)
        self.lib.runtime.copy_to_device(self.ws.descs, table)
        for row, (p, _) in zip(table, self.mats):
            mode = ROUND_MODE[p.type]
            row[DESC["X"]] = self.ws.ptr[f"r{mode}"] if mode else row[DESC["X"]]
        self.lib.runtime.copy_to_device(self.ws.descs_p, table)

    # -- the paths --------------------------------------------------------------------------------
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
            d = self.descs[first + j]
            x, y, bias = d[DESC["X"]], d[DESC["Y"]], d[DESC["BIAS"]]
            kernel = self.lib.resolve(impl)
            self.launch(kernel, (-(-p.n // MV_WARPS), rows), (MV_WARPS * self.warp,),
                        [p.ptr, x, y, p.k, p.n])  # fmt: skip
            if bias:
                self.launch(self.op["add_bias"], (rows,), (NORM_THREADS,), [y, bias, p.n])

    def glu(self, first: int, rows: int, act: int, norm: Fused | None = None) -> None:
        """g = act(h Wg^T) * (h Wu^T) for the gate (first) and up descriptors; act 0 SiLU,
        1 GELU-tanh; `norm` as for matmul."""
        ws = self.ws
        fused = all(impl == BUILTIN_MATMUL for _, impl in self.mats[first : first + 2])
        if fused and self._mmq_fits(first, 2, rows):
            self._mmq(first, 2, rows, act, norm)
            return
        if fused and rows <= self._mv_rows(first, 2):
            self._matvec(first, 2, rows, act, norm)
            return
        self.matmul(first, 2, rows)
        n = rows * self.mats[first][0].n
        kernel = self.op["geglu" if act else "swiglu"]
        self.launch(kernel, (min(4096, -(-n // 256)),), (256,), [ws.g, ws.u, ws.g, n])

    def _mv_rows(self, first: int, count: int) -> int:
        """Most rows descriptors first .. first + count - 1 run as decode products (_matvec)."""
        if not self.round_prefill:
            return self.tune.mv_max_rows
        mats = [p for p, _ in self.mats[first : first + count]]
        work = sum(p.n * p.k for p in mats)
        return mvq_max_rows([p.type for p in mats], work, tune=self.tune)

    def _mmq_fits(self, first: int, count: int, rows: int) -> bool:
        """Whether descriptors first .. first + count - 1 over `rows` rows run on mmq.hip."""
        mats, t = self.mats[first : first + count], self.tune
        ours = all(impl == BUILTIN_MATMUL and p.type in MMQ_TYPES for p, impl in mats)
        if not (self.mmq and self.round_prefill and t.mmq_min_rows <= rows <= t.mmq_max_rows
                and ours):  # fmt: skip
            return False
        return rows <= t.mmq_launch_rows or sum(p.nbytes for p, _ in mats) <= t.mmq_reread_bytes

    def _mmq(
        self, first: int, count: int, rows: int, act: int | None = None, norm: Fused | None = None
    ) -> None:
        """Products of mmq_min_rows .. mmq_max_rows rows on int8 tensor cores (mmq.hip): per
        mmq_launch_rows rows, x quantized once by mvq_quant (or, with `norm` "q", by the add_norm
        making it: one launch), as the decode products round it, then one launch over the
        matrices (or the gated pair) writing those rows of y."""
        mats = [p for p, _ in self.mats[first : first + count]]
        types, t = [p.type for p in mats], self.tune
        k, need = mats[0].k, mvq_need(types)
        ns = [p.n for p in (mats[:1] if act is not None else mats)]
        cus, descs = self.lib.runtime.props.compute_units, self.ws.descs
        pf = int(t.mmq_prefetch and l2_prefetch_pays(mats, t))
        for r0 in range(0, rows, t.mmq_launch_rows):
            n = min(t.mmq_launch_rows, rows - r0)
            if norm is not None and norm.suffix == "q":  # (norm_quantizable: one launch)
                xg = self.add_norm_quant(norm, n, k, need, r0)
            else:
                xg = self._quantize_x(self.descs[first][DESC["X"]] + 4 * r0 * k, k, n, need)
            mt, halves = mmq_shape(n)
            ks = self._ks(k, types, ns, halves)
            items = mmq_items(ns, ks)
            grid = (even_grid(items, t.mmq_blocks_per_cu * cus // halves), halves)
            tail = [k, need, items, ks]
            if act is None:
                self.launch(self.lib.get(f"mmq_multi_m{mt}"), grid, (MVQ_THREADS,),
                            [descs, first, count, n, r0, xg, *tail, pf])  # fmt: skip
            else:
                self.launch(self.lib.get(f"mmq_glu_m{mt}"), grid, (MVQ_THREADS,),
                            [descs, first, n, r0, xg, *tail, act, pf])  # fmt: skip

    def _ks(self, k: int, types: list[str], ns: list[int], halves: int) -> int:
        """Warps of an mmq block splitting a row group's chunks (tuning.mmq_ks)."""
        return mmq_ks(k, types, ns, self.lib.runtime.props.compute_units, halves, tune=self.tune)

    def _lanes(self, types: list[str], k: int, rows: int, n: int, pair: bool) -> int:
        """Lanes per weight row of a decode product (tuning.mvq_lanes)."""
        cus = self.lib.runtime.props.compute_units
        return mvq_lanes(types, k, rows, n, pair, cus, tune=self.tune)

    def add_norm(self, rows: int, k: int, args: list) -> None:
        """layer.hip's add_norm over `rows` rows of k with args (x, o, w_post, w_next, eps):
        x += post(o) (when o), ws.h = norm(x) * w_next."""
        x, o, w_post, w_next, eps = args
        self.launch(self.op["add_norm"], (rows,), (add_norm_threads(k, self.warp),),
                    [x, o, w_post, w_next, self.ws.h, k, eps])  # fmt: skip

    def add_norm_quant(self, norm: Fused, rows: int, k: int, need: int, r0: int = 0,
                       h: int = 0, xq: int | None = None) -> int:  # fmt: skip
        """The add_norm of `norm` ("q") over rows r0 .. r0 + rows - 1, x quantized into xq
        (default ws.xq; add_norm_quant, mvq_quant's layout for those rows), the normed rows
        also into h when given; returns xq."""
        x, o, w_post, w_next, eps = norm.args
        x, o = x + 4 * r0 * k, o + 4 * r0 * k if o else 0
        xq = self.ws.xq if xq is None else xq
        self.launch(self.lib.get("add_norm_quant"), (rows,), (anq_threads(k, self.tune),),
                    [x, o, w_post, w_next, h, xq, k, need, eps])  # fmt: skip
        return xq

    def _quantize_x(self, x: int, k: int, rows: int, need: int) -> int:
        """x [rows, k] rounded to int8 once into ws.xq (mvq_quant, mmv.hip's layout); ws.xq."""
        tasks = rows * -(-k // 256)
        self.launch(self.lib.get("mvq_quant"), (-(-tasks // 8),), (MVQ_THREADS,),
                    [x, self.ws.xq, k, rows, need])  # fmt: skip
        return self.ws.xq

    def _matvec(
        self, first: int, count: int, rows: int, act: int | None = None, norm: Fused | None = None
    ) -> None:
        """Decode products (few rows) of descriptors first .. first + count - 1, which share x:
        mmv.hip with int8 activations rounded as prefill rounds them; without rounding
        (round_prefill off) linear.hip's float kernels. `act`: the gated product (gate, up) with
        that activation. `norm`: the add_norm making x, run with this launch (Fused)."""
        mats = [p for p, _ in self.mats[first : first + count]]
        ws, t = self.ws, self.tune
        if not self.round_prefill:
            grid = (-(-max(p.n for p in mats) // MV_WARPS), rows, 1 if act is not None else count)
            args = [ws.descs, first] + ([act] if act is not None else [])
            kernel = self.mv_glu if act is not None else self.mv_multi
            self.launch(kernel, grid, (MV_WARPS * self.warp,), args)
            return
        types = [p.type for p in mats]
        k, x = mats[0].k, self.descs[first][DESC["X"]]
        suffix, rm = mvq_variant(types, rows)
        c = 1  # blocks per row group, each taking rm rows of x (mmv.hip's gridDim.y)
        if t.mvq_split and rows > MVQ_SPLIT_RM:
            suffix, rm = mvq_variant(types, MVQ_SPLIT_RM)
            c = -(-rows // rm)
        block_rows = min(rows, rm) if c > 1 else rows
        need = mvq_need(types)
        cus = self.lib.runtime.props.compute_units
        n = max(p.n for p in mats)
        g = self.mvq_lanes or self._lanes(types, k, block_rows, n, act is not None)
        rb = MVQ_THREADS // g
        items = sum(-(-p.n // rb) for p in (mats[:1] if act is not None else mats))
        most = max(1, t.mvq_blocks * cus // c)
        grid = even_grid(items, most)
        if norm is not None and norm.suffix == "q":  # x quantized by add_norm
            xg, norm = self.add_norm_quant(norm, rows, k, need), None
        elif mvq_global_x(need, block_rows, k, rm, tune=t):
            xg = self._quantize_x(x, k, rows, need)
        else:
            xg = 0
        flags = t.mvq_flags if l2_prefetch_pays(mats, t) else t.mvq_flags & ~1
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
        (gemm.hip, 16-bit operands) when activations are rounded and no matrix is F32; narrow
        F32 ones (routers) one warp per output (mv_multi); else float32 SIMT tiles (mm_tiled)."""
        mats = self.mats[first : first + count]
        max_n = max(p.n for p, _ in mats)
        x, k = self.descs[first][DESC["X"]], mats[0][0].k
        if self.round_prefill and k % 32 == 0 and all(p.type != "F32" for p, _ in mats):
            for mode in sorted({ROUND_MODE[p.type] for p, _ in mats}):
                self.launch(self.lib.get("act_half"), (rows,), (NORM_THREADS,),
                            [x, self.ws.ptr[f"r{mode}"], k, mode])  # fmt: skip
            cus = self.lib.runtime.props.compute_units
            ns = [p.n for p, _ in mats]
            bm = self.gemm_rows or gemm_tile_rows(rows, ns, GEMM_N, cus, self.tune)
            grid = (-(-rows // bm), -(-max_n // GEMM_N), count)
            self.launch(self.lib.get(f"gemm_m{bm}"), grid, (GEMM_THREADS,),
                        [self.ws.descs_p, first, rows])  # fmt: skip
            return
        if max_n <= NARROW_N and all(p.type == "F32" for p, _ in mats):
            # one warp per output (mv_multi): mm_tiled's 64 x 64 tiles would leave all but
            # rows / 64 blocks of the GPU idle (a router of 32 experts: 0.44 ms a layer)
            grid = (-(-max_n // MV_WARPS), rows, count)
            self.launch(self.mv_multi, grid, (MV_WARPS * self.warp,), [self.ws.descs, first])
            return
        modes = {ROUND_MODE[p.type] for p, _ in mats} if self.round_prefill else set()
        for mode in sorted(modes - {0}):
            self.launch(self.op["act_round"], (rows,), (NORM_THREADS,),
                        [x, self.ws.ptr[f"r{mode}"], k, mode])  # fmt: skip
        grid = (-(-max_n // 64), -(-rows // 64), count)
        descs = self.ws.descs_p if self.round_prefill else self.ws.descs
        self.launch(self.mm_tiled, grid, (256,), [descs, first, rows])

    # -- which add_norm a product takes over ---------------------------------------------------
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
                and not mvq_global_x(mvq_need(types), 1, k, 1, tune=self.tune))  # fmt: skip

    def norm_quantizable(self, first: int, count: int, rows: int, head: bool = False) -> bool:
        """Whether the add_norm making the x of descriptors first .. first + count - 1 over
        `rows` rows runs as add_norm_quant, quantizing x for their launch (xg) where each of its
        blocks, or a mvq_quant launch, would quantize it: decode products of mmv.hip (int8
        types, not the gen kernels) or one launch of mmq.hip, rows of at most ANQ_K and steps
        of at most quant_norm_rows rows; the output head (`head`) only for one row (a pass may
        gather its rows). Its sums of squares run in another order than add_norm's, so h can
        differ in the last bits."""
        if not (self.quant_norm and self.round_prefill and rows <= self.quant_norm_rows):
            return False
        if rows > 1 and head:
            return False
        mats = self.mats[first : first + count]
        types = [p.type for p, _ in mats]
        if not (all(impl == BUILTIN_MATMUL for _, impl in mats) and mats[0][0].k <= ANQ_K):
            return False
        if self._mmq_fits(first, count, rows):
            return rows <= self.tune.mmq_launch_rows
        ints = all(ROUND_MODE[t] in (1, 2) for t in types) and not MVQ_GEN & set(types)
        return ints and rows <= self._mv_rows(first, count)

    def with_tuning(self, **knobs) -> None:
        """Replace some launch knobs (experiments and tests)."""
        self.tune = replace(self.tune, **knobs)
