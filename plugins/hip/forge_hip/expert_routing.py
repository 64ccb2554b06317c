"""The routing of the hip plan's mixture of experts (`forge_hip.experts`) for R token rows of ws.h,
all on the device (kernels/moe.hip):

1. the router's logits into ws.moe_logits: a float32 router over at most ROUTER_ROWS rows
   (decode steps, short chunks) as moe_router, a block per expert (a plain product's warp per
   expert row made 16 blocks for 128 experts, the slowest launch of a Qwen3-30B-A3B decode
   step), any other router as a plain product (its bias when the model has one);
2. each row's experts and weights, and the R k (row, slot) pairs sorted by expert and cut into
   tiles of at most RM pairs of one expert: moe_route, one block; past TOPK_ROWS rows the
   experts and weights come first from moe_topk (a warp per row over many blocks: one block took
   a 512-row pass of Qwen3-30B-A3B 160 us a layer, 32 rows at a time).

Decode steps' routing is a latency chain of one warp, so each row's probabilities are computed
once into registers before its k arg-max rounds, and one-pair tiles of at most a warp's pairs
are sorted by rank instead of by moe_route's scans (H200, Qwen3-30B-A3B twin, inside the
replayed decode graph: 6.3 -> 4.1 us a layer).
"""

from __future__ import annotations

from forge.models.spec import ExpertFFN, ModelSpec
from forge_hip.contract import constants
from forge_hip.library import BUILTIN_MATMUL, KernelLibrary
from forge_hip.products import DESC, Products
from forge_hip.workspace import Workspace

_C = constants()
MOE_THREADS = _C["MOE_THREADS"]
ROUTER_THREADS, ROUTER_VEC = _C["MOE_ROUTER_THREADS"], _C["MOE_ROUTER_VEC"]
ROUTER_ROWS = _C["MOE_ROUTER_ROWS"]
GATINGS = {"softmax": 0, "softmax_chosen": 1}  # moe_route's gating
TOPK_ROWS = 32  # rows past which moe_topk chooses the experts before moe_route sorts the pairs
TOPK_THREADS = 256


def route_threads(n_expert: int, rows: int) -> int:
    """moe_route's block: a thread per expert at least (its scans), a 64-lane group per row up
    to MOE_THREADS (its rows go a warp each); a whole 1024-thread block for one decode row only
    lengthens its barriers."""
    want = max(n_expert, 64 * rows)
    return min(MOE_THREADS, -(-want // 64) * 64)


class Routing:
    """The router and routing launches of one model's mixture-of-experts layers."""

    def __init__(self, spec: ModelSpec, products: Products, lib: KernelLibrary, ws: Workspace):
        if not isinstance(spec.ffn, ExpertFFN):
            raise TypeError("Routing needs a model whose FFN is a mixture of experts")
        self.f, self.products, self.lib, self.ws = spec.ffn, products, lib, ws

    def run(self, router: int, rows: int, rm: int, tiles: int) -> None:
        """Logits of the router (descriptor `router`) over `rows` rows of ws.h, then ws.moe_ids /
        moe_w (each row's experts and weights), moe_order / moe_pos (the pairs sorted by expert
        and back) and moe_tiles (`tiles` tiles of at most `rm` pairs)."""
        f, ws, lib, launch = self.f, self.ws, self.lib, self.products.launch
        k = f.n_expert_used
        gating = [ws.moe_logits, rows, f.n_expert, k, GATINGS[f.gating], int(f.norm_weights),
                  f.weights_scale]  # fmt: skip
        sorted_out = [ws.moe_ids, ws.moe_w, ws.moe_order, ws.moe_pos, ws.moe_tiles]
        float_router = self._float_router(router, rows)
        if float_router is None:
            self.products.matmul(router, 1, rows)
        else:
            launch(lib.get("moe_router"), (f.n_expert,), (ROUTER_THREADS,), float_router)
        chosen = rows > TOPK_ROWS
        if chosen:
            per_block = TOPK_THREADS // lib.runtime.props.warp_size
            launch(lib.get("moe_topk"), (-(-rows // per_block),), (TOPK_THREADS,),
                   [*gating, ws.moe_ids, ws.moe_w])  # fmt: skip
        launch(lib.get("moe_route"), (1,), (route_threads(f.n_expert, rows),),
               [*gating, rm, tiles, int(chosen), *sorted_out])  # fmt: skip

    def _float_router(self, first: int, rows: int) -> list | None:
        """moe_router's arguments (W, bias, x, rows, K, E, logits) when the router is a float32
        matrix (ours, rows of K floats) that it takes for `rows` rows, else None."""
        p, impl = self.products.mats[first]
        d = self.products.descs[first]
        fits = (impl == BUILTIN_MATMUL and p.type == "F32" and rows <= ROUTER_ROWS
                and p.k % 4 == 0 and p.k <= 4 * ROUTER_THREADS * ROUTER_VEC
                and p.row_bytes == 4 * p.k
                and (p.ptr | d[DESC["X"]]) % 16 == 0)  # (its float4 loads)  # fmt: skip
        if not fits:
            return None
        return [p.ptr, d[DESC["BIAS"]], d[DESC["X"]], rows, p.k, p.n, d[DESC["Y"]]]
