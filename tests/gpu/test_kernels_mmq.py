"""mmq.hip: products of 2..128 token rows (64 per launch) on int8 tensor cores, against float64
references of the same int8-rounded activations (mmv.hip's mvq_quant); its shuffle-and-dp4a
fragment path (the one AMD compiles) against the mma path bit for bit; and a runner's many-row
decode steps on mmq against the same steps on mmv.hip's kernels."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import EXPERT_TYPES, KERNELS
from forge_hip.sources import load_source
from forge_hip.tuning import (
    DEFAULT,
    MMQ_TYPES,
    MVQ_THREADS,
    mmq_items,
    mmq_ks,
    mmq_shape,
    mvq_need,
)

from forge.backend import SeqBatch
from tests.support.golden_rules import BOUNDS, greedy_mismatches, logit_errors
from tests.support.gpu_helpers import golden_runner, rel_err
from tests.support.mvq_cases import MvqCase, gated_act, mvq_k, quantize_x

MMQ_LAUNCH_ROWS = DEFAULT.mmq_launch_rows


def launch_mmq(
    rt, lib, dev, case: MvqCase, act=None, ks=None, grid=None, get=None, pf=None, shape=None
):
    """Per 64 rows of x (MMQ_LAUNCH_ROWS), those rows quantized by mvq_quant into a poisoned
    buffer, then mmq_multi (act None) or mmq_glu over the case's matrices writing them, as
    forge_hip.plan launches them; `ks` warps per row group (None: the plan's), `grid` blocks
    (fewer than the items: blocks loop), `get` the kernel lookup (another build of mmq.hip),
    `pf` mmq.hip's L2 prefetch flag (None: 1). 17-64 rows: blocks over two row halves of x
    (`shape`: (MT, halves) instead of mmq_shape's)."""
    types, R, K = case.types, case.R, case.K
    need = mvq_need(types)
    ns = [w.shape[0] for w in case.W][: 1 if act is not None else None]
    pf = 1 if pf is None else pf
    get = get or lib.get
    for r0 in range(0, R, MMQ_LAUNCH_ROWS):
        n = min(MMQ_LAUNCH_ROWS, R - r0)
        xq = quantize_x(rt, lib, dev, case, need, r0, n)
        mt, halves = shape or mmq_shape(n)
        kw = ks or mmq_ks(K, types, ns, rt.props.compute_units, halves)
        items = mmq_items(ns, kw)
        blocks = (min(grid or items, items), halves)
        if act is None:
            rt.launch(get(f"mmq_multi_m{mt}"), blocks, (MVQ_THREADS,),
                      [case.descs, 0, len(types), n, r0, xq, K, need, items, kw, pf])  # fmt: skip
        else:
            rt.launch(get(f"mmq_glu_m{mt}"), blocks, (MVQ_THREADS,),
                      [case.descs, 0, n, r0, xq, K, need, items, kw, act, pf])  # fmt: skip


@pytest.mark.parametrize("R", [2, 5, 9, 16, 17, 32, 45, 64])
@pytest.mark.parametrize("type_name", sorted(MMQ_TYPES - set(EXPERT_TYPES)))  # (moe.hip: MXFP4)
def test_mmq_each_type(rt, lib, dev, type_name, R):
    """37 weight rows: a partial second 16-row tile, rows past N clamped; 3 blocks loop over the
    row groups; an odd number of blocks (K-quants: 3 super-blocks)."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, [type_name], R, mvq_k([type_name]), [37], bias=False)
    launch_mmq(rt, lib, dev, case, grid=3)
    assert rel_err(case.out(0), case.ref(0)) < 1e-5


MIXED = [
    ("Q4_K", "Q4_K", "Q6_K"),  # llama-3 Q4_K_M q/k/v
    ("Q5_0", "Q5_0", "Q8_0"),  # gemma-3 Q4_K_M q/k/v
    ("Q8_0", "Q4_K", "Q5_K"),  # both quantized copies of x
    ("Q4_0", "Q5_1", "Q4_1"),
]


@pytest.mark.parametrize("ks", [1, 2, 4, 8])
@pytest.mark.parametrize("R", [12, 32, 60])
@pytest.mark.parametrize("types", MIXED, ids="-".join)
def test_mmq_mixed_matrices_and_warp_splits(rt, lib, dev, types, R, ks):
    """Three matrices in one launch with biases; every split of a row group's chunks over its
    warps (ks), including more warps than a type has chunks."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, mvq_k(types), [37, 50, 19], bias=True)
    launch_mmq(rt, lib, dev, case, ks=ks, grid=5)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


@pytest.mark.parametrize(
    "types,K,R", [(("Q4_K", "Q6_K"), 4096, 32), (("Q6_K",), 14336, 9), (("Q8_0", "Q5_0"), 2048, 20)]
)
def test_mmq_long_rows(rt, lib, dev, types, K, R):
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, K, [45, 21][: len(types)], bias=False)
    launch_mmq(rt, lib, dev, case)
    for j in range(len(types)):
        assert rel_err(case.out(j), case.ref(j)) < 1e-5, types[j]


@pytest.mark.parametrize("R", [3, 10, 32, 51])
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("types", [("Q4_K", "Q4_K"), ("Q5_0", "Q5_0"), ("Q4_K", "Q6_K")],
                         ids="-".join)  # fmt: skip
def test_mmq_gated(rt, lib, dev, types, act, R):
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, types, R, mvq_k(types), [53, 53], bias=act == 1)
    launch_mmq(rt, lib, dev, case, act=act, grid=4)
    assert rel_err(case.out(0), gated_act(case.ref(0), act) * case.ref(1)) < 1e-5


@pytest.mark.parametrize("act", [None, 0])
def test_mmq_prefetch_changes_no_output_bit(rt, lib, dev, act):
    """pf only moves each block's first weights into L2 before the grid wait: the same bits
    with it as without, whether blocks loop over several items or take one each."""
    rng = np.random.default_rng()
    types = ("Q4_K", "Q4_K") if act is not None else ("Q8_0", "Q4_K", "Q6_K")
    case = MvqCase(dev, rng, types, 20, mvq_k(types), [53, 53, 29][: len(types)], bias=True)
    outs = []
    for pf, grid in ((0, 2), (1, 2), (1, 64)):
        launch_mmq(rt, lib, dev, case, act=act, grid=grid, pf=pf)
        outs.append([case.out(j).copy() for j in range(1 if act is not None else len(types))])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a, b)
    ref = gated_act(case.ref(0), act) * case.ref(1) if act is not None else case.ref(0)
    assert rel_err(outs[0][0], ref) < 1e-5


@pytest.mark.parametrize("ks", [1, 2, 4, 8])
@pytest.mark.parametrize("R", [33, 64, 100])
def test_mmq_gated_64_row_launches_and_warp_splits(rt, lib, dev, R, ks):
    """33-64 rows (100: two launches) as m2 blocks over two row halves of x, with every split of
    a row group's chunks over its warps."""
    rng = np.random.default_rng()
    case = MvqCase(dev, rng, ("Q4_K", "Q6_K"), R, mvq_k(("Q4_K", "Q6_K")), [45, 45], bias=True)
    launch_mmq(rt, lib, dev, case, act=1, ks=ks, grid=3)
    assert rel_err(case.out(0), gated_act(case.ref(0), 1) * case.ref(1)) < 1e-5


@pytest.mark.parametrize("R", [17, 24, 32])
def test_m1_row_halves_match_one_m2_launch_bit_for_bit(rt, lib, dev, R):
    """17-32 rows run as m1 blocks over two 16-row halves of x (mmq_shape); with the same warp
    split, every output equals the single m2 launch's (block sums are exact, each output adds
    the same terms in the same order)."""
    assert mmq_shape(R) == (1, 2)
    rng = np.random.default_rng()
    for types, act in [(("Q4_K", "Q6_K", "Q8_0"), None), (("Q5_0", "Q4_1"), None),
                       (("Q4_K", "Q4_K"), 0)]:  # fmt: skip
        ns = [53, 53] if act is not None else [37, 50, 19][: len(types)]
        case = MvqCase(dev, rng, types, R, mvq_k(types), ns, bias=True)
        launch_mmq(rt, lib, dev, case, act=act, ks=2, shape=(2, 1))
        one = [case.out(j).copy() for j in range(len(types))]
        assert (
            rel_err(
                one[0], case.ref(0) if act is None else gated_act(case.ref(0), act) * case.ref(1)
            )
            < 1e-5
        )
        for y, w in zip(case.y, case.W):  # poisoned again: the halves must write every output
            rt.memset(y, 0xFF, R * w.shape[0] * 4)
        launch_mmq(rt, lib, dev, case, act=act, ks=2)
        for j in range(1 if act is not None else len(types)):
            np.testing.assert_array_equal(case.out(j), one[j], err_msg=str(types))


def test_mmq_shuffle_fragments_match_mma_bit_for_bit(rt, lib, dev):
    """mmq.hip built with MMQ_EMULATE multiplies its fragments through warp shuffles and dp4a
    (what AMD compiles): the int32 block sums are exact either way, so every output is equal."""
    binary = rt.compile(load_source("mmq.hip"), "mmq.hip", ["-DMMQ_EMULATE"])
    module = rt.load(binary)

    def emulated(name):
        return rt.function(module, name, KERNELS[name][1])

    rng = np.random.default_rng()
    for types, R, act in [(("Q4_K", "Q6_K", "Q8_0"), 32, None), (("Q5_0", "Q4_1"), 13, None),
                          (("Q5_K", "Q5_1"), 20, None), (("Q4_0", "Q4_0"), 17, 1),
                          (("Q4_K", "Q4_K"), 40, 0)]:  # fmt: skip
        ns = [53, 53] if act is not None else [37, 50, 19][: len(types)]
        case = MvqCase(dev, rng, types, R, mvq_k(types), ns, bias=True)
        launch_mmq(rt, lib, dev, case, act=act)
        mma = [case.out(j).copy() for j in range(len(types))]
        launch_mmq(rt, lib, dev, case, act=act, get=emulated)
        for j in range(1 if act is not None else len(types)):
            np.testing.assert_array_equal(case.out(j), mma[j], err_msg=str(types))


@pytest.mark.parametrize("name", ["gemma3-q4_k_m.gguf", "qwen3-q4_k_m.gguf", "llama-q8_0.gguf"])
def test_many_row_decode_step_matches_one_row_steps(rt, golden_dir, name):
    """Decode steps of 12, 32 and 48 sequences (48: two launches per product) on mmq.hip
    against each sequence's own one-row step (mmv.hip). Both round x to the same int8 blocks and
    sum blocks exactly, so a row agrees to float32 summation order, unless that order flips one
    int8 rounding of a later layer's activations (a step of 1/127 of a block's peak): then the
    row still meets the golden bounds and greedy picks differ only at near ties. mmq must have
    run."""
    runner = golden_runner(rt, golden_dir, name)
    runner.plan.products.round_prefill = True
    launched = []
    launch = runner.plan.launch

    def record(kernel, *args):
        launched.append(kernel.name)
        return launch(kernel, *args)

    runner.plan.launch = record
    try:
        rng = np.random.default_rng()
        for n in (12, 32, 48):
            runner.allocate_kv(n, 16)  # one 16-position block per sequence
            seqs = [rng.integers(1, runner.spec.n_vocab, size=6).astype(np.int32) for _ in range(n)]
            tables = [np.array([i], np.int32) for i in range(n)]
            for s, t in zip(seqs, tables):
                runner.forward([SeqBatch(s[:5], 0, t, "none")])
            one = np.stack([runner.forward([SeqBatch(s[5:], 5, t)])[0][0]
                            for s, t in zip(seqs, tables)])  # fmt: skip
            launched.clear()
            rows = runner.forward([SeqBatch(s[5:], 5, t) for s, t in zip(seqs, tables)])
            assert any(k.startswith("mmq_") for k in launched), launched
            got = np.stack([r[0] for r in rows])
            err = np.abs(got - one).max(axis=1) / one.std(axis=1)
            print(f"{name}: {n} rows, max |diff| / std per row {np.array2string(err, precision=1)}")
            assert np.median(err) < 1e-5  # most rows: summation order only
            mx, mean = logit_errors(got, one)
            assert mx <= BOUNDS["quant"][0] and mean <= BOUNDS["quant"][1], (mx, mean)
            assert not greedy_mismatches(got, [int(np.argmax(r)) for r in one])
    finally:
        runner.close()
