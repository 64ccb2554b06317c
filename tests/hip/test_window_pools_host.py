"""hip keeps sliding-window layers' cache apart (`HipRunner.windowed_kv`), without a GPU (a
recording fake runtime): each layer's cache sized by its pool, each row's slots and block
tables per pool against a direct computation, the attention launches of a windowed layer naming
its pool's fields, and bad window tables refused with the reason. The arithmetic ran on the
device: tests/gpu/test_window_pools_gpu.py and the golden models (gemma3's and gpt-oss's
windowed layers)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.kv import layer_bytes

from forge.backend import SeqBatch
from forge.errors import ContextOverflowError, ForgeRuntimeError
from forge.gguf import open_gguf
from forge.kv_pools import FREED
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime

BS = 16
WINDOW = 8  # the golden gemma3's: 5 of its 6 layers (the 6th attends to every position)
ATTENTION = ("attn_decode", "qk_rope_store", "attn_rows", "attn_prefill")


def _runner(golden_dir, rt, window_blocks=None, n_blocks=64):
    from forge_hip.runner import HipRunner

    gguf = open_gguf(str(golden_dir / "models" / "gemma3-q4_k_m.gguf"))
    runner = HipRunner(build_spec(gguf), gguf, get_plugin_manager().kernels, runtime=rt)
    runner.allocate_kv(n_blocks, BS, window_blocks)
    return runner


def test_each_layer_holds_its_pools_blocks(golden_dir):
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, {WINDOW: 5})
    s, kv = runner.spec, runner.kv
    pools = [kv.pool(i) for i in range(s.n_layer)]
    assert pools == [1 if ls.sliding_window == WINDOW else 0 for ls in s.layers]
    assert pools.count(0) == 1 and kv.pool_blocks == (64, 5) and runner.meta.pools == 2
    sizes = [layer_bytes(s, (64 if p == 0 else 5) * BS, kv.format) for p in pools]
    at = kv.buffer.ptr
    for i, (k_size, v_size) in enumerate(sizes):  # one after another, none overlapping
        assert kv.layer(i) == (at, at + k_size)
        at += k_size + v_size
    assert kv.nbytes == at - kv.buffer.ptr == runner.memory_estimate()["kv_cache"]
    runner.allocate_kv(64, BS)  # the same runner, no window pools: every layer full-length
    whole = s.n_layer * sum(layer_bytes(s, 64 * BS, kv.format))
    assert runner.kv.nbytes == whole and runner.meta.pools == 1
    assert {runner.kv.pool(i) for i in range(s.n_layer)} == {0}
    assert kv.nbytes < whole * (1 + 5 * 5 / 64) / 6 + 4096  # the windowed layers' share went
    runner.close()


def _step(rows_of):
    """A sequence's pieces: (tokens, start, full table, window table)."""
    return [SeqBatch(np.arange(1, n + 1, dtype=np.int32), start, np.asarray(full, np.int32),
                     "last", (np.asarray(win, np.int32),))
            for n, start, full, win in rows_of]  # fmt: skip


def _expected(batch, pool: int):
    """Each row's slot in `pool` (0: full, 1: the window's) from the tables directly, and the
    table entries as uploaded (FREED as block 0)."""
    slots, tables = [], []
    for b in batch:
        table = b.block_table if pool == 0 else b.window_tables[0]
        last = b.start + len(b.tokens) - 1
        tables += [max(int(t), 0) for t in table[: last // BS + 1]]
        slots += [int(table[p // BS]) * BS + p % BS for p in range(b.start, last + 1)]
    return slots, tables


@pytest.mark.parametrize("decode", [False, True])
def test_rows_read_each_pools_slots_and_tables(golden_dir, decode):
    """Positions past the window's first blocks: FREED entries, uploaded as block 0; each
    pool's slots from its own table; attention of the windowed layers names the window pool's
    slots and offsets, the full layer the full pool's, each with its own K/V."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, {WINDOW: 6})
    if decode:  # two sequences, one token each, at positions 40 and 30
        batch = _step([(1, 40, [7, 1, 2], [FREED, FREED, 4]), (1, 30, [3, 9], [FREED, 5])])
    else:  # a prompt piece at 33..44 reads from position 26 on: block 1 onwards
        batch = _step([(12, 33, [0, 1, 2], [FREED, 3, 1]), (3, 0, [5], [0])])
    runner.forward(batch)
    meta, rows = runner.meta, sum(len(b.tokens) for b in batch)
    n_bt = sum((b.start + len(b.tokens) - 1) // BS + 1 for b in batch)
    full_slots, full_bt = _expected(batch, 0)
    win_slots, win_bt = _expected(batch, 1)
    assert meta.field("slots")[:rows].tolist() == full_slots
    assert meta.field("slots1")[:rows].tolist() == win_slots
    assert meta.bt_host()[: 2 * n_bt].tolist() == full_bt + win_bt
    firsts = np.cumsum([0] + [(b.start + len(b.tokens) - 1) // BS + 1 for b in batch])[:-1]
    row_first = np.repeat(firsts, [len(b.tokens) for b in batch])
    assert meta.field("btoff")[:rows].tolist() == row_first.tolist()
    assert meta.field("btoff1")[:rows].tolist() == (row_first + n_bt).tolist()
    launches = [(n, set(a)) for n, a in rt.launch_args if n.startswith(ATTENTION)]
    per_layer = len(launches) // runner.spec.n_layer
    assert per_layer in (1, 2) and len(launches) == per_layer * runner.spec.n_layer
    for i in range(runner.spec.n_layer):
        own, other = (meta.slots1, meta.slots) if runner.kv.pool(i) else (meta.slots, meta.slots1)
        offsets = meta.btoff1 if runner.kv.pool(i) else meta.btoff
        for name, args in launches[i * per_layer : (i + 1) * per_layer]:
            assert set(runner.kv.layer(i)) <= args, (i, name)
            assert other not in args, (i, name)
            assert own in args or name.startswith(("attn_rows", "attn_prefill")), (i, name)
            assert offsets in args or name.startswith("qk_rope_store"), (i, name)
    runner.close()


def test_bad_window_tables_are_refused_with_the_reason(golden_dir):
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, {WINDOW: 6})
    with pytest.raises(ForgeRuntimeError, match="0 window tables for 1 window pools"):
        runner.forward([SeqBatch(np.array([1], np.int32), 0, np.array([0], np.int32))])
    # position 40's window starts at 33, in block 2: freed there, it cannot be read
    gone = _step([(1, 40, [0, 1, 2], [FREED, FREED, FREED])])
    with pytest.raises(ForgeRuntimeError, match="window of 8 positions has left"):
        runner.forward(gone)
    outside = _step([(1, 40, [0, 1, 2], [FREED, FREED, 6])])  # the pool has blocks 0..5
    with pytest.raises(ForgeRuntimeError, match=r"outside 0\.\.5"):
        runner.forward(outside)
    short = _step([(1, 40, [0, 1, 2], [FREED, 2])])
    with pytest.raises(ContextOverflowError, match="has no KV block"):
        runner.forward(short)
    runner.close()
