"""Decode-product kernel sweep: mmv.hip's mvq_* kernels against linear.hip's mv_multi / mv_glu on
the matrix shapes of the two benchmark twins (llama-3-8b and gemma3-270m, Q4_K_M), one decode
step's products each, as CUDA-graph replays of many launches over copies of the weights (more
bytes than L2 holds, as a real step reads). Prints microseconds per launch and weight GB/s.

  python benchmarks/mvq_sweep.py [--quick] [--out DIR]
  python benchmarks/mvq_sweep.py --rows 8 16 32 [--shapes g3] [--out DIR]
  python benchmarks/mvq_sweep.py --tuning-out DIR

--tuning-out: time the candidates of the launch knobs it can measure on this device (mvq_flags,
mvq_blocks: one decode step's products of both twins, each model's step relative to its best
candidate, summed) and write DIR/<arch>.json in forge_hip/tuned's format (copy it there to make
it this device's tuning).

--rows: the products at those token rows (server decode steps): the plan's mvq kernel, its
variants (rows per pass RM, lanes, x in global memory) and the gemm path (act_half + gemm.hip) that
products past the decode limit took before.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "hip")]

from forge_hip.arena import Placed, device_rows  # noqa: E402
from forge_hip.library import ROUND_MODE, KernelLibrary  # noqa: E402
from forge_hip.products import DESC, descriptor  # noqa: E402
from forge_hip.runtime import open_runtime  # noqa: E402
from forge_hip.sources import load_source  # noqa: E402
from forge_hip.tuning import (  # noqa: E402
    DEFAULT,
    MVQ_SMEM,
    MVQ_THREADS,
    mvq_global_x,
    mvq_lanes,
    mvq_need,
    mvq_variant,
    mvq_xbytes,
)

from tests.support.quant_blocks import random_raw  # noqa: E402

# (name, types, K, rows per matrix, glu, layers of the model using it)
SHAPES = [
    ("l8b.qkv", ["Q4_K", "Q4_K", "Q6_K"], 4096, [4096, 1024, 1024], False, 32),
    ("l8b.wo", ["Q4_K"], 4096, [4096], False, 32),
    ("l8b.gate_up", ["Q4_K", "Q4_K"], 4096, [14336, 14336], True, 32),
    ("l8b.down", ["Q6_K"], 14336, [4096], False, 32),
    ("l8b.head", ["Q6_K"], 4096, [128256], False, 1),
    ("g3.qkv", ["Q5_0", "Q5_0", "Q8_0"], 640, [1024, 256, 256], False, 18),
    ("g3.wo", ["Q4_K"], 1024, [640], False, 18),
    ("g3.gate_up", ["Q5_0", "Q5_0"], 640, [2048, 2048], True, 18),
    ("g3.down", ["Q6_K"], 2048, [640], False, 18),
    ("g3.head", ["Q8_0"], 640, [262144], False, 1),
]
ROW_BYTES = {"Q4_K": 144 / 256, "Q6_K": 210 / 256, "Q5_0": 22 / 32, "Q8_0": 34 / 32}


class Bench:
    def __init__(self, quick: bool):
        self.rt = open_runtime()
        self.lib = KernelLibrary(self.rt)
        self.stream = self.rt.stream()
        self.sms = self.rt.props.compute_units
        self.quick = quick
        self.rng = np.random.default_rng(0)
        self.bufs = []
        self.variants = {}
        self.tables = {}  # device descriptor table address -> its host copy

    def put(self, arr):
        buf = self.rt.alloc(arr.nbytes)
        self.rt.copy_to_device(buf, np.ascontiguousarray(arr))
        self.bufs.append(buf)
        return buf

    def variant(self, defines: str) -> dict:
        """mmv.hip's r1 kernels compiled with `defines` first: name -> kernel."""
        if defines not in self.variants:
            src = load_source("mmv.hip")
            src = defines + "\n" + re.sub(r"MVQ_KERNELS\((r2|r4|r8|gen),[^\n]*\n", "", src)
            mod = self.rt.load(self.rt.compile(src, "mmv_variant.hip"))
            self.variants[defines] = {
                k: self.rt.function(mod, k, sig)
                for k, sig in (("mvq_multi_r1", "piiiipiiipi"), ("mvq_glu_r1", "piiipiiipii"))
            }
        return self.variants[defines]

    def shape(self, name, types, K, ns, glu, R):
        """Descriptor table of enough weight copies to exceed L2, x and y buffers."""
        nbytes = sum(int(n * K * ROW_BYTES[t]) for t, n in zip(types, ns))
        copies = max(2, -(-256_000_000 // nbytes))
        raws = []
        for t, n in zip(types, ns):
            raw = random_raw(self.rng, t, n, K)
            raws.append(raw)
        x = self.put(self.rng.standard_normal((R, K)).astype(np.float32))
        ys = [self.rt.alloc(4 * R * n) for n in ns]
        self.bufs += ys
        table = []
        for _ in range(copies):
            for t, n, raw in zip(types, ns, raws):
                data, at = device_rows(t, raw)
                w = self.put(data)
                placed = Placed(w.ptr + at, t, K, n, data.shape[1])
                table.append(descriptor(placed, x.ptr, ys[len(table) % len(ns)].ptr, 0))
        descs = self.put(np.asarray(table, np.int64))
        self.tables[descs.ptr] = np.asarray(table, np.int64)
        return descs, copies, nbytes, x

    def time_graph(self, enqueue, copies: int, launches: int = 40) -> float:
        """Microseconds per product, from replays of a graph of `launches` products."""
        rt, s = self.rt, self.stream
        rt.begin_capture(s)
        try:
            for i in range(launches):
                enqueue(i % copies)
        finally:
            graph = rt.end_capture(s)
        rt.replay(graph, s)
        rt.synchronize(s)
        best = float("inf")
        for _ in range(3 if self.quick else 5):
            a, b = rt.event(), rt.event()
            rt.record(a, s)
            rt.replay(graph, s)
            rt.record(b, s)
            rt.synchronize(s)
            best = min(best, rt.elapsed_ms(a, b) * 1e3 / launches)
        return best

    def run_shape(self, name, types, K, ns, glu, R, configs):
        descs, copies, nbytes, x = self.shape(name, types, K, ns, glu, R)
        count = len(types)
        out = []
        lib, rt, s = self.lib, self.rt, self.stream
        for cfg in configs:
            kind = cfg["kind"]
            if kind == "gemm":
                enq = self.gemm_enqueue(descs, count, ns, K, R, glu, types, x)
            elif kind == "old":
                kernel = lib.get("mv_glu" if glu else "mv_multi")
                grid = (-(-max(ns) // 4), R, 1 if glu else count)
                args = (lambda c: [descs, c * count, 0]) if glu else (lambda c: [descs, c * count])

                def enq(c, kernel=kernel, grid=grid, args=args):
                    rt.launch(kernel, grid, (128,), args(c), stream=s)
            else:
                suffix, rm = mvq_variant(types, R)
                if cfg.get("rm"):
                    suffix, rm = f"r{cfg['rm']}", cfg["rm"]
                g = cfg.get("G") or mvq_lanes(types, K, R, max(ns), glu, self.sms)
                nt = cfg.get("threads", MVQ_THREADS)
                rb = nt // g
                items = sum(-(-n // rb) for n in (ns[:1] if glu else ns))
                most = cfg.get("bps", 4) * self.sms
                grid = -(-items // -(-items // most))
                flags = cfg.get("flags", DEFAULT.mvq_flags)
                if cfg.get("plan") and nbytes > DEFAULT.mvq_prefetch_bytes:
                    flags &= ~1  # the plan's rule: big matrices never prefetch (l2_prefetch_pays)
                need = mvq_need(types)
                xg = 0
                quant = None
                use_xg = cfg.get("xg", int(mvq_global_x(need, R, K, rm)))
                if need and (use_xg or mvq_xbytes(need, R, K) > MVQ_SMEM[rm]):
                    xg = self.rt.alloc(mvq_xbytes(need, R, K))
                    self.bufs.append(xg)
                    tasks = R * -(-K // 256)
                    quant = (lib.get("mvq_quant"), (-(-tasks // 8),), (MVQ_THREADS,),
                             [x, xg, K, R, need])  # fmt: skip
                if "src" in cfg:
                    kern = self.variant(cfg["src"])
                    kernel = kern["mvq_glu_r1" if glu else "mvq_multi_r1"]
                else:
                    kernel = lib.get(f"mvq_{'glu' if glu else 'multi'}_{suffix}")

                tail = [x, K, need, items, xg, flags]

                def enq(c, kernel=kernel, grid=grid, g=g, nt=nt, tail=tail, quant=quant):
                    if quant:
                        rt.launch(*quant, stream=s)
                    if glu:
                        a = [descs, c * count, R, g, *tail, 0]
                    else:
                        a = [descs, c * count, count, R, g, *tail]
                    rt.launch(kernel, (grid,), (nt,), a, stream=s)

            try:
                us = self.time_graph(enq, copies)
            except Exception as exc:  # one configuration failing does not end the sweep
                print(f"{name:12s} R={R} {cfg_label(cfg)}: {exc}", flush=True)
                continue
            out.append({"shape": name, "R": R, "cfg": cfg_label(cfg), "us": round(us, 2),
                        "GBs": round(nbytes / us / 1e3, 1)})  # fmt: skip
            label = cfg_label(cfg)
            print(f"{name:12s} R={R} {label:38s} {us:9.2f} us {nbytes / us / 1e3:8.1f} GB/s",
                  flush=True)  # fmt: skip
        return out

    def gemm_enqueue(self, descs, count, ns, K, R, glu, types, x):
        """The gemm path of forge_hip.products (Products._gemm) for one copy of the product (and
        the gated product's geglu): act_half per rounding mode, then gemm_m64/m128 over
        descriptors whose x is the rounded activations."""
        rt, lib, s = self.rt, self.lib, self.stream
        modes = sorted({ROUND_MODE[t] for t in types})
        half = {m: self.rt.alloc(4 * R * K) for m in modes}
        self.bufs += list(half.values())
        rows = self.tables[descs.ptr].copy()
        for i, row in enumerate(rows):
            row[DESC["X"]] = half[ROUND_MODE[types[i % count]]].ptr
        descs_p = self.put(rows)
        blocks = -(-R // 128) * sum(-(-n // 128) for n in ns)
        bm = 128 if 2 * blocks >= self.sms else 64
        gemm = lib.get(f"gemm_m{bm}")
        act = lib.get("act_half")
        geglu = lib.get("geglu")
        ys = [int(r[DESC["Y"]]) for r in rows[:count]]

        def enq(c):
            for m in modes:
                rt.launch(act, (R,), (256,), [x, half[m], K, m], stream=s)
            rt.launch(gemm, (-(-R // bm), -(-max(ns) // 128), count), (256,),
                      [descs_p, c * count, R], stream=s)  # fmt: skip
            if glu:
                n = R * ns[0]
                rt.launch(geglu, (min(4096, -(-n // 256)),), (256,), [ys[0], ys[1], ys[0], n],
                          stream=s)  # fmt: skip

        return enq


def step_times(results) -> None:
    """One decode step's products per model (R = 1): layers x per-shape time."""
    for model in ("l8b", "g3"):
        for cfg in ("kind=old", "kind=new"):
            tot = sum(
                layers * next(r["us"] for r in results
                              if r["shape"] == name and r["cfg"] == cfg and r["R"] == 1)
                for name, *_, layers in SHAPES if name.startswith(model)
            )  # fmt: skip
            print(f"{model} {cfg}: products of one decode step {tot / 1e3:.3f} ms", flush=True)


def rows_sweep(b: Bench, rows: list[int], prefixes: list[str], out: str | None) -> int:
    """Each shape at each row count: the plan's kernel, variants, and the gemm path."""
    results = []
    for name, types, K, ns, glu, _ in SHAPES:
        if not any(name.startswith(p) for p in prefixes):
            continue
        for R in rows:
            configs = [{"kind": "new"}, {"kind": "gemm"}]
            if R > 8:
                configs += [{"kind": "new", "rm": 8}] + (
                    [{"kind": "new", "rm": 16}] if R > 16 else []
                )
                configs += [{"kind": "new", "G": g} for g in (8, 16, 32)]
                configs += [{"kind": "new", "xg": 1}, {"kind": "new", "xg": 0},
                            {"kind": "new", "bps": 1}, {"kind": "new", "bps": 2}]  # fmt: skip
            results += b.run_shape(name, types, K, ns, glu, R, configs)
    for model in ("l8b", "g3"):  # one decode step's products per configuration kind
        for R in rows:
            for cfg in ("kind=new", "kind=gemm"):
                got = [layers * r["us"] for name, *_, layers in SHAPES for r in results
                       if name.startswith(model) and r["shape"] == name and r["R"] == R
                       and r["cfg"] == cfg]  # fmt: skip
                if got:
                    print(f"{model} R={R} {cfg}: products of one step {sum(got) / 1e3:.3f} ms "
                          f"({len(got)} shapes)", flush=True)  # fmt: skip
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "mvq_rows.json").write_text(json.dumps(results, indent=1))
    return 0


# Launch knobs this sweep measures: knob -> (the run_shape config key, candidates).
KNOBS = {"mvq_flags": ("flags", (0, 1, 3, 5, 7)), "mvq_blocks": ("bps", (2, 4, 8))}


def write_tuning(b: Bench, out: Path) -> int:
    """Time each knob's candidates over one decode step's products (R = 1) of both twins, as the
    plan launches them (its prefetch rule applied to the flags); the best candidate (the sum
    over models of its step time relative to that model's best) goes into <out>/<arch>.json
    with the per-model step times it rests on."""
    knobs = {}
    for knob, (key, values) in KNOBS.items():
        steps: dict[int, dict[str, float]] = {v: {} for v in values}
        for name, types, K, ns, glu, layers in SHAPES:
            for r in b.run_shape(name, types, K, ns, glu, 1, [{"kind": "new", key: v, "plan": 1}
                                                             for v in values]):  # fmt: skip
                v = int(r["cfg"].split(f"{key}=")[1].split(",")[0])
                model = name.split(".")[0]
                steps[v][model] = steps[v].get(model, 0.0) + layers * r["us"]
        best = {m: min(steps[v][m] for v in values) for m in steps[values[0]]}
        score = {v: sum(steps[v][m] / best[m] for m in best) for v in values}
        chosen = min(values, key=score.get)
        shown = "; ".join(f"{v}: " + ", ".join(f"{m} {us:.1f} us" for m, us in steps[v].items())
                          for v in values)  # fmt: skip
        knobs[knob] = {"value": chosen, "measured": f"{b.rt.props.name}, "
                       f"{time.strftime('%Y-%m-%d')}, one decode step's products per "
                       f"candidate: {shown}"}  # fmt: skip
        print(f"{knob}: {chosen} ({shown})", flush=True)
    about = (f"Launch knobs measured on {b.rt.props.name} ({b.rt.props.arch}) by "
             "benchmarks/mvq_sweep.py --tuning-out; the others: default.json.")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{b.rt.props.arch}.json"
    path.write_text(json.dumps({"about": about, "knobs": knobs}, indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return 0


def cfg_label(cfg) -> str:
    return ",".join(f"{k}={v}".replace("\n", ";") for k, v in cfg.items()) or "default"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, nargs="+", help="sweep these token rows (9..32: servers)")
    ap.add_argument("--shapes", default="", help="name prefixes, e.g. g3 (default: all)")
    ap.add_argument("--tuning-out", help="write the measured knobs as DIR/<arch>.json")
    args = ap.parse_args()
    b = Bench(args.quick)
    if args.tuning_out:
        return write_tuning(b, Path(args.tuning_out))
    if args.rows:
        return rows_sweep(b, args.rows, args.shapes.split(",") if args.shapes else [""], args.out)
    t0 = time.time()
    b.lib.get("mvq_multi_r1")  # compile
    b.lib.get("mv_multi")
    print(f"compiled in {time.time() - t0:.1f} s; {b.rt.props.name} {b.sms} SMs", flush=True)
    base = [{"kind": "old"}, {"kind": "new"}]
    sweep = [
        {"kind": "new", "G": 16}, {"kind": "new", "G": 32},
        {"kind": "new", "bps": 2}, {"kind": "new", "bps": 8},
        {"kind": "new", "flags": 0}, {"kind": "new", "flags": 3}, {"kind": "new", "flags": 5},
        {"kind": "new", "flags": 7},
        {"kind": "new", "threads": 128},
        {"kind": "new", "xg": 1}, {"kind": "new", "xg": 0},
        {"kind": "new", "src": "#define MVQ_MIN_BLOCKS 3"},
        {"kind": "new", "src": "#define MVQ_MIN_BLOCKS 2"},
        {"kind": "new", "src": "#define MVQ_STEP(RM) 4\n#define MVQ_MIN_BLOCKS 3"},
        {"kind": "new", "src": "#define MVQ_STEP(RM) 4\n#define MVQ_MIN_BLOCKS 2"},
        {"kind": "new", "src": "#define MVQ_STEP(RM) 1"},
    ]  # fmt: skip
    results = []
    for name, types, K, ns, glu, _ in SHAPES:  # the main comparison first
        results += b.run_shape(name, types, K, ns, glu, 1, base)
    for name, types, K, ns, glu, _ in SHAPES[:4]:
        for R in (2, 4, 8):
            results += b.run_shape(name, types, K, ns, glu, R, base)
    step_times(results)
    for name, types, K, ns, glu, _ in SHAPES:
        results += b.run_shape(name, types, K, ns, glu, 1, sweep)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "mvq_sweep.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
