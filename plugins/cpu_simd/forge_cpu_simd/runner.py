"""The cpu_simd runner: the transformer forward pass of a `ModelSpec` in NumPy.

Weights are prepared once by the kernels that win in the kernel table (the built-in one
dequantizes to float32 for BLAS). The KV cache is paged: every layer keeps K and V in flat slot
arrays [n_blocks * block_size, n_head_kv, head_dim], and a sequence's block table maps its
positions to slots.
"""

from __future__ import annotations

import numpy as np

from forge.backend import Runner, SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError
from forge.gguf import GGUFFile
from forge.kernels import KernelTable
from forge.models.spec import ModelSpec
from forge_cpu_simd import ops
from forge_cpu_simd.matmul import embedding_rows
from forge_cpu_simd.plugin import ELEMENTWISE_OPS

BACKEND = "cpu_simd"


class _Linear:
    """A prepared weight plus the kernel that multiplies by it (and optional bias)."""

    def __init__(self, kernel, weight, bias: np.ndarray | None = None, split=None):
        self.kernel, self.weight, self.bias, self.split = kernel, weight, bias, split

    def __call__(self, x: np.ndarray):
        y = self.kernel(x, self.weight)
        if self.bias is not None:
            y += self.bias
        return np.split(y, self.split, axis=-1) if self.split else y


class _Ops:
    """The winning kernel of each non-matmul op, as attributes (self.ops.rms_norm(...))."""

    def __init__(self, kernels: KernelTable):
        for op in ELEMENTWISE_OPS:
            setattr(self, op, kernels.require(BACKEND, op).impl)


class CpuRunner(Runner):
    def __init__(self, spec: ModelSpec, gguf: GGUFFile, kernels: KernelTable, progress=None):
        self.spec, self.gguf, self.kernels = spec, gguf, kernels
        self.ops = _Ops(kernels)
        total = spec.n_layer + 1
        self.layers = []
        for i in range(spec.n_layer):
            self.layers.append(self._load_layer(i))
            if progress:
                progress(i + 1, total)
        self.output_norm = self._vector("output_norm.weight")
        out_name = "token_embd.weight" if spec.tied_output else "output.weight"
        self.output = self._linear([out_name])
        if progress:
            progress(total, total)
        self.embd_info = gguf.tensors["token_embd.weight"]
        self.k_cache: list[np.ndarray] = []
        self.v_cache: list[np.ndarray] = []
        self.block_size = 0

    # -- loading --------------------------------------------------------------------------------
    def _vector(self, name: str) -> np.ndarray:
        from forge_cpu_simd.dequant import dequantize

        info = self.gguf.tensors[name]
        return dequantize(self.gguf.raw(name), info.type, info.shape[0]).reshape(-1)

    def _linear(self, names: list[str], biases: list[str] | None = None) -> _Linear:
        infos = [self.gguf.tensors[n] for n in names]
        impls = [self.kernels.require(BACKEND, "matmul", i.type).impl for i in infos]
        prepared = [k.prepare(self.gguf.raw(n), i) for k, n, i in zip(impls, names, infos)]
        bias = np.concatenate([self._vector(b) for b in biases]) if biases else None
        if len(names) == 1:
            return _Linear(impls[0], prepared[0], bias)
        sizes = list(np.cumsum([i.shape[1] for i in infos])[:-1])
        if all(k is impls[0] for k in impls) and hasattr(impls[0], "fuse"):
            fused = impls[0].fuse(prepared)
            if fused is not None:
                return _Linear(impls[0], fused, bias, sizes)
        return _Stacked([_Linear(k, p) for k, p in zip(impls, prepared)], bias, sizes)

    def _load_layer(self, i: int) -> dict:
        s, p = self.spec, f"blk.{i}."
        layer = {
            "attn_norm": self._vector(p + "attn_norm.weight"),
            "qkv": self._linear(
                [p + f"attn_{x}.weight" for x in "qkv"],
                [p + f"attn_{x}.bias" for x in "qkv"] if s.qkv_bias else None,
            ),
            "wo": self._linear([p + "attn_output.weight"]),
            "ffn_norm": self._vector(p + "ffn_norm.weight"),
            "gate_up": self._linear([p + "ffn_gate.weight", p + "ffn_up.weight"]),
            "down": self._linear([p + "ffn_down.weight"]),
        }
        if s.qk_norm:
            layer["q_norm"] = self._vector(p + "attn_q_norm.weight")
            layer["k_norm"] = self._vector(p + "attn_k_norm.weight")
        if s.post_norms:
            layer["post_attn"] = self._vector(p + "post_attention_norm.weight")
            layer["post_ffn"] = self._vector(p + "post_ffw_norm.weight")
        return layer

    # -- cache ----------------------------------------------------------------------------------
    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        s, slots = self.spec, n_blocks * block_size
        try:
            self.k_cache = [
                np.zeros((slots, s.n_head_kv, s.head_dim), np.float32) for _ in range(s.n_layer)
            ]
            self.v_cache = [
                np.zeros((slots, s.n_head_kv, s.head_dim_v), np.float32) for _ in range(s.n_layer)
            ]
        except MemoryError:
            from forge.errors import OutOfMemoryError

            need = slots * s.kv_bytes_per_token()
            raise OutOfMemoryError(f"cannot allocate a {need / 2**20:.0f} MiB KV cache") from None
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
        pos = np.concatenate([np.arange(b.start, b.start + len(b.tokens)) for b in batch])
        bounds = np.cumsum([0] + [len(b.tokens) for b in batch])
        slots = np.concatenate([self._slots(b, b.start, b.start + len(b.tokens)) for b in batch])
        past = [self._slots(b, 0, b.start + len(b.tokens)) for b in batch]  # same every layer
        x = embedding_rows(self.gguf.raw("token_embd.weight"), self.embd_info, ids)
        if s.embed_scale != 1.0:
            x *= np.float32(s.embed_scale)
        rows = self._output_rows(batch, bounds)
        every_row = [np.arange(lo, hi) for lo, hi in zip(bounds, bounds[1:])]
        rope_cache: dict[tuple[float, float], tuple[np.ndarray, np.ndarray]] = {}
        keys_cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        last = s.n_layer - 1
        for li, (layer, lspec) in enumerate(zip(self.layers, s.layers)):
            key = (lspec.rope_base, lspec.rope_scale)
            if key not in rope_cache:
                rope_cache[key] = ops.rope_tables(pos, s.rope_dim, *key)
            # The last layer's attention output and FFN matter only for rows whose logits are
            # wanted (its K/V are still cached for every row).
            queries = rows if li == last else every_row
            x = self._layer(
                li, layer, lspec, x, pos, slots, past, queries, rope_cache[key], keys_cache
            )
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

    def _layer(self, li, layer, lspec, x, pos, slots, past, queries, rope_cs, keys_cache):
        """One transformer block; returns the new hidden state of the rows in `queries`."""
        s = self.spec
        n = x.shape[0]
        h = self.ops.rms_norm(x, layer["attn_norm"], s.rms_eps)
        q, k, v = layer["qkv"](h)
        q = q.reshape(n, s.n_head, s.head_dim)
        k = k.reshape(n, s.n_head_kv, s.head_dim)
        v = v.reshape(n, s.n_head_kv, s.head_dim_v)
        if s.qk_norm:
            q = self.ops.rms_norm(q, layer["q_norm"], s.rms_eps)
            k = self.ops.rms_norm(k, layer["k_norm"], s.rms_eps)
        self.ops.rope(q, *rope_cs, s.rope_neox)
        self.ops.rope(k, *rope_cs, s.rope_neox)
        kc, vc = self.k_cache[li], self.v_cache[li]
        kept = np.concatenate(queries).astype(np.int64)
        kc[slots] = k
        vc[slots] = v
        attn = self._attention(q, kc, vc, pos, past, queries, lspec.sliding_window, keys_cache)
        if kept.size == 0:
            return x[:0]
        x = x[kept] if kept.size != n else x
        o = layer["wo"](attn.reshape(kept.size, -1))
        if s.post_norms:
            o = self.ops.rms_norm(o, layer["post_attn"], s.rms_eps)
        x = x + o
        h = self.ops.rms_norm(x, layer["ffn_norm"], s.rms_eps)
        gate, up = layer["gate_up"](h)
        d = layer["down"](getattr(self.ops, s.activation)(gate) * up)
        if s.post_norms:
            d = self.ops.rms_norm(d, layer["post_ffn"], s.rms_eps)
        return x + d

    def _attention(self, q, kc, vc, pos, past, queries, window, keys_cache) -> np.ndarray:
        """Attention output [query rows, heads, Dv] of every sequence's query rows, in order.

        Sequences with one query row (decode steps, the last layer of a prefill) go through
        `decode_attention` together: one set of products instead of one per sequence.
        """
        s = self.spec
        sizes = [sel.size for sel in queries]
        starts = np.cumsum([0] + sizes)
        attn = np.empty((starts[-1], s.n_head, s.head_dim_v), np.float32)
        singles = [i for i, n in enumerate(sizes) if n == 1]
        if len(singles) < 2:
            singles = []
        if singles:
            key = (window, tuple(singles))
            if key not in keys_cache:
                keys_cache[key] = _padded_keys(past, queries, pos, singles, window)
            rows, past_slots, valid = keys_cache[key]
            attn[starts[singles]] = self.ops.decode_attention(
                q[rows], kc, vc, past_slots, valid, s.attn_scale
            )
        single = set(singles)
        for i, (seq_past, sel) in enumerate(zip(past, queries)):
            if sel.size == 0 or i in single:
                continue
            attn[starts[i] : starts[i + 1]] = self.ops.attention(
                q[sel], kc[seq_past], vc[seq_past], pos[sel], s.attn_scale, window
            )
        return attn

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
        weights = sum(_nbytes(layer) for layer in self.layers) + _nbytes(self.output)
        kv = sum(a.nbytes for a in self.k_cache + self.v_cache)
        return {"weights": weights, "kv_cache": kv}


def _padded_keys(past, queries, pos, seqs, window):
    """For the listed sequences' single query rows: those rows' indices, the cache slots
    [len(seqs), T] of the keys each sees (causal and sliding-window limits applied), padded on
    the right with slot 0, and their mask."""
    rows = np.array([queries[i][0] for i in seqs])
    spans = []
    for i, p in zip(seqs, pos[rows].tolist()):
        lo = 0 if window is None else max(0, p - window + 1)
        spans.append(past[i][lo : p + 1])
    width = max(len(span) for span in spans)
    slots = np.zeros((len(spans), width), np.int64)
    valid = np.zeros((len(spans), width), bool)
    for r, span in enumerate(spans):
        slots[r, : len(span)] = span
        valid[r, : len(span)] = True
    return rows, slots, valid


class _Stacked:
    """Several separately prepared weights applied to the same input (unfusable kernels)."""

    def __init__(self, parts: list[_Linear], bias: np.ndarray | None, sizes: list[int]):
        self.parts, self.bias, self.sizes = parts, bias, sizes

    def __call__(self, x):
        ys = [p(x) for p in self.parts]
        if self.bias is None:
            return ys
        return np.split(np.concatenate(ys, axis=-1) + self.bias, self.sizes, axis=-1)


def weight_bytes(spec: ModelSpec, gguf: GGUFFile) -> int:
    """Bytes the prepared (float32) weights take. An untied token_embd.weight is not counted:
    embedding rows are dequantized from the mapped file as they are looked up."""
    names = [n for n in spec.weight_names() if spec.tied_output or n != "token_embd.weight"]
    return sum(gguf.tensors[n].n_elements * 4 for n in names)


def _nbytes(obj) -> int:
    if hasattr(obj, "nbytes"):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, _Linear):
        return _nbytes(obj.weight)
    if isinstance(obj, _Stacked):
        return sum(_nbytes(p) for p in obj.parts)
    return 0
