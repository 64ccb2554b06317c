"""Activation buffers of a forward pass, sized once for a row capacity, in one allocation.

Rows are tokens of a (chunk of a) batch: at most `ROW_CAP` per pass (larger batches are cut into
chunks). Logits are produced for at most `out_rows` rows at a time (bounded by OUT_BYTES).
"""

from __future__ import annotations

from forge.models.spec import ExpertFFN, ModelSpec
from forge_hip.arena import align
from forge_hip.contract import constants
from forge_hip.runtime.base import DeviceBuffer, Runtime
from forge_hip.tuning import DEFAULT, Tuning, mvq_xbytes

ROW_CAP = 512  # token rows per forward pass (the API's prefill chunk)
OUT_BYTES = 64 << 20  # bound of the logits buffer
MAX_SPLITS = 64  # decode attention splits over the KV length (the plan keeps a wave of blocks)
ROWS_SPLITS = 16  # the same for prompt pieces of up to 16 rows, and one-row per-head decode
PART_ROWS = 4 * ROW_CAP  # (row, split) pairs the attention partials hold (prompt pieces' splits)
DESC_LEN = constants()["DESC_LEN"]  # int64 per matrix descriptor


def mask_words(n_vocab: int) -> int:
    """u32 words of one row's token mask (forge.backend.pack_token_mask)."""
    return -(-n_vocab // 32)


def out_rows(spec: ModelSpec) -> int:
    """Rows of logits one output pass holds."""
    return max(1, min(ROW_CAP, OUT_BYTES // (4 * spec.n_vocab)))


def buffer_sizes(spec: ModelSpec, n_desc: int, tune: Tuning = DEFAULT) -> dict[str, int]:
    """Bytes of each workspace buffer."""
    s, r, o = spec, ROW_CAP, out_rows(spec)
    part_rows = PART_ROWS
    widest = max(s.n_embd, s.ffn.n_ff, s.n_head * s.head_dim_v)
    return {
        **{f"r{mode}": 4 * r * widest for mode in (1, 2, 3, 4)},  # rounded activations
        "x": 4 * r * s.n_embd,
        "x2": 4 * s.n_embd,  # the residual's other buffer for one-row steps (fused add_norm)
        "h": 4 * r * s.n_embd,
        "o": 4 * r * s.n_embd,
        "q": 4 * r * s.n_head * s.head_dim,
        "k": 4 * r * s.n_head_kv * s.head_dim,
        "v": 4 * r * s.n_head_kv * s.head_dim_v,
        "attn": 4 * r * s.n_head * s.head_dim_v,
        "g": 4 * r * s.ffn.n_ff,
        "u": 4 * r * s.ffn.n_ff,
        "part_o": 4 * part_rows * s.n_head * s.head_dim_v,
        "part_ml": 8 * part_rows * s.n_head,
        "att_cnt": 4 * r * s.n_head,  # attention's split counters (zero between launches)
        "rope_freqs": 4 * s.n_layer * (s.rope_dim // 2),  # forge_hip.attention_part's tables
        "hg": 4 * o * s.n_embd,
        "logits": 4 * o * s.n_vocab,
        "am": 4 * o,
        "smp_part": 4 * 3 * o * tune.sample_parts,  # sample_rows' per-slice (max, id, bad)
        "smp_cnt": 4 * o,  # sample_rows' slice counters (zero between launches)
        "descs": 8 * DESC_LEN * n_desc,
        "descs_p": 8 * DESC_LEN * n_desc,  # the same, reading rounded activations (prefill)
        # int8 x of mmq.hip launches (64 rows) and of mmv.hip products (every row of a pass:
        # batch-invariant passes keep types mmq.hip does not take on mmv.hip past 64 rows)
        "xq": mvq_xbytes(3, r, widest),
        **expert_buffer_sizes(spec),
    }


def expert_buffer_sizes(spec: ModelSpec) -> dict[str, int]:
    """The buffers of forge_hip.experts (none for a dense FFN): per (row, slot) pair of a pass
    its expert, weight, sorted place, x rounded in sorted order, gate/up and down outputs."""
    f = spec.ffn
    if not isinstance(f, ExpertFFN):
        return {}
    pairs = ROW_CAP * f.n_expert_used
    return {
        "moe_logits": 4 * ROW_CAP * f.n_expert,
        "moe_ids": 4 * pairs,
        "moe_w": 4 * pairs,
        "moe_order": 4 * pairs,
        "moe_pos": 4 * pairs,
        "moe_tiles": 4 * 3 * (pairs + f.n_expert),  # (expert, first pair, pairs) per tile
        "moe_xq": mvq_xbytes(3, pairs, max(spec.n_embd, f.n_ff)),  # both roundings
        "moe_g": 4 * pairs * f.n_ff,
        "moe_y": 4 * pairs * spec.n_embd,
    }


def n_descs(spec: ModelSpec) -> int:
    """Matrix descriptors: per layer Q, K, V, O, gate, up, down (and a router); two for the
    output head."""
    return 8 * spec.n_layer + 2


def workspace_bytes(spec: ModelSpec, tune: Tuning = DEFAULT) -> int:
    return sum(align(v) for v in buffer_sizes(spec, n_descs(spec), tune).values())


class Workspace:
    """The buffers of `buffer_sizes`, as attributes holding device addresses."""

    def __init__(self, rt: Runtime, spec: ModelSpec, tune: Tuning = DEFAULT):
        self.rt = rt
        sizes = buffer_sizes(spec, n_descs(spec), tune)
        self.nbytes = sum(align(v) for v in sizes.values())
        self.buffer: DeviceBuffer | None = rt.alloc(self.nbytes)
        at = self.buffer.ptr
        self.ptr: dict[str, int] = {}
        for name, size in sizes.items():
            self.ptr[name] = at
            at += align(size)

    def __getattr__(self, name: str) -> int:
        ptr = self.__dict__.get("ptr", {})
        if name in ptr:
            return ptr[name]
        raise AttributeError(name)

    def close(self) -> None:
        if self.buffer is not None:
            self.rt.free(self.buffer)
            self.buffer = None
