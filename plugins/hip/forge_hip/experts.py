"""The mixture-of-experts FFN of the hip plan (kernels/moe.hip), for R token rows of ws.h:

1. the add_norm making ws.h, handed over by the plan (`first_product`'s "q");
2. the router and the routing (`forge_hip.expert_routing`): each row's experts and weights, and
   the R k (row, slot) pairs sorted by expert and cut into tiles of at most RM pairs of one
   expert, on the device;
3. moe_quant: the pairs' rows of ws.h, in sorted order, rounded to int8 blocks as the decode
   products round them; moe_glu_<V>: every chosen expert's gate/up product with the activation,
   one launch whose blocks each take some weight rows of one tile's expert (only chosen experts
   are read; a tile's pairs share each weight row read);
4. moe_quant of those outputs, moe_down_<V>: the down products the same way;
5. moe_combine: each row's weighted sum of its pairs' outputs into ws.o.

Grids depend on R only (tiles past the last do nothing), so the launches are graph-captured
like the rest of a decode step. V follows the pairs per expert: one-pair tiles for decode, 8 for
a few pairs per expert, tiles of 32 on int8 tensor cores ("mma", mmq.h's types) for some more,
and past GEMM_PAIRS pairs an expert the prefill passes' 16-bit tensor-core tiles of 64 or 128
pairs ("gemm64" / "gemm128", moe_gemm.hip: steps 3-4 become act_half of ws.h, moe_gemm_glu_m<BM>,
act_half of the gated outputs, moe_gemm_down_m<BM>); "gen" when an expert matrix is Q2_K or Q3_K.
One-pair tiles of matrices of one type take that type's own kernel (moe_glu_r1_<type>: fewer
registers, more blocks on a compute unit) where moe.hip has one.

One-pair tiles (decode steps) read each pair's token row of x rounded once per token, not once
per pair: by add_norm_quant as it writes ws.h (the plan hands the add_norm over: `first_product`'s
"q"), else by moe_quant of ws.h's rows; moe_glu finds a pair's row through moe_order. (H200,
Qwen3-30B-A3B twin, inside the replayed decode graph: add_norm and moe_quant 2.9 + 0.4 us a
layer, add_norm_quant 1.9.)
"""

from __future__ import annotations

from dataclasses import dataclass

from forge.models.spec import ExpertFFN, ModelSpec
from forge_hip.arena import Placed
from forge_hip.contract import constants
from forge_hip.expert_routing import Routing
from forge_hip.library import MOE_TYPED_R1, ROUND_MODE, KernelLibrary
from forge_hip.products import GEMM_N, GEMM_THREADS, NORM_THREADS, Fused, Products
from forge_hip.tuning import (
    ANQ_K,
    MMQ_TYPES,
    MVQ_GEN,
    MVQ_THREADS,
    MVQ_UNIT,
    mvq_lanes,
    mvq_need,
)
from forge_hip.workspace import Workspace

_C = constants()
ACTIVATIONS = {"silu": 0, "swiglu_oai": 2}  # moe_glu's act
VARIANT_RM = {"r1": 1, "r8": 8, "gen": 8, "mma": 32, "gemm64": 64, "gemm128": 128}  # pairs a tile
# Pairs per expert from which the 16-bit tensor-core tiles take the products, and from which
# their tiles hold 128 pairs. H200, Qwen3-30B-A3B twin: at 16 an expert (256-token pass) 64-pair
# tiles 9,460 tok/s against the int8 tiles' 8,164; at 32 (512 tokens) 128-pair tiles 14,789
# against 13,311: decoding a tile's weights costs more than its half-empty rows.
GEMM_PAIRS, GEMM128_PAIRS = 16, 32
MMA_ROWS = 16 * _C["MMQ_WARPS"]  # weight rows per block of the mma variant
COMBINE_THREADS = 256
# Units a lane of a one-pair tile's row takes at least (expert_lanes). H200, decode graph, lanes
# forced (2026-11-29): gpt-oss-20b twin gate/up (MXFP4, 180 units) 32 / 16 / 8 lanes 471.2 /
# 477.9 / 432.8 tok/s, down 32 / 16 lanes 471.2 / 458.3; Qwen3-30B-A3B twin gate/up (Q4_K, 64
# units) 16 / 8 / 32 lanes 386.9 / 391.5 / 391.3, down (Q6_K, 48 units) 16 / 8 386.9 / 394.1.
GLU_UNITS, DOWN_UNITS = 8, 5


@dataclass(frozen=True)
class ExpertLaunches:
    """One layer's mixture of experts: its norm weights and descriptors."""

    norm: int  # the FFN's input norm weight
    post_norm: int  # post_ffw_norm.weight (0: none)
    router: int  # descriptor of the router's product
    gate_up: int  # first of the gate, up descriptors (expert 0; BIAS: [n_expert, N] or 0)
    down: int
    types: tuple[str, ...]  # the gate, up and down weight types

    @property
    def first_product(self) -> tuple[int, int, str]:
        """(first descriptor, count, how the add_norm making x fuses) of the product reading
        this part's input: the router's; "q": always handed to `Experts.run` (Fused "q"), which
        launches it, rounding ws.h for the expert products too where they read it so."""
        return self.router, 1, "q"


def variant(types: tuple[str, ...], pairs: int, n_expert: int) -> str:
    """moe_glu_<V> / moe_down_<V> for `pairs` (row, slot) pairs over `n_expert` experts."""
    if MVQ_GEN & set(types):
        return "gen"
    per_expert = pairs / n_expert
    if per_expert <= 2:
        return "r1"
    if per_expert <= 8 or not set(types) <= MMQ_TYPES:
        return "r8"
    if per_expert < GEMM_PAIRS or types[0] != types[1]:  # (a gated tile decodes one type)
        return "mma"
    return "gemm128" if per_expert >= GEMM128_PAIRS else "gemm64"


def kernel(kind: str, v: str, types: list[str], typed: bool = True) -> str:
    """moe.hip's kernel for `kind` ("glu", "down") of variant v over matrices of `types`."""
    if typed and v == "r1" and len(set(types)) == 1 and types[0] in MOE_TYPED_R1:
        return f"moe_{kind}_r1_{types[0].lower()}"
    return f"moe_{kind}_{v}"


def expert_lanes(types: list[str], k: int, rm: int, n: int, gated: bool) -> int:
    """Lanes per weight row of moe_glu_<V> (`gated`) / moe_down_<V>: the decode products' rule
    (mvq_lanes), but one-pair tiles halve them down to 8 while a lane would take fewer than
    GLU_UNITS (gated: each step loads a unit of both rows) or DOWN_UNITS units of its row."""
    g = mvq_lanes(types, k, rm, n)
    units = min(k // MVQ_UNIT[t] for t in types)
    want = GLU_UNITS if gated else DOWN_UNITS
    while rm == 1 and g > 8 and units < want * g:
        g //= 2
    return g


def block_rows(v: str, lanes: int) -> int:
    """Weight rows one block of moe_glu_<v> / moe_down_<v> takes (lanes: per row, mmv.h's)."""
    return MMA_ROWS if v == "mma" else MVQ_THREADS // lanes


def max_tiles(pairs: int, rm: int, n_expert: int) -> int:
    """Most tiles `pairs` sorted pairs make at `rm` pairs a tile: one partial tile per expert."""
    return -(-pairs // rm) + min(n_expert, pairs)


class Experts:
    """Descriptors and launches of the mixture-of-experts parts of one model."""

    def __init__(self, spec: ModelSpec, products: Products, lib: KernelLibrary, ws: Workspace):
        if not isinstance(spec.ffn, ExpertFFN):
            raise TypeError("Experts needs a model whose FFN is a mixture of experts")
        self.spec, self.f, self.products, self.lib, self.ws = spec, spec.ffn, products, lib, ws
        self.routing = Routing(spec, products, lib, ws)
        self.typed = True  # one-type r1 kernels where moe.hip has them (off: the generic ones)

    def part(self, prefix: str) -> ExpertLaunches:
        """Descriptors of one layer's router and experts (prefix "blk.<i>.")."""
        f, ws, placed = self.f, self.ws, self.products.arena.placed
        vector = self.products.arena.address

        def expert0(name: str) -> Placed:  # expert 0's rows; expert e's follow at e N rows
            p = placed[name]
            return Placed(p.ptr, p.type, p.k, p.n // f.n_expert, p.row_bytes)

        router = self.products.add([(prefix + "ffn_gate_inp.weight", ws.h, ws.moe_logits,
                                     vector(prefix + "ffn_gate_inp.bias"))])  # fmt: skip
        mats = {m: expert0(f"{prefix}ffn_{m}_exps.weight") for m in ("gate", "up", "down")}
        gate_up = self.products.add_placed(
            [(mats[m], 0, ws.moe_g if m == "gate" else 0, vector(f"{prefix}ffn_{m}_exps.bias"))
             for m in ("gate", "up")])  # fmt: skip
        down = self.products.add_placed(
            [(mats["down"], 0, ws.moe_y, vector(prefix + "ffn_down_exps.bias"))]
        )
        return ExpertLaunches(vector(f"{prefix}{f.norm}.weight"),
                              vector(prefix + "post_ffw_norm.weight"), router, gate_up, down,
                              tuple(m.type for m in mats.values()))  # fmt: skip

    def run(self, part: ExpertLaunches, rows: int, norm: Fused | None = None) -> None:
        """The mixture over `rows` rows of ws.h into ws.o (ws.o = sum of the chosen experts'
        outputs times their weights); `norm`: the add_norm making ws.h (Fused "q", launched
        here), or None when ws.h holds it already."""
        f, s, ws, lib, launch = self.f, self.spec, self.ws, self.lib, self.products.launch
        k, pairs = f.n_expert_used, rows * f.n_expert_used
        v = variant(part.types, pairs, f.n_expert)
        rm = VARIANT_RM[v]
        tiles = max_tiles(pairs, rm, f.n_expert)
        need = mvq_need(list(part.types[:2])) if v == "r1" else 0  # (token rows: one-pair tiles)
        rounded = self._add_norm(norm, rows, need)
        self.routing.run(part.router, rows, rm, tiles)
        if v.startswith("gemm"):
            self._gemm_products(part, rows, pairs, rm, tiles)
        else:
            self._products(part, v, rows, tiles, rounded)
        launch(lib.get("moe_combine"), (rows, -(-s.n_embd // COMBINE_THREADS)),
               (COMBINE_THREADS,), [ws.moe_y, ws.moe_pos, ws.moe_w, k, s.n_embd, ws.o])  # fmt: skip

    def _add_norm(self, norm: Fused | None, rows: int, need: int) -> bool:
        """Launch the add_norm of `norm` (none: nothing) writing ws.h; with `need`, where
        add_norm_quant takes the row, ws.h's rows also rounded into ws.moe_xq (mvq_quant's
        layout for `rows` rows). Returns whether they were."""
        if norm is None:
            return False
        ws, n, pr = self.ws, self.spec.n_embd, self.products
        if need and pr.quant_norm and pr.round_prefill and n <= ANQ_K and n % 32 == 0:
            pr.add_norm_quant(norm, rows, n, need, h=ws.h, xq=ws.moe_xq)
            return True
        pr.add_norm(rows, n, norm.args)
        return False

    def _products(self, part: ExpertLaunches, v: str, rows: int, tiles: int, rounded: bool) -> None:
        """The chosen experts' gate/up and down products of the dot-product variants (steps 3-4);
        one-pair tiles read x by token row (`rounded`: ws.moe_xq holds them already)."""
        f, s, ws, lib, launch = self.f, self.spec, self.ws, self.lib, self.products.launch
        k, pairs, rm = f.n_expert_used, rows * f.n_expert_used, VARIANT_RM[v]
        gate_up_types, down_types = list(part.types[:2]), [part.types[2]]
        if v == "r1":  # x rows per token, found through moe_order
            need = mvq_need(gate_up_types)
            if not rounded:
                self._quantize(ws.h, 0, 1, s.n_embd, rows, gate_up_types)
            x_rows, by_token = rows, [ws.moe_order, k]
        else:  # a copy per pair in sorted order
            need = self._quantize(ws.h, ws.moe_order, k, s.n_embd, pairs, gate_up_types)
            x_rows, by_token = pairs, ([] if v == "mma" else [0, 1])
        lanes = expert_lanes(gate_up_types, s.n_embd, rm, f.n_ff, gated=True)
        launch(lib.get(kernel("glu", v, gate_up_types, self.typed)),
               (-(-f.n_ff // block_rows(v, lanes)), tiles), (MVQ_THREADS,),
               [ws.descs, part.gate_up, ws.moe_tiles, ws.moe_xq, x_rows, s.n_embd, need, lanes,
                ACTIVATIONS[f.activation], f.swiglu_alpha, f.swiglu_limit, *by_token])  # fmt: skip
        need = self._quantize(ws.moe_g, 0, 1, f.n_ff, pairs, down_types)
        lanes = expert_lanes(down_types, f.n_ff, rm, s.n_embd, gated=False)
        launch(
            lib.get(kernel("down", v, down_types, self.typed)),
            (-(-s.n_embd // block_rows(v, lanes)), tiles),
            (MVQ_THREADS,),
            [ws.descs, part.down, ws.moe_tiles, ws.moe_xq, pairs, f.n_ff, need, lanes],
        )

    def _gemm_products(
        self, part: ExpertLaunches, rows: int, pairs: int, bm: int, tiles: int
    ) -> None:
        """The same products on 16-bit tensor cores (moe_gemm.hip, tiles of bm pairs): ws.h's
        rows and then the gated outputs rounded as the experts' type rounds them, into 16-bit
        words in ws.moe_xq."""
        f, s, ws, lib, launch = self.f, self.spec, self.ws, self.lib, self.products.launch
        launch(lib.get("act_half"), (rows,), (NORM_THREADS,),
               [ws.h, ws.moe_xq, s.n_embd, ROUND_MODE[part.types[0]]])  # fmt: skip
        launch(lib.get(f"moe_gemm_glu_m{bm}"), (-(-f.n_ff // (GEMM_N // 2)), tiles),
               (GEMM_THREADS,),
               [ws.descs, part.gate_up, ws.moe_tiles, ws.moe_xq, ws.moe_order, f.n_expert_used,
                ACTIVATIONS[f.activation], f.swiglu_alpha, f.swiglu_limit])  # fmt: skip
        launch(lib.get("act_half"), (pairs,), (NORM_THREADS,),
               [ws.moe_g, ws.moe_xq, f.n_ff, ROUND_MODE[part.types[2]]])  # fmt: skip
        launch(lib.get(f"moe_gemm_down_m{bm}"), (-(-s.n_embd // GEMM_N), tiles), (GEMM_THREADS,),
               [ws.descs, part.down, ws.moe_tiles, ws.moe_xq])  # fmt: skip

    def _quantize(self, x: int, order: int, kk: int, k: int, pairs: int, types: list[str]) -> int:
        """Rows order[i] / kk (order 0: row i) of x [*, k] for `pairs` rows into ws.moe_xq,
        rounded for `types`; returns the copies made (mvq_need)."""
        need = mvq_need(types)
        tasks = pairs * -(-k // 256)
        self.products.launch(
            self.lib.get("moe_quant"),
            (-(-tasks // (MVQ_THREADS // 32)),),
            (MVQ_THREADS,),
            [x, order, kk, self.ws.moe_xq, k, pairs, need],
        )
        return need
