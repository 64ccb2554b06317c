"""HipRunner's host side without a GPU: a recording fake runtime checks the launch plan (every
argument packs against its kernel's signature, kernels per decode step, one graph per batch size,
one host->device copy per step), chunking, the preflight message and cleanup after failures."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from forge_hip.runtime.base import ArgPack, DeviceBuffer, DeviceProps, Kernel

from forge.backend import SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError, OutOfMemoryError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.plugins import get_plugin_manager


class FakeRuntime:
    """Records launches and copies; device memory is a counter of addresses."""

    platform = "fake"

    def __init__(self, free=80 << 30, fail_upload_at=None):
        self.props = DeviceProps("Fake GPU", "sm_90", 96 << 30, free, 132, 32, "fake-1")
        self.free_bytes, self.fail_upload_at = free, fail_upload_at
        self.next, self.live, self.uploads = 1 << 32, {}, 0
        self.launches, self.capturing, self.replays = [], False, 0
        self.launch_args: list[tuple[str, list[int]]] = []
        self.blocks: list[tuple[int, ...]] = []
        self.bound_threads: list[int] = []

    def bind(self):
        self.bound_threads.append(threading.get_ident())

    def alloc(self, n):
        if n > self.free_bytes:
            raise OutOfMemoryError("fake alloc")
        buf = DeviceBuffer(self.next, n)
        self.live[buf.ptr] = n
        self.next += (n + 511) // 256 * 256
        return buf

    def free(self, buf):
        self.live.pop(buf.ptr, None)
        buf.ptr = 0

    def free_memory(self):
        return self.free_bytes - sum(self.live.values())

    def copy_to_device(self, dst, src, stream=None):
        self.uploads += 1
        if self.uploads == self.fail_upload_at:
            raise ForgeRuntimeError("injected upload failure")

    def copy_to_host(self, dst, src, stream=None):
        dst[...] = 0

    def stream(self):
        return "stream"

    def synchronize(self, stream=None):
        pass

    def event(self):
        return object()

    def record(self, event, stream=None):
        pass

    def elapsed_ms(self, a, b):
        return 0.001

    def compile(self, source, name, flags=()):
        return source.encode()

    def load(self, binary):
        return binary

    def function(self, module, name, signature):
        src = module.decode()  # macro-made kernels (embed_q4_k) show their suffix only
        assert f" {name}(" in src or f"({name.split('_', 1)[-1]}," in src, name
        return Kernel(None, name, signature)

    def launch(self, kernel, grid, block, args, shared=0, stream=None, overlap=False):
        ArgPack(kernel.signature, args)  # raises on a wrong argument count or type
        assert overlap == (self.capturing and kernel.overlaps)  # only graph launches overlap
        assert all(int(g) >= 1 for g in grid) and int(block[0]) <= 1024
        self.launches.append((kernel.name, tuple(grid), self.capturing))
        self.blocks.append(tuple(block))
        self.launch_args.append((kernel.name, [int(getattr(a, "ptr", a)) for a in args]))

    def begin_capture(self, stream):
        self.capturing = True

    def end_capture(self, stream):
        self.capturing = False
        return "graph"

    def replay(self, graph, stream):
        self.replays += 1

    def close(self):
        pass


def _spec(golden_dir, name):
    gguf = open_gguf(str(golden_dir / "models" / name))
    return gguf, build_spec(gguf)


def _runner(golden_dir, name, rt):
    from forge_hip.runner import HipRunner

    gguf, spec = _spec(golden_dir, name)
    return HipRunner(spec, gguf, get_plugin_manager().kernels, runtime=rt)


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf", "llama-f32.gguf"])
def test_plan_packs_and_decode_is_one_graph_per_batch_size(golden_dir, name):
    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    runner.allocate_kv(32, 16)
    n_layer = runner.spec.n_layer
    ids = np.arange(1, 41, dtype=np.int32)  # past plan.MVQ_MAX_ROWS: the prefill products
    rows = runner.forward([SeqBatch(ids, 0, np.arange(3, dtype=np.int32), "all")])
    assert rows[0].shape == (40, runner.spec.n_vocab)
    assert not any(cap for _, _, cap in rt.launches)
    prefill_kernel = "mm_tiled" if name == "llama-f32.gguf" else "gemm_m64"  # F32: SIMT float32
    assert prefill_kernel in {n for n, _, _ in rt.launches}
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
    per_step = runner.graphs.kernels[2]
    # per layer: qkv, attention (one fused launch), wo, add_norm, gate/up, down, add_norm
    assert per_step == 7 * n_layer + 4, per_step
    assert rt.replays == 3
    assert runner.kv.f16 == (name != "llama-f32.gguf")
    runner.close()
    assert not rt.live


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
    for fuse, rows in ((True, 1), (False, 1), (True, 2)):
        runner.plan.fuse_norm = fuse
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

    gguf, spec = _spec(golden_dir, "gemma3-q4_k_m.gguf")
    need = HipBackend().memory_needed(spec, gguf, 1024)
    assert need["weights"] >= sum(gguf.tensors[n].nbytes for n in spec.weight_names())
    assert need["kv_cache"] == spec.kv_bytes_per_token(2) * 1024
    assert need["workspace"] > 0


def test_staged_tiles_fit_or_the_plain_kernel_stays():
    """The staged kernels take a product when RB rows (RB = threads / lanes) of every matrix
    make 16-byte aligned tiles within mmv.hip's buffer (gate + up together), with the most
    threads that fit; x too long for their shared memory, or no fit: 0 (the plain kernel)."""
    from types import SimpleNamespace

    from forge_hip.plan import MVQ_STAGE_BUF, mvq_stage_threads

    def mat(k, row_bytes):
        return SimpleNamespace(k=k, row_bytes=row_bytes)

    head = [mat(640, 680)]  # gemma3 Q8_0 head rows: 16 x 680 bytes per 256 threads
    assert mvq_stage_threads(head, 16, False, False, 1) == 256
    q4k = mat(4096, 2304)  # llama-8B Q4_K rows, 32 lanes each
    assert mvq_stage_threads([q4k, q4k], 32, False, False, 2) == 256  # 8 rows: 18 KiB
    assert mvq_stage_threads([q4k, q4k], 32, True, False, 2) == 128  # gate + up: 2 x 4 rows
    q80 = mat(1024, 1088)  # 16 rows: 17 KiB, over the folded-norm kernels' smaller buffer
    assert 16 * 1088 > MVQ_STAGE_BUF[True]
    assert mvq_stage_threads([q80], 16, False, False, 1) == 256
    assert mvq_stage_threads([q80], 16, False, True, 1) == 128
    assert mvq_stage_threads([q4k], 32, False, True, 2) == 0  # x of 4096: past their x space
    assert mvq_stage_threads([mat(14336, 11760)], 32, False, False, 2) == 0  # x: 17.5 KiB
    assert mvq_stage_threads([mat(8192, 16384)], 32, False, False, 0) == 0  # F16 rows: no fit


def test_one_row_products_take_the_staged_kernels(golden_dir):
    """Batch-1 products go through the staged kernels (mmv.hip *_s) where their tiles fit, with
    the block mvq_stage_threads gives; mvq_stage_bytes None keeps the plain ones; two-row steps
    never stage."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, "gemma3-q4_k_m.gguf", rt)
    runner.allocate_kv(32, 16)
    table = np.arange(3, dtype=np.int32)
    seen = {}
    for stage, rows in ((0, 1), (None, 1), (0, 2)):
        runner.plan.mvq_stage_bytes = stage
        runner.graphs.clear()
        rt.launches.clear()
        rt.blocks.clear()
        batch = [SeqBatch(np.array([5 + r], np.int32), 3, table + 3 * r) for r in range(rows)]
        runner.forward_argmax(batch)
        mvq = [(n, b) for (n, _, _), b in zip(rt.launches, rt.blocks) if n.startswith("mvq_")]
        seen[stage, rows] = sum(n.endswith("s") for n, _ in mvq), len(mvq)
        if stage == 0 and rows == 1:
            assert all(b[0] in (64, 128, 256) for n, b in mvq if n.endswith("s"))
    staged, total = seen[0, 1]
    assert 0 < staged <= total
    assert seen[None, 1][0] == 0 and seen[0, 2][0] == 0


def test_qk_rope_store_grid_gives_each_q_and_k_head_a_warp():
    """qk_rope_store's blocks: ceil((H + Hkv) / warps per block) for Q/K heads, then one per V."""
    from forge_hip.plan import qk_rope_blocks

    assert qk_rope_blocks(32, 8, 128, 32) == 10 + 8  # llama-8B: 40 Q/K heads over 4 warps
    assert qk_rope_blocks(4, 1, 128, 32) == 2 + 1  # gemma3: 5 heads, the second block one warp
    assert qk_rope_blocks(4, 1, 128, 64) == 3 + 1  # wave64: two warps per block
