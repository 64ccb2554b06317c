"""Matrix-vector products and embedding lookups for every weight type against NumPy (float64):
matvec.hip's per-type kernels, and mmv.hip's decode products (int8 activations rounded like
llama.cpp's, several matrices per launch, gated products, 1..32 token rows)."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import TYPE_SUFFIX
from forge_hip.tuning import (
    MVQ_SPLIT_RM,
    MVQ_THREADS,
    anq_threads,
    mvq_global_x,
    mvq_lanes,
    mvq_max_rows,
    mvq_need,
    mvq_variant,
    mvq_xbytes,
)

from tests.support.gpu_helpers import add_norm_ref, rel_err
from tests.support.mvq_cases import (
    MvqCase,
    gated_act,
    mvq_k,
    odd_k,
    quantize_x,
    random_weights,
    round_acts,
)


@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
@pytest.mark.parametrize("rows_per_block", [1, 4])
def test_third_party_matvec(rt, lib, dev, type_name, rows_per_block):
    """The third-party matmul kernel the replacement test registers, per type, against float64:
    its own source directory, forge's headers, the signature read from its declaration."""
    from forge_hip.library import HipKernel

    from tests.support.gpu_helpers import THIRD_PARTY_KERNELS

    rng = np.random.default_rng()
    K, N, B = odd_k(type_name), 37, 2
    raw, W = random_weights(rng, type_name, N, K)
    x = rng.standard_normal((B, K)).astype(np.float32)
    y = dev.poisoned(B * N * 4)
    name = "matvec_" + TYPE_SUFFIX[type_name]
    kernel = lib.resolve(HipKernel("matvec.hip", name, directory=THIRD_PARTY_KERNELS))
    warp = rt.props.warp_size
    grid = ((N + rows_per_block - 1) // rows_per_block, B)
    rt.launch(
        kernel, grid, (rows_per_block * warp,), [dev.put_rows(type_name, raw), dev.put(x), y, K, N]
    )
    out = dev.get(y, (B, N))
    ref = x.astype(np.float64) @ W.T
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
def test_embed(rt, lib, dev, type_name):
    rng = np.random.default_rng()
    K, V = odd_k(type_name), 50
    raw, W = random_weights(rng, type_name, V, K)
    ids = rng.integers(0, V, size=7).astype(np.int32)
    out = dev.poisoned(len(ids) * K * 4)
    rt.launch(
        lib.get("embed_" + TYPE_SUFFIX[type_name]),
        (len(ids),),
        (128,),
        [dev.put_rows(type_name, raw), dev.put(ids), out, K, 0.5],
    )
    got = dev.get(out, (len(ids), K))
    np.testing.assert_allclose(got, 0.5 * W[ids], rtol=1e-6, atol=1e-30)


def test_launch_arguments_are_checked_against_the_signature(lib):
    from forge_hip.runtime.base import ArgPack

    from forge.errors import UsageError

    with pytest.raises(UsageError, match="wants 5 arguments"):
        ArgPack(lib.get("embed_q4_0").signature, [0, 0, 0, 1])


def launch_mvq(
    rt,
    lib,
    dev,
    case: MvqCase,
    act=None,
    lanes=None,
    grid=None,
    xg=None,
    flags=3,
    rm=None,
    chunks=1,
):
    """Run mvq_multi (act None) or mvq_glu over the case's matrices as forge_hip.plan does; x is
    quantized by mvq_quant first when `xg`, or (None) when the plan would (mvq_global_x). `rm`:
    the kernel's rows per pass instead of the plan's (fewer than R: rows in chunks). `chunks`:
    blocks per row group, each taking rm rows of x (the grid's y)."""
    types, R, K = case.types, case.R, case.K
    suffix, rm = (f"r{rm}", rm) if rm else mvq_variant(types, R)
    block_rows = min(R, rm) if chunks > 1 else R
    need = mvq_need(types)
    ns = [w.shape[0] for w in case.W]
    cus = rt.props.compute_units
    g = lanes or mvq_lanes(types, K, block_rows, max(ns), act is not None, cus)
    rb = MVQ_THREADS // g
    items = sum(-(-n // rb) for n in (ns[:1] if act is not None else ns))
    xq = 0
    if need and (xg or (xg is None and mvq_global_x(need, block_rows, K, rm))):
        xq = quantize_x(rt, lib, dev, case, need)
    grid = (min(grid or items, items), chunks)
    tail = [case.xbuf, K, need, items, xq, flags]
    if act is None:
        rt.launch(lib.get(f"mvq_multi_{suffix}"), grid, (MVQ_THREADS,),
                  [case.descs, 0, len(types), R, g, *tail])  # fmt: skip
    else:
        rt.launch(lib.get(f"mvq_glu_{suffix}"), grid, (MVQ_THREADS,),
                  [case.descs, 0, R, g, *tail, act])  # fmt: skip


@pytest.mark.parametrize("R", [1, 3, 8])
@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
def test_mvq_single_matrix(rt, lib, dev, type_name, R):
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, [type_name], R, mvq_k([type_name]), [37], bias=False)
    launch_mvq(rt, lib, dev, case, grid=3)  # fewer blocks than row groups: blocks loop
    assert rel_err(case.out(0), case.ref(0)) < 1e-5


MIXED = [
    ("Q4_K", "Q4_K", "Q6_K"),  # llama-3 Q4_K_M q/k/v
    ("Q5_0", "Q5_0", "Q8_0"),  # gemma-3 Q4_K_M q/k/v
    ("Q8_0", "Q4_K", "F16"),  # both quantized copies of x, and a float type
    ("Q2_K", "Q4_0", "BF16"),  # the generic kernel
    ("F32", "Q5_1", "Q4_1"),
    ("Q5_K", "Q3_K", "Q6_K"),
]


@pytest.mark.parametrize("R", [1, 2, 5])
@pytest.mark.parametrize("types", MIXED, ids="-".join)
def test_mvq_mixed_matrices_one_launch(rt, lib, dev, types, R):
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, mvq_k(types), [37, 50, 19], bias=True)
    launch_mvq(rt, lib, dev, case, lanes=int(rng.choice([4, 8, 32])), grid=5)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


@pytest.mark.parametrize("flags", [0, 1, 7])
@pytest.mark.parametrize(
    "types,K,R,xg",
    [(("Q4_K", "Q8_0"), 4096, 8, True), (("Q6_K",), 4096, 8, False), (("Q6_K",), 14336, 1, None),
     (("Q5_0", "Q4_K"), 512, 3, True)],
)  # fmt: skip
def test_mvq_quantized_x_in_global_memory(rt, lib, dev, types, K, R, xg, flags):
    """x quantized once by mvq_quant (what the plan does when it does not fit shared memory or
    is long: the third case), or by every block at the limit of its shared memory (the second),
    and the prefetch flags on/off."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, K, [45, 21][: len(types)], bias=False)
    launch_mvq(rt, lib, dev, case, xg=xg, flags=flags)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


def test_mvq_quant_layout(rt, lib, dev):
    """mvq_quant's int8 values and {scale, sum} are llama.cpp's roundings, bit for bit."""
    rng = np.random.default_rng()
    R, K = 3, 512
    x = rng.standard_normal((R, K)).astype(np.float32)
    x[1, :256] = 0.0  # an all-zero block
    x[2, 7], x[2, 9] = 5.0, -5.0  # a peak tie: the first one sets the sign
    xg = dev.poisoned(mvq_xbytes(3, R, K))
    rt.launch(lib.get("mvq_quant"), (1,), (MVQ_THREADS,), [dev.put(x), xg, K, R, 3])
    got = dev.get(xg, (mvq_xbytes(3, R, K),), np.uint8)
    rs = R * K + R * K // 4
    for mode, at in ((1, 0), (2, rs)):
        q, ds, _ = round_acts(x, mode)
        np.testing.assert_array_equal(got[at : at + R * K].view(np.int8).reshape(R, K), q)
        np.testing.assert_array_equal(
            got[at + R * K : at + rs].view(np.float32).reshape(ds.shape), ds
        )


def check_gated(rt, lib, dev, types, act, R, K=None, lanes=None):
    """act(x W_gate^T) * (x W_up^T) of 53-row matrices (bias with GELU) against float64."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, K or mvq_k(types), [53, 53], bias=act == 1)
    launch_mvq(rt, lib, dev, case, act=act, grid=4, lanes=lanes)
    ref = gated_act(case.ref(0), act) * case.ref(1)
    assert rel_err(case.out(0), ref) < 1e-5


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K"), ("Q5_0", "Q5_0")], ids="-".join)
def test_mvq_gated_long_rows_few_lanes(rt, lib, dev, types, lanes):
    """One-row gated products with rows of 4096 (the llama-8B's gate/up, which the plan gives 8
    lanes, the tuning's mvq_pair_lanes): each lane runs many units of both rows in turn."""
    check_gated(rt, lib, dev, types, 0, 1, K=4096, lanes=lanes)


@pytest.mark.parametrize("R", [1, 4, 7])
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K"), ("Q5_0", "Q5_0"), ("Q4_K", "Q6_K"),
                                   ("F16", "F16"), ("Q3_K", "Q8_0")], ids="-".join)  # fmt: skip
def test_mvq_gated(rt, lib, dev, types, act, R):
    check_gated(rt, lib, dev, types, act, R)


# -- mmv.hip: 9..32 token rows (server decode steps) -----------------------------------------------
@pytest.mark.parametrize("R", [11, 16, 23, 32])
@pytest.mark.parametrize("type_name", list(TYPE_SUFFIX))
def test_mvq_many_rows(rt, lib, dev, type_name, R):
    """Every weight type at 9..32 rows, with the plan's kernel for them (r16/r32; gen and the
    float types, which the plan leaves to the gemm path past 8 rows, through row chunks of 8
    and 16/32) and its lanes per row."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, [type_name], R, mvq_k([type_name]), [37], bias=True)
    launch_mvq(rt, lib, dev, case, grid=3)
    assert rel_err(case.out(0), case.ref(0)) < 1e-5


@pytest.mark.parametrize("R,rm", [(11, 8), (23, 16), (32, 16), (32, 8), (9, 4), (17, 32)])
@pytest.mark.parametrize("lanes", [4, 16, 32])
@pytest.mark.parametrize("types", [("Q5_0", "Q5_0", "Q8_0"), ("Q4_K", "Q6_K", "Q5_K"),
                                   ("Q4_0", "Q5_1", "Q4_1")], ids="-".join)  # fmt: skip
def test_mvq_row_chunks_and_lanes(rt, lib, dev, types, lanes, R, rm):
    """Rows past the kernel's RM run in chunks (each row group reading its weights again); the
    halving reduction over G lanes with G below, at and above RM."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, mvq_k(types), [37, 50, 19], bias=True)
    launch_mvq(rt, lib, dev, case, lanes=lanes, grid=5, rm=rm)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


@pytest.mark.parametrize("xg", [True, False])
@pytest.mark.parametrize("R", [32, 23, 9])
@pytest.mark.parametrize("types", [("Q5_0", "Q5_0", "Q8_0"), ("Q4_K", "Q6_K", "Q5_K"),
                                   ("Q2_K", "F16", "Q4_1")], ids="-".join)  # fmt: skip
def test_mvq_blocks_share_row_groups(rt, lib, dev, types, R, xg):
    """Rows of x split over the blocks of each row group (grid y = ceil(R / 8) blocks of the
    8-row kernels, r8 or gen, each with 8 rows; the last one partial), x quantized per block or
    once into global memory, with fewer blocks than row groups (blocks loop)."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, mvq_k(types), [37, 50, 19], bias=True)
    gen = "Q2_K" in types  # the generic kernel (mvq_variant's choice) has 8 rows too
    launch_mvq(rt, lib, dev, case, grid=3, xg=xg, flags=1, rm=None if gen else MVQ_SPLIT_RM,
               chunks=-(-R // MVQ_SPLIT_RM))  # fmt: skip
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


@pytest.mark.parametrize("R", [13, 32])
@pytest.mark.parametrize("act", [0, 1])
def test_mvq_gated_blocks_share_row_groups(rt, lib, dev, act, R):
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, ("Q4_K", "Q4_K"), R, mvq_k(["Q4_K"]), [53, 53], bias=act == 1)
    launch_mvq(rt, lib, dev, case, act=act, grid=4, rm=MVQ_SPLIT_RM, chunks=-(-R // MVQ_SPLIT_RM))
    ref = gated_act(case.ref(0), act) * case.ref(1)
    assert rel_err(case.out(0), ref) < 1e-5


@pytest.mark.parametrize("R", [13, 32])
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("types", [("Q5_0", "Q5_0"), ("Q4_K", "Q6_K"), ("Q8_0", "Q8_0")],
                         ids="-".join)  # fmt: skip
def test_mvq_gated_many_rows(rt, lib, dev, types, act, R):
    check_gated(rt, lib, dev, types, act, R)


@pytest.mark.parametrize("xg", [True, False])
@pytest.mark.parametrize(
    "types,K,R", [(("Q4_K", "Q8_0"), 4096, 32), (("Q6_K",), 2048, 19), (("Q5_0",), 640, 32)]
)
def test_mvq_many_rows_x_in_global_or_shared(rt, lib, dev, types, K, R, xg):
    """32 rows of x quantized by mvq_quant, or by every block (where it fits shared memory)."""
    if not xg and mvq_xbytes(mvq_need(list(types)), R, K) > 40960:
        pytest.skip("does not fit shared memory")
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, K, [45, 21][: len(types)], bias=False)
    launch_mvq(rt, lib, dev, case, xg=xg, flags=1)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


def test_mvq_max_rows_by_type():
    """Past 8 rows the plan keeps Q2_K/Q3_K (float-decoded units) and float weights on the gemm
    path; every other type runs decode products up to 32 rows, fewer for large matrices."""
    assert mvq_max_rows(["Q5_0", "Q8_0"]) == 32
    assert mvq_max_rows(["Q5_0", "Q5_0", "Q8_0"], 1536 * 640) == 32  # gemma3 qkv
    assert mvq_max_rows(["Q5_0", "Q5_0"], 2 * 2048 * 640) == 32  # gemma3 gate/up
    assert mvq_max_rows(["Q5_0", "Q5_0"], 2 * 2048 * 640, 56 << 20) == 22  # a lower limit
    assert mvq_max_rows(["Q8_0"], 262144 * 640) == 8  # gemma3 head
    assert mvq_max_rows(["Q4_K", "Q4_K", "Q6_K"], 6144 * 4096) == 8  # llama-3-8b qkv
    assert mvq_max_rows(["Q4_K", "Q6_K", "Q5_K", "Q4_0", "Q4_1", "Q5_1"]) == 32
    assert mvq_max_rows(["Q4_K", "Q3_K"]) == 8
    assert mvq_max_rows(["Q2_K"]) == 8
    assert mvq_max_rows(["Q8_0", "F16"]) == 8
    assert mvq_variant(["Q5_0"], 9) == ("r16", 16)
    assert mvq_variant(["Q5_0"], 32) == ("r32", 32)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen2-q4_k.gguf"])
def test_decode_step_of_many_rows_matches_one_row_steps(rt, golden_dir, name, split):
    """A decode step of 23 sequences (every product on mmv.hip's r32 kernels, or on r8 kernels
    with x's rows split over blocks: the mvq_split knob; rounding on as in serving; mmq.hip off,
    test_kernels_mmq covers it) gives each sequence the logits of its own one-row step."""
    from forge_hip.runner import HipRunner

    from forge.backend import SeqBatch
    from forge.gguf import open_gguf
    from forge.models import build_spec
    from forge.plugins import get_plugin_manager

    gguf = open_gguf(str(golden_dir / "models" / name))
    runner = HipRunner(build_spec(gguf), gguf, get_plugin_manager().kernels, runtime=rt)
    n = 23
    runner.allocate_kv(n + 1, 16)
    try:
        plan = runner.plan
        plan.products.with_tuning(mvq_split=split)
        plan.products.mmq = False
        groups = [g for a, f in zip(plan.attention, plan.ffn)
                  for g in ((a.qkv, 3), (a.wo, 1), (f.gate_up, 2), (f.down, 1))]  # fmt: skip
        assert all(plan.products._mv_rows(first, c) >= n
                   for first, c in groups + [(plan.out_h, 1)])  # fmt: skip
        rng = np.random.default_rng()
        v = runner.spec.n_vocab
        prompts = [rng.integers(1, v, size=int(rng.integers(2, 10))).astype(np.int32)
                   for _ in range(n)]  # fmt: skip
        tables = [np.array([i], np.int32) for i in range(n)]
        runner.forward([SeqBatch(p[:-1], 0, t, "none") for p, t in zip(prompts, tables)])
        many = runner.forward([SeqBatch(p[-1:], len(p) - 1, t) for p, t in zip(prompts, tables)])
        for p, t, got in zip(prompts, tables, many):
            one = runner.forward([SeqBatch(p[-1:], len(p) - 1, t)])[0]
            assert np.abs(got[0] - one[0]).max() <= 1e-3 * one.std()
    finally:
        runner.close()


@pytest.mark.parametrize("R", [1, 3])
@pytest.mark.parametrize("K,need", [(256, 3), (640, 1), (768, 2), (4096, 3), (8192, 2)])
@pytest.mark.parametrize("form", ["first", "plain_add", "post_norm"])
@pytest.mark.parametrize("tasks", ["plan", 2])
def test_add_norm_quant(rt, lib, dev, R, K, need, form, tasks):
    """mmv.hip's add_norm_quant (R rows; the plan's block, or two tasks of 256 per warp): the
    residual update and h = rmsnorm(x) * w_next against float64, and h's int8 copies in xg
    (mvq_quant's layout for R rows) are llama.cpp's roundings of the h it computed (stored
    when given), bit for bit."""
    rng = np.random.default_rng()
    eps = 1e-6
    x = rng.standard_normal((R, K)).astype(np.float32) * 2
    o = rng.standard_normal((R, K)).astype(np.float32) * 5
    wp, wn = (rng.standard_normal(K).astype(np.float32) for _ in range(2))
    use_o, use_post = {"first": (False, False), "plain_add": (True, False),
                       "post_norm": (True, True)}[form]  # fmt: skip
    nx = mvq_xbytes(need, R, K)
    xd, h, xg = dev.put(x), dev.poisoned(x.nbytes), dev.poisoned(nx)
    args = [xd, dev.put(o) if use_o else 0, dev.put(wp) if use_post else 0, dev.put(wn), h, xg,
            K, need, eps]  # fmt: skip
    threads = anq_threads(K) if tasks == "plan" else 32 * -(-K // 512)
    rt.launch(lib.get("add_norm_quant"), (R,), (threads,), args)

    x64, h64 = add_norm_ref(x, o if use_o else None, wp if use_post else None, wn, eps)
    assert rel_err(dev.get(xd, (R, K)), x64) < 1e-6
    hk = dev.get(h, (R, K))
    assert rel_err(hk, h64) < 1e-6
    got, at = dev.get(xg, (nx,), np.uint8), 0
    for mode in (1, 2):
        if need & mode:
            q, ds, _ = round_acts(hk, mode)
            np.testing.assert_array_equal(got[at : at + R * K].view(np.int8).reshape(R, K), q)
            np.testing.assert_array_equal(got[at + R * K : at + R * K + R * K // 4]
                                          .view(np.float32), ds.reshape(-1))  # fmt: skip
            at += R * K + R * K // 4
