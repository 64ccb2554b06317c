"""The cpu_simd runner: the transformer forward pass of a `ModelSpec` in NumPy.

Per layer an attention block and an FFN block (`forge_cpu_simd.blocks`), whose weights are
prepared once by the kernels that win in the kernel table. The KV cache is paged: every layer
keeps K and V in flat slot arrays [n_blocks * block_size, n_head_kv, head_dim], and a sequence's
block table maps its positions to slots.
"""

from __future__ import annotations

import numpy as np

from forge.backend import Runner, SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError, UnsupportedModelError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.kv_cache import KvFormat
from forge.models.spec import ModelSpec
from forge_cpu_simd.blocks import FFN_BLOCKS, AttentionBlock, Step
from forge_cpu_simd.kv_store import KvArray
from forge_cpu_simd.loading import BACKEND, WeightLoader
from forge_cpu_simd.matmul import embedding_rows
from forge_cpu_simd.plugin import ELEMENTWISE_OPS


class _Ops:
    """The winning kernel of each non-matmul op, as attributes (self.ops.rms_norm(...))."""

    def __init__(self, kernels: KernelTable):
        for op in ELEMENTWISE_OPS:
            setattr(self, op, kernels.require(BACKEND, op).impl)


class CpuRunner(Runner):
    def __init__(self, spec: ModelSpec, gguf: GGUFFile, kernels: KernelTable, progress=None,
                 kv_formats: tuple[KvFormat, KvFormat] = (KvFormat.F32, KvFormat.F32)):  # fmt: skip
        """`kv_formats`: how the cache stores K and V (float32 by default: llama.cpp's golden
        references were made with a float32 cache)."""
        self.spec, self.gguf, self.kernels = spec, gguf, kernels
        self.kv_formats = kv_formats
        for fmt, dim in zip(kv_formats, (spec.head_dim, spec.head_dim_v)):
            if dim % fmt.block:  # refused before any weight loads
                raise UnsupportedModelError(
                    f"a {fmt.value} KV cache needs head sizes that are multiples of "
                    f"{fmt.block}; this model's are {dim}"
                )
        self.ops = _Ops(kernels)
        load = WeightLoader(gguf, kernels)
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

    # -- cache ----------------------------------------------------------------------------------
    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        s, slots = self.spec, n_blocks * block_size
        fk, fv = self.kv_formats
        self.k_cache, self.v_cache = [], []  # the old cache goes first
        self.k_cache = [KvArray(fk, slots, s.n_head_kv, s.head_dim) for _ in range(s.n_layer)]
        self.v_cache = [KvArray(fv, slots, s.n_head_kv, s.head_dim_v) for _ in range(s.n_layer)]
        self.block_size = block_size

    def _slots(self, b: SeqBatch, lo: int, hi: int) -> np.ndarray:
        pos = np.arange(lo, hi)
        blocks = pos // self.block_size
        if len(b.block_table) <= (hi - 1) // self.block_size:
            raise ContextOverflowError(
                f"sequence position {hi - 1} has no KV block (block table of {len(b.block_table)})"
            )
        return b.block_table[blocks].astype(np.int64) * self.block_size + pos % self.block_size

    # -- forward --------------------------------------------------------------------------------
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        if not self.k_cache:
            raise ForgeRuntimeError("allocate_kv() must be called before forward()")
        s = self.spec
        ids = np.concatenate([np.asarray(b.tokens, dtype=np.int64) for b in batch])
        if ids.size and (ids.min() < 0 or ids.max() >= s.n_vocab):
            raise ForgeRuntimeError(f"token id out of range 0..{s.n_vocab - 1}")
        bounds = np.cumsum([0] + [len(b.tokens) for b in batch])
        step = Step(
            pos=np.concatenate([np.arange(b.start, b.start + len(b.tokens)) for b in batch]),
            slots=np.concatenate(
                [self._slots(b, b.start, b.start + len(b.tokens)) for b in batch]
            ),  # fmt: skip
            past=[self._slots(b, 0, b.start + len(b.tokens)) for b in batch],
            every_row=[np.arange(lo, hi) for lo, hi in zip(bounds, bounds[1:])],
        )
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
