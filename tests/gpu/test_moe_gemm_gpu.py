"""moe_gemm.hip's grouped expert products on 16-bit tensor cores against NumPy float64 on the
dequantized weights: pairs routed unevenly over experts (one with none, one with more than two
tiles), token rows gathered through the sorted order, partial tiles in both dimensions, biases,
and both gated activations; the tiles past the last and the rows of no pair stay untouched."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.library import MOE_GEMM_ROWS, ROUND_MODE

from tests.support.expert_cases import Experts, moe_act
from tests.support.gpu_helpers import rel_err
from tests.support.mvq_cases import round_acts

E, TOKENS, USED = 5, 131, 3
WEIGHTS = [0.45, 0.3, 0.0, 0.15, 0.1]  # expert 2 is never chosen; expert 0 takes several tiles


def _halves(x: np.ndarray, type_name: str) -> np.ndarray:
    """The float16 activations act_half writes for the products of `type_name`."""
    return round_acts(x, ROUND_MODE[type_name])[2].astype(np.float16)


def _routing(rng, bm: int):
    """(expert of each pair [P], sorted order [P], tiles [T, 3]: expert, first, pairs; then
    zero tiles up to the launch's count)."""
    experts = rng.choice(E, size=TOKENS * USED, p=WEIGHTS).astype(np.int32)
    order = np.argsort(experts, kind="stable").astype(np.int32)
    tiles = []
    for e in range(E):
        first, n = int(np.searchsorted(experts[order], e)), int((experts == e).sum())
        tiles += [[e, first + s, min(bm, n - s)] for s in range(0, n, bm)]
    tiles += [[0, 0, 0]] * 3
    return experts, order, np.array(tiles, np.int32)


CASES = [("Q4_K", "Q6_K", 0), ("MXFP4", "MXFP4", 2), ("Q8_0", "Q4_0", 0), ("Q5_K", "Q5_K", 2)]


@pytest.mark.parametrize("bm", MOE_GEMM_ROWS)
@pytest.mark.parametrize("gate_type,down_type,act", CASES)
def test_grouped_products_match_float64(rt, lib, dev, gate_type, down_type, act, bm):
    rng = np.random.default_rng()
    k_quant = "K" in gate_type + down_type
    n_embd, n_ff = (512, 256 * (1 + (bm == 64))) if k_quant else (32 * 13, 32 * 7)
    gate, up = (Experts(dev, rng, E, gate_type, n_ff, n_embd, act == 2) for _ in range(2))
    down = Experts(dev, rng, E, down_type, n_embd, n_ff, True)
    experts, order, tiles = _routing(rng, bm)
    pairs = TOKENS * USED
    x = rng.standard_normal((TOKENS, n_embd)).astype(np.float32)
    xh = _halves(x, gate_type)
    g = dev.poisoned(4 * (pairs + 1) * n_ff)  # a row past the last pair
    y = dev.poisoned(4 * (pairs + 1) * n_embd)
    descs = dev.put(np.array([[0] * 8, gate.desc(g.ptr), up.desc(0), down.desc(y.ptr)], np.int64))
    tl = dev.put(tiles)
    gates = [
        (gate.apply(experts[p], xh[p // USED]), up.apply(experts[p], xh[p // USED])) for p in order
    ]  # sorted row s is pair order[s]: its token p // USED, its expert
    # gpt-oss's clamp where about half the products pass it (random weights' products are far
    # larger than real ones': the clamped outputs are exact, the others keep their error)
    alpha, limit = 1.702, float(np.median(np.abs([gu[0] for gu in gates])))
    rt.launch(lib.get(f"moe_gemm_glu_m{bm}"), (-(-n_ff // 64), len(tiles)), (256,),
              [descs, 1, tl, dev.put(xh), dev.put(order), USED, act, alpha, limit])  # fmt: skip
    got_g = dev.get(g, (pairs + 1, n_ff))
    assert np.isnan(got_g[pairs]).all(), "wrote past the last pair"
    want_g = np.stack([moe_act(gv, uv, act, alpha, limit) for gv, uv in gates])
    # 16-bit operands multiply exactly; quantized weights are rounded to float16 once (2^-11),
    # MXFP4's are exact in float16
    tol = {"MXFP4": 1e-5}.get(gate_type, 3e-3)
    assert rel_err(got_g[:pairs], want_g) < tol, rel_err(got_g[:pairs], want_g)

    # the gated outputs as act_half rounds them (scaled into float16's range: random weights)
    gh = _halves(got_g[:pairs] / np.abs(got_g[:pairs]).max(), down_type)
    rt.launch(lib.get(f"moe_gemm_down_m{bm}"), (-(-n_embd // 128), len(tiles)), (256,),
              [descs, 3, tl, dev.put(gh)])  # fmt: skip
    got_y = dev.get(y, (pairs + 1, n_embd))
    assert np.isnan(got_y[pairs]).all()
    want_y = np.stack([down.apply(experts[p], gh[s]) for s, p in enumerate(order)])
    tol = {"MXFP4": 1e-5}.get(down_type, 3e-3)
    assert rel_err(got_y[:pairs], want_y) < tol, rel_err(got_y[:pairs], want_y)


def test_empty_tiles_write_nothing(rt, lib, dev):
    """A launch whose tiles are all empty (the grid's tiles past the last) leaves y as it was."""
    rng = np.random.default_rng(1)
    gate, up = (Experts(dev, rng, E, "Q8_0", 64, 64, False) for _ in range(2))
    g = dev.poisoned(4 * 64 * 64)
    descs = dev.put(np.array([gate.desc(g.ptr), up.desc(0)], np.int64))
    tiles = dev.put(np.zeros((4, 3), np.int32))
    xh, order = dev.put(np.ones((64, 64), np.float16)), dev.put(np.arange(64, dtype=np.int32))
    rt.launch(lib.get("moe_gemm_glu_m64"), (1, 4), (256,),
              [descs, 0, tiles, xh, order, 1, 0, 0.0, 0.0])  # fmt: skip
    assert np.isnan(dev.get(g, (64, 64))).all()
