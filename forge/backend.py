"""The contract between the core and a backend plugin.

A backend class (registered through `forge_register_backends`) probes the machine and, when chosen,
opens a `Runner` for one model: the runner places the weights on its device, owns the KV-cache
storage, and runs forward passes over batches of sequences. Everything about sequences, scheduling
and sampling stays in the core; the runner only computes.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np

from forge.devices import BackendProbe
from forge.errors import UsageError

if TYPE_CHECKING:
    from forge.gguf import GGUFFile
    from forge.kernels import KernelTable
    from forge.kv_cache import KvTypes
    from forge.models.spec import ModelSpec


@dataclass
class SeqBatch:
    """New tokens of one sequence to run in a forward pass.

    `tokens` are appended at positions start .. start+len(tokens)-1; `block_table` lists the
    KV-cache blocks (physical ids, in order) that hold positions 0 .. start+len(tokens)-1.
    """

    tokens: np.ndarray  # int32 [n_new]
    start: int  # position of tokens[0]; equals how many tokens this sequence already cached
    block_table: np.ndarray  # int32 [n_blocks_used]
    output: Literal["last", "all", "none"] = "last"  # which rows of logits to return
    # with `Runner.windowed_kv`: per sliding window (ascending), the sequence's blocks in that
    # window's pool, -1 for blocks that left the window
    window_tables: tuple[np.ndarray, ...] = ()


@dataclass(frozen=True)
class Shard:
    """The part of a model that one device holds and computes (Megatron-style tensor
    parallelism: whole heads, FFN columns and vocabulary rows per device)."""

    rank: int  # 0 .. world size - 1
    device: int  # device index within the backend
    device_name: str
    heads: range  # query heads it computes (with their Q rows and attention output columns)
    kv_heads: range  # KV heads its cache holds (replicated when fewer than devices)
    ffn_columns: range  # gate/up columns (down rows) of the FFN
    vocab: range  # rows of the output head (its logits)


@dataclass(frozen=True)
class Placement:
    """Where a runner put its model: one shard per device, together covering every head, FFN
    column and vocabulary row."""

    shards: tuple[Shard, ...]

    @property
    def world_size(self) -> int:
        return len(self.shards)

    @classmethod
    def single(cls, spec: ModelSpec, device: int = 0, device_name: str = "") -> Placement:
        """The whole model on one device."""
        ffn = getattr(spec.ffn, "n_ff", 0)
        return cls((Shard(0, device, device_name, range(spec.n_head), range(spec.n_head_kv),
                          range(ffn), range(spec.n_vocab)),))  # fmt: skip


@dataclass(frozen=True)
class DeviceSampling:
    """How to pick one sequence's next token without the host: the built-in chain top_k ->
    top_p -> min_p -> temperature -> draw (`forge.sampling`'s stages, same rules and ties), or
    the argmax when `temperature` is 0.

    The draw takes the first kept token, in token-id order, whose running sum of
    softmax weights exceeds ``u`` times their total, with ``u = philox_uniform(key, counter)``:
    the same key and counter (the sequence's token index) always give the same ``u``.
    """

    temperature: float = 0.0  # 0: argmax (lowest id among ties)
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    key: int = 0  # 64-bit key of the sequence's random stream
    counter: int = 0  # which draw of that stream (32-bit)
    # the tokens allowed at this step (structured output), as `pack_token_mask` packs them;
    # None: every token. Masked tokens' logits are -inf before the chain runs.
    mask: np.ndarray | None = field(default=None, compare=False)

    @property
    def log_min_p(self) -> float:
        return math.log(self.min_p) if self.min_p > 0.0 else -math.inf


def pack_token_mask(allowed: np.ndarray) -> np.ndarray:
    """A bool array [n_vocab] of allowed tokens as uint32 words: token i is bit i % 32 of word
    i // 32 (the layout sampling.hip's mask_logits reads)."""
    bits = np.packbits(np.asarray(allowed, bool), bitorder="little")
    words = np.zeros(-(-bits.size // 4) * 4, np.uint8)
    words[: bits.size] = bits
    return words.view("<u4").astype(np.uint32)


def unpack_token_mask(mask: np.ndarray, n_vocab: int) -> np.ndarray:
    """The bool array [n_vocab] a `pack_token_mask` result holds."""
    bits = np.unpackbits(np.asarray(mask, "<u4").view(np.uint8), bitorder="little")
    return bits[:n_vocab].astype(bool)


_M32 = 0xFFFFFFFF


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
    four 32-bit words from a 128-bit counter block and a 64-bit key."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * x0, 0xCD9E8D57 * x2
        x0, x1, x2, x3 = (
            ((p1 >> 32) ^ x1 ^ k0) & _M32,
            p1 & _M32,
            ((p0 >> 32) ^ x3 ^ k1) & _M32,
            p0 & _M32,
        )
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return x0, x1, x2, x3


def philox_uniform(key: int, counter: int) -> float:
    """A uniform double in [0, 1): 53 bits of the first two words of Philox4x32-10 with key
    (key's low 32 bits, high 32 bits) and counter block (counter, 0, 0, 0). sampling.hip
    computes the same."""
    x0, x1, _, _ = philox4x32((counter & _M32, 0, 0, 0), (key & _M32, (key >> 32) & _M32))
    return ((x0 >> 5) * 67108864 + (x1 >> 6)) / 9007199254740992.0


def sample_host(logits: np.ndarray, pick: DeviceSampling) -> int:
    """`pick` applied on the host to one logits row [n_vocab] with forge.sampling's own stages:
    the reference of a device's `forward_sample`."""
    from forge.sampling.pickers import check_top, greedy_pick
    from forge.sampling.select import survivors, weighted_index
    from forge.sampling.stages import MinP, Temperature, TopK, TopP

    work = np.array(logits, dtype=np.float32)
    if pick.mask is not None:
        work[~unpack_token_mask(pick.mask, work.size)] = -np.inf
    if pick.temperature == 0.0:
        return greedy_pick(work, None)
    check_top(float(work.max()))
    stages = [TopK(pick.top_k) if pick.top_k > 0 else None,
              TopP(pick.top_p) if pick.top_p < 1.0 else None,
              MinP(pick.min_p) if pick.min_p > 0.0 else None,
              Temperature(pick.temperature) if pick.temperature != 1.0 else None]  # fmt: skip
    for stage in stages:
        if stage is not None:
            work = stage(work, None)
    top = work.max()
    ids, values = survivors(work)
    i = weighted_index(np.exp(values - top), philox_uniform(pick.key, pick.counter))
    return int(i if ids is None else ids[i])


# Prompt tokens per pass unless a runner says otherwise (`Runner.prefill_chunk`): a long prompt
# runs in pieces, so decoding sequences beside it are not stalled for its whole length.
PREFILL_CHUNK = 256


class Runner(ABC):
    """A model placed on its device(s), ready to run forward passes."""

    spec: ModelSpec
    # Prompt tokens a pass takes at once: the piece a long prompt runs in (engine, `Model.logits`,
    # `forge bench`). Larger pieces read the weights fewer times; a runner whose passes take more
    # rows says so.
    prefill_chunk: ClassVar[int] = PREFILL_CHUNK
    # Most token rows a pass takes in one piece (None: no limit). The scheduler then keeps a
    # step's prompt rows within it beside the step's decode rows (a larger step would run as
    # several passes, its fed tokens read back between them).
    pass_rows: ClassVar[int | None] = None
    # True when `forward_sample` picks on the device (only token ids come back); the engine
    # then uses it for every sequence whose chain `DeviceSampling` can express.
    samples_on_device: ClassVar[bool] = False
    # True when `start_sample` takes `feed`: a sequence's next token straight from the ids the
    # previous started step picked, before they are read (the engine then runs one step ahead).
    feeds_picks: ClassVar[bool] = False
    # True when sliding-window layers keep a cache of their own: `allocate_kv` takes
    # `window_blocks` and passes read `SeqBatch.window_tables` for those layers.
    windowed_kv: ClassVar[bool] = False

    @abstractmethod
    def allocate_kv(self, n_blocks: int, block_size: int) -> None:
        """Allocate KV storage for `n_blocks` blocks of `block_size` positions for every layer
        (a `windowed_kv` runner also takes `window_blocks`: {window: blocks} of the pools its
        layers of that sliding window use instead)."""

    @abstractmethod
    def forward(self, batch: list[SeqBatch]) -> list[np.ndarray | None]:
        """Run one forward pass over all sequences together and write their K/V into the cache.

        Returns, per sequence, float32 logits of shape [rows, n_vocab] for the rows its `output`
        asked for ("last": 1 row, "all": len(tokens) rows), or None for "none".
        """

    def forward_argmax(self, batch: list[SeqBatch]) -> list[int]:
        """Greedy shortcut: the argmax token of each sequence's last row. Backends that can
        pick on the device override this so that no logits row is copied to the host."""
        rows = self.forward([replace(b, output="last") for b in batch])
        return [int(np.argmax(r[-1])) for r in rows if r is not None]

    def forward_sample(
        self, batch: list[SeqBatch], picks: list[DeviceSampling | None]
    ) -> list[int | None]:
        """Run `batch` and pick the next token of each sequence whose `picks` entry is given
        (its last row; None entries produce no row and get None). This default computes the
        logits and picks on the host (`sample_host`); backends with `samples_on_device`
        override it so that only token ids leave the device."""
        rows = self.forward([replace(b, output="last" if p is not None else "none")
                             for b, p in zip(batch, picks)])  # fmt: skip
        return [None if p is None else sample_host(r[-1], p) for r, p in zip(rows, picks)]

    def start_sample(
        self,
        batch: list[SeqBatch],
        picks: list[DeviceSampling | None],
        feed: list[int] | None = None,
        feed_from: Callable[[], list[int | None]] | None = None,
    ) -> Callable[[], list[int | None]]:
        """Start `forward_sample(batch, picks)` and return a function that waits for its
        tokens. The engine does its host work for the previous tokens in between, so a runner
        whose passes run asynchronously (a GPU) overlaps the two. This default runs the pass
        before returning.

        `feed` (runners with `feeds_picks` only): per sequence, -1, or the batch row of the step
        `feed_from` (a function an earlier `start_sample` returned) whose picked token is this
        sequence's one token (its `tokens` are then a placeholder); `feed_from` need not have
        been called. Call each returned function before the runner's next pass, or, when that
        pass feeds from it, before the pass after that."""
        if feed is not None and any(f >= 0 for f in feed):
            raise NotImplementedError(f"{type(self).__name__} cannot feed picked tokens")
        tokens = self.forward_sample(batch, picks)
        return lambda: tokens

    def prepare_batches(self, max_seqs: int) -> None:  # noqa: B027 - optional hook
        """Called by a scheduler (after `allocate_kv`) before it runs anything: get ready for
        steps of up to `max_seqs` sequences now rather than during the first requests (a GPU
        runner captures the graphs it will replay). Nothing by default."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to free by default
        """Free device memory. Safe to call twice."""

    @property
    def placement(self) -> Placement:
        """Which device holds which part of the model (by default all of it on device 0)."""
        return getattr(self, "_placement", None) or Placement.single(self.spec)

    def memory_estimate(self) -> dict[str, int]:
        """Bytes this runner holds, by kind ("weights", "kv_cache", "workspace")."""
        return {}


def forward_in_chunks(runner: Runner, table, ids: np.ndarray, start: int, chunk: int,
                      output: str = "all", last: str | None = None):  # fmt: skip
    """Feed `ids` at positions start.. to `runner` in pieces of `chunk` tokens, as the engine
    runs a prompt: window blocks the next piece no longer reads go back first (`table`: a
    `forge.kv_pools.SeqBlocks`). Yields each piece's `forward` result; a piece asks for
    `output`, the last one for `last` when given."""
    for lo in range(0, len(ids), chunk):
        piece = ids[lo : lo + chunk]
        table.trim(start + lo)
        table.ensure(start + lo + len(piece))
        wanted = last if last is not None and lo + len(piece) == len(ids) else output
        batch = SeqBatch(piece, start + lo, table.array(), wanted, table.window_arrays())
        yield runner.forward([batch])[0]


def kv_type_args(method: Callable, kv_types: KvTypes, backend: str) -> dict:
    """The keyword arguments passing `kv_types` to a backend's `open_runner` or
    `memory_needed`: none when no type was chosen (backends written before KV types still
    work), a UsageError when one was and the method takes none."""
    if not kv_types.chosen:
        return {}
    if "kv_types" not in inspect.signature(method).parameters:
        raise UsageError(f"backend {backend!r} takes no KV cache types (kv_cache_type_k/v)")
    return {"kv_types": kv_types}


def option_args(method: Callable, **options: object) -> dict:
    """The `options` a backend's `open_runner` or `memory_needed` takes (a parameter of that
    name): options of one backend (cpu_simd's expert cache) pass by the others unseen."""
    params = inspect.signature(method).parameters
    return {k: v for k, v in options.items() if k in params}


class Backend(ABC):
    """A way to execute models. Subclasses are registered by plugins; `probe` must never raise."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def probe(self) -> BackendProbe:
        """Find what this backend can use here. Never raises: failures are reported as
        `BackendProbe(available=False, reason=...)`."""

    @abstractmethod
    def open_runner(
        self,
        spec: ModelSpec,
        gguf: GGUFFile,
        kernels: KernelTable,
        *,
        device: int = 0,
        progress: Callable[[int, int], None] | None = None,
        n_ctx: int | None = None,
        kv_types: KvTypes | None = None,
    ) -> Runner:
        """Place the model's weights on device `device` and return a runner for it.

        `n_ctx`, when given, is the context the caller will allocate KV blocks for, so that a
        memory preflight can count the KV cache too. `kv_types`: the formats asked for K and V
        (`forge.kv_cache.KvFormat`; None or a None field: the backend's choice); a format the
        backend cannot store is an UnsupportedModelError, raised before any weight loads.

        `progress(done, total)`, when given, is called as weights are placed.

        Raises `OutOfMemoryError` (after freeing what it took) when the weights do not fit.
        """

    def memory_needed(
        self, spec: ModelSpec, gguf: GGUFFile, n_ctx: int, kv_types: KvTypes | None = None
    ) -> dict[str, int]:
        """Estimated bytes to run this model with an `n_ctx` cache (`kv_types` as for
        open_runner): weights, kv_cache, workspace."""
        return {}
