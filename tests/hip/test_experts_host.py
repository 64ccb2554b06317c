"""The hip plan of a mixture of experts without a GPU (a recording fake runtime): which moe.hip
launches a pass makes for its row count, that their grids depend on the rows only (so decode
steps are captured once and replayed), and the workspace and refusals around them. The
arithmetic runs on the device (tests/gpu/test_experts_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from forge.backend import SeqBatch
from forge.errors import UnsupportedModelError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.plugins import get_plugin_manager
from tests.support.fake_runtime import FakeRuntime

MODEL = "qwen3moe-q4_k_m.gguf"


def _runner(golden_dir, rt, name=MODEL):
    from forge_hip.runner import HipRunner

    gguf = open_gguf(str(golden_dir / "models" / name))
    return HipRunner(build_spec(gguf), gguf, get_plugin_manager().kernels, runtime=rt)


def _moe_launches(rt) -> list[tuple[str, tuple]]:
    return [(n, g) for n, g, _ in rt.launches if n.startswith("moe_")]


@pytest.mark.parametrize("rows,variant", [(1, "r1"), (8, "r1"), (24, "r8"), (48, "mma"),
                                          (100, "gemm64"), (300, "gemm128")])  # fmt: skip
def test_a_pass_makes_the_expert_launches_of_each_layer_with_the_variant_for_its_rows(
    golden_dir, rows, variant
):
    from forge_hip.expert_routing import ROUTER_ROWS, TOPK_ROWS, route_threads
    from forge_hip.experts import VARIANT_RM, kernel, max_tiles
    from forge_hip.library import ROUND_MODE

    rt = FakeRuntime()
    runner = _runner(golden_dir, rt)
    f = runner.spec.ffn
    runner.allocate_kv(64, 16)
    rt.launches.clear()
    tokens = np.arange(1, rows + 1, dtype=np.int32) % 400
    runner.forward([SeqBatch(tokens, 0, np.arange(-(-rows // 16)), "last")])
    moe = _moe_launches(rt)
    want = []
    router = ["moe_router"] if rows <= ROUTER_ROWS else []  # (the model's routers are F32)
    topk = ["moe_topk"] if rows > TOPK_ROWS else []  # many rows: chosen by a warp each first
    gemm = variant.startswith("gemm")
    for part in runner.plan.ffn:
        if gemm:  # 16-bit tensor-core tiles (moe_gemm.hip): activations by act_half
            products = [f"moe_gemm_glu_m{variant[4:]}", f"moe_gemm_down_m{variant[4:]}"]
        else:
            glu = kernel("glu", variant, part.types[:2])
            # (one-pair tiles: their token rows rounded by the add_norm before the router)
            first = [] if variant == "r1" else ["moe_quant"]
            products = [*first, glu, "moe_quant", kernel("down", variant, part.types[2:])]
        want += [*router, *topk, "moe_route", *products, "moe_combine"]
    assert [n for n, _ in moe] == want
    halves = [a for n, a in rt.launch_args if n == "act_half" and a[1] == runner.ws.moe_xq]
    if gemm:  # ws.h's rows for gate/up (Q4_K: q8 per 256), the gated outputs for down
        ws, n_embd = runner.ws, runner.spec.n_embd
        expected = []
        for p in runner.plan.ffn:
            expected += [
                [ws.h, ws.moe_xq, n_embd, 2],
                [ws.moe_g, ws.moe_xq, f.n_ff, ROUND_MODE[p.types[2]]],
            ]
        assert halves == expected
    else:
        assert halves == []
    r1 = {n for n, _ in moe if "_r1" in n}  # the one-type kernels: Q4_K gate/up, Q4_K/Q6_K down
    assert r1 <= {"moe_glu_r1_q4_k", "moe_down_r1_q4_k", "moe_down_r1_q6_k"} and (rows > 8) != bool(
        r1
    )
    pairs = rows * f.n_expert_used
    rm = VARIANT_RM[variant]
    for name, grid in moe:
        if name.startswith(("moe_glu", "moe_down", "moe_gemm")):
            assert grid[1] == max_tiles(pairs, rm, f.n_expert)  # every possible tile a block row
        if name.startswith("moe_gemm_glu"):  # 64 outputs of both gate and up a block
            assert grid[0] == -(-f.n_ff // 64)
        if name.startswith("moe_gemm_down"):
            assert grid[0] == -(-runner.spec.n_embd // 128)
        if name == "moe_route":
            assert grid == (1,)
        if name == "moe_combine":
            assert grid == (rows, -(-runner.spec.n_embd // 256))
        if name == "moe_router":
            assert grid == (f.n_expert,)
    # the router: one product per layer whose output is moe_route's first argument
    routes = [a for n, a in rt.launch_args if n == "moe_route"]
    assert {a[0] for a in routes} == {runner.ws.moe_logits} and routes[0][1:4] == [rows, 8, 2]
    assert {a[9] for a in routes} == {int(bool(topk))}  # moe_route's `chosen`
    for name, grid in moe:
        if name == "moe_topk":  # a 32-lane warp per row, 8 a block
            assert grid == (-(-rows // 8),)
    tops = [a for n, a in rt.launch_args if n == "moe_topk"]  # the same row arguments
    assert len(tops) == (len(routes) if topk else 0)
    assert all(a[:7] == r[:7] and a[7:] == r[10:12] for a, r in zip(tops, routes))
    blocks = {b for (n, _, _), b in zip(rt.launches, rt.blocks, strict=True) if n == "moe_route"}
    assert blocks == {(route_threads(f.n_expert, rows),)}
    routers = [a for n, a in rt.launch_args if n == "moe_router"]
    assert len(routers) == (runner.spec.n_layer if router else 0)
    for a in routers:  # W, bias, x = ws.h, rows, K, E, logits
        assert a[2:] == [runner.ws.h, rows, runner.spec.n_embd, f.n_expert, runner.ws.moe_logits]


@pytest.mark.parametrize("quant_norm", [True, False])
@pytest.mark.parametrize("rows", [1, 8])
def test_one_pair_tiles_read_x_rounded_once_per_token(golden_dir, rows, quant_norm):
    """One-pair tiles: the add_norm before the router writes ws.h and its rows rounded into
    ws.moe_xq (add_norm_quant; without the products' quant_norm, add_norm then moe_quant of
    ws.h's `rows` rows), and the gate/up kernel reads pair p's row p / k through moe_order:
    x rounded once per token, not once per pair."""
    from forge_hip.experts import kernel
    from forge_hip.tuning import mvq_need

    rt = FakeRuntime()
    runner = _runner(golden_dir, rt)
    runner.plan.products.quant_norm = quant_norm
    f, ws, n_embd = runner.spec.ffn, runner.ws, runner.spec.n_embd
    runner.allocate_kv(64, 16)
    rt.launches.clear()
    runner.forward([SeqBatch(np.arange(1, rows + 1, dtype=np.int32), 0, np.arange(1), "last")])
    part = runner.plan.ffn[-1]
    need = mvq_need(list(part.types[:2]))
    glu = dict(rt.launch_args)[kernel("glu", "r1", part.types[:2])]  # (the last layer's)
    assert glu[2:7] == [ws.moe_tiles, ws.moe_xq, rows, n_embd, need]  # P: the token rows
    assert glu[-2:] == [ws.moe_order, f.n_expert_used]
    rounded = [a for n, a in rt.launch_args if n == "add_norm_quant" and a[5] == ws.moe_xq]
    token_quant = [a for n, a in rt.launch_args if n == "moe_quant" and a[0] == ws.h]
    if quant_norm:
        assert len(rounded) == runner.spec.n_layer and not token_quant
        assert rounded[0][4:8] == [ws.h, ws.moe_xq, n_embd, need]
    else:
        assert not rounded and len(token_quant) == runner.spec.n_layer
        assert token_quant[0] == [ws.h, 0, 1, ws.moe_xq, n_embd, rows, need]  # in token order
        norms = [a for n, a in rt.launch_args if n == "add_norm" and a[3] == part.norm]
        assert norms and norms[-1][4] == ws.h


def test_route_block_fits_its_experts_and_rows():
    from forge_hip.expert_routing import MOE_THREADS, route_threads

    assert route_threads(128, 1) == 128 and route_threads(32, 1) == 64  # decode: small blocks
    assert route_threads(8, 3) == 192 and route_threads(128, 512) == MOE_THREADS
    assert route_threads(1024, 1) == MOE_THREADS  # a thread per expert (the scans)
    for e, r in [(8, 1), (100, 2), (128, 9), (256, 64)]:
        t = route_threads(e, r)
        assert t % 64 == 0 and e <= t <= MOE_THREADS


def test_decode_steps_replay_one_graph_with_the_expert_launches(golden_dir):
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt)
    runner.allocate_kv(64, 16)
    runner.forward([SeqBatch(np.arange(1, 6, dtype=np.int32), 0, np.arange(1), "last")])
    rt.launches.clear()
    for pos in range(5, 9):
        runner.forward([SeqBatch(np.array([7], np.int32), pos, np.arange(1), "last")])
    captured = [n for n, _, capturing in rt.launches if capturing]
    assert captured.count("moe_route") == runner.spec.n_layer  # captured once ...
    assert rt.replays >= 3  # ... and replayed for the later steps
    assert not [n for n, _, capturing in rt.launches if n.startswith("moe_") and not capturing]


def test_workspace_holds_every_pair_of_a_full_pass(golden_dir):
    from forge_hip.workspace import ROW_CAP, buffer_sizes, n_descs

    spec = build_spec(open_gguf(str(golden_dir / "models" / MODEL)))
    sizes = buffer_sizes(spec, n_descs(spec))
    pairs = ROW_CAP * spec.ffn.n_expert_used
    assert sizes["moe_y"] == 4 * pairs * spec.n_embd and sizes["moe_g"] == 4 * pairs * spec.ffn.n_ff
    assert sizes["moe_tiles"] >= 12 * pairs  # one-pair tiles: a tile per pair at least
    dense = build_spec(open_gguf(str(golden_dir / "models" / "qwen3-q8_0.gguf")))
    assert not [k for k in buffer_sizes(dense, n_descs(dense)) if k.startswith("moe_")]


def test_expert_weights_the_kernels_do_not_decode_are_refused_by_name(golden_dir):
    from forge_hip.capacity import check_spec

    gguf = open_gguf(str(golden_dir / "models" / "gpt-oss-mxfp4.gguf"))
    as_f16 = SimpleNamespace(tensors={n: SimpleNamespace(type="F16" if "_exps.weight" in n
                                                         else t.type, shape=t.shape)
                                      for n, t in gguf.tensors.items()})  # fmt: skip
    with pytest.raises(UnsupportedModelError, match=r"F16 weights \(blk\.0\.ffn_gate_exps"):
        check_spec(build_spec(gguf), as_f16)


@pytest.mark.parametrize("rows,variant", [(1, "r1"), (8, "r8"), (24, "mma"), (300, "gemm128")])
def test_mxfp4_experts_take_the_variant_for_their_rows(golden_dir, rows, variant):
    """MXFP4 experts (gpt-oss: 8 experts, 4 a token) take every variant, both kinds of
    tensor-core tiles included."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, "gpt-oss-mxfp4.gguf")
    runner.allocate_kv(64, 16)
    rt.launches.clear()
    tokens = np.arange(1, rows + 1, dtype=np.int32) % 400
    runner.forward([SeqBatch(tokens, 0, np.arange(-(-rows // 16)), "last")])
    names = [n for n, _ in _moe_launches(rt)]
    suffix = {"r1": "r1_mxfp4", "gemm128": "m128"}.get(variant, variant)
    kind = "moe_gemm_" if variant.startswith("gemm") else "moe_"
    assert names.count(f"{kind}glu_{suffix}") == names.count(f"{kind}down_{suffix}") == 4
    assert len({n for n in names if n.startswith(f"{kind}glu")}) == 1


def test_one_type_kernels_only_where_every_matrix_has_that_type(golden_dir):
    from forge_hip.experts import kernel

    assert kernel("glu", "r1", ["Q4_K", "Q4_K"]) == "moe_glu_r1_q4_k"
    assert kernel("glu", "r1", ["Q4_K", "Q5_K"]) == "moe_glu_r1"  # mixed
    assert kernel("down", "r1", ["Q5_K"]) == "moe_down_r1"  # no kernel of its own
    assert kernel("down", "r8", ["MXFP4"]) == "moe_down_r8"  # one-pair tiles only
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, "gpt-oss-mxfp4.gguf")
    runner.allocate_kv(64, 16)
    runner.plan.ffns.typed = False  # the generic kernels, for comparisons
    rt.launches.clear()
    runner.forward([SeqBatch(np.arange(1, 2, dtype=np.int32), 0, np.arange(1), "last")])
    assert {n for n, _ in _moe_launches(rt) if "_r1" in n} == {"moe_glu_r1", "moe_down_r1"}


def test_too_many_experts_per_token_are_refused(golden_dir):
    from forge_hip.capacity import check_spec

    spec = build_spec(open_gguf(str(golden_dir / "models" / MODEL)))
    many = spec.model_copy(update={"ffn": spec.ffn.model_copy(
        update={"n_expert": 64, "n_expert_used": 32})})  # fmt: skip
    with pytest.raises(UnsupportedModelError, match=r"up to 16 experts per token, not 32"):
        check_spec(many)


def test_mxfp4_expert_rows_are_placed_16_byte_aligned(golden_dir):
    """The arena pads each MXFP4 row's exponents so its codes load as aligned words, and makes
    room for the padding (the arena's layout counts the device rows, not the file's)."""
    from forge_hip.arena import layout, mxfp4_row_bytes

    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, "gpt-oss-mxfp4.gguf")
    gguf = open_gguf(str(golden_dir / "models" / "gpt-oss-mxfp4.gguf"))
    placed = {n: p for n, p in runner.arena.placed.items() if p.type == "MXFP4"}
    assert len(placed) == 3 * runner.spec.n_layer
    starts = sorted(off for off, _ in layout(runner.spec, gguf)[0].values())
    base = runner.arena.buffer.ptr
    for p in placed.values():  # the padded rows end before the next tensor starts
        start = p.ptr - base - (p.row_bytes - 16 * (p.k // 32))
        after = next(o for o in starts if o > start)
        assert start + p.nbytes <= after
    for p in placed.values():
        assert p.ptr % 16 == 0 and p.row_bytes == mxfp4_row_bytes(p.k) and p.row_bytes % 16 == 0
        assert p.row_bytes > 17 * p.k // 32  # (128 or 256 elements: 4 or 8 exponents, padded)


@pytest.mark.parametrize("name", [MODEL, "gpt-oss-mxfp4.gguf"])
def test_prefill_routers_run_one_warp_per_output(golden_dir, name):
    """The float32 router of a prefill pass (N = the expert count) is not cut into 64 x 64 tiles
    (8 blocks for 512 rows) but launched one warp per output: a block per row."""
    rt = FakeRuntime()
    runner = _runner(golden_dir, rt, name)
    runner.allocate_kv(64, 16)
    rt.launches.clear()
    rows = 300
    tokens = np.arange(1, rows + 1, dtype=np.int32) % 400
    runner.forward([SeqBatch(tokens, 0, np.arange(-(-rows // 16)), "last")])
    routers = [(g, a) for (n, g, _), (_, a) in zip(rt.launches, rt.launch_args) if n == "mv_multi"]
    first = [p.router for p in runner.plan.ffn]
    assert [a[1] for _, a in routers] == first and all(g[1] == rows for g, _ in routers)
    assert "mm_tiled" not in {n for n, _, _ in rt.launches}


def test_a_router_that_is_not_float32_takes_the_plain_product(golden_dir):
    """moe_router reads float32 rows with float4 loads; any other router type (or a replaced
    matmul kernel) goes through the plain product, which writes the same logits buffer."""
    from dataclasses import replace

    rt = FakeRuntime()
    runner = _runner(golden_dir, rt)
    runner.allocate_kv(64, 16)
    products = runner.plan.ffns.products
    for part in runner.plan.ffn:
        p, impl = products.mats[part.router]
        products.mats[part.router] = (replace(p, type="F16", row_bytes=2 * p.k), impl)
    rt.launches.clear()
    runner.forward([SeqBatch(np.array([5], np.int32), 0, np.arange(1), "last")])
    names = [n for n, _, _ in rt.launches]
    assert "moe_router" not in names and names.count("moe_route") == runner.spec.n_layer


def test_the_16_bit_expert_tiles_take_only_types_they_decode():
    """variant gives moe_gemm.hip's tiles only matrices its type switch decodes (a type it lacks
    would leave y unwritten), gate and up of one type (a gated tile decodes one), and past
    GEMM_PAIRS pairs an expert."""
    from forge_hip.experts import GEMM128_PAIRS, GEMM_PAIRS, variant
    from forge_hip.sources import load_source
    from forge_hip.tuning import MMQ_TYPES

    text = load_source("moe_gemm.hip")
    for t in MMQ_TYPES:
        assert f"case T_{t}: gemm_tile<T_{t}, BM, GLU>" in text, t
    e = 8
    assert variant(("Q4_K", "Q4_K", "Q6_K"), GEMM_PAIRS * e, e) == "gemm64"
    assert variant(("Q4_K", "Q4_K", "Q6_K"), GEMM128_PAIRS * e, e) == "gemm128"
    assert variant(("Q4_K", "Q4_K", "Q6_K"), (GEMM_PAIRS - 1) * e, e) == "mma"
    assert variant(("Q4_K", "Q5_K", "Q6_K"), 64 * e, e) == "mma"  # gate and up differ
    assert variant(("F16", "F16", "F16"), 64 * e, e) == "r8"  # no int8 or 16-bit tile here
    assert variant(("Q3_K", "Q3_K", "Q6_K"), 64 * e, e) == "gen"


def test_one_pair_tiles_give_each_lane_enough_units():
    """expert_lanes: fewer lanes (not below 8) than the decode products' rule where a lane
    would take fewer than GLU_UNITS (gate/up) or DOWN_UNITS (down) units; tiles of several
    pairs keep the rule."""
    from forge_hip.experts import expert_lanes
    from forge_hip.tuning import mvq_lanes

    assert expert_lanes(["MXFP4"] * 2, 2880, 1, 2880, gated=True) == 16  # gpt-oss: 180 units
    assert expert_lanes(["MXFP4"], 2880, 1, 2880, gated=False) == 32  # 5.6 units a lane
    assert expert_lanes(["Q4_K"] * 2, 2048, 1, 768, gated=True) == 8  # Qwen3: 64 units
    assert expert_lanes(["Q6_K"], 768, 1, 2048, gated=False) == 8  # 48 units
    assert expert_lanes(["Q4_K"], 768, 1, 2048, gated=False) == 8 == mvq_lanes(["Q4_K"], 768)
    assert expert_lanes(["MXFP4"] * 2, 2880, 8, 2880, gated=True) == mvq_lanes(["MXFP4"], 2880, 8)
    assert expert_lanes(["Q8_0"] * 2, 64, 1, 64, gated=True) == mvq_lanes(["Q8_0"], 64)  # < 8
