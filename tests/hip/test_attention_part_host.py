"""forge_hip.attention_part without a GPU (a recording fake runtime): what gpt-oss's attention
hands the kernels (its sinks, YaRN's frequency table and magnitude, the output bias) in decode,
prefill and mixed passes, and that models without them hand over nothing new. The arithmetic runs
on the device (tests/gpu/test_attention.py, test_attn_prefill.py, test_golden_gpu.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from forge_hip.contract import constants
from forge_hip.library import TCD_BK, attn_decode_kernel, attn_decode_tc_kernel
from forge_hip.tuning import load_tuning

from forge.backend import SeqBatch
from forge.gguf import open_gguf
from forge.kv_cache import KvFormat, KvTypes
from forge.models import build_spec
from forge.models.rope import rope_frequencies
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime


class UploadingRuntime(FakeRuntime):
    """FakeRuntime that keeps what is copied to the device, by address."""

    def __init__(self):
        super().__init__()
        self.copies: dict[int, np.ndarray] = {}

    def copy_to_device(self, dst, src, stream=None):
        super().copy_to_device(dst, src, stream)
        self.copies[int(getattr(dst, "ptr", dst))] = np.array(src, copy=True)


DECODE_SINKS = 29  # attn_decode's sinks argument (the grouped kernels take H after it)
PREFILL_SINKS = 16  # attn_prefill's (its split partials, counters and splits after it)


def _runner(golden_dir, name, rt, kv_types=None):
    from forge_hip.runner import HipRunner

    gguf = open_gguf(str(golden_dir / "models" / name))
    runner = HipRunner(build_spec(gguf), gguf, get_plugin_manager().kernels, runtime=rt,
                       kv_types=kv_types)  # fmt: skip
    runner.allocate_kv(64, 16)
    return runner


def _decode_step(runner, rt, rows: int = 1) -> None:
    """Prompts of 3 tokens in `rows` sequences, then one decode step of each: `rt` records the
    decode step's launches (and shared memory) alone."""
    runner.forward([SeqBatch(np.arange(1, 4, dtype=np.int32), 0, np.array([r]), "last")
                    for r in range(rows)])  # fmt: skip
    rt.launches.clear()
    rt.shared.clear()
    runner.forward([SeqBatch(np.array([5], np.int32), 3, np.array([r]), "last")
                    for r in range(rows)])  # fmt: skip


def _args(rt, prefix: str) -> list[list[int]]:
    return [a for n, a in rt.launch_args if n.startswith(prefix)]


def test_gpt_oss_yarn_tables_are_the_models_frequencies(golden_dir):
    rt = UploadingRuntime()
    runner = _runner(golden_dir, "gpt-oss-q8_0.gguf", rt)
    s, at = runner.spec, runner.ws.rope_freqs
    for i, a in enumerate(runner.plan.attention):
        layer = s.layers[i]
        assert a.rope_freqs == at + 4 * i * (s.rope_dim // 2)
        want = rope_frequencies(s.rope_dim, layer.rope_base, layer.rope).astype(np.float32)
        np.testing.assert_array_equal(rt.copies[a.rope_freqs], want)
        assert a.mscale == layer.rope.mscale != 1.0
    # YaRN moves the low frequencies: the table is not the plain base^(-2i/d)
    plain = s.layers[0].rope_base ** (-2.0 * np.arange(s.rope_dim // 2) / s.rope_dim)
    assert not np.allclose(rt.copies[runner.plan.attention[0].rope_freqs], plain)


@pytest.mark.usefixtures("attn_decode_path")
@pytest.mark.parametrize("rows", [1, 9, 300])
def test_gpt_oss_attention_gets_sinks_yarn_and_the_output_bias(golden_dir, rows):
    """One-row decode (attn_decode), a short prompt (qk_rope_store + attn_rows) and a long one
    (attn_prefill) all receive the layer's sinks; RoPE gets the table and YaRN's magnitude."""
    from forge_hip.products import DESC

    rt = FakeRuntime()
    runner = _runner(golden_dir, "gpt-oss-q8_0.gguf", rt)
    address = runner.arena.address
    plan = runner.plan
    if rows == 1:
        runner.forward([SeqBatch(np.arange(1, 4, dtype=np.int32), 0, np.arange(1), "last")])
        rt.launch_args.clear()
        runner.forward([SeqBatch(np.array([5], np.int32), 3, np.arange(1), "last")])
        rt.launches.clear()
        decode = _args(rt, "attn_decode")
        assert len(decode) == runner.spec.n_layer
        for i, args in enumerate(decode):
            a = plan.attention[i]
            assert args[DECODE_SINKS] == address(f"blk.{i}.attn_sinks.weight") != 0
            assert args[22] == a.rope_freqs != 0  # (the argument after freq_scale)
            assert args[23] == int(a.mscale)  # (the fake runtime records ints)
    else:
        runner.forward([SeqBatch(np.arange(1, rows + 1, dtype=np.int32) % 400, 0,
                                 np.arange(-(-rows // 16)), "last")])  # fmt: skip
        kernel = "attn_rows" if rows <= 128 else "attn_prefill"
        at = -1 if kernel == "attn_rows" else PREFILL_SINKS
        attn = _args(rt, kernel)
        assert [a[at] for a in attn] == [address(f"blk.{i}.attn_sinks.weight")
                                         for i in range(runner.spec.n_layer)]  # fmt: skip
        rope = _args(rt, "qk_rope_store")
        assert [a[17] for a in rope] == [a.rope_freqs for a in plan.attention]
        assert [a[18] for a in rope] == [int(a.mscale) for a in plan.attention]
    for i, a in enumerate(plan.attention):
        bias = plan.products.descs[a.wo][DESC["BIAS"]]
        assert bias == address(f"blk.{i}.attn_output.bias") != 0


@pytest.mark.usefixtures("attn_decode_path")
def test_models_without_sinks_or_scaled_rope_hand_over_nothing_new(golden_dir):
    rt = FakeRuntime()
    runner = _runner(golden_dir, "qwen3-q8_0.gguf", rt)
    runner.forward([SeqBatch(np.arange(1, 10, dtype=np.int32), 0, np.arange(1), "last")])
    runner.forward([SeqBatch(np.arange(1, 301, dtype=np.int32) % 400, 0, np.arange(19), "last")])
    runner.forward([SeqBatch(np.array([5], np.int32), 9, np.arange(1), "last")])
    for a in runner.plan.attention:
        assert (a.sinks, a.rope_freqs, a.mscale) == (0, 0, 1.0)
    n = runner.spec.n_layer
    for kernel, sinks in (
        ("attn_rows", -1),
        ("attn_prefill", PREFILL_SINKS),
        ("attn_decode", DECODE_SINKS),
    ):
        launched = _args(rt, kernel)
        assert len(launched) >= n and all(a[sinks] == 0 for a in launched), kernel
    rope = _args(rt, "qk_rope_store")
    assert len(rope) >= n and all(a[17:19] == [0, 1] for a in rope)
    decode = _args(rt, "attn_decode")
    assert all(a[22:24] == [0, 1] for a in decode)


def test_the_plan_groups_only_shared_kv_heads():
    assert attn_decode_kernel(128, 128, 32, 8) == ("attn_decode_w128_g4", 4)
    assert attn_decode_kernel(256, 256, 4, 1) == ("attn_decode_w256_g4", 4)
    assert attn_decode_kernel(64, 64, 8, 8) == ("attn_decode_w64", 1)  # no sharing: per head
    assert attn_decode_kernel(512, 512, 8, 1) == ("attn_decode_w512", 1)  # no grouped layout


def test_tensor_core_decode_only_where_it_applies():
    f16, q8 = KvFormat.F16, KvFormat.Q8_0
    h100 = "sm_90"
    assert attn_decode_tc_kernel(128, 128, 32, 8, h100, f16) == "attn_decode_tc128"
    assert attn_decode_tc_kernel(64, 64, 64, 8, h100, f16) == "attn_decode_tc64"
    assert attn_decode_tc_kernel(64, 64, 8, 8, h100, f16) == "attn_decode_tc64"  # one a KV head
    assert attn_decode_tc_kernel(128, 128, 32, 8, "gfx942", f16) is None  # NVIDIA sm_90 only
    assert attn_decode_tc_kernel(128, 128, 32, 8, "sm_89", f16) is None  # 100 KB a block
    assert attn_decode_tc_kernel(128, 128, 32, 8, h100, q8) == "attn_decode_tc128_q8"
    assert attn_decode_tc_kernel(64, 64, 64, 8, h100, q8) == "attn_decode_tc64_q8"
    assert attn_decode_tc_kernel(128, 128, 32, 8, h100, KvFormat.Q4_0) is None  # f16, Q8_0 only
    assert attn_decode_tc_kernel(128, 128, 32, 8, h100, KvFormat.BF16) is None
    assert attn_decode_tc_kernel(256, 256, 4, 1, h100, f16) is None  # heads of 64 or 128
    assert attn_decode_tc_kernel(128, 64, 32, 8, h100, f16) is None  # D == Dv
    assert attn_decode_tc_kernel(64, 64, 64, 2, h100, f16) is None  # at most 16 a KV head


class NvidiaFake(FakeRuntime):
    """FakeRuntime as the NVIDIA platform: dynamic shared memory is granted."""

    platform = "cuda"

    def reserve_shared(self, kernel, nbytes):
        return replace(kernel, shared=nbytes)


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("knob", [False, True, None], ids=["off", "on", "default"])
def test_nvidia_decode_over_a_float16_cache_on_tensor_cores(golden_dir, hip_knobs, knob, rows):
    """With the `tc_decode` knob (on by default) each layer runs attn_decode_tc64's fused form
    over (KV head, row, splits) with its dynamic shared memory, the splits keeping two blocks a
    compute unit: no qk_rope_store, the launch takes what the prompt's qk_rope_store of the
    same layer took (new Q/K/V rows, norm weights, slots, RoPE). Without it, attn_decode."""
    if knob is not None:
        hip_knobs(tc_decode=knob)
    else:
        load_tuning.cache_clear()  # tuned/default.json's value
    rt = NvidiaFake()
    runner = _runner(golden_dir, "qwen3-q8_0.gguf", rt)
    _decode_step(runner, rt, rows)
    names = [n for n, _, _ in rt.launches if n.startswith(("qk_rope", "attn"))]
    s = runner.spec
    if knob is False:
        assert names == ["attn_decode_w64_g4"] * s.n_layer
        return
    assert names == ["attn_decode_tc64"] * s.n_layer
    stores, fused = _args(rt, "qk_rope_store"), _args(rt, "attn_decode_tc64")
    assert len(stores) == len(fused) == s.n_layer  # (the prompt's, then the decode step's)
    for st, fu in zip(stores, fused):
        assert fu[0] == st[0] and fu[16:20] == st[1:5]  # q, then k, v, q/k norm weights
        assert fu[20] == st[6] and fu[21:] == st[13:20]  # slots, RoPE (n_rot .. eps)
    tc = [i for i, (n, _, _) in enumerate(rt.launches) if n == "attn_decode_tc64"]
    fill = runner.tune.att_fill
    want = min(runner.splits, max(1, 2 * fill * rt.props.compute_units // (rows * s.n_head_kv)))
    assert {rt.launches[i][1] for i in tc} == {(s.n_head_kv, rows, want)}
    assert {rt.shared[i] for i in tc} == {constants()["TCD_SMEM_64"]}
    runner.close()


@pytest.mark.parametrize("q8_knob", [False, True, None], ids=["off", "on", "default"])
def test_a_q8_0_cache_decodes_on_tensor_cores_where_its_knob_says(golden_dir, hip_knobs, q8_knob):
    """A Q8_0 cache takes attn_decode_tc64_q8 (with its own dynamic shared memory) when both
    tc_decode and tc_decode_q8 are on (tuned/default.json: both), otherwise attn_decode."""
    if q8_knob is not None:
        hip_knobs(tc_decode=True, tc_decode_q8=q8_knob)
    else:
        load_tuning.cache_clear()
    rt = NvidiaFake()
    q8 = KvTypes(KvFormat.Q8_0, KvFormat.Q8_0)
    runner = _runner(golden_dir, "qwen3-q8_0.gguf", rt, q8)
    _decode_step(runner, rt)
    names = [n for n, _, _ in rt.launches if n.startswith("attn")]
    if q8_knob is False:
        assert set(names) == {"attn_decode_w64_g4"}
    else:
        assert names == ["attn_decode_tc64_q8"] * runner.spec.n_layer
        tc = [i for i, (n, _, _) in enumerate(rt.launches) if n == "attn_decode_tc64_q8"]
        assert {rt.shared[i] for i in tc} == {constants()["TCD_SMEM_Q8_64"]}
    runner.close()


def test_cache_blocks_shorter_than_a_tensor_core_tile_take_attn_decode(golden_dir, hip_knobs):
    """attn_decode_tc finds each key tile's cache blocks once a tile (at most two, so blocks
    hold TCD_BK positions or more): a cache of shorter blocks decodes with attn_decode, also
    after the same runner decoded on tensor cores over a cache of longer ones."""
    hip_knobs(tc_decode=True)
    rt = NvidiaFake()
    runner = _runner(golden_dir, "qwen3-q8_0.gguf", rt)

    def decode_kernels() -> set[str]:
        _decode_step(runner, rt)
        return {n for n, _, _ in rt.launches if n.startswith("attn")}

    assert decode_kernels() == {"attn_decode_tc64"}  # blocks of 16 (_runner's)
    runner.allocate_kv(128, TCD_BK // 2)
    assert decode_kernels() == {"attn_decode_w64_g4"}
    runner.close()


@pytest.mark.usefixtures("attn_decode_path")
@pytest.mark.parametrize("name,blocks", [("gpt-oss-q8_0.gguf", 2), ("qwen3-q8_0.gguf", 2),
                                         ("gemma3-q4_k_m.gguf", 1)])  # fmt: skip
def test_decode_launches_a_block_per_four_query_heads_of_a_kv_head(golden_dir, name, blocks):
    """gpt-oss's 8 heads on 2 KV heads: 2 full blocks; qwen3's 4 on 2: 2 half blocks; gemma3's 4
    on 1: one. The grouped kernel gets the head count after the sinks."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, name, rt)
    runner.forward([SeqBatch(np.arange(1, 4, dtype=np.int32), 0, np.arange(1), "last")])
    rt.launches.clear()
    rt.launch_args.clear()
    runner.forward([SeqBatch(np.array([5], np.int32), 3, np.arange(1), "last")])
    grids = [(n, g) for n, g, _ in rt.launches if n.startswith("attn_decode")]
    s = runner.spec
    assert [n for n, _ in grids] == [f"attn_decode_w{s.head_dim}_g4"] * s.n_layer
    assert all(g[:2] == (blocks, 1) for _, g in grids)
    assert all(a[DECODE_SINKS + 1] == s.n_head for a in _args(rt, "attn_decode"))


@pytest.mark.parametrize("kv", [KvFormat.F16, KvFormat.Q8_0])
@pytest.mark.parametrize("runtime", [NvidiaFake, FakeRuntime], ids=["nvidia", "other"])
def test_prefill_attention_takes_its_tile_ring_on_nvidia(golden_dir, runtime, kv):
    """A prompt past att_rows_max runs attn_prefill (the _q kernel over a Q8_0 cache): on NVIDIA
    with the dynamic shared memory of its ring of K/V tiles (contract.h's AP_SMEM_<DP> /
    AP_SMEM_Q<DP>, the sizes the kernels' static_assert holds them to), elsewhere with none (the
    SIMT path's shared memory is static there)."""
    rt = runtime()
    runner = _runner(golden_dir, "qwen3-q8_0.gguf", rt, KvTypes(kv, kv))
    n = runner.tune.att_rows_max + 1
    table = np.arange(-(-n // 16))  # (blocks of 16 positions)
    runner.forward([SeqBatch(np.arange(n, dtype=np.int32) % 50 + 1, 0, table, "last")])
    quant = "Q" if kv.block > 1 else ""
    name = f"attn_prefill_{quant.lower()}{runner.spec.head_dim}"
    ring = [rt.shared[i] for i, (k, _, _) in enumerate(rt.launches) if k == name]
    assert len(ring) == runner.spec.n_layer
    want = constants()[f"AP_SMEM_{quant}{runner.spec.head_dim}"] if runtime is NvidiaFake else 0
    assert set(ring) == {want}
    runner.close()


def test_prefill_rings_fit_every_nvidia_part_forge_builds_for():
    """attn_prefill's dynamic shared memory (plus its static shared memory and the 1 KB the
    driver keeps a block) fits a block of sm_86 / sm_89 (99 KB), and two blocks an SM of sm_90
    (228 KB): the register count already holds it to two, more stages must not take one away."""
    c = constants()
    sizes = {k: v for k, v in c.items() if k.startswith("AP_SMEM_")}
    assert len(sizes) == 6
    static = 4 * (2 * (64 + 1) + c["AP_STAGES"] * 64) + 4  # s_pos, s_off, s_slot; the merge flag
    for name, nbytes in sizes.items():
        assert nbytes + static + 1024 <= 99 * 1024, name
        assert 2 * (nbytes + static + 1024) <= 228 * 1024, name
    # the f16 ring's geometry: stages x positions x (K row + V row of DP + 8 halves) x 2 bytes
    assert c["AP_SMEM_128"] == c["AP_STAGES"] * 64 * 2 * (128 + 8) * 2
