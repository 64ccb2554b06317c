"""The launch plan of one rank of a tensor-parallel group (`forge.sharding`): the single-GPU plan
over the rank's heads, FFN columns and vocabulary rows (`forge.shard_view`), plus the
collectives that make the ranks one model:

- after the attention output product and after the FFN's down product, the partial sums in ws.o
  are all-reduced, so every rank adds the same sum to its copy of the residual stream;
- the output head computes the rank's vocabulary rows into a buffer of its own; all-gathered and
  put back in vocabulary order (layer.hip's unshard_rows), every rank holds every logit and
  picks the same tokens from the same sampling parameters, as the next step needs on each rank.

The collectives go on the plan's stream, so a captured decode step replays them with its kernels.
"""

from __future__ import annotations

from forge.kernels import KernelTable
from forge.models.spec import ModelSpec
from forge_hip.arena import WeightArena
from forge_hip.collectives import Communicator
from forge_hip.executor import Launcher
from forge_hip.library import KernelLibrary
from forge_hip.plan import Plan
from forge_hip.products import NORM_THREADS
from forge_hip.tuning import Tuning
from forge_hip.workspace import Workspace, out_rows


class _ReducedFFNs:
    """An FFN part runner whose output (ws.o) is all-reduced after each run."""

    def __init__(self, inner, reduce):  # noqa: ANN001 - DenseFFNs, ShardedPlan._reduce
        self._inner, self._reduce = inner, reduce

    def part(self, prefix: str):  # noqa: ANN201 - the inner runner's launches
        return self._inner.part(prefix)

    def run(self, part, rows: int, norm) -> None:  # noqa: ANN001
        self._inner.run(part, rows, norm)
        self._reduce(rows)


class ShardedPlan(Plan):
    """`Plan` for rank `comm.rank` of `comm.world`; `vocab[r]` are rank r's output-head rows."""

    def __init__(self, spec: ModelSpec, kernels: KernelTable, lib: KernelLibrary,
                 arena: WeightArena, ws: Workspace, launch: Launcher, warp: int, tune: Tuning,
                 *, comm: Communicator, vocab: tuple[range, ...]):  # fmt: skip
        self.comm, self.vocab, self._rt = comm, vocab, lib.runtime
        self.part = max(len(v) for v in vocab)  # the gathered rows' stride per rank
        rows, self._bufs = out_rows(spec), []
        try:
            for n in (1, comm.world):
                self._bufs.append(self._rt.alloc(4 * n * rows * self.part))
            self.shard_logits, self.gathered = (b.ptr for b in self._bufs)
            super().__init__(spec, kernels, lib, arena, ws, launch, warp, tune)
            self.ffns = _ReducedFFNs(self.ffns, self._reduce)
            self.unshard = lib.get("unshard_rows")
            # NCCL sets a communicator up on its first collective: not inside a graph capture
            self._reduce(1)
            self._rt.synchronize(self.launch.stream)
        except BaseException:
            self.close()
            raise

    def _head_out(self) -> int:
        return self.shard_logits

    def _reduce(self, rows: int) -> None:
        self.comm.all_reduce(self.ws.o, rows * self.spec.n_embd, self.launch.stream)

    def _attention(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super()._attention(*args, **kwargs)
        self._reduce(args[2])  # (i, launches, rows, ...)

    def _logits_done(self, rows: int) -> None:
        """Every rank's logits of `rows` rows into ws.logits, in vocabulary order."""
        self.comm.all_gather(self.shard_logits, self.gathered, rows * self.part,
                             self.launch.stream)  # fmt: skip
        args = [self.gathered, self.ws.logits, rows, self.spec.n_vocab, self.part]
        self.launch(self.unshard, (rows, self.comm.world), (NORM_THREADS,), args)

    def close(self) -> None:
        """Free the rank's logits buffers (the rest belongs to the runner)."""
        for buf in self._bufs:
            self._rt.free(buf)
        self._bufs = []
