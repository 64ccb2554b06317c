"""moe.hip on the GPU: the router's choices against cpu_simd's NumPy routing, and whole
mixture-of-experts models against cpu_simd at row counts that take each kernel variant (the
golden checks against llama.cpp are in test_golden_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import forge
from forge.models.spec import ExpertFFN
from tests.support.golden_rules import BOUNDS, logit_errors, weight_class


def _route_ref(ffn: ExpertFFN, logits: np.ndarray):
    from forge_cpu_simd.experts import ExpertFFNBlock

    return ExpertFFNBlock.route(SimpleNamespace(f=ffn), logits)


@pytest.mark.parametrize("gating,norm", [("softmax", True), ("softmax", False),
                                         ("softmax_chosen", False)])  # fmt: skip
@pytest.mark.parametrize("rows,n_expert,k,rm", [(1, 128, 8, 1), (4, 128, 8, 1), (5, 8, 2, 1),
                                                (37, 8, 2, 8), (512, 128, 8, 32),
                                                (300, 32, 4, 1)])  # fmt: skip
@pytest.mark.parametrize("topk", [False, True])
def test_route_and_sort_match_numpy(rt, lib, dev, gating, norm, rows, n_expert, k, rm, topk):
    """Chosen experts and weights as cpu_simd's routing (ties to the lower id), the pairs
    sorted by expert, and tiles of at most rm pairs of one expert covering them; all in
    moe_route's block, or (topk) chosen by moe_topk's warps first, then sorted by moe_route
    (one-pair tiles of at most 32 pairs by rank, experts shared by rows among them)."""
    from forge_hip.expert_routing import GATINGS, TOPK_THREADS, route_threads
    from forge_hip.experts import max_tiles

    rng = np.random.default_rng(rows * n_expert)
    logits = rng.standard_normal((rows, n_expert)).astype(np.float32) * 3
    logits[:, 5] = logits[:, 2]  # exact ties in every row
    ffn = ExpertFFN(n_expert=n_expert, n_expert_used=k, n_ff=64, gating=gating,
                    norm_weights=norm, weights_scale=1.5)  # fmt: skip
    pairs, tiles = rows * k, max_tiles(rows * k, rm, n_expert)
    ids, w, order, pos = (dev.poisoned(4 * pairs) for _ in range(4))
    tl = dev.poisoned(12 * tiles)
    gate = [dev.put(logits), rows, n_expert, k, GATINGS[gating], int(norm), 1.5]
    if topk:
        per_block = TOPK_THREADS // rt.props.warp_size
        rt.launch(lib.get("moe_topk"), (-(-rows // per_block),), (TOPK_THREADS,),
                  [*gate, ids, w])  # fmt: skip
    rt.launch(lib.get("moe_route"), (1,), (route_threads(n_expert, rows),),
              [*gate, rm, tiles, int(topk), ids, w, order, pos, tl])  # fmt: skip
    ref_ids, ref_w = _route_ref(ffn, logits)
    got_ids = dev.get(ids, (rows, k), np.int32)
    np.testing.assert_array_equal(got_ids, ref_ids)
    np.testing.assert_allclose(dev.get(w, (rows, k)), ref_w, rtol=2e-6, atol=1e-7)
    _check_sorted(dev, ref_ids.ravel(), order, pos, tl, tiles, rm)


def _check_sorted(dev, flat, order, pos, tl, tiles, rm):
    """Every pair once in `order`, grouped by expert in ascending order (within an expert any
    order), `pos` its inverse, and tiles of at most rm pairs of one expert covering them."""
    pairs = len(flat)
    sorted_pairs = dev.get(order, (pairs,), np.int32)
    np.testing.assert_array_equal(np.sort(sorted_pairs), np.arange(pairs))
    assert (np.diff(flat[sorted_pairs]) >= 0).all()
    np.testing.assert_array_equal(dev.get(pos, (pairs,), np.int32)[sorted_pairs], np.arange(pairs))
    t = dev.get(tl, (tiles, 3), np.int32)
    live = t[t[:, 2] > 0]
    assert (live[:, 2] <= rm).all() and live[:, 2].sum() == pairs
    assert (live[1:, 1] == live[:-1, 1] + live[:-1, 2]).all() and live[0, 1] == 0
    for e, s0, c in live:
        assert (flat[sorted_pairs[s0 : s0 + c]] == e).all()
    assert (t[len(live) :, 2] == 0).all()  # the tiles past the last do nothing


ROUTERS = [(1, 2048, 128, False), (5, 2880, 32, True), (32, 256, 8, False), (3, 4096, 64, True)]


@pytest.mark.parametrize("rows,k,n_expert,bias", ROUTERS)
def test_float_router_matches_float64(rt, lib, dev, rows, k, n_expert, bias):
    """moe_router's logits of a float32 router (Qwen3-30B-A3B's 2048 x 128, gpt-oss-20b's
    2880 x 32 with a bias, the most rows and the longest rows it takes) against float64."""
    from forge_hip.expert_routing import ROUTER_THREADS

    rng = np.random.default_rng(rows + k)
    w = rng.standard_normal((n_expert, k)).astype(np.float32)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal(n_expert).astype(np.float32) if bias else None
    out = dev.poisoned(4 * rows * n_expert)
    bias_buf = dev.put(b) if bias else 0
    rt.launch(lib.get("moe_router"), (n_expert,), (ROUTER_THREADS,),
              [dev.put(w), bias_buf, dev.put(x), rows, k, n_expert, out])  # fmt: skip
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if b is None else b)
    got = dev.get(out, (rows, n_expert))
    np.testing.assert_allclose(got, want, rtol=0, atol=3.2e-6 * np.sqrt(k))


def test_combine_sums_each_rows_slots_in_order(rt, lib, dev):
    """moe_combine: out[r] = sum_j w[r k + j] y[pos[r k + j]], every column of a row even when
    the row is longer than a block (the grid's second dimension)."""
    rows, k, n = 3, 8, 2880
    rng = np.random.default_rng(3)
    y = rng.standard_normal((rows * k, n)).astype(np.float32)
    pos = rng.permutation(rows * k).astype(np.int32)
    w = rng.random(rows * k).astype(np.float32)
    out = dev.poisoned(4 * rows * n)
    rt.launch(lib.get("moe_combine"), (rows, -(-n // 256)), (256,),
              [dev.put(y), dev.put(pos), dev.put(w), k, n, out])  # fmt: skip
    want = np.einsum("rj,rjn->rn", w.reshape(rows, k).astype(np.float64),
                     y[pos].reshape(rows, k, n).astype(np.float64))  # fmt: skip
    np.testing.assert_allclose(dev.get(out, (rows, n)), want, rtol=1e-5, atol=1e-5)


PLANNED = {  # the variants a model's passes of 1, 24 and 300 tokens take
    "qwen3moe-q4_k_m.gguf": {"r1", "r8", "gemm128"},  # 8 experts, 2 a token
    "qwen3moe-q8_0.gguf": {"r1", "r8", "gemm128"},
    "gpt-oss-q8_0.gguf": {"r1", "mma", "gemm128"},  # 8 experts, 4 a token: 12 pairs each at 24
    "gpt-oss-mxfp4.gguf": {"r1", "mma", "gemm128"},
}


@pytest.mark.parametrize("forced", [None, "r1", "r1-any", "r1-quant", "r8", "gen", "mma",
                                    "gemm64"])  # fmt: skip
@pytest.mark.parametrize("model_file", list(PLANNED))
def test_moe_model_matches_cpu_at_every_variant(rt, model_file, forced, golden_dir, monkeypatch,
                                                report):  # fmt: skip
    """Logits of prompts of 1, 24 and 300 tokens on hip and cpu_simd, within the golden bound
    of the model's weights: the planned variants and each variant forced at every size (tiles
    of 1 or 8 pairs for 512 pairs of a pass; gen: the decoder of every type, the one Q2_K/Q3_K
    experts take; r1 takes the one-type kernels where moe.hip has them, r1-any the kernels for
    every type, r1-quant token rows rounded by moe_quant instead of the add_norm; mma / gemm64:
    int8 / 16-bit tensor-core tiles of 32 / 64 pairs)."""
    from forge_hip import experts

    monkeypatch.setenv("FORGE_HIP_KV", "f32")
    v = forced and forced.split("-")[0]
    if forced is not None:
        monkeypatch.setattr(experts, "variant", lambda *a: v)
    path = str(golden_dir / "models" / model_file)
    gpu = forge.load(path, backend="hip", n_ctx=512)
    gpu.runner.plan.ffns.typed = forced != "r1-any"
    gpu.runner.plan.products.quant_norm = forced != "r1-quant"
    cpu = forge.load(path, backend="cpu_simd", n_ctx=512)
    f = gpu.runner.spec.ffn
    try:
        rng = np.random.default_rng(7)
        seen, worst = set(), 0.0
        for n in (1, 24, 300):
            tokens = rng.integers(3, gpu.n_vocab, n).tolist()
            types = gpu.runner.plan.ffn[0].types
            seen.add(experts.variant(types, min(n, 256) * f.n_expert_used, f.n_expert))
            mx, _ = logit_errors(gpu.logits(tokens), cpu.logits(tokens))
            worst = max(worst, mx)
        assert seen == (PLANNED[model_file] if forced is None else {v})
    finally:
        gpu.runner.close()
    report.append(f"moe hip vs cpu {model_file:22s} {forced or 'planned':7s} max {worst:.2e}")
    assert worst <= BOUNDS[weight_class(model_file)][0], worst
