"""forge_hip.invariance without a GPU (a recording fake runtime): under the config key
batch_invariant, a one-row decode step, an 8-row step and a 300-row prompt pass launch the same
product and attention kernels (up to their rows per tile) (their bits are compared on the device:
tests/gpu/test_batch_invariance_gpu.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from forge.backend import SeqBatch
from forge.gguf import open_gguf
from forge.kernels import KernelTable
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime


def test_batch_invariant_table_is_marked_and_kept_by_builtin_only():
    table = KernelTable()
    assert not table.invariant
    inv = table.batch_invariant()
    assert inv.invariant and inv.builtin_only({}).invariant
    assert not table.builtin_only({}).invariant


def _runner(golden_dir, name, kernels):
    from forge_hip.runner import HipRunner

    rt = FakeRuntime()
    gguf = open_gguf(str(golden_dir / "models" / name))
    runner = HipRunner(build_spec(gguf), gguf, kernels, runtime=rt)
    runner.allocate_kv(64, 16)
    runner.graph_policy.enabled = False  # launches recorded one by one
    return runner, rt


def _kernels(runner, rt, batch) -> set[str]:
    """The product and attention kernels one forward pass launches, less the suffix of their
    rows per tile (mvq_multi_r8 -> mvq_multi, mmq_glu_m2 -> mmq_glu: one reduction per row)."""
    rt.launches.clear()
    runner.forward(batch)
    names = {n for n, _, _ in rt.launches if n.startswith(("mvq_", "mmq_", "gemm_", "attn"))}
    return {re.sub(r"_[rm][0-9]+$", "", n) for n in names}


def _passes(runner, rt) -> list[set[str]]:
    """Kernels of a 300-token prompt pass, then of decode steps of 1 and 8 sequences."""
    tables = [np.arange(s * 4, s * 4 + 4, dtype=np.int32) for s in range(8)]
    prompt = np.arange(3, 303, dtype=np.int32) % runner.spec.n_vocab
    long = _kernels(runner, rt, [SeqBatch(prompt, 0, np.arange(20, 40, dtype=np.int32))])
    for t in tables:
        runner.forward([SeqBatch(np.arange(1, 20, dtype=np.int32), 0, t, "none")])
    steps = [_kernels(runner, rt, [SeqBatch(np.array([5], np.int32), 19, t) for t in tables[:n]])
             for n in (1, 8)]  # fmt: skip
    return [long, *steps]


@pytest.mark.parametrize("name", ["llama-q8_0.gguf", "qwen2-q2_k.gguf", "llama-f16.gguf"])
def test_every_row_count_launches_the_same_kernels(golden_dir, name):
    kernels = get_plugin_manager().kernels.batch_invariant()
    runner, rt = _runner(golden_dir, name, kernels)
    long, one, eight = _passes(runner, rt)
    assert long == one == eight
    assert "attn_rows" in one and not {k for k in one if k.startswith("attn_decode")}
    grids = [grid for n, grid, _ in rt.launches if n == "attn_rows"]
    assert grids and all(g[2] == 1 for g in grids)  # one split: a row's positions in one block
    assert runner.plan.products.invariant


def test_default_plan_picks_kernels_by_row_count(golden_dir):
    """What batch_invariant fixes: by default one row, 8 rows and 300 rows take other paths."""
    runner, rt = _runner(golden_dir, "llama-q8_0.gguf", get_plugin_manager().kernels)
    long, one, eight = _passes(runner, rt)
    assert len({frozenset(long), frozenset(one), frozenset(eight)}) == 3
    assert not runner.plan.products.invariant


def test_a_mixture_of_experts_under_batch_invariant_says_its_experts_are_not_covered(
    golden_dir, recwarn
):
    kernels = get_plugin_manager().kernels.batch_invariant()
    _runner(golden_dir, "qwen3moe-q8_0.gguf", kernels)
    said = [str(w.message) for w in recwarn if "expert layers" in str(w.message)]
    assert len(said) == 1 and "batch_invariant" in said[0]
    recwarn.clear()
    _runner(golden_dir, "qwen3moe-q8_0.gguf", get_plugin_manager().kernels)  # default: silent
    _runner(golden_dir, "llama-q8_0.gguf", kernels)  # dense: covered, silent
    assert not [w for w in recwarn if "expert layers" in str(w.message)]
