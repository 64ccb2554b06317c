"""The cpu_simd runner: the transformer forward pass of a `ModelSpec` in NumPy.

Per layer an attention block and an FFN block (`forge_cpu_simd.blocks`), whose weights are
prepared once by the kernels that win in the kernel table. The KV cache is paged: every layer
keeps K and V in flat slot arrays [n_blocks * block_size, n_head_kv, head_dim], and a sequence's
block table maps its positions to slots.
"""

from __future__ import annotations

import numpy as np

from forge.backend import Runner, SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.kv_cache import KvFormat, require_whole_blocks
from forge.models.spec import ModelSpec
from forge.models.weights import model_weights
from forge_cpu_simd.blocks import FFN_BLOCKS, AttentionBlock, Step
from forge_cpu_simd.kv_store import KvArray
from forge_cpu_simd.loading import BACKEND, DEFAULT_EXPERT_CACHE_MB, WeightLoader
from forge_cpu_simd.matmul import embedding_rows
from forge_cpu_simd.plugin import ELEMENTWISE_OPS


class _Ops:
    """The winning kernel of each non-matmul op, as attributes (self.ops.rms_norm(...))."""

    def __init__(self, kernels: KernelTable):
        for op in ELEMENTWISE_OPS:
            setattr(self, op, kernels.require(BACKEND, op).impl)


class CpuRunner(Runner):
    windowed_kv = True  # sliding-window layers cache only their windows (SeqBatch.window_tables)

    def __init__(self, spec: ModelSpec, gguf: GGUFFile, kernels: KernelTable, progress=None,
                 kv_formats: tuple[KvFormat, KvFormat] = (KvFormat.F32, KvFormat.F32),
                 expert_cache_bytes: int = DEFAULT_EXPERT_CACHE_MB << 20):  # fmt: skip
        """`kv_formats`: how the cache stores K and V (float32 by default: llama.cpp's golden
        references were made with a float32 cache). `expert_cache_bytes`: prepared experts of
        a mixture kept over all layers."""
        self.spec, self.gguf, self.kernels = spec, gguf, kernels
        self.kv_formats = kv_formats
        for fmt, dim in zip(kv_formats, (spec.head_dim, spec.head_dim_v)):
            require_whole_blocks(fmt, [dim])  # refused before any weight loads
        self.ops = _Ops(kernels)
        load = WeightLoader(gguf, kernels, expert_cache_bytes)
        load.compile_kernels(list(model_weights(spec)))
        ffn_block = FFN_BLOCKS[type(spec.ffn)]
        total = spec.n_layer + 1
        self.blocks: list[tuple[AttentionBlock, object]] = []
        for i, layer in enumerate(spec.layers):
            p = f"blk.{i}."
            self.blocks.append((AttentionBlock(spec, layer, load, p, self.ops),
                                ffn_block(spec, load, p, self.ops)))  # fmt: skip
            if progress:
                progress(i + 1, total)
        self.output_norm = load.vector("output_norm.weight")
        self.output = load.linear(["token_embd.weight" if spec.tied_output else "output.weight"])
        if progress:
            progress(total, total)
        self.embd_info = gguf.tensors["token_embd.weight"]
        self.k_cache: list[KvArray] = []
        self.v_cache: list[KvArray] = []
        self.block_size = 0
        self.windows: tuple[int, ...] = ()  # the windows whose layers have pools of their own

    # -- cache ----------------------------------------------------------------------------------
    def allocate_kv(
        self, n_blocks: int, block_size: int, window_blocks: dict[int, int] | None = None
    ) -> None:
        """A cache of `n_blocks` blocks for every layer, but those of a sliding window in
        `window_blocks`, which get that many blocks (their pool's)."""
        s, (fk, fv) = self.spec, self.kv_formats
        window_blocks = window_blocks or {}
        self.k_cache, self.v_cache = [], []  # the old cache goes first
        for layer in s.layers:
            slots = window_blocks.get(layer.sliding_window, n_blocks) * block_size
            self.k_cache.append(KvArray(fk, slots, s.n_head_kv, s.head_dim))
            self.v_cache.append(KvArray(fv, slots, s.n_head_kv, s.head_dim_v))
        self.block_size, self.windows = block_size, tuple(sorted(window_blocks))
        for block in self.blocks:
            w = block[0].layer.sliding_window
            block[0].pool = w if w in window_blocks else None

    def _slots(self, table: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Cache slots of positions lo .. hi - 1 through a block table (blocks that left a
        window's pool, -1 there, give slot 0: never read, the window masks them)."""
        pos = np.arange(lo, hi)
        if len(table) <= (hi - 1) // self.block_size:
            raise ContextOverflowError(
                f"sequence position {hi - 1} has no KV block (block table of {len(table)})"
            )
        blocks = table[pos // self.block_size].astype(np.int64)
        return np.where(blocks >= 0, blocks * self.block_size + pos % self.block_size, 0)

    def _tables(self, b: SeqBatch) -> dict[int | None, np.ndarray]:
        """The block table of each pool for one sequence: None for the full layers."""
        if len(b.window_tables) != len(self.windows):
            raise ForgeRuntimeError(
                f"{len(b.window_tables)} window tables for {len(self.windows)} window pools"
            )
        return {None: b.block_table, **dict(zip(self.windows, b.window_tables))}

    # -- forward --------------------------------------------------------------------------------
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        if not self.k_cache:
            raise ForgeRuntimeError("allocate_kv() must be called before forward()")
        s = self.spec
        ids = np.concatenate([np.asarray(b.tokens, dtype=np.int64) for b in batch])
        if ids.size and (ids.min() < 0 or ids.max() >= s.n_vocab):
            raise ForgeRuntimeError(f"token id out of range 0..{s.n_vocab - 1}")
        bounds = np.cumsum([0] + [len(b.tokens) for b in batch])
        tables = [self._tables(b) for b in batch]
        ends = [b.start + len(b.tokens) for b in batch]
        pools = [None, *self.windows]
        step = Step(
            pos=np.concatenate([np.arange(b.start, e) for b, e in zip(batch, ends)]),
            slots={p: np.concatenate([self._slots(t[p], b.start, e)
                                      for t, b, e in zip(tables, batch, ends)]) for p in pools},
            past={p: [self._slots(t[p], 0, e) for t, e in zip(tables, ends)] for p in pools},
            every_row=[np.arange(lo, hi) for lo, hi in zip(bounds, bounds[1:])],
        )  # fmt: skip
        x = embedding_rows(self.gguf.raw("token_embd.weight"), self.embd_info, ids)
        if s.embed_scale != 1.0:
            x *= np.float32(s.embed_scale)
        rows = self._output_rows(batch, bounds)
        last = s.n_layer - 1
        for li, (attention, ffn) in enumerate(self.blocks):
            # The last layer's attention output and FFN matter only for rows whose logits are
            # wanted (its K/V are still cached for every row).
            queries = rows if li == last else step.every_row
            x = attention(x, self.k_cache[li], self.v_cache[li], step, queries)
            if x.shape[0]:
                x = ffn(x)
        return self._logits(x, batch, rows)

    def _output_rows(self, batch: list[SeqBatch], bounds: np.ndarray) -> list[np.ndarray]:
        """Per sequence, the rows (indices into the batch's tokens) whose logits it wants."""
        rows = []
        for b, lo, hi in zip(batch, bounds, bounds[1:]):
            if b.output == "all":
                rows.append(np.arange(lo, hi))
            elif b.output == "last" and hi > lo:
                rows.append(np.array([hi - 1]))
            else:
                rows.append(np.array([], dtype=np.int64))
        return rows

    def _logits(self, x, batch, rows) -> list[np.ndarray | None]:
        """Logits of the output rows; `x` holds exactly those rows, in order."""
        if x.shape[0] == 0:
            return [None] * len(batch)
        logits = self.output(self.ops.rms_norm(x, self.output_norm, self.spec.rms_eps))
        out, at = [], 0
        for b, r in zip(batch, rows):
            out.append(None if b.output == "none" else logits[at : at + len(r)])
            at += len(r)
        return out

    def memory_estimate(self) -> dict[str, int]:
        weights = sum(a.nbytes + f.nbytes for a, f in self.blocks) + self.output.nbytes
        kv = sum(a.nbytes for a in self.k_cache + self.v_cache)  # as stored
        return {"weights": weights, "kv_cache": kv}
