"""HipRunner on the device: mixed batches and graph-replayed decode against one-pass prefill,
a third-party matmul kernel through the kernel table, the memory preflight, and cleanup."""

from __future__ import annotations

import numpy as np
import pytest

import forge
from forge.backend import SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError, OutOfMemoryError
from forge.kernels import KernelSpec
from forge.plugins import get_plugin_manager
from tests.support.golden_rules import BOUNDS, greedy_mismatches, logit_errors
from tests.support.gpu_helpers import golden_model, golden_runner


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf"])
def test_mixed_batch_and_graph_decode_match_prefill(rt, golden_dir, name):
    runner = golden_runner(rt, golden_dir, name)
    try:
        rng = np.random.default_rng()
        v = runner.spec.n_vocab
        seqs = [rng.integers(1, v, size=n).astype(np.int32) for n in (13, 21, 7)]
        tables = [np.arange(i * 8, i * 8 + 8, dtype=np.int32)[::-1].copy() for i in range(3)]
        ref = [runner.forward([SeqBatch(s, 0, t, "all")])[0] for s, t in zip(seqs, tables)]
        # prefill all but the last 2 tokens: a mixed batch holds sequence 0's second chunk,
        # sequence 2's whole prompt and one decode token of sequence 1
        runner.forward([SeqBatch(seqs[0][:4], 0, tables[0], "none"),
                        SeqBatch(seqs[1][:-3], 0, tables[1], "none")])  # fmt: skip
        out = runner.forward([SeqBatch(seqs[0][4:-2], 4, tables[0], "last"),
                              SeqBatch(seqs[2][:-2], 0, tables[2], "all"),
                              SeqBatch(seqs[1][-3:-2], len(seqs[1]) - 3, tables[1])])  # fmt: skip
        assert np.abs(out[0][0] - ref[0][-3]).max() <= 1e-3 * ref[0].std()
        assert np.abs(out[1] - ref[2][:-2]).max() <= 1e-3 * ref[2].std()
        assert np.abs(out[2][0] - ref[1][-3]).max() <= 1e-3 * ref[1].std()
        # ... then decode steps of batch 3 (graph replay), logits and device argmax
        for step in (2, 1):
            batch = [SeqBatch(s[-step : len(s) - step + 1], len(s) - step, t)
                     for s, t in zip(seqs, tables)]  # fmt: skip
            if step == 2:
                rows = runner.forward(batch)
                for r, full in zip(rows, ref):
                    assert np.abs(r[0] - full[-2]).max() <= 1e-3 * full.std()
            else:
                ids = runner.forward_argmax(batch)
                assert ids == [int(np.argmax(full[-1])) for full in ref]
        assert runner.graphs.kernels, "decode steps were not captured"
        per_step = runner.graphs.kernels[3]
        print(f"{name}: {per_step} kernels per decode step ({runner.spec.n_layer} layers)")
        # one attention launch per layer; each product on mmq.hip (2-32 rows) after the
        # launch quantizing its x
        assert per_step <= 11 * runner.spec.n_layer + 5
    finally:
        runner.close()


def _three_sequences_at_decode(runner):
    """Three random prompts (9, 14 and 5 tokens) prefilled but their last token, and the decode
    step that feeds those: (rng, seqs, tables, batch)."""
    rng = np.random.default_rng()
    v = runner.spec.n_vocab
    seqs = [rng.integers(1, v, size=n).astype(np.int32) for n in (9, 14, 5)]
    tables = [np.arange(i * 8, i * 8 + 8, dtype=np.int32) for i in range(3)]
    runner.forward([SeqBatch(s[:-1], 0, t, "none") for s, t in zip(seqs, tables)])
    batch = [SeqBatch(s[-1:], len(s) - 1, t) for s, t in zip(seqs, tables)]
    return rng, seqs, tables, batch


def test_forward_sample_picks_on_the_device(rt, golden_dir):
    """forward_sample against the host reference on the logits of the same step: graph-replayed
    decode (a batch mixing sampled, greedy and no-output sequences), the same step without graphs,
    and a prefill; the same key and counter give the same ids."""
    from forge.backend import DeviceSampling, sample_host

    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        rng, seqs, tables, batch = _three_sequences_at_decode(runner)
        logits = [r[-1] for r in runner.forward(batch)]  # graph replay, logits
        mismatches = 0
        for graphs in (True, False):
            runner.graph_policy.enabled = graphs
            for c in range(6):
                pick = DeviceSampling(0.9, 20, 0.9, 0.02, key=1234 + c, counter=c)
                ids = runner.forward_sample(batch, [pick, None, DeviceSampling()])
                assert ids[1] is None and ids[2] == int(np.argmax(logits[2]))
                mismatches += ids[0] != sample_host(logits[0], pick)
                assert ids == runner.forward_sample(batch, [pick, None, DeviceSampling()])
        assert mismatches <= 1
        runner.graph_policy.enabled = True
        # prefill: the pick of the last prompt row
        full = runner.forward([SeqBatch(seqs[1], 0, tables[1], "last")])[0][-1]
        pick = DeviceSampling(1.1, 0, 0.8, 0.0, key=99, counter=3)
        got = runner.forward_sample([SeqBatch(seqs[1], 0, tables[1])], [pick])
        assert got == [sample_host(full, pick)]
    finally:
        runner.close()


def test_masked_picks_on_the_device(rt, golden_dir):
    """Token masks through the runner: a graph-replayed decode step (its masked graph), the same
    step without graphs, and a prefill's pick; every pick is allowed and equals the host
    reference on the same step's logits with the same mask; unmasked steps are unchanged."""
    from forge.backend import DeviceSampling, pack_token_mask, sample_host

    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        rng, seqs, tables, batch = _three_sequences_at_decode(runner)
        v = runner.spec.n_vocab
        logits = [r[-1] for r in runner.forward(batch)]
        allowed = rng.random((3, v)) < 0.01
        allowed[:, 1] = True
        allowed[0, np.argmax(logits[0])] = False  # greedy must pick the best allowed one
        masks = [pack_token_mask(a) for a in allowed]
        for graphs in (True, False):
            runner.graph_policy.enabled = graphs
            picks = [DeviceSampling(mask=masks[0]), None,
                     DeviceSampling(0.9, 20, 0.9, key=7, counter=1, mask=masks[2])]  # fmt: skip
            ids = runner.forward_sample(batch, picks)
            assert ids[1] is None and allowed[0, ids[0]] and allowed[2, ids[2]]
            assert ids[0] == sample_host(logits[0], picks[0])
            assert ids[2] == sample_host(logits[2], picks[2])
            plain = runner.forward_sample(batch, [DeviceSampling(), None, DeviceSampling()])
            assert plain[0] == int(np.argmax(logits[0]))
        assert ("masked", 3) in runner.graphs.graphs
        runner.graph_policy.enabled = True
        full = runner.forward([SeqBatch(seqs[1], 0, tables[1], "last")])[0][-1]
        pick = DeviceSampling(mask=masks[1])
        assert runner.forward_sample([SeqBatch(seqs[1], 0, tables[1])], [pick]) == [
            sample_host(full, pick)
        ]
    finally:
        runner.close()


def test_started_step_is_read_when_collected(rt, golden_dir):
    """start_sample queues a graph-replayed step and returns; its ids equal forward_sample's,
    also when another pass runs before they are collected (the runner reads them first)."""
    from forge.backend import DeviceSampling

    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        rng = np.random.default_rng()
        v = runner.spec.n_vocab
        seqs = [rng.integers(1, v, size=n).astype(np.int32) for n in (6, 11, 8, 3)]
        tables = [np.arange(i * 8, i * 8 + 8, dtype=np.int32) for i in range(4)]
        runner.forward([SeqBatch(s[:-1], 0, t, "none") for s, t in zip(seqs, tables)])
        batch = [SeqBatch(s[-1:], len(s) - 1, t) for s, t in zip(seqs[:3], tables[:3])]
        picks = [DeviceSampling(0.8, 30, 0.95, 0.0, key=5, counter=2), None, DeviceSampling()]
        want = runner.forward_sample(batch, picks)
        assert want[1] is None
        collect = runner.start_sample(batch, picks)  # same positions: the same K/V rewritten
        assert runner.steps.unfetched
        other = runner.forward([SeqBatch(seqs[3][-1:], len(seqs[3]) - 1, tables[3])])[0]
        assert collect() == want and collect() == want
        alone = runner.forward([SeqBatch(seqs[3][-1:], len(seqs[3]) - 1, tables[3])])[0]
        assert np.array_equal(other, alone)
        assert runner.start_sample(batch, picks)() == want
    finally:
        runner.close()


def _fed_and_host_fed(runner, n_seq: int, rng) -> tuple[list, list]:
    """Four decode steps of n_seq sequences fed from the host, then the same steps started back
    to back with every token fed on the device (same positions: the same K/V rewritten)."""
    from forge.backend import DeviceSampling

    v = runner.spec.n_vocab
    seqs = [rng.integers(1, v, size=int(n)).astype(np.int32) for n in rng.integers(3, 12, n_seq)]
    tables = [np.array([i], np.int32) for i in range(n_seq)]
    runner.forward([SeqBatch(s[:-1], 0, t, "none") for s, t in zip(seqs, tables)])

    def picks(k):
        return [DeviceSampling(0.8, 30, 0.95, 0.0, key=i, counter=k) if i % 2 else
                DeviceSampling() for i in range(n_seq)]  # fmt: skip

    def batch(k, tokens):
        return [SeqBatch(np.array([t], np.int32), len(s) - 1 + k, tab)
                for t, s, tab in zip(tokens, seqs, tables)]  # fmt: skip

    want, tokens = [], [int(s[-1]) for s in seqs]
    for k in range(4):
        tokens = runner.forward_sample(batch(k, tokens), picks(k))
        want.append(tokens)
    started = [runner.start_sample(batch(0, [int(s[-1]) for s in seqs]), picks(0))]
    for k in range(1, 4):
        feed = list(range(n_seq))
        started.append(runner.start_sample(batch(k, [0] * n_seq), picks(k), feed, started[-1]))
        if n_seq <= runner.graph_policy.decode_rows:  # fed on the device, not read first
            assert list(runner.meta.field("feed")[:n_seq]) == feed
    return [c() for c in started], want


def test_fed_steps_equal_steps_fed_from_the_host(rt, golden_dir):
    """Decode steps started back to back, each sequence's token fed on the device from the
    previous step's pick (read only afterwards), pick what steps fed from the host pick:
    greedy and seeded sampling rows; 3 rows (decode graphs, fed on the device) and 70 (passes,
    whose picks are read before the next step)."""
    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        runner.allocate_kv(80, 16)
        rng = np.random.default_rng()
        for n_seq in (3, 70):
            got, want = _fed_and_host_fed(runner, n_seq, rng)
            assert got == want, n_seq
    finally:
        runner.close()


def test_sampled_generation_repeats_with_its_seed(rt, golden_dir):  # rt: skips without a GPU
    model = forge.load(str(golden_dir / "models" / "gemma3-q4_k_m.gguf"), backend="hip", n_ctx=128)
    try:
        assert model.runner.samples_on_device
        kw = dict(max_tokens=12, temperature=0.9, top_k=30, top_p=0.95, min_p=0.02, seed=11)
        a = model.complete([2, 10, 20, 30], **kw).tokens
        assert a == model.complete([2, 10, 20, 30], **kw).tokens
        runs = {
            tuple(model.complete([2, 10, 20, 30], **{**kw, "seed": s}).tokens) for s in range(4)
        }
        assert len(runs) > 1
    finally:
        model.runner.close()


def test_generation_run_ahead_equals_step_by_step(rt, golden_dir):
    """Model.generate starting each step before reading the last token (fed on the device)
    gives the tokens of the step-by-step loop: greedy and seeded sampling."""
    model = forge.load(str(golden_dir / "models" / "gemma3-q4_k_m.gguf"), backend="hip", n_ctx=128)
    try:
        kws = [dict(temperature=0), dict(temperature=0.9, top_k=30, seed=3)]
        ahead = [model.complete([2, 10, 20, 30], max_tokens=24, **kw).tokens for kw in kws]
        model.runner.feeds_picks = False  # this instance: the step-by-step loop
        steps = [model.complete([2, 10, 20, 30], max_tokens=24, **kw).tokens for kw in kws]
        assert ahead == steps and len(ahead[0]) == 24
    finally:
        model.runner.close()


def test_replacement_matmul_kernel_is_used(rt, golden_dir):
    """A plugin's Q8_0 matmul (tests/support/third_party_kernels' matvec.hip) replaces the
    built-in one."""
    from forge_hip.library import HipKernel

    from tests.support.gpu_helpers import THIRD_PARTY_KERNELS

    pm = get_plugin_manager()
    table = type(pm.kernels)()
    for key in pm.kernels.keys():
        for k in pm.kernels.candidates(*key):
            table.add(k)
    custom = HipKernel("matvec.hip", "matvec_q8_0", directory=THIRD_PARTY_KERNELS)
    table.add(KernelSpec("hip", "matmul", "Q8_0", custom, priority=10, plugin="test"))
    base = golden_runner(rt, golden_dir, "llama-q8_0.gguf")
    repl = golden_runner(rt, golden_dir, "llama-q8_0.gguf", table)
    try:
        assert all(impl == custom for _, impl in repl.plan.products.mats)
        ids = np.arange(1, 12, dtype=np.int32)
        a = base.forward([SeqBatch(ids, 0, np.arange(4, dtype=np.int32), "all")])[0]
        b = repl.forward([SeqBatch(ids, 0, np.arange(4, dtype=np.int32), "all")])[0]
        mx, _ = logit_errors(b, a)
        assert mx < 1e-3, mx
        assert any(key.endswith(":matvec_q8_0") for key in repl.lib._kernels)
    finally:
        base.close()
        repl.close()


def test_bad_batches_raise_typed_errors(rt, golden_dir):
    runner = golden_runner(rt, golden_dir, "llama-q4_0.gguf")
    try:
        with pytest.raises(ContextOverflowError):
            runner.forward([SeqBatch(np.arange(20, dtype=np.int32), 0, np.array([0], np.int32))])
        with pytest.raises(ForgeRuntimeError):
            runner.forward([SeqBatch(np.array([1], np.int32), 0, np.array([64], np.int32))])
        with pytest.raises(ForgeRuntimeError):
            runner.forward([SeqBatch(np.array([10**6], np.int32), 0, np.array([0], np.int32))])
    finally:
        runner.close()


class _Counting:
    """A runtime wrapper that counts live allocations and can fail the n-th upload."""

    def __init__(self, rt, fail_upload_at=None, free_bytes=None):
        self._rt, self.live, self.uploads = rt, 0, 0
        self.fail_upload_at, self.free_bytes = fail_upload_at, free_bytes

    def __getattr__(self, name):
        return getattr(self._rt, name)

    def alloc(self, n):
        buf = self._rt.alloc(n)
        self.live += 1
        return buf

    def free(self, buf):
        if buf.ptr:
            self.live -= 1
        self._rt.free(buf)

    def free_memory(self):
        return self.free_bytes if self.free_bytes is not None else self._rt.free_memory()

    def copy_to_device(self, dst, src, stream=None):
        self.uploads += 1
        if self.fail_upload_at is not None and self.uploads == self.fail_upload_at:
            raise ForgeRuntimeError("injected upload failure")
        self._rt.copy_to_device(dst, src, stream)


def test_preflight_refuses_with_numbers_and_load_falls_back(rt, golden_dir, monkeypatch):
    from forge_hip.runner import HipRunner

    path, gguf, spec = golden_model(golden_dir, "llama-f32.gguf")
    fake = _Counting(rt, free_bytes=64 << 20)
    with pytest.raises(OutOfMemoryError, match=r"MiB.*weights.*only 64 MiB are free"):
        HipRunner(spec, gguf, get_plugin_manager().kernels, runtime=fake)
    assert fake.live == 0
    monkeypatch.setattr(type(rt), "free_memory", lambda self: 1 << 20)
    model = forge.load(path, backend="hip", config={"fallback": "cpu_simd"}, n_ctx=64)
    assert model.backend == "cpu_simd"


def test_failure_mid_load_frees_everything(rt, golden_dir):
    from forge_hip.runner import HipRunner

    _, gguf, spec = golden_model(golden_dir, "qwen3-q8_0.gguf")
    fake = _Counting(rt, fail_upload_at=5)
    with pytest.raises(ForgeRuntimeError, match="injected"):
        HipRunner(spec, gguf, get_plugin_manager().kernels, runtime=fake)
    assert fake.live == 0 and fake.uploads == 5


def test_scheduler_on_a_worker_thread_batches_like_single_requests(rt, golden_dir):
    """The server's path: the scheduler thread (not the loading thread) runs the passes, each
    step started before the last one's tokens are read; batched results equal single ones
    (float32 weights: each row's math is batch-independent), greedy and seeded sampling, with
    requests arriving while others decode (prompts in passes beside fed decode rows)."""
    from tests.support.batch_invariance import alone_and_scheduled

    model = forge.load(str(golden_dir / "models" / "llama-f32.gguf"), backend="hip", n_ctx=512)
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):", "1, 2, 3,",
               "Water boils at", "My favourite colour"]  # fmt: skip
    kws = [dict(temperature=0) if i % 3 else dict(temperature=0.8, top_k=20, seed=i)
           for i in range(len(prompts))]  # fmt: skip
    try:
        single, batched, stats = alone_and_scheduled(model, prompts, kws, 12, 8, first=2)
        assert batched == single
        assert stats["prompt_steps"] >= 2
    finally:
        model.runner.close()


def _decode_steps(runner, setting: str, n_seq: int = 1) -> tuple[dict, int]:
    """Logits [n_seq, 4, vocab] of four decode steps of n_seq sequences (graph-replayed, after
    a 9-token prompt each) with the plan's `setting` on and off, and the kernels of a step
    with it on."""
    rng = np.random.default_rng()
    ids = rng.integers(1, runner.spec.n_vocab, size=(n_seq, 13)).astype(np.int32)
    tables = [np.arange(8 * i, 8 * i + 8, dtype=np.int32)[::-1].copy() for i in range(n_seq)]
    logits, launched = {}, 0
    for on in (True, False):
        setattr(runner.plan, setting, on)
        runner.graphs.clear()
        for s, t in zip(ids, tables):
            runner.forward([SeqBatch(s[:9], 0, t, "none")])
        steps = [runner.forward([SeqBatch(s[p : p + 1], p, t) for s, t in zip(ids, tables)])
                 for p in range(9, 13)]  # fmt: skip
        logits[on] = np.stack([np.stack([step[i][0] for step in steps]) for i in range(n_seq)])
        launched = launched if not on else runner.graphs.kernels[n_seq]
    return logits, launched


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf", "qwen3-q4_k_m.gguf"])
def test_one_row_decode_with_add_norm_folded_matches_separate(rt, golden_dir, name):
    """Batch-1 decode steps whose add_norms run inside the products (mvq_*_r1n, the residual
    alternating buffers) give exactly the logits of the same steps with separate add_norm
    launches (both compute add_norm.h's arithmetic in one warp)."""
    runner = golden_runner(rt, golden_dir, name)
    runner.plan.products.round_prefill = True  # the int8 decode products, where the fusion applies
    runner.plan.products.quant_norm = False  # (which would take these add_norms first)
    try:
        logits, launched = _decode_steps(runner, "fuse_norm")
        np.testing.assert_array_equal(logits[True], logits[False])  # add_norm.h: the same bits
        print(f"{name}: {launched} kernels per fused step")
        # feed_ids, embedding, the first add_norm (stays a launch), 5 per layer (attention in one
        # launch: attn_decode, or attn_decode_tc's fused form), head, sampling
        assert launched == 5 * runner.spec.n_layer + 5
    finally:
        runner.close()


@pytest.mark.parametrize("n_seq", [1, 5])
@pytest.mark.parametrize(
    "name", ["qwen2-q4_k.gguf", "qwen3-q4_k_m.gguf", "llama-q8_0.gguf", "gemma3-q4_k_m.gguf"]
)
def test_decode_with_x_quantized_in_add_norm_matches_separate(rt, golden_dir, name, n_seq):
    """Decode steps (one sequence: mmv.hip; five: mmq.hip) whose add_norms run as
    add_norm_quant, rounding the next product's x into ws.xq (gemma3's post-norms included),
    give the logits of the same steps with add_norm launches (fuse_norm off) and x quantized
    in the products' blocks or by mvq_quant, up to the order of the sums of squares: h's scale
    may differ in its last bits, and an int8 rounding of x may then move by one step (1/127 of
    a block's peak): that row still meets the golden bounds, and greedy picks differ only at
    near ties."""
    runner = golden_runner(rt, golden_dir, name)
    runner.plan.products.round_prefill = True
    runner.plan.products.fuse_norm = False
    try:
        logits, launched = _decode_steps(runner, "quant_norm", n_seq)
        a, b = (logits[on].reshape(-1, runner.spec.n_vocab) for on in (True, False))
        err = np.abs(a - b).max(axis=1) / b.std(axis=1)
        print(f"{name}, {n_seq} rows: {launched} kernels per step, max |diff| / std per row "
              f"{np.array2string(err, precision=1)}")  # fmt: skip
        assert err.min() < 1e-5  # rows without a moved rounding: the sums' order only
        mx, mean = logit_errors(a, b)
        assert mx <= BOUNDS["quant"][0] and mean <= BOUNDS["quant"][1], (mx, mean)
        assert not greedy_mismatches(a, [int(np.argmax(r)) for r in b])
        if n_seq == 1:  # feed_ids, embedding, 5 per layer + 2 add_norm_quant, head + its
            # add_norm_quant, sampling (these small models' down products quantize in-block)
            assert launched == 7 * runner.spec.n_layer + 5
    finally:
        runner.close()


def test_prepared_pass_graphs_match_launches(rt, golden_dir):
    """Passes of 65-128 rows (past mmq.hip and attn_rows: the prefill products and
    attn_prefill.hip) replayed from graphs captured by prepare_batches give the logits the
    same pass launched kernel by kernel gives: a prompt alone, and a prompt beside decode rows."""
    from forge_hip.tuning import DEFAULT

    PASS_GRAPH_ROWS = DEFAULT.pass_graph_rows

    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        runner.prepare_batches(4)
        rng = np.random.default_rng()
        v = runner.spec.n_vocab
        prompt = rng.integers(1, v, size=PASS_GRAPH_ROWS - 11).astype(np.int32)
        olds = [rng.integers(1, v, size=n).astype(np.int32) for n in (30, 17, 9)]
        tables = [np.arange(i * 16, i * 16 + 16, dtype=np.int32) for i in range(4)]
        for s, t in zip(olds, tables):
            runner.forward([SeqBatch(s[:-1], 0, t, "none")])
        mixed = [SeqBatch(s[-1:], len(s) - 1, t) for s, t in zip(olds, tables)]
        runs = {}
        for graphs in (False, True):
            runner.graph_policy.enabled = graphs
            replays = len(runner.graphs.graphs)
            alone = runner.forward([SeqBatch(prompt, 0, tables[3], "all")])[0]
            both = runner.forward([*mixed, SeqBatch(prompt[:-3], 0, tables[3], "all")])
            assert len(runner.graphs.graphs) == replays  # nothing captured here
            runs[graphs] = (alone, both)
        (alone0, both0), (alone1, both1) = runs[False], runs[True]
        assert alone0.shape == (len(prompt), v)
        np.testing.assert_array_equal(alone1, alone0)
        for a, b in zip(both1, both0):
            np.testing.assert_array_equal(a, b)
        assert np.abs(both1[3] - alone1[:-3]).max() <= 1e-3 * alone1.std()  # same prompt rows
    finally:
        runner.graph_policy.enabled = True
        runner.close()


def test_prepared_wide_decode_graphs_match_launches(rt, golden_dir):
    """A decode step of more sequences than the decode graphs take (70 rows: a pass of one
    token per sequence, captured by prepare_batches) gives the logits of the same step launched
    kernel by kernel."""
    runner = golden_runner(rt, golden_dir, "gemma3-q4_k_m.gguf")
    try:
        runner.allocate_kv(256, 16)
        runner.prepare_batches(80)
        assert ("pass", 70, True) in runner.graphs.graphs
        rng = np.random.default_rng()
        v = runner.spec.n_vocab
        seqs = [rng.integers(1, v, size=int(n)).astype(np.int32) for n in rng.integers(2, 9, 70)]
        tables = [np.array([i * 3, i * 3 + 1], np.int32) for i in range(70)]
        runner.forward([SeqBatch(s[:-1], 0, t, "none") for s, t in zip(seqs, tables)])
        step = [SeqBatch(s[-1:], len(s) - 1, t) for s, t in zip(seqs, tables)]
        runs = {}
        for graphs in (False, True):
            runner.graph_policy.enabled = graphs
            captured = len(runner.graphs.graphs)
            runs[graphs] = np.stack([r[-1] for r in runner.forward(step)])
            assert len(runner.graphs.graphs) == captured
        assert runs[True].shape == (70, v)
        np.testing.assert_array_equal(runs[True], runs[False])
    finally:
        runner.graph_policy.enabled = True
        runner.close()
