"""The mixture-of-experts FFN of the hip plan (kernels/moe.hip), for R token rows of ws.h:

1. the router's product (a plain descriptor: any weight type, bias when the model has one) into
   ws.moe_logits;
2. moe_route, one block: each row's experts and weights, the R k (row, slot) pairs sorted by
   expert and cut into tiles of at most RM pairs of one expert, all on the device; past
   TOPK_ROWS rows the experts and weights come first from moe_topk (a warp per row over many
   blocks: one block took a 512-row pass of Qwen3-30B-A3B 160 us a layer, 32 rows at a time);
3. moe_quant: the pairs' rows of ws.h, in sorted order, rounded to int8 blocks as the decode
   products round them; moe_glu_<V>: every chosen expert's gate/up product with the activation,
   one launch whose blocks each take some weight rows of one tile's expert (only chosen experts
   are read; a tile's pairs share each weight row read);
4. moe_quant of those outputs, moe_down_<V>: the down products the same way;
5. moe_combine: each row's weighted sum of its pairs' outputs into ws.o.

A float32 router over at most MOE_ROUTER_ROWS rows (decode steps, short chunks) runs as
moe_router, a block per expert, instead of the plain product (a warp per expert: 16 blocks for
128 experts, the slowest launch of a Qwen3-30B-A3B decode step).

Grids depend on R only (tiles past the last do nothing), so the launches are graph-captured
like the rest of a decode step. V follows the pairs per expert: one-pair tiles for decode, 8 for
a few pairs per expert, tiles of 32 on int8 tensor cores ("mma", mmq.h's types) for some more,
and past GEMM_PAIRS pairs an expert the prefill passes' 16-bit tensor-core tiles of 64 or 128
pairs ("gemm64" / "gemm128", moe_gemm.hip: steps 3-4 become act_half of ws.h, moe_gemm_glu_m<BM>,
act_half of the gated outputs, moe_gemm_down_m<BM>); "gen" when an expert matrix is Q2_K or Q3_K.
One-pair tiles of matrices of one type take that type's own kernel (moe_glu_r1_<type>: fewer
registers, more blocks on a compute unit) where moe.hip has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge.models.spec import ExpertFFN, ModelSpec
from forge_hip.arena import Placed
from forge_hip.contract import constants
from forge_hip.library import BUILTIN_MATMUL, MOE_TYPED_R1, ROUND_MODE, KernelLibrary
from forge_hip.products import DESC, GEMM_N, GEMM_THREADS, NORM_THREADS, Products
from forge_hip.tuning import MMQ_TYPES, MVQ_GEN, MVQ_THREADS, mvq_lanes, mvq_need
from forge_hip.workspace import Workspace

_C = constants()
MOE_THREADS = _C["MOE_THREADS"]
ROUTER_THREADS, ROUTER_VEC = _C["MOE_ROUTER_THREADS"], _C["MOE_ROUTER_VEC"]
ROUTER_ROWS = _C["MOE_ROUTER_ROWS"]
ACTIVATIONS = {"silu": 0, "swiglu_oai": 2}  # moe_glu's act
GATINGS = {"softmax": 0, "softmax_chosen": 1}  # moe_route's gating
VARIANT_RM = {"r1": 1, "r8": 8, "gen": 8, "mma": 32, "gemm64": 64, "gemm128": 128}  # pairs a tile
# Pairs per expert from which the 16-bit tensor-core tiles take the products, and from which
# their tiles hold 128 pairs. H200, Qwen3-30B-A3B twin: at 16 an expert (256-token pass) 64-pair
# tiles 9,460 tok/s against the int8 tiles' 8,164; at 32 (512 tokens) 128-pair tiles 14,789
# against 13,311: decoding a tile's weights costs more than its half-empty rows.
GEMM_PAIRS, GEMM128_PAIRS = 16, 32
MMA_ROWS = 16 * _C["MMQ_WARPS"]  # weight rows per block of the mma variant
COMBINE_THREADS = 256
TOPK_ROWS = 32  # rows past which moe_topk chooses the experts before moe_route sorts the pairs
TOPK_THREADS = 256


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
    def first_product(self) -> tuple[int, int, bool]:
        """(first descriptor, count, whether the add_norm making x may fuse into it) of the
        product reading this part's input: the router's; never fused (the expert launches read
        ws.h too)."""
        return self.router, 1, False


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


def block_rows(v: str, lanes: int) -> int:
    """Weight rows one block of moe_glu_<v> / moe_down_<v> takes (lanes: per row, mmv.h's)."""
    return MMA_ROWS if v == "mma" else MVQ_THREADS // lanes


def route_threads(n_expert: int, rows: int) -> int:
    """moe_route's block: a thread per expert at least (its scans), a 64-lane group per row up
    to MOE_THREADS (its rows go a warp each); a whole 1024-thread block for one decode row only
    lengthens its barriers."""
    want = max(n_expert, 64 * rows)
    return min(MOE_THREADS, -(-want // 64) * 64)


def max_tiles(pairs: int, rm: int, n_expert: int) -> int:
    """Most tiles `pairs` sorted pairs make at `rm` pairs a tile: one partial tile per expert."""
    return -(-pairs // rm) + min(n_expert, pairs)


class Experts:
    """Descriptors and launches of the mixture-of-experts parts of one model."""

    def __init__(self, spec: ModelSpec, products: Products, lib: KernelLibrary, ws: Workspace):
        if not isinstance(spec.ffn, ExpertFFN):
            raise TypeError("Experts needs a model whose FFN is a mixture of experts")
        self.spec, self.f, self.products, self.lib, self.ws = spec, spec.ffn, products, lib, ws
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

    def run(self, part: ExpertLaunches, rows: int, norm: None = None) -> None:
        """The mixture over `rows` rows of ws.h into ws.o (ws.o = sum of the chosen experts'
        outputs times their weights); `norm` is always None (first_product)."""
        f, s, ws, lib, launch = self.f, self.spec, self.ws, self.lib, self.products.launch
        k, pairs = f.n_expert_used, rows * f.n_expert_used
        v = variant(part.types, pairs, f.n_expert)
        rm = VARIANT_RM[v]
        tiles = max_tiles(pairs, rm, f.n_expert)
        self._router(part.router, rows)
        gating = [ws.moe_logits, rows, f.n_expert, k, GATINGS[f.gating], int(f.norm_weights),
                  f.weights_scale]  # fmt: skip
        chosen = rows > TOPK_ROWS
        if chosen:
            per_block = TOPK_THREADS // lib.runtime.props.warp_size
            launch(lib.get("moe_topk"), (-(-rows // per_block),), (TOPK_THREADS,),
                   [*gating, ws.moe_ids, ws.moe_w])  # fmt: skip
        launch(lib.get("moe_route"), (1,), (route_threads(f.n_expert, rows),),
               [*gating, rm, tiles, int(chosen), ws.moe_ids, ws.moe_w, ws.moe_order,
                ws.moe_pos, ws.moe_tiles])  # fmt: skip
        if v.startswith("gemm"):
            self._gemm_products(part, rows, pairs, rm, tiles)
        else:
            self._products(part, v, rm, pairs, tiles)
        launch(lib.get("moe_combine"), (rows, -(-s.n_embd // COMBINE_THREADS)),
               (COMBINE_THREADS,), [ws.moe_y, ws.moe_pos, ws.moe_w, k, s.n_embd, ws.o])  # fmt: skip

    def _products(self, part: ExpertLaunches, v: str, rm: int, pairs: int, tiles: int) -> None:
        """The chosen experts' gate/up and down products of the dot-product variants (steps 3-4)."""
        f, s, ws, lib, launch = self.f, self.spec, self.ws, self.lib, self.products.launch
        k = f.n_expert_used
        gate_up_types, down_types = list(part.types[:2]), [part.types[2]]
        need = self._quantize(ws.h, ws.moe_order, k, s.n_embd, pairs, gate_up_types)
        lanes = mvq_lanes(gate_up_types, s.n_embd, rm, f.n_ff)
        launch(lib.get(kernel("glu", v, gate_up_types, self.typed)),
               (-(-f.n_ff // block_rows(v, lanes)), tiles),
               (MVQ_THREADS,),
               [ws.descs, part.gate_up, ws.moe_tiles, ws.moe_xq, pairs, s.n_embd, need, lanes,
                ACTIVATIONS[f.activation], f.swiglu_alpha, f.swiglu_limit])  # fmt: skip
        need = self._quantize(ws.moe_g, 0, 1, f.n_ff, pairs, down_types)
        lanes = mvq_lanes(down_types, f.n_ff, rm, s.n_embd)
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

    def _router(self, first: int, rows: int) -> None:
        """The router's logits of `rows` rows of ws.h into ws.moe_logits: moe_router for a
        float32 matrix (ours, rows of K floats) over few rows, else the plain product."""
        p, impl = self.products.mats[first]
        d = self.products.descs[first]
        fits = (impl == BUILTIN_MATMUL and p.type == "F32" and rows <= ROUTER_ROWS
                and p.k % 4 == 0 and p.k <= 4 * ROUTER_THREADS * ROUTER_VEC
                and p.row_bytes == 4 * p.k
                and (p.ptr | d[DESC["X"]]) % 16 == 0)  # (its float4 loads)  # fmt: skip
        if not fits:
            self.products.matmul(first, 1, rows)
            return
        self.products.launch(self.lib.get("moe_router"), (p.n,), (ROUTER_THREADS,),
                             [p.ptr, d[DESC["BIAS"]], d[DESC["X"]], rows, p.k, p.n,
                              d[DESC["Y"]]])  # fmt: skip

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
