"""The transformer blocks of the cpu_simd forward pass, one class per part of `forge.models.spec`.

Each block loads its part's weights (rows of `forge.models.weights`) and computes, for hidden
states x [rows, n_embd], the residual stream after it. The runner holds one attention block and
one FFN block per layer, the FFN block chosen by the type of `spec.ffn` (`FFN_BLOCKS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from forge.models.rope import FREQS_TENSOR, rope_frequencies
from forge.models.spec import DenseFFN, ExpertFFN, LayerSpec, ModelSpec
from forge_cpu_simd import ops
from forge_cpu_simd.experts import ExpertFFNBlock
from forge_cpu_simd.kv_store import KvArray, consecutive, query_rounding
from forge_cpu_simd.loading import WeightLoader


@dataclass
class Step:
    """What every layer of one forward pass shares: the new rows' positions and cache slots,
    each sequence's cache slots of positions 0 .. its last, and per-pass memos."""

    pos: np.ndarray  # int64 [rows]: position of each new row
    # per cache pool (None: the full layers', else a sliding window's), the cache slot each new
    # row's K/V goes to (int64 [rows]), and per sequence the slots of its positions 0 .. last
    slots: dict[int | None, np.ndarray]
    past: dict[int | None, list[np.ndarray]]
    every_row: list[np.ndarray]  # per sequence: its rows of the pass
    rope: dict = field(default_factory=dict)  # frequencies -> (cos, sin) [rows, rope_dim/2]
    keys: dict = field(default_factory=dict)  # decode_attention's padded key slots, by layout
    layouts: dict = field(default_factory=dict)  # query lists' row layouts, by id
    spans: dict = field(default_factory=dict)  # (pool, sequence, lo, hi) -> cache slots to read

    def rope_tables(self, freqs: np.ndarray, mscale: float,
                    key: tuple) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """cos, sin of the pass's positions for these frequencies; `key` names them (layers
        with equal frequencies share the tables)."""
        found = self.rope.get(key)
        if found is None:
            found = self.rope[key] = ops.rope_tables(self.pos, freqs, mscale)
        return found

    def layout(self, queries: list[np.ndarray]) -> tuple:
        """Of a list of per-sequence query rows, the same for every layer of the pass that
        attends with it: the kept rows in order (int64), each sequence's first output row and
        the end, the sequences with exactly one query row, and per sequence its query rows'
        (positions, lowest, highest) (None without query rows)."""
        found = self.layouts.get(id(queries))
        if found is None or found[0] is not queries:
            sizes = [sel.size for sel in queries]
            kept = np.concatenate(queries).astype(np.int64)
            starts = np.cumsum([0] + sizes)
            singles = [i for i, n in enumerate(sizes) if n == 1]
            ranges = []
            for sel in queries:
                qpos = self.pos[sel]
                ranges.append((qpos, int(qpos.min()), int(qpos.max())) if sel.size else None)
            found = self.layouts[id(queries)] = (queries, kept, starts, singles, ranges)
        return found[1:]

    def key_slots(self, pool: int | None, seq: int, lo: int, hi: int) -> np.ndarray | slice:
        """The cache slots of sequence `seq`'s positions lo .. hi - 1 in `pool`: a slice when
        they are one run (KvArray.read then gives a view), else the slot array."""
        key = (pool, seq, lo, hi)
        found = self.spans.get(key)
        if found is None:
            slots = self.past[pool][seq][lo:hi]
            run = consecutive(slots)
            found = self.spans[key] = slots if run is None else run
        return found


class AttentionBlock:
    """Grouped-query attention over the paged cache (`forge.models.spec.Attention`)."""

    def __init__(self, spec: ModelSpec, layer: LayerSpec, load: WeightLoader, prefix: str, ops_):
        a = spec.attention
        self.spec, self.layer, self.ops = spec, layer, ops_
        self.pool: int | None = None  # its cache's pool (the runner's allocate_kv sets it)
        self.norm = load.vector(prefix + "attn_norm.weight")
        self.qkv = load.linear([prefix + f"attn_{x}.weight" for x in "qkv"],
                               [prefix + f"attn_{x}.bias" for x in "qkv"] if a.qkv_bias
                               else None)  # fmt: skip
        self.q_norm = load.vector(prefix + "attn_q_norm.weight") if a.qk_norm else None
        self.k_norm = load.vector(prefix + "attn_k_norm.weight") if a.qk_norm else None
        self.wo = load.linear([prefix + "attn_output.weight"],
                              [prefix + "attn_output.bias"] if a.out_bias else None)  # fmt: skip
        self.post_norm = load.vector(prefix + "post_attention_norm.weight") if a.post_norm else None
        # passed to the attention ops only when the model has them (kernels may predate them)
        self.sinks = {"sinks": load.vector(prefix + "attn_sinks.weight")} if a.sinks else {}
        factors = load.vector(FREQS_TENSOR) if layer.rope.kind == "llama3" else None
        self.rope_freqs = rope_frequencies(spec.rope_dim, layer.rope_base, layer.rope, factors)
        self._rope_key = (self.rope_freqs.tobytes(), layer.rope.mscale)

    def __call__(self, x, kc: KvArray, vc: KvArray, step: Step,
                 queries: list[np.ndarray]) -> np.ndarray:  # fmt: skip
        """The residual stream of the rows in `queries` after attention; K/V of every row of x
        are stored into this layer's cache kc, vc first."""
        s, n = self.spec, x.shape[0]
        h = self.ops.rms_norm(x, self.norm, s.rms_eps)
        q, k, v = self.qkv(h)
        q = q.reshape(n, s.n_head, s.head_dim)  # [rows, H, D]
        k = k.reshape(n, s.n_head_kv, s.head_dim)  # [rows, Hkv, D]
        v = v.reshape(n, s.n_head_kv, s.head_dim_v)  # [rows, Hkv, Dv]
        if self.q_norm is not None:
            q = self.ops.rms_norm(q, self.q_norm, s.rms_eps)
            k = self.ops.rms_norm(k, self.k_norm, s.rms_eps)
        cos, sin = step.rope_tables(self.rope_freqs, self.layer.rope.mscale, self._rope_key)
        self.ops.rope(q, cos, sin, s.rope_neox)
        self.ops.rope(k, cos, sin, s.rope_neox)
        kc.write(step.slots[self.pool], k)
        vc.write(step.slots[self.pool], v)
        kept = step.layout(queries)[0]
        if kept.size == 0:
            return x[:0]
        rounding = query_rounding(kc.fmt)  # as llama.cpp's attention over that K format
        if rounding is not None:
            q = rounding(q.reshape(n * s.n_head, s.head_dim)).reshape(q.shape)
        attn = self._attend(q, kc, vc, step, queries)  # [kept, H, Dv]
        o = self.wo(attn.reshape(kept.size, -1))
        if self.post_norm is not None:
            o = self.ops.rms_norm(o, self.post_norm, s.rms_eps)
        return (x[kept] if kept.size != n else x) + o

    def _attend(self, q, kc, vc, step: Step, queries: list[np.ndarray]) -> np.ndarray:
        """Attention output [query rows, heads, Dv] of every sequence's query rows, in order.

        Sequences with one query row (decode steps, the last layer of a prefill) go through
        `decode_attention` together: one set of products instead of one per sequence.
        """
        s, window = self.spec, self.layer.sliding_window
        past = step.past[self.pool]
        _, starts, singles, ranges = step.layout(queries)
        attn = np.empty((starts[-1], s.n_head, s.head_dim_v), np.float32)
        if len(singles) < 2:
            singles = []
        if singles:
            key = (self.pool, window, tuple(singles))
            if key not in step.keys:
                step.keys[key] = _padded_keys(past, queries, step.pos, singles, window)
            rows, past_slots, valid = step.keys[key]
            attn[starts[singles]] = self.ops.decode_attention(
                q[rows],
                kc.read(past_slots),
                vc.read(past_slots),
                valid,
                s.attn_scale,
                **self.sinks,
            )
        single = set(singles)
        for i, sel in enumerate(queries):
            if sel.size == 0 or i in single:
                continue
            qpos, first, last = ranges[i]
            hi = last + 1
            lo = 0 if window is None else max(0, first - window + 1)
            # only the keys some query sees are read (the op takes positions from k's first)
            keys = step.key_slots(self.pool, i, lo, hi)
            attn[starts[i] : starts[i + 1]] = self.ops.attention(
                q[sel], kc.read(keys), vc.read(keys), qpos - lo, s.attn_scale, window,
                **self.sinks,
            )  # fmt: skip
        return attn

    @property
    def nbytes(self) -> int:
        return weights_nbytes(self)


class DenseFFNBlock:
    """The gated feed-forward network (`forge.models.spec.DenseFFN`)."""

    def __init__(self, spec: ModelSpec, load: WeightLoader, prefix: str, ops_):
        f: DenseFFN = spec.ffn
        self.eps, self.ops = spec.rms_eps, ops_
        self.act = getattr(ops_, f.activation)
        self.norm = load.vector(prefix + "ffn_norm.weight")
        self.gate_up = load.linear([prefix + "ffn_gate.weight", prefix + "ffn_up.weight"])
        self.down = load.linear([prefix + "ffn_down.weight"])
        self.post_norm = load.vector(prefix + "post_ffw_norm.weight") if f.post_norm else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        h = self.ops.rms_norm(x, self.norm, self.eps)
        gate, up = self.gate_up(h)
        d = self.down(self.act(gate) * up)
        if self.post_norm is not None:
            d = self.ops.rms_norm(d, self.post_norm, self.eps)
        return x + d

    @property
    def nbytes(self) -> int:
        return weights_nbytes(self)


def weights_nbytes(block) -> int:  # noqa: ANN001
    """Bytes of the weights a block holds (its prepared matrices and vectors)."""
    return sum(getattr(v, "nbytes", 0) for v in vars(block).values() if v is not block.ops)


# FFN block class by the type of spec.ffn.
FFN_BLOCKS = {DenseFFN: DenseFFNBlock, ExpertFFN: ExpertFFNBlock}


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
