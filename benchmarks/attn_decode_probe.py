"""attn_decode alone at depth: microseconds per launch inside a captured graph (launches back to
back, as a decode step replays them) and the K/V bytes it reads per second, for the per-head
kernel (attn_decode_w<W>) and the grouped one (attn_decode_w<W>_g4), per cache format, cached
length and most splits. Default heads: Llama-3-8B's (32 query heads, 8 KV heads of 128).

  python benchmarks/attn_decode_probe.py [--heads 32 8 128] [--positions 4096 32768]
      [--splits 16 64] [--formats f16 q8_0] [--dirs new=kernels old=DIR] [--out DIR]

--dirs compares kernel sources (an A/B of attention.hip): label=directory each. --tc adds
attn_decode_tc (tensor cores) for a float16 or Q8_0 cache (--tc-only: that kernel alone), each
directory's with its own block and ring sizes (contract.h's TCD_*).

Prints one JSON line per case and the device's copy bandwidth (a 2 GiB device-to-device copy),
the floor a launch is measured against.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "hip")]

from forge_hip.contract import constants, kernel_signatures  # noqa: E402
from forge_hip.kv import KV_FORMAT_IDS, row_bytes  # noqa: E402
from forge_hip.library import (  # noqa: E402
    ATT_THREADS,
    TCD_FORMATS,
    HipKernel,
    KernelLibrary,
    attn_decode_blocks,
    attn_decode_kernel,
    attn_decode_tc_kernel,
    tcd_shared_bytes,
)
from forge_hip.runtime import open_runtime  # noqa: E402

from benchmarks.gpu_bench import copy_bandwidth  # noqa: E402
from forge.kv_cache import KvFormat  # noqa: E402
from tests.gpu.test_attention import BS, Case  # noqa: E402
from tests.support.gpu_helpers import Dev  # noqa: E402


def chain_us(rt, stream, launch, n: int, reps: int = 10) -> float:
    """Microseconds per launch of `launch` (kernel, grid, block, args) in a graph of n."""
    rt.begin_capture(stream)
    for _ in range(n):
        rt.launch(*launch, stream=stream, overlap=True)
    graph = rt.end_capture(stream)
    rt.replay(graph, stream)
    rt.synchronize(stream)
    a, b = rt.event(), rt.event()
    rt.record(a, stream)
    for _ in range(reps):
        rt.replay(graph, stream)
    rt.record(b, stream)
    rt.synchronize(stream)
    return rt.elapsed_ms(a, b) * 1e3 / reps / n


def kernel(lib, name: str, directory: str):
    """Kernel `name` compiled from `directory`'s sources, with the signature declared there."""
    source, sig = kernel_signatures(str(Path(directory).resolve()))[name]
    return replace(lib.resolve(HipKernel(source, name, sig, str(Path(directory).resolve()))),
                   overlaps=True)  # fmt: skip


def probe_tc(rt, lib, dev, directory: str, heads, position: int, splits: int, n: int,
             fmt: KvFormat = KvFormat.F16) -> dict:  # fmt: skip
    """attn_decode_tc (tensor cores, float16 or Q8_0 cache) on the same kind of case, in its
    fused form (Q rotated, the row's K/V stored by the kernel, as the plan launches it) where
    the source has one, else over queries already rotated (as after qk_rope_store)."""
    H, KVH, D = heads
    c = Case(np.random.default_rng(0), H, KVH, D, D, [position], fmt)
    b = c.buffers(dev, splits)
    name = attn_decode_tc_kernel(D, D, H, KVH, rt.props.arch, fmt)
    source = str(Path(directory).resolve())  # (that source's block and ring sizes)
    tc = rt.reserve_shared(kernel(lib, name, directory), tcd_shared_bytes(D, fmt, source))
    args = [dev.put(c.q), b["kc"], b["vc"], dev.put(c.bt), dev.put(c.btoff), dev.put(c.pos),
            b["part_o"], b["part_ml"], b["cnt"], b["out"], H, KVH, BS, D**-0.5, 0, 0]  # fmt: skip
    if len(tc.signature) > len(args):  # the fused form: new K/V, no norms, plain RoPE
        args += [dev.put(c.k), dev.put(c.v), 0, 0, dev.put(c.slots), D, 0, 500000.0, 1.0, 0,
                 1.0, 1e-5]  # fmt: skip
    launch = (tc, (KVH, 1, splits), (constants(source)["TCD_THREADS"],), args)
    return timed(rt, launch, n, fmt, heads, position, splits)


def timed(rt, launch, n: int, fmt: KvFormat, heads, position: int, splits: int) -> dict:
    """One case's line: microseconds per launch (`chain_us`) and the K/V bytes read per second."""
    _, KVH, D = heads
    us = chain_us(rt, rt.stream(), launch, n)
    kv_bytes = 2 * position * KVH * row_bytes(fmt, D)
    return {"kernel": launch[0].name, "format": fmt.value, "positions": position,
            "splits": splits, "us": round(us, 2),
            "GB/s": round(kv_bytes / us / 1e3, 1)}  # fmt: skip


def probe(rt, lib, dev, directory: str, heads, position: int, splits: int, fmt: KvFormat,
          grouped: bool, n: int) -> dict:  # fmt: skip
    H, KVH, D = heads
    c = Case(np.random.default_rng(0), H, KVH, D, D, [position], fmt)
    b = c.buffers(dev, splits)
    name, nq = attn_decode_kernel(D, D, H, KVH)
    if not grouped:
        name, nq = name.removesuffix(f"_g{nq}"), 1
    nw = dev.put(np.ones(D, np.float32))
    args = [dev.put(c.q), dev.put(c.k), dev.put(c.v), nw, nw, dev.put(c.pos), dev.put(c.slots),
            dev.put(c.bt), dev.put(c.btoff), b["kc"], b["vc"], b["part_o"], b["part_ml"],
            b["cnt"], b["out"], KVH, D, D, D, 1, 10000.0, 1.0, 0, 1.0, 1e-6, BS, D**-0.5, 0,
            KV_FORMAT_IDS[fmt], 0, *([H] if nq > 1 else [])]  # fmt: skip
    launch = (
        kernel(lib, name, directory),
        (attn_decode_blocks(H, KVH, nq), 1, splits),
        (ATT_THREADS,),
        args,
    )
    return timed(rt, launch, n, fmt, heads, position, splits)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], metavar=("H", "KVH", "D"))
    ap.add_argument("--positions", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--splits", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--formats", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--dirs", nargs="+", default=[f"new={ROOT / 'kernels'}"])
    ap.add_argument("--grouped-only", action="store_true", help="leave out the per-head kernel")
    ap.add_argument("--tc", action="store_true", help="also attn_decode_tc (float16 cache)")
    ap.add_argument("--tc-only", action="store_true", help="attn_decode_tc alone")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rt = open_runtime()
    lib = KernelLibrary(rt)
    results = [{"copy GB/s": round(copy_bandwidth(rt) / 1e9, 1)}]
    print(json.dumps(results[0]), flush=True)
    kinds = () if a.tc_only else (True,) if a.grouped_only else (False, True)

    def record(label: str, run, *args) -> None:  # noqa: ANN001 - probe or probe_tc
        dev = Dev(rt)
        results.append({"kernels": label, **run(rt, lib, dev, *args)})
        dev.free()
        print(json.dumps(results[-1]), flush=True)

    for label, directory in (d.split("=", 1) for d in a.dirs):
        for fmt in map(KvFormat, a.formats):
            for p in a.positions:
                for splits in a.splits:
                    for grouped in kinds:
                        record(label, probe, directory, a.heads, p, splits, fmt, grouped,
                               a.launches)  # fmt: skip
                    if (a.tc or a.tc_only) and fmt in TCD_FORMATS:
                        record(label, probe_tc, directory, a.heads, p, splits, a.launches, fmt)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "attn_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
