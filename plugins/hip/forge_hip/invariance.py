"""Batch invariance on hip (the config key batch_invariant): a row's results do not depend on
the other rows of its pass, their number or its place among them, nor on how its prompt was cut
into chunks.

The plan's default launches pick their kernels and reduction orders by a pass's row count: one
row on mmv.hip, 2..128 rows on mmq.hip (whose K split depends on the row halves), more on
gemm.hip; lanes per weight row chosen for one row or many; add_norm folded into one-row products
or quantizing x for a step of at most 64 rows; attention split over the KV length as the rows
leave room, fused into one decode launch for decode steps only. Each choice reduces a row in its
own order, so a sequence alone and among others differed in the last bits of its logits.

Under batch_invariant every choice is fixed per matrix, not per pass:
- products (InvariantProducts): mmq.hip's types on mmq.hip from one row up (launches of at
  most 64 rows, K split as for one row half), the other types on mmv.hip at any row count, with
  the lanes one row takes; the add_norm making an integer product's x quantizes it at any row
  count (add_norm_quant, one block per row), the output head's is add_norm's;
- attention (forge_hip.attention_part reads `invariant`): qk_rope_store then attn_rows for every
  pass, decode steps included, over one split: a row's positions in one block, in the same
  order whatever else runs.
Chunked prefill then equals unchunked, and a decode token has the bits its position gets in a
prefill pass (so a one-token prompt chunk, or a recomputed preempted sequence, changes nothing).
Mixtures of experts (forge_hip.experts) are not covered yet: their tiles depend on the routing.

The cost, H200 (benchmarks/gpu_notes.md), decode tok/s against the default plan: gemma3-270m
twin -31% for one sequence (-47% at position 600), -8% for 8 sequences, -4% for 32; Llama-3-8B
twin -52% for one (mmq.hip takes one row at half the speed of mmv.hip's r1 kernels), +2% for 8,
+10% for 32. Hence a switch, off by default.
"""

from __future__ import annotations

import logging
import warnings

from forge.kernels import KernelTable
from forge_hip.library import BUILTIN_MATMUL, ROUND_MODE
from forge_hip.products import Products
from forge_hip.tuning import ANQ_K, MMQ_TYPES, MVQ_GEN
from forge_hip.workspace import ROW_CAP


def wants_invariance(kernels: KernelTable) -> bool:
    """Whether the kernel table is the one the config key batch_invariant runs."""
    return bool(getattr(kernels, "invariant", False))


def warn_if_uncovered(kernels: KernelTable, experts: bool) -> None:
    """Say so when batch_invariant is asked of a mixture of experts, whose expert layers this
    module does not cover (their results still depend on the other rows of a pass)."""
    if experts and wants_invariance(kernels):
        text = ("forge hip: batch_invariant covers the attention and dense products of this "
                "mixture-of-experts model, not its expert layers: its tokens may still depend "
                "on what else runs beside them")  # fmt: skip
        logging.getLogger("forge.hip").warning("%s", text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def products_for(kernels: KernelTable) -> type[Products]:
    """The Products class of a plan running `kernels`."""
    return InvariantProducts if wants_invariance(kernels) else Products


class InvariantProducts(Products):
    """Products whose path and per-row reduction order depend on their matrices only."""

    invariant = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fuse_norm = False  # (one-row kernels only)

    def _mmq_fits(self, first: int, count: int, rows: int) -> bool:
        mats = self.mats[first : first + count]
        ours = all(impl == BUILTIN_MATMUL and p.type in MMQ_TYPES for p, impl in mats)
        return self.mmq and self.round_prefill and ours and rows >= 1

    def _mv_rows(self, first: int, count: int) -> int:
        return ROW_CAP if self.round_prefill else super()._mv_rows(first, count)

    def _ks(self, k: int, types: list[str], ns: list[int], halves: int) -> int:
        return super()._ks(k, types, ns, 1)

    def _lanes(self, types: list[str], k: int, rows: int, n: int, pair: bool) -> int:
        return super()._lanes(types, k, 1, n, pair)

    def norm_quantizable(self, first: int, count: int, rows: int, head: bool = False) -> bool:
        """As Products', at any row count (launches of at most 64 rows on mmq.hip); never for
        the output head, whose rows a pass may gather after its add_norm."""
        if head or not (self.quant_norm and self.round_prefill):
            return False
        mats = self.mats[first : first + count]
        types = {p.type for p, _ in mats}
        ours = all(impl == BUILTIN_MATMUL for _, impl in mats) and mats[0][0].k <= ANQ_K
        ints = all(ROUND_MODE[t] in (1, 2) for t in types) and not MVQ_GEN & types
        return ours and ints
