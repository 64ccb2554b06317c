"""moe.hip's expert kernels of one-pair tiles (decode steps: moe_glu_r1*, moe_down_r1*) against
float64 on gguf's dequantized weights and activations rounded as llama.cpp rounds them: at every
lane count a weight row may take, the one-type kernels and the one for every type, gate/up
reading each pair's token row through the sorted order; the tiles past the last write nothing."""

from __future__ import annotations

import numpy as np
import pytest
from forge_hip.experts import kernel
from forge_hip.library import ROUND_MODE
from forge_hip.tuning import MVQ_THREADS, mvq_need, mvq_xbytes

from tests.support.expert_cases import Experts, moe_act
from tests.support.gpu_helpers import rel_err
from tests.support.mvq_cases import mvq_k, round_acts

E, TOKENS, USED = 6, 3, 2
CASES = [  # gate, up, down types, activation (2: gpt-oss's clamped SwiGLU, with biases)
    ("MXFP4", "MXFP4", "MXFP4", 2),
    ("Q4_K", "Q4_K", "Q6_K", 0),
    ("Q8_0", "Q8_0", "Q8_0", 0),
    ("Q5_K", "Q4_K", "Q5_K", 0),  # mixed gate/up, no one-type down: the kernels for every type
    ("Q8_0", "Q4_K", "Q6_K", 0),  # both roundings of x (blocks of 32 and of 256): two copies
]


def _quantize(rt, lib, dev, x, types):
    """x's rows rounded for `types` by moe_quant (in row order) into a poisoned buffer."""
    rows, k = x.shape
    need = mvq_need(types)
    xg = dev.poisoned(mvq_xbytes(need, rows, k))
    tasks = rows * -(-k // 256)
    rt.launch(lib.get("moe_quant"), (-(-tasks // (MVQ_THREADS // 32)),), (MVQ_THREADS,),
              [dev.put(x), 0, 1, xg, k, rows, need])  # fmt: skip
    return xg, need


@pytest.mark.parametrize("lanes", [4, 8, 16, 32])
@pytest.mark.parametrize("gate_t,up_t,down_t,act", CASES)
def test_one_pair_tiles_match_float64(rt, lib, dev, gate_t, up_t, down_t, act, lanes):
    rng = np.random.default_rng(lanes)
    n_embd = mvq_k([gate_t, up_t, down_t])
    n_ff = 2 * n_embd
    bias = act == 2
    gate, up = (Experts(dev, rng, E, t, n_ff, n_embd, bias) for t in (gate_t, up_t))
    down = Experts(dev, rng, E, down_t, n_embd, n_ff, bias)
    experts = np.concatenate([rng.choice(E, USED, replace=False) for _ in range(TOKENS)])
    pairs = TOKENS * USED
    order = np.argsort(experts, kind="stable").astype(np.int32)
    tiles = np.array([[experts[p], s, 1] for s, p in enumerate(order)] + [[0, 0, 0]] * 2, np.int32)
    x = rng.standard_normal((TOKENS, n_embd)).astype(np.float32)
    g = dev.poisoned(4 * (pairs + 1) * n_ff)  # a row past the last pair
    y = dev.poisoned(4 * (pairs + 1) * n_embd)
    descs = dev.put(np.array([gate.desc(g.ptr), up.desc(0), down.desc(y.ptr)], np.int64))
    tl, rb = dev.put(tiles), MVQ_THREADS // lanes

    xg, need = _quantize(rt, lib, dev, x, [gate_t, up_t])  # one row per token
    xr = {t: round_acts(x, ROUND_MODE[t])[2] for t in (gate_t, up_t)}
    tokens = order // USED  # sorted pair s is pair order[s] of token order[s] // USED
    gates = [(gate.apply(experts[p], xr[gate_t][t]), up.apply(experts[p], xr[up_t][t]))
             for p, t in zip(order, tokens)]  # fmt: skip
    alpha, limit = 1.702, float(np.median(np.abs([gu[0] for gu in gates])))  # half clamped
    rt.launch(lib.get(kernel("glu", "r1", [gate_t, up_t])), (-(-n_ff // rb), len(tiles)),
              (MVQ_THREADS,), [descs, 0, tl, xg, TOKENS, n_embd, need, lanes, act, alpha, limit,
                               dev.put(order), USED])  # fmt: skip
    got_g = dev.get(g, (pairs + 1, n_ff))
    assert np.isnan(got_g[pairs]).all(), "wrote past the last pair"
    want_g = np.stack([moe_act(gv, uv, act, alpha, limit) for gv, uv in gates])
    assert rel_err(got_g[:pairs], want_g) < 1e-5, rel_err(got_g[:pairs], want_g)

    gq, need = _quantize(rt, lib, dev, got_g[:pairs], [down_t])  # the sorted pairs' rows
    rt.launch(lib.get(kernel("down", "r1", [down_t])), (-(-n_embd // rb), len(tiles)),
              (MVQ_THREADS,), [descs, 2, tl, gq, pairs, n_ff, need, lanes])  # fmt: skip
    got_y = dev.get(y, (pairs + 1, n_embd))
    assert np.isnan(got_y[pairs]).all()
    gr = round_acts(got_g[:pairs], ROUND_MODE[down_t])[2]
    want_y = np.stack([down.apply(experts[p], gr[s]) for s, p in enumerate(order)])
    assert rel_err(got_y[:pairs], want_y) < 1e-5, rel_err(got_y[:pairs], want_y)
