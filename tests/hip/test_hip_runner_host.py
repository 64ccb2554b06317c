"""HipRunner's host side without a GPU: a recording fake runtime checks the launch plan (every
argument packs against its kernel's signature, kernels per decode step, one graph per batch size,
one host->device copy per step), chunking, the preflight message and cleanup after failures."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from forge.backend import DeviceSampling, SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError, OutOfMemoryError
from forge.gguf import open_gguf
from forge.kv_cache import KvFormat
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime


def _spec(golden_dir, name):
    gguf = open_gguf(str(golden_dir / "models" / name))
    return gguf, build_spec(gguf)


def _runner(golden_dir, name, rt):
    from forge_hip.runner import HipRunner

    gguf, spec = _spec(golden_dir, name)
    return HipRunner(spec, gguf, get_plugin_manager().kernels, runtime=rt)


def test_mmq_past_64_rows_only_for_matrices_l2_holds(golden_dir, monkeypatch):
    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    # the golden gemma3's products are far under mmq_reread_bytes; as if they were over it
    runner.plan.products.with_tuning(mmq_reread_bytes=1024)
    runner.allocate_kv(32, 16)
    for rows, kernel in ((64, "mmq_multi_m2"), (65, "gemm_m64")):
        rt.launches.clear()
        runner.forward([SeqBatch(np.arange(1, rows + 1, dtype=np.int32), 0, np.arange(5), "last")])
        names = {n for n, _, _ in rt.launches}
        assert kernel in names and not {"mmq_multi_m2", "gemm_m64"} - {kernel} & names, rows


@pytest.mark.parametrize("limit,pf", [(None, 1), (1024, 0)])
def test_mmq_prefetches_only_launches_under_the_byte_limit(golden_dir, monkeypatch, limit, pf):
    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    # the golden gemma3's matrices are far under mvq_prefetch_bytes; 1024: as if they were over
    if limit is not None:
        runner.plan.products.with_tuning(mvq_prefetch_bytes=limit)
    runner.allocate_kv(32, 16)
    runner.forward([SeqBatch(np.arange(1, 21, dtype=np.int32), 0, np.arange(2), "last")])
    # mmq_multi's and mmq_glu's last argument is pf
    pfs = [args[-1] for name, args in rt.launch_args if name.startswith("mmq_")]
    assert len(pfs) == 4 * runner.spec.n_layer and set(pfs) == {pf}


@pytest.mark.parametrize("platform", ["fake", "rocm"])
def test_33_to_64_row_mmq_launches_split_x_rows_over_two_halves(golden_dir, monkeypatch, platform):
    # 40 rows: one m2 launch per product with gridDim.y = 2 (rows 0-31, 32-39), on every platform
    rt = FakeRuntime()
    monkeypatch.setattr(rt, "platform", platform, raising=False)
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(32, 16)
    runner.forward([SeqBatch(np.arange(1, 41, dtype=np.int32), 0, np.arange(3), "last")])
    grids = [g for n, g, _ in rt.launches if n.startswith("mmq_")]
    names = [n for n, _, _ in rt.launches if n.startswith("mmq_")]
    assert names.count("mmq_multi_m2") == 3 * runner.spec.n_layer  # q/k/v, wo, down
    assert names.count("mmq_glu_m2") == runner.spec.n_layer
    assert len(grids) == 4 * runner.spec.n_layer and all(g[1] == 2 for g in grids)


@pytest.mark.usefixtures("attn_decode_path")
@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf", "llama-f32.gguf"])
def test_plan_packs_and_decode_is_one_graph_per_batch_size(golden_dir, name):
    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    runner.allocate_kv(32, 16)
    n_layer = runner.spec.n_layer
    ids = np.arange(1, 41, dtype=np.int32)  # past mvq_max_rows: the prefill products
    table = np.arange(3, dtype=np.int32)
    for rep in range(2):  # a prompt pass of up to PASS_GRAPH_ROWS rows: captured, replayed
        rt.launches.clear()
        rows = runner.forward([SeqBatch(ids, 0, table, "all")])
        assert rows[0].shape == (40, runner.spec.n_vocab)
        names = [n for n, _, cap in rt.launches if cap]
        if rep == 0:
            # 40 rows: quantized types on mmq.hip (mmq_max_rows), F32 on SIMT float32 tiles;
            # attention by attn_rows (ATT_ROWS_MAX)
            prefill_kernel = "mm_tiled" if name == "llama-f32.gguf" else "mmq_multi_m2"
            assert prefill_kernel in names and "attn_rows" in names
        else:
            assert not names  # replayed; the output launches (not captured) stay
    assert runner.graphs.kernels[("pass", 40, False)] > 6 * n_layer
    rt.launches.clear()  # 100 rows (a server's decode rows and new prompts): still mmq, attn_rows
    runner.forward([SeqBatch(np.arange(1, 101, dtype=np.int32), 0, np.arange(7), "last")])
    names = {n for n, _, _ in rt.launches}
    if name != "llama-f32.gguf":
        assert "mmq_multi_m2" in names and "gemm_m64" not in names
    assert "attn_rows" in names and not any(n.startswith("attn_prefill") for n in names)
    rt.launches.clear()
    long = np.arange(1, 141, dtype=np.int32)  # past pass_graph_rows and att_rows_max: launched
    runner.forward([SeqBatch(long, 0, np.arange(5, 14, dtype=np.int32), "last")])
    assert not any(cap for _, _, cap in rt.launches)
    prefill_kernel = "mm_tiled" if name == "llama-f32.gguf" else "gemm_m64"  # past mmq_max_rows
    assert {"qk_rope_store", prefill_kernel} <= {n for n, _, _ in rt.launches}
    assert "attn_rows" not in {n for n, _, _ in rt.launches}
    for step in range(3):
        rt.launches.clear()
        uploads = rt.uploads
        batch = [SeqBatch(np.array([5], np.int32), 40 + step, np.arange(3, dtype=np.int32)),
                 SeqBatch(np.array([7], np.int32), step, np.array([5], np.int32))]  # fmt: skip
        assert len(runner.forward_argmax(batch)) == 2
        assert rt.uploads == uploads + 1  # one host->device copy per step
        assert all(cap for _, _, cap in rt.launches)  # launched only while capturing
        if step:
            assert not rt.launches  # replayed: Python launched nothing
        else:
            quants = [n for n, _, _ in rt.launches].count("mvq_quant")
            anq = [n for n, _, _ in rt.launches].count("add_norm_quant")
    per_step = runner.graphs.kernels[2]
    # per layer: qkv, attention (one fused launch), wo, add_norm, gate/up, down, add_norm;
    # products on mmq.hip (quantized types at 2 rows) take x quantized by one launch before,
    # except q/k/v and gate/up: their add_norm quantizes it (add_norm_quant); around them:
    # feed_ids, embedding, add_norm, the head, sampling
    assert quants == (0 if name == "llama-f32.gguf" else 2 * n_layer + 1)
    assert anq == (0 if name == "llama-f32.gguf" else 2 * n_layer)
    assert per_step == 7 * n_layer + 5 + quants, per_step
    assert rt.replays == 2 + 1 + 3  # the 40-row pass twice, the 100-row once, 3 decode steps
    assert runner.kv.format.value == ("f32" if name == "llama-f32.gguf" else "f16")
    runner.close()
    assert not rt.live


def test_a_fed_step_takes_its_tokens_from_the_last_steps_picks(golden_dir):
    """start_sample's feed: after a graph-replayed decode step, whose picked ids stay on the
    device, the next step's metadata names the ids row each fed sequence copies (feed_ids, the
    first launch of every pass, does it); after another pass in between, or from a step that is
    not the last one started, the picks are read and written into the batch instead. Misuse is
    a clear error."""
    from forge.backend import DeviceSampling

    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(32, 16)
    tables = [np.arange(3, dtype=np.int32) + 3 * i for i in range(3)]
    batch = [SeqBatch(np.array([5 + i], np.int32), 3, t) for i, t in enumerate(tables)]
    fed = [SeqBatch(np.array([9], np.int32), 4, t) for t in tables]
    picks = [DeviceSampling()] * 3
    with pytest.raises(ForgeRuntimeError, match="feed_from"):
        runner.start_sample(fed, picks, feed=[0, 0, 0])
    first = runner.start_sample(batch, picks)
    assert rt.launches[0][0] == "feed_ids" and rt.launches[0][2]  # captured, first
    second = runner.start_sample(fed, picks, [2, -1, 0], first)
    meta = runner.meta
    assert list(meta.field("feed")[:3]) == [2, -1, 0]
    assert list(meta.field("ids")[:3]) == [9, 9, 9]  # placeholders, replaced on the device
    assert first() == [0, 0, 0] and second() == [0, 0, 0]  # the fake's copies give zeros
    # a pass holding a prompt: its picks are gathered into ids rows 0 and 1
    prompt = SeqBatch(np.arange(1, 6, dtype=np.int32), 0, tables[2])
    mixed = runner.start_sample([prompt, batch[1], batch[0]], [picks[0], None, picks[0]])
    runner.start_sample(fed, picks, [2, -1, 0], mixed)
    assert list(meta.field("feed")[:7]) == [1, -1, 0, -1, -1, -1, -1]
    with pytest.raises(ForgeRuntimeError, match="picked no token"):
        runner.start_sample(fed, picks, [1, 1, 1], mixed)  # batch row 1 picked nothing
    third = runner.start_sample(batch, picks)
    runner.forward([SeqBatch(np.arange(1, 5, dtype=np.int32), 0, tables[0], "none")])
    runner.start_sample(fed, picks, [1, 1, 1], third)()
    assert list(meta.field("feed")[:3]) == [-1, -1, -1]  # read on the host instead
    assert list(meta.field("ids")[:3]) == third()  # the picks, in place of the placeholders
    fourth = runner.start_sample(batch, picks)
    runner.start_sample(batch, picks)  # another step started after it: fourth is not the last
    runner.start_sample(fed, picks, [0, 1, 2], fourth)
    assert list(meta.field("feed")[:3]) == [-1, -1, -1]
    two = [SeqBatch(np.array([1, 2], np.int32), 4, tables[0])]
    with pytest.raises(ForgeRuntimeError, match="exactly one token"):
        runner.start_sample(two, picks[:1], [0], fourth)
    with pytest.raises(ForgeRuntimeError, match="picks"):
        runner.start_sample(fed, picks, [0], fourth)
    runner.close()
    assert not rt.live


def test_prepared_batches_replay_without_capturing(golden_dir):
    """prepare_batches captures every decode step of up to max_seqs rows and every pass of up
    to PASS_GRAPH_ROWS rows, running nothing; the steps a scheduler then runs (decode, a prompt
    beside decode rows) launch nothing from Python, and a block-table buffer sized for the whole
    cache keeps the graphs valid for any batch."""
    from forge_hip.tuning import DEFAULT

    PASS_GRAPH_ROWS = DEFAULT.pass_graph_rows

    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(2048, 16)
    runner.prepare_batches(6)
    assert not rt.replays and not any(not cap for _, _, cap in rt.launches)
    keys = set(runner.graphs.graphs)
    assert keys == set(range(1, 7)) | {("pass", r, False) for r in range(2, PASS_GRAPH_ROWS + 1)}
    rt.launches.clear()
    tables = [np.arange(i * 200, i * 200 + 200, dtype=np.int32) for i in range(6)]
    decode = [SeqBatch(np.array([3 + i], np.int32), 3000 + i, t) for i, t in enumerate(tables)]
    runner.forward_argmax(decode)  # 6 rows, 1,128 block-table entries: past the first buffer
    prompt = SeqBatch(np.arange(1, 91, dtype=np.int32), 0, tables[5])
    runner.forward_argmax(decode[:5] + [prompt])  # 95 rows
    runner.forward_argmax(decode[:1])
    assert set(runner.graphs.graphs) == keys and rt.replays == 3
    assert not [n for n, _, cap in rt.launches if cap], "a graph was captured while serving"
    rt.launches.clear()
    runner.prepare_batches(PASS_GRAPH_ROWS + 40)  # decode steps past the decode graphs' rows
    decode_rows = runner.graph_policy.decode_rows
    wide = {("pass", r, True) for r in range(decode_rows + 1, PASS_GRAPH_ROWS + 1)}
    assert set(runner.graphs.graphs) == keys | set(range(7, decode_rows + 1)) | wide
    runner.close()


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf", "llama-f32.gguf"])
def test_one_row_decode_folds_add_norm_into_the_products(golden_dir, name):
    """A batch-1 step with integer weight types: every add_norm after the first is computed by
    the product reading its output (mvq_*_r1n), the residual alternating between ws.x and ws.x2;
    float weights (llama-f32) and fuse_norm off keep the separate launches. Two-row steps too."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    runner.allocate_kv(32, 16)
    n_layer, table = runner.spec.n_layer, np.arange(3, dtype=np.int32)
    counts = {}
    # quant_norm would take these add_norms first (the next test)
    runner.plan.products.quant_norm = False
    for fuse, rows in ((True, 1), (False, 1), (True, 2)):
        runner.plan.products.fuse_norm = fuse
        runner.graphs.clear()
        rt.launches.clear()
        if fuse and rows == 1:
            rt.launch_args.clear()
        batch = [SeqBatch(np.array([5 + r], np.int32), 3, table + 3 * r) for r in range(rows)]
        runner.forward_argmax(batch)
        names = [n for n, _, _ in rt.launches]
        counts[fuse, rows] = (names.count("add_norm"), sum("_r1n" in n for n in names))
    fusable = name != "llama-f32.gguf"
    assert counts[True, 1] == ((1, 2 * n_layer) if fusable else (2 * n_layer + 1, 0))
    assert counts[False, 1] == counts[True, 2] == (2 * n_layer + 1, 0)
    if fusable:  # the residual leaves each fused add_norm in the other buffer
        ws = runner.ws
        fused = [a for n, a in rt.launch_args if "_r1n" in n]
        assert len(fused) == 2 * n_layer
        assert all(a[-6] != a[-2] and {a[-6], a[-2]} == {ws.x, ws.x2} for a in fused)
    runner.close()


@pytest.mark.parametrize("name", ["qwen2-q4_k.gguf", "llama-q4_0.gguf", "gemma3-q4_k_m.gguf"])
def test_one_row_decode_quantizes_x_in_add_norm(golden_dir, name):
    """A batch-1 step's add_norms run as add_norm_quant, which also rounds the next product's
    x into ws.xq: the q/k/v, gate/up and head products then read it there (xg) and quantize
    nothing themselves, and the residual stays in ws.x. Steps of several rows do the same
    before mmq.hip, but for the head (a pass may gather its rows). A gathered head gets its
    plain add_norm back; quant_norm and fuse_norm off keep the add_norm launches."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    runner.allocate_kv(32, 16)
    plan, ws, n_layer = runner.plan, runner.ws, runner.spec.n_layer
    table = np.arange(3, dtype=np.int32)
    runner.forward_argmax([SeqBatch(np.array([5], np.int32), 3, table)])
    calls = [(n, a) for n, a in rt.launch_args]
    names = [n for n, _ in calls]
    assert names.count("add_norm") == 0 and names.count("add_norm_quant") == 2 * n_layer + 1
    for i, (n, a) in enumerate(calls):
        if n == "add_norm_quant":
            x, o, w_post, w_next, h, xg, k, need, _ = a
            assert (x, h, xg, k) == (ws.x, 0, ws.xq, runner.spec.n_embd)
            assert o in (0, ws.o) and (w_post == 0) == (
                o == 0 or not runner.spec.attention.post_norm
            )
            nxt, args = calls[i + 1]  # the product reading it: xg given, the same copies of x
            assert nxt in ("mvq_multi_r1", "mvq_glu_r1")
            at = 0 if nxt == "mvq_multi_r1" else -1  # (the gated kernel has no count)
            assert (args[at + 7], args[at + 9]) == (need, ws.xq)
    w_next = [a[3] for n, a in calls if n == "add_norm_quant"]
    attention, ffn = plan.attention, plan.ffn
    assert w_next == [
        attention[0].norm,
        *[
            w
            for i in range(n_layer)
            for w in (ffn[i].norm, attention[i + 1].norm if i + 1 < n_layer else plan.output_norm)
        ],
    ]
    rt.launch_args.clear()  # a step of 5 rows: the same, on mmq.hip; the head keeps add_norm
    rows5 = [SeqBatch(np.array([5 + i], np.int32), 3, table + 3 * i) for i in range(5)]
    runner.forward_argmax(rows5)
    calls = [(n, a) for n, a in rt.launch_args]
    names = [n for n, _ in calls]
    assert names.count("add_norm_quant") == 2 * n_layer and names.count("add_norm") == 1
    for i, (n, _) in enumerate(calls):
        if n == "add_norm_quant":
            nxt, args = calls[i + 1]
            assert nxt.startswith(("mmq_multi_m", "mmq_glu_m")) and ws.xq in args
    assert [n for n, _ in calls[-4:-1]] == ["add_norm", "mvq_quant", "mmq_multi_m1"]
    rt.launches.clear()
    # a pass, its head row gathered: the head's add_norm is launched
    runner.graph_policy.enabled = False
    runner.forward_argmax([SeqBatch(np.array([6], np.int32), 4, table)])
    names = [n for n, _, _ in rt.launches]
    at = names.index("gather_rows")
    assert names.count("add_norm") == 1 and names[at - 1] == "add_norm"
    assert names.count("add_norm_quant") == 2 * n_layer
    rt.launches.clear()
    runner.graph_policy.enabled = True
    plan.products.quant_norm, plan.products.fuse_norm = False, False
    runner.graphs.clear()
    runner.forward_argmax([SeqBatch(np.array([7], np.int32), 5, table)])
    names = [n for n, _, _ in rt.launches]
    assert names.count("add_norm") == 2 * n_layer + 1 and "add_norm_quant" not in names
    runner.close()


def test_forward_on_another_thread_binds_the_device_there(golden_dir):
    """A server runs passes on a worker thread; GPU APIs keep the current device per thread."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, "llama-f32.gguf", rt)
    runner.allocate_kv(8, 16)
    ids = np.arange(1, 6, dtype=np.int32)
    picks = []
    worker = threading.Thread(
        target=lambda: picks.extend(
            runner.forward_argmax([SeqBatch(ids, 0, np.arange(1, dtype=np.int32))])
        )
    )
    worker.start()
    worker.join()
    assert len(picks) == 1
    assert worker.ident in rt.bound_threads
    runner.close()


def test_long_batches_are_cut_into_chunks(golden_dir):
    from forge_hip.workspace import ROW_CAP

    rt = FakeRuntime()
    runner = _runner(golden_dir, "llama-q4_0.gguf", rt)
    runner.allocate_kv(128, 16)
    n = ROW_CAP + 100
    ids = np.ones(n, np.int32)
    table = np.arange(-(-n // 16), dtype=np.int32)
    out = runner.forward(
        [SeqBatch(ids, 0, table, "all"), SeqBatch(np.ones(3, np.int32), 0, table[-1:], "last")]
    )
    assert out[0].shape == (n, runner.spec.n_vocab) and out[1].shape == (1, runner.spec.n_vocab)
    embeds = [g for name, g, _ in rt.launches if name.startswith("embed_")]
    assert [g[0] for g in embeds] == [ROW_CAP, 103]
    runner.close()


def test_errors_and_preflight(golden_dir):
    rt = FakeRuntime()
    runner = _runner(golden_dir, "llama-q4_0.gguf", rt)
    with pytest.raises(ForgeRuntimeError, match="allocate_kv"):
        runner.forward([SeqBatch(np.ones(1, np.int32), 0, np.zeros(1, np.int32))])
    runner.allocate_kv(4, 16)
    with pytest.raises(ContextOverflowError):
        runner.forward([SeqBatch(np.ones(20, np.int32), 0, np.zeros(1, np.int32))])
    with pytest.raises(ForgeRuntimeError, match="block"):
        runner.forward([SeqBatch(np.ones(1, np.int32), 0, np.array([4], np.int32))])
    with pytest.raises(ForgeRuntimeError, match="token id"):
        runner.forward([SeqBatch(np.array([-1], np.int32), 0, np.zeros(1, np.int32))])
    with pytest.raises(OutOfMemoryError, match="kv_cache"):
        runner.allocate_kv(10**7, 16)
    runner.close()
    runner.close()  # twice is safe
    assert not rt.live

    small = FakeRuntime(free=300 << 20)
    with pytest.raises(OutOfMemoryError, match=r"weights .* MiB.*only \d+ MiB are free"):
        _runner(golden_dir, "llama-q4_0.gguf", small)
    assert not small.live


def test_failure_mid_load_frees_what_it_took(golden_dir):
    rt = FakeRuntime(fail_upload_at=3)
    with pytest.raises(ForgeRuntimeError, match="injected"):
        _runner(golden_dir, "gemma3-f16.gguf", rt)
    assert not rt.live


def test_memory_needed_counts_weights_kv_and_workspace(golden_dir):
    from forge_hip.backend import HipBackend
    from forge_hip.capacity import memory_needed

    gguf, spec = _spec(golden_dir, "gemma3-q4_k_m.gguf")
    need = HipBackend().memory_needed(spec, gguf, 1024)
    assert need["weights"] >= sum(gguf.tensors[n].nbytes for n in spec.weight_names())
    # one sequence: 1 full layer of 1024 positions, 5 of a window of 8 beside a 512-row piece
    window_positions = (-(-(8 + 512) // 16) + 2) * 16
    per_layer = spec.kv_bytes_per_token(KvFormat.F16) // spec.n_layer
    assert need["kv_cache"] == per_layer * (1024 + 5 * window_positions)
    # the pools of 8 sequences (server.max_batch), or every layer at full length (a tensor-
    # parallel rank's cache)
    eight = HipBackend().memory_needed(spec, gguf, 32768, max_seqs=8)["kv_cache"]
    assert eight == per_layer * (32768 + 5 * 8 * window_positions)
    whole = memory_needed(spec, gguf, 32768, max_seqs=None)["kv_cache"]
    assert whole == per_layer * 6 * 32768
    assert need["workspace"] > 0


def test_only_small_decode_products_prefetch_their_first_rows(golden_dir, monkeypatch):
    """mmv.hip's L2 prefetch (flags bit 0) is asked for only by launches whose matrices hold at
    most mvq_prefetch_bytes: the limit is set between this model's products here, so both kinds
    occur."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(32, 16)
    mats = runner.plan.products.mats
    sizes = sorted({p.n * p.row_bytes for p, _ in mats})
    limit = sizes[len(sizes) // 2]
    runner.plan.products.with_tuning(mvq_prefetch_bytes=limit)
    rt.launch_args.clear()
    runner.forward_argmax([SeqBatch(np.array([5], np.int32), 3, np.arange(3, dtype=np.int32))])
    seen = set()
    for name, args in rt.launch_args:
        if not name.startswith(("mvq_multi", "mvq_glu")):
            continue
        first, count = args[1], (args[2] if name.startswith("mvq_multi") else 2)
        flags = args[10] if name.startswith("mvq_multi") else args[9]
        big = sum(p.n * p.row_bytes for p, _ in mats[first : first + count]) > limit
        assert flags == (0 if big else runner.plan.tune.mvq_flags), (name, first, count)
        seen.add(big)
    assert seen == {True, False}
    runner.close()


def test_long_matrices_give_each_lane_a_whole_step_of_units():
    """Output heads (mvq_long_n rows or more) with short rows take fewer lanes per row, so that
    every lane loads a whole step of units; other matrices keep the general rule."""
    from forge_hip.tuning import DEFAULT, mvq_lanes

    MVQ_LONG_N = DEFAULT.mvq_long_n

    assert mvq_lanes(["Q8_0"], 640, 1, 262144) == 8  # gemma3 head: 40 units, 5 per lane
    assert mvq_lanes(["Q8_0"], 640, 1, 2048) == 16  # same rows, few of them
    assert mvq_lanes(["Q8_0"], 640, 2, MVQ_LONG_N) == 16  # two-row steps keep 16
    assert mvq_lanes(["Q8_0"], 1024, 1, MVQ_LONG_N) == 16  # 64 units: 4 per lane already
    assert mvq_lanes(["Q6_K"], 4096, 1, 128256) == 16  # llama-8B head: 256 units, long
    assert mvq_lanes(["Q6_K"], 4096, 1, 4096) == 32  # the same rows, few of them
    assert mvq_lanes(["Q6_K"], 4096, 2, 128256) == 32  # more than one row
    assert mvq_lanes(["Q5_0", "Q5_0", "Q8_0"], 640, 1, 1024) == 16


def test_long_gated_rows_take_fewer_lanes_where_they_fill_the_gpu():
    """One-row gated products with rows of 64 units or more take mvq_pair_lanes when that still
    leaves mvq_pair_fill blocks per compute unit; everything else keeps the general rule."""
    from forge_hip.tuning import DEFAULT, mvq_lanes

    assert DEFAULT.mvq_pair_lanes == 8
    gate_up = (["Q4_K", "Q4_K"], 4096)  # llama-8B: 128 units per row, 14336 rows
    assert mvq_lanes(*gate_up, 1, 14336, True, 132) == 8  # 448 blocks of 32 rows: 3.4 per SM
    assert mvq_lanes(*gate_up, 1, 14336, True, 160) == 32  # too few blocks for 160 SMs
    assert mvq_lanes(*gate_up, 1, 14336, False, 132) == 32  # not gated
    assert mvq_lanes(*gate_up, 2, 14336, True, 132) == 32  # two rows
    assert mvq_lanes(*gate_up, 1, 14336, True) == 32  # compute units unknown
    assert mvq_lanes(["Q5_0", "Q5_0"], 640, 1, 2048, True, 132) == 16  # gemma3: 40 units


def test_one_row_products_of_long_rows_take_x_from_one_quantizing_launch():
    """mvq_global_x: a one-row product quantizes x once (mvq_quant) past mvq_row_tasks pieces of
    256 (llama-8B's 4096-wide O: not in each of its blocks); several rows keep mvq_quant_tasks
    pieces in all; a copy larger than a block's shared memory always goes through mvq_quant."""
    from forge_hip.tuning import DEFAULT, mvq_global_x

    assert (DEFAULT.mvq_row_tasks, DEFAULT.mvq_quant_tasks) == (8, 32)
    assert mvq_global_x(1, 1, 4096, 1)  # 16 pieces
    assert not mvq_global_x(1, 1, 2048, 1)  # 8: gemma3's rows stay in the blocks
    assert not mvq_global_x(0, 1, 4096, 1)  # float types: nothing to quantize
    assert not mvq_global_x(1, 2, 4096, 2)  # two rows: 32 pieces
    assert mvq_global_x(1, 3, 4096, 4)  # 48 pieces
    assert mvq_global_x(3, 1, 1 << 20, 1)  # past the block's shared memory


def _arena_rows(type_name: str, n: int, k: int, seed: int):
    """Random GGML rows of `type_name`, gguf's dequantization of them, and the arena's device
    layout of them (forge_hip.arena.device_rows: bytes, row-0 pointer offset)."""
    from forge_hip.arena import device_rows
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from tests.support.quant_blocks import random_raw

    raw = random_raw(np.random.default_rng(seed), type_name, n, k)
    ref = dequantize(raw, GGMLQuantizationType[type_name]).reshape(n, k)
    data, at = device_rows(type_name, raw)
    assert data.shape == raw.shape
    return raw, ref, data, at


def test_q8_0_rows_put_the_scales_before_the_row_pointer():
    """The arena's Q8_0 rows: block c's f16 scale 2 (c + 1) bytes before the row pointer, its 32
    quants at pointer + 32 c; decoded that way they equal gguf's dequantizer on the GGML blocks."""
    from forge_hip.arena import device_rows

    raw, ref, data, at = _arena_rows("Q8_0", 7, 96, 5)
    assert at == 6
    out = np.empty((7, 96), np.float32)
    for c in range(3):
        d = data[:, at - 2 * (c + 1) : at - 2 * c].copy().view(np.float16).astype(np.float32)
        q = data[:, at + 32 * c : at + 32 * (c + 1)].view(np.int8).astype(np.float32)
        out[:, 32 * c : 32 * (c + 1)] = d * q
    np.testing.assert_array_equal(out, ref)
    same, off = device_rows("Q4_K", raw)
    assert same is raw and off == 0


def test_q6_k_rows_put_scales_and_d_before_the_row_pointer():
    """The arena's Q6_K rows: block c's 192 quant bytes (ql, qh) at pointer + 192 c, its 16 int8
    scales and f16 d 18 (c + 1) bytes before the pointer; decoded that way (GGML's formula) they
    equal gguf's dequantizer on the GGML blocks."""
    _, ref, data, at = _arena_rows("Q6_K", 5, 768, 6)
    assert at == 54
    out = np.empty((5, 768), np.float32)
    for c in range(3):
        aux = data[:, at - 18 * (c + 1) : at - 18 * c]
        sc = aux[:, :16].view(np.int8).astype(np.float32)
        d = aux[:, 16:].copy().view(np.float16).astype(np.float32)
        q = data[:, at + 192 * c : at + 192 * (c + 1)].astype(np.int32)
        ql, qh = q[:, :128], q[:, 128:]
        for i in range(256):  # GGML: element i = 128 h + 32 j + e (e < 32)
            h, j, e = i // 128, (i % 128) // 32, i % 32
            lo = (ql[:, 64 * h + 32 * (j & 1) + e] >> (4 * (j >> 1))) & 15
            hi = (qh[:, 32 * h + e] >> (2 * j)) & 3
            s = sc[:, 8 * h + 2 * j + e // 16]
            out[:, 256 * c + i] = d[:, 0] * s * ((lo | (hi << 4)) - 32)
    np.testing.assert_array_equal(out, ref)


def test_qk_rope_store_grid_gives_each_q_and_k_head_a_warp():
    """qk_rope_store's blocks: ceil((H + Hkv) / warps per block) for Q/K heads, then one per V."""
    from forge_hip.tuning import qk_rope_blocks

    assert qk_rope_blocks(32, 8, 128, 32) == 10 + 8  # llama-8B: 40 Q/K heads over 4 warps
    assert qk_rope_blocks(4, 1, 128, 32) == 2 + 1  # gemma3: 5 heads, the second block one warp
    assert qk_rope_blocks(4, 1, 128, 64) == 3 + 1  # wave64: two warps per block


def test_mmq_warp_split_fills_the_gpu_within_the_chunks():
    from forge_hip.tuning import mmq_items, mmq_ks

    assert mmq_ks(640, ["Q8_0"], [262144], 132) == 1  # the head fills the GPU by its rows
    assert mmq_ks(4096, ["Q4_K"], [14336], 132) == 4  # 448 row groups of 32 rows: 2 per CU
    assert mmq_items([14336], 4) == 448 and mmq_items([14336], 2) == 224
    assert mmq_ks(640, ["Q5_0", "Q5_0", "Q8_0"], [1024, 256, 256], 132) == 8  # never 264 groups
    assert mmq_ks(256, ["Q4_K", "Q6_K"], [100, 100], 132) == 2  # Q6_K: 2 chunks of 128


@pytest.mark.usefixtures("attn_decode_path")
@pytest.mark.parametrize("rows", [2, 8, 12, 32, 48])
def test_many_row_steps_run_mmq_and_split_attention_to_fill_the_gpu(golden_dir, rows):
    """2-64 rows of a model with mmq types: every product is x quantized once (mvq_quant) then
    one mmq launch (m1 up to 16 rows, m1 over two 16-row halves up to 32, m2 over two 32-row
    halves above) writing those rows, with its row groups and warp split as the plan computes
    them; attention splits stop at att_fill blocks per compute unit. plan.mmq off: the mvq
    kernels (or the prefill GEMM past 32)."""
    from forge_hip.tuning import DEFAULT, MMQ_WARPS, mmq_items
    from forge_hip.workspace import PART_ROWS

    ATT_FILL, MMQ_LAUNCH_ROWS = DEFAULT.att_fill, DEFAULT.mmq_launch_rows

    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(2048, 16)
    spec, plan = runner.spec, runner.plan
    batch = [SeqBatch(np.array([5], np.int32), 3, np.array([r], np.int32)) for r in range(rows)]
    for mmq in (True, False):
        plan.products.mmq = mmq
        runner.graphs.clear()
        rt.launches.clear()
        rt.launch_args.clear()
        runner.forward_argmax(batch)
        names = [n for n, _, _ in rt.launches]
        products = [n for n in names if n.startswith(("mmq_", "mvq_multi", "mvq_glu", "gemm"))]
        if not mmq:
            assert not any(n.startswith("mmq_") for n in products), products
            continue
        step = MMQ_LAUNCH_ROWS
        halves = [(r0, min(step, rows - r0)) for r0 in range(0, rows, step)]
        # qkv, wo, gate/up, down; the head, each once per launch
        assert len(products) == (4 * spec.n_layer + 1) * len(halves)
        mts = {1 if n <= 32 else 2 for _, n in halves}
        assert set(products) == {f"mmq_{k}_m{mt}" for k in ("multi", "glu") for mt in mts}
        ys = {g[1] for n, g, _ in rt.launches if n.startswith("mmq_")}
        assert ys == {1 if n <= 16 else 2 for _, n in halves}  # gridDim.y: x's row halves
        # x quantized once before each: by mvq_quant, or by the add_norm making it (q/k/v, gate/up)
        before = [names[i - 1] for i, n in enumerate(names) if n in products]
        assert before.count("add_norm_quant") == 2 * spec.n_layer
        assert before.count("mvq_quant") == len(products) - 2 * spec.n_layer
        seen = set()
        for name, args in rt.launch_args:
            if name.startswith("mmq_multi"):
                first, count, r, r0 = args[1:5]
                items, ks = args[8], args[9]
                ns = [int(plan.products.descs[first + j][6]) for j in range(count)]
                assert (r0, r) in halves and ks in (1, 2, 4, 8) and items == mmq_items(ns, ks)
                seen.add(r0)
        assert seen == {r0 for r0, _ in halves}
        grids = [g for n, g, _ in rt.launches if n.startswith("attn_decode")]
        blocks = plan.attentions.decode_blocks()  # gemma3: 4 query heads on 1 KV head: 1
        assert blocks == 1
        fill = ATT_FILL * rt.props.compute_units // (rows * blocks)
        want = min(runner.splits, PART_ROWS // rows, fill)
        assert grids and all(g == (blocks, rows, max(1, want)) for g in grids), grids
        assert MMQ_WARPS == 8
    runner.close()


@pytest.mark.usefixtures("attn_decode_path")
def test_one_row_decode_splits_fill_one_wave_of_grouped_blocks(golden_dir):
    """One-row decode at a long context: the grouped kernel (gemma3: 4 query heads on 1 KV
    head, one block a split) splits up to a block per compute unit (MAX_SPLITS at most); the
    per-head kernel keeps the 16 splits measured best for it."""
    from dataclasses import replace

    from forge_hip.workspace import MAX_SPLITS, ROWS_SPLITS

    rt = FakeRuntime()
    rt.props = replace(rt.props, compute_units=40)  # fewer than MAX_SPLITS blocks fill it
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(2048, 16)
    spec, plan = runner.spec, runner.plan
    cus = rt.props.compute_units
    for per_head in (False, True):
        if per_head:  # as when the heads are not shared: one block per query head
            plan.attentions.decode_group = 1
            plan.op["attn_decode"] = plan.lib.get(f"attn_decode_w{spec.head_dim}")
        runner.graphs.clear()
        rt.launches.clear()
        runner.forward_argmax([SeqBatch(np.array([5], np.int32), 3, np.array([0], np.int32))])
        grids = [g for n, g, _ in rt.launches if n.startswith("attn_decode")]
        assert runner.splits == MAX_SPLITS
        # (per head, the fill rule would give 40 // 4 = 10)
        want = (spec.n_head, 1, ROWS_SPLITS) if per_head else (1, 1, cus)
        assert grids and all(g == want for g in grids), (per_head, grids)
    runner.close()


@pytest.mark.parametrize("windowed", [False, True])
def test_decode_metadata_fast_path_writes_what_the_general_one_writes(golden_dir, monkeypatch,
                                                                     windowed):  # fmt: skip
    """A step of one-token pieces (a decode step) fills the host metadata through step_meta's
    `_prepare_decode`; every word of it, and what it returns, equals `_prepare_rows`' result for
    the same pieces: positions across block boundaries, tables longer than needed, outputs
    "last" / "all" / "none", argmax and sampled picks, fed and unfed rows (`windowed`: also a
    window pool's tables, with blocks below the window freed)."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(256, 16, {8: 100} if windowed else None)
    rng = np.random.default_rng(7)
    n = 24
    starts = rng.integers(0, 100, n)

    def window_table(p, full):  # blocks wholly below position p - 7 have left the window
        table = rng.integers(0, 100, len(full)).astype(np.int32)
        table[: max(0, p - 7) // 16] = -1
        return (table,)

    chunk = [SeqBatch(np.array([rng.integers(0, runner.spec.n_vocab)], np.int32), int(p),
                      rng.permutation(256)[: p // 16 + 1 + rng.integers(0, 3)].astype(np.int32),
                      ("last", "all", "none")[i % 3])
             for i, p in enumerate(starts)]  # fmt: skip
    if windowed:
        chunk = [replace(b, window_tables=window_table(b.start, b.block_table)) for b in chunk]
    sampled = DeviceSampling(temperature=0.7, top_k=20, top_p=0.9, key=5)
    picks = [None if b.output == "none" else (sampled if i % 2 else DeviceSampling())
             for i, b in enumerate(chunk)]  # fmt: skip
    feed = [int(i) if i % 4 else -1 for i in range(n)]
    from forge_hip import step_meta

    results = []
    for prepare in (step_meta._prepare_rows, step_meta._prepare_decode):
        runner.meta.host[:] = 12345  # what either leaves unwritten stays so
        rows, wanted, n_bt = prepare(runner.meta, runner.spec.n_vocab, runner.kv, chunk,
                                     runner.graphs.clear, picks, feed)  # fmt: skip
        results.append((rows, [w.tolist() for w in wanted], n_bt, runner.meta.host.copy()))
    (rows, wanted, n_bt, host), fast = results
    assert rows == n and n_bt == (1 + windowed) * sum(int(p) // 16 + 1 for p in starts)
    assert fast[:3] == (rows, wanted, n_bt)
    np.testing.assert_array_equal(fast[3], host)

    def general(*args):
        raise AssertionError("a decode step took the general path")

    # one-token pieces take the fast path; longer ones cannot
    monkeypatch.setattr(step_meta, "_prepare_rows", general)
    assert runner._prepare(chunk, picks, feed)[0] == n
    longer = [SeqBatch(np.array([1, 2], np.int32), 0, np.arange(2, dtype=np.int32))]
    with pytest.raises(AssertionError, match="general path"):
        runner._prepare(chunk + longer, picks + [None], feed + [-1])


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf", "qwen3-q8_0.gguf"])
def test_arena_places_exactly_the_weight_table(golden_dir, name):
    """The hip arena and plan read the model's weights from forge.models.weights: every row
    present is placed (vectors widened to float32), nothing else."""
    from forge.models.weights import model_weights

    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    table = model_weights(runner.spec)
    assert set(runner.arena.placed) == set(table)
    gguf = open_gguf(golden_dir / "models" / name)
    for n, w in table.items():
        placed = runner.arena.placed[n]
        if w.kind == "vector":
            assert (placed.type, placed.k, placed.n) == ("F32", w.shape(runner.spec)[0], 1)
        else:
            assert (placed.type, placed.k, placed.n) == (
                gguf.tensors[n].type,
                *w.shape(runner.spec),
            )
    runner.close()


def test_masked_picks_launch_mask_logits_before_sampling(golden_dir):
    """A step whose picks carry token masks: their rows' masks are uploaded (all-ones for rows
    without) and mask_logits runs before sample_rows, in a graph of its own for decode steps;
    unmasked steps launch no mask_logits."""
    from forge.backend import pack_token_mask

    rt = FakeRuntime()
    runner = _runner(golden_dir, "qwen2-q4_k.gguf", rt)
    runner.allocate_kv(32, 16)
    v = runner.spec.n_vocab
    allowed = np.zeros(v, bool)
    allowed[[3, 40, v - 1]] = True
    mask = pack_token_mask(allowed)
    batch = [SeqBatch(np.array([5 + i], np.int32), 3, np.array([i], np.int32)) for i in range(3)]
    picks = [DeviceSampling(mask=mask), None, DeviceSampling(temperature=0.5, key=2)]
    runner.forward_sample(batch, picks)
    names = [n for n, _, _ in rt.launches]
    assert names[-2:] == ["mask_logits", "sample_rows"]
    assert ("masked", 3) in runner.graphs.graphs and 3 not in runner.graphs.graphs
    mask_args = next(a for n, a in rt.launch_args if n == "mask_logits")
    assert mask_args[1:] == [v, runner.masks.address()]
    np.testing.assert_array_equal(runner.masks.host[0], mask)
    assert (runner.masks.host[1:3] == 0xFFFFFFFF).all()
    rt.launches.clear()
    runner.forward_sample(batch, [DeviceSampling()] * 3)  # unmasked: the plain graph
    assert 3 in runner.graphs.graphs and "mask_logits" not in [n for n, _, _ in rt.launches]
    rt.launches.clear()
    prompt = SeqBatch(np.arange(1, 20, dtype=np.int32), 0, np.arange(4, 6, dtype=np.int32))
    runner.forward_sample([prompt], [DeviceSampling(mask=mask)])  # a pass: gathered output
    names = [n for n, _, _ in rt.launches]
    assert names[-2:] == ["mask_logits", "sample_rows"]
    with pytest.raises(ForgeRuntimeError, match="token mask of 2 words"):
        runner.forward_sample(batch[:1], [DeviceSampling(mask=mask[:2])])
    runner.close()
    assert not rt.live


def test_kv_types_the_kernels_cannot_read_are_refused_before_anything_is_placed(golden_dir):
    from forge_hip.runner import HipRunner

    from forge.errors import UnsupportedModelError
    from forge.kv_cache import KvTypes

    gguf, spec = _spec(golden_dir, "qwen2-q4_k.gguf")
    kernels = get_plugin_manager().kernels
    refused = {("f16", "f32"): "one format; asked for f16 and f32",
               ("q8_0", "bf16"): "one format; asked for q8_0 and bf16"}  # fmt: skip
    for (k, v), match in refused.items():
        types = KvTypes.parse(k, v)
        rt = FakeRuntime()
        with pytest.raises(UnsupportedModelError, match=match):
            HipRunner(spec, gguf, kernels, runtime=rt, kv_types=types)
        assert not rt.live and rt.uploads == 0
    rt = FakeRuntime()
    runner = HipRunner(spec, gguf, kernels, runtime=rt, kv_types=KvTypes.parse("f32", "auto"))
    runner.allocate_kv(4, 16)
    assert runner.kv.format is KvFormat.F32  # asked for, on a model that defaults to f16
    runner.close()
    runner = HipRunner(spec, gguf, kernels, runtime=rt, kv_types=KvTypes.parse("q4_0", "q4_0"))
    runner.allocate_kv(4, 16)
    assert runner.kv.format is KvFormat.Q4_0
    runner.close()
