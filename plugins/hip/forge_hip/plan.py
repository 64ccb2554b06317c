"""The launch plan of one forward pass: which kernels run, in which order, over which buffers.

Per layer and step, the attention part (`forge_hip.attention_part`: the Q/K/V product,
attention, the output product); then the FFN part (dense: the gate/up product with the
activation fused, the down product; a mixture of experts: `forge_hip.experts`). Between parts
one add + norm makes the next part's input; it often runs inside or just before the next
product's launch (`forge_hip.products.Fused`).
After the last layer: the output product, then (decode, or when ids are asked for) one token per
row picked on the device (sampling.hip: argmax or the top-k/top-p/min-p/temperature draw).

Product launches (path choice, descriptors, fusion) are `forge_hip.products`'; launch sizes are
`forge_hip.tuning`'s. Kernels come from the kernel table: a third-party kernel for an op, or a
"matmul" kernel for a weight type, replaces the built-in one (see `forge_hip.plugin`).
"""

from __future__ import annotations

from forge.kernels import KernelTable
from forge.models.spec import ExpertFFN, ModelSpec
from forge_hip.arena import WeightArena
from forge_hip.attention_part import AttentionLaunches, Attentions
from forge_hip.dense_ffn import DenseFFNs
from forge_hip.executor import Launcher
from forge_hip.experts import Experts
from forge_hip.invariance import products_for, warn_if_uncovered
from forge_hip.library import BUILTIN_OPS, SAMPLE_THREADS, KernelLibrary
from forge_hip.products import NORM_THREADS, Fused
from forge_hip.tuning import Tuning, sample_parts
from forge_hip.workspace import PART_ROWS, Workspace

MASK_BLOCKS = 8  # mask_logits blocks per row (a 262144-token row: 8192 words)


class Plan:
    """Resolves the kernels of a model and enqueues the launches of a forward pass."""

    def __init__(self, spec: ModelSpec, kernels: KernelTable, lib: KernelLibrary,
                 arena: WeightArena, ws: Workspace, launch: Launcher, warp: int,
                 tune: Tuning):  # fmt: skip
        self.spec, self.lib, self.arena, self.ws, self._launch = spec, lib, arena, ws, launch
        self.warp = warp
        w = arena.placed
        embd = w["token_embd.weight"]
        self.k_embed = lib.resolve(kernels.require("hip", "embed", embd.type).impl)
        self.op = {op: lib.resolve(kernels.require("hip", op).impl) for op in BUILTIN_OPS}
        builtin_decode = kernels.require("hip", "attn_decode").impl == BUILTIN_OPS["attn_decode"]
        self.feed_ids = lib.get("feed_ids")
        self.mask_logits = lib.get("mask_logits")
        make = products_for(kernels)  # (forge_hip.invariance: batch_invariant's, or the default)
        self.products = p = make(kernels, self.op, lib, arena, ws, launch, warp, tune)
        experts = isinstance(spec.ffn, ExpertFFN)
        warn_if_uncovered(kernels, experts)
        self.ffns = Experts(spec, p, lib, ws) if experts else DenseFFNs(spec, p, ws)
        self.attention, self.ffn = [], []
        self.attentions = Attentions(spec, p, lib, ws, self.op, warp, builtin_decode)
        for i in range(spec.n_layer):
            self.attention.append(self.attentions.part(i))
            self.ffn.append(self.ffns.part(f"blk.{i}."))
        out = "token_embd.weight" if spec.tied_output else "output.weight"
        self.out_h = p.add([(out, ws.h, self._head_out(), 0)])
        self.out_g = p.add([(out, ws.hg, self._head_out(), 0)])
        p.upload()
        self.embd = embd
        self.output_norm = w["output_norm.weight"].ptr
        self._head_norm: Fused | None = None  # the last add_norm, left to output()

    @property
    def launch(self) -> Launcher:
        """Where every launch of the plan goes (probes may put a recorder there)."""
        return self._launch

    @launch.setter
    def launch(self, launcher) -> None:  # noqa: ANN001 - a Launcher or a recording callable
        self._launch = self.products.launch = launcher

    @property
    def tune(self) -> Tuning:
        """The launch knobs (`forge_hip.tuning`), shared with the products."""
        return self.products.tune

    def _head_out(self) -> int:
        """Where the output product writes (a tensor-parallel rank: its own vocabulary rows)."""
        return self.ws.logits

    def _logits_done(self, rows: int) -> None:
        """After the output product: ws.logits holds `rows` rows (a rank gathers them here)."""

    # -- the pass ---------------------------------------------------------------------------------
    def layers_pass(self, rows: int, splits: int, meta, kv, decode: bool = False) -> None:
        """Embedding, every layer, and the final norm (into ws.h) for `rows` token rows.

        `decode`: every row is the one new token of its own sequence (attention then runs as one
        fused launch per layer). `splits`: most splits of an attention over the KV length (the
        kernels use fewer for short contexts, one split needing no merge)."""
        s, ws, L = self.spec, self.ws, self.launch
        splits = max(1, min(splits, PART_ROWS // rows))
        if decode and self.tune.att_fill:
            splits = min(splits, self.attentions.decode_splits(kv, rows, self.tune.att_fill))
        res = [ws.x, ws.x2]  # the residual stream; a fused add_norm writes the other buffer

        def add_norm(o, w_post, w_next, first, count, fuse=True):
            """x += post(o) (when o); h = norm(x) * w_next: launched, or (`fuse`) left to the
            launch of the product of descriptors first .. first + count - 1 (norm_fusable,
            norm_quantizable; "q": always, to the part that launches it), which it returns
            (Fused)."""
            head = first == self.out_h
            if not fuse:
                self._add_norm(rows, res[0], o, w_post, w_next)
                return None
            if fuse == "q" or self.products.norm_quantizable(first, count, rows, head):
                return Fused("q", [res[0], o, w_post, w_next, s.rms_eps])
            if o and self.products.norm_fusable(first, count, rows):
                args = [res[0], o, w_post, w_next, res[1], s.rms_eps]
                res.reverse()
                return Fused("n", args)
            self._add_norm(rows, res[0], o, w_post, w_next)
            return None

        L(self.feed_ids, (1,), (NORM_THREADS,), [meta.ids, meta.feed, ws.am, rows])
        L(self.k_embed, (rows,), (NORM_THREADS,), [self.embd.ptr, meta.ids, ws.x, s.n_embd,
                                                   s.embed_scale])  # fmt: skip
        first = self.attention[0]
        norm = add_norm(0, 0, first.norm, first.qkv, 3)
        for i, (attn, ffn) in enumerate(zip(self.attention, self.ffn)):
            self._attention(i, attn, rows, splits, meta, kv, decode, norm)
            self.ffns.run(ffn, rows, add_norm(ws.o, attn.post_norm, ffn.norm,
                                              *ffn.first_product))  # fmt: skip
            if i + 1 < s.n_layer:
                nxt = self.attention[i + 1]
                norm = add_norm(ws.o, ffn.post_norm, nxt.norm, nxt.qkv, 3)
            else:  # the head's: output() decides whether it computes it (gathered rows or not)
                self._head_norm = add_norm(ws.o, ffn.post_norm, self.output_norm, self.out_h, 1)

    def _attention(self, i: int, a: AttentionLaunches, rows: int, splits: int, meta, kv,
                   decode: bool, norm: Fused | None) -> None:  # fmt: skip
        """Layer i's attention part (`forge_hip.attention_part`; a tensor-parallel plan adds its
        all-reduce after it)."""
        self.attentions.run(i, a, rows, splits, meta, kv, decode, norm)

    def _add_norm(self, rows: int, x: int, o: int, w_post: int, w_next: int) -> None:
        """layer.hip's add_norm over `rows` rows: x += post(o) (when o), ws.h = norm(x) * w_next."""
        self.products.add_norm(rows, self.spec.n_embd, [x, o, w_post, w_next, self.spec.rms_eps])

    def output(self, rows: int, gather_idx: int | None, picks: tuple[int, int] | None,
               mask: int = 0) -> None:  # fmt: skip
        """Logits of `rows` rows of ws.h (gathered through `gather_idx` when given) into
        ws.logits; with `picks` = (sampling parameters, their field stride), one token per row
        into ws.am (parameter row i, or gather_idx[i] when gathering: see sampling.hip). `mask`
        (a device address, 0: none): each logits row's allowed tokens (mask_logits), the others
        set to -inf before the pick."""
        ws, norm, self._head_norm = self.ws, self._head_norm, None
        if norm is not None and gather_idx is not None:  # the last add_norm, unfused after all
            self._add_norm(1, *norm.args[:4])  # (left only by one-row passes)
            norm = None
        if gather_idx is not None:
            self.launch(self.op["gather_rows"], (rows,), (NORM_THREADS,),
                        [ws.h, gather_idx, ws.hg, self.spec.n_embd])  # fmt: skip
        self.products.matmul(self.out_g if gather_idx is not None else self.out_h, 1, rows, norm)
        self._logits_done(rows)
        if picks is not None:
            params, stride = picks
            cus = self.lib.runtime.props.compute_units
            if mask:
                self.launch(self.mask_logits, (rows, MASK_BLOCKS), (NORM_THREADS,),
                            [ws.logits, self.spec.n_vocab, mask])  # fmt: skip
            parts = sample_parts(self.spec.n_vocab, rows, cus, self.tune)
            self.launch(self.op["sample_rows"], (rows, parts), (SAMPLE_THREADS,),
                        [ws.logits, self.spec.n_vocab, params, stride, gather_idx or 0, ws.am,
                         ws.smp_part, ws.smp_cnt])  # fmt: skip
