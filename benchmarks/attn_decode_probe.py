"""attn_decode alone: microseconds per launch inside a captured graph (overlapped launches, as
the decode step replays them), on the gemma3-270m twin's heads (4 query heads, 1 KV head of 256,
f16 cache) at several cached lengths; optionally for other kernel directories (A/B of sources).

  python benchmarks/attn_decode_probe.py [--positions 16 64 128 1024] [--rows 1 32]
      [--splits 1 16] [--dirs new=kernels old=DIR]

Three chains of N launches each: attention back to back ("attn"), attention after a one-block
add_norm ("norm+attn", like a step where it follows a short product) and add_norm alone
("norm"); "after norm" = (norm+attn - norm) / N is attention's marginal cost after a kernel.
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

from forge_hip.library import ATT_THREADS, KERNELS, HipKernel, KernelLibrary  # noqa: E402
from forge_hip.runtime import open_runtime  # noqa: E402

from tests.gpu.test_attention import Case  # noqa: E402
from tests.support.gpu_helpers import Dev  # noqa: E402

H, KVH, D, BS = 4, 1, 256, 16


def kernel(lib, name: str, directory: str | None):
    source, sig = KERNELS[name]
    k = lib.resolve(HipKernel(source, name, sig, str(Path(directory).resolve())))
    return replace(k, overlaps=True)


def chain_us(rt, stream, launches, n: int, reps: int = 20) -> float:
    """Microseconds per repetition of `launches` (a list of (kernel, grid, block, args)) in a
    captured graph of n repetitions."""
    rt.begin_capture(stream)
    for _ in range(n):
        for k, grid, block, args in launches:
            rt.launch(k, grid, block, args, stream=stream, overlap=True)
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


def probe(rt, lib, dev, directory: str, positions: int, splits: int, n: int, rows: int) -> dict:
    rng = np.random.default_rng(0)
    c = Case(rng, H, KVH, D, D, [positions] * rows, True)
    b = c.buffers(dev, splits)
    q, k, v = dev.put(c.q), dev.put(c.k), dev.put(c.v)
    nw = dev.put(np.ones(D, np.float32))
    meta = [dev.put(c.pos), dev.put(c.slots), dev.put(c.bt), dev.put(c.btoff)]
    att = kernel(lib, "attn_decode", directory)
    att_args = [q, k, v, nw, nw, *meta, b["kc"], b["vc"], b["part_o"], b["part_ml"], b["cnt"],
                b["out"], KVH, D, D, D, 1, 10000.0, 1.0, 0, 1.0, 1e-6, BS, D**-0.5, 0, 1,
                0]  # fmt: skip
    x, o, xn = (
        dev.put(np.ones(640, np.float32)),
        dev.put(np.ones(640, np.float32)),
        dev.put(np.zeros(640, np.float32)),
    )
    w = dev.put(np.ones(640, np.float32))
    norm = kernel(lib, "add_norm", directory)
    norm_args = [x, o, w, w, xn, 640, 1e-6]
    attn_l = (att, (H, rows, splits), (ATT_THREADS,), att_args)
    norm_l = (norm, (1,), (32,), norm_args)
    stream = rt.stream()
    a = chain_us(rt, stream, [attn_l], n)
    na = chain_us(rt, stream, [norm_l, attn_l], n)
    no = chain_us(rt, stream, [norm_l], n)
    return {"attn": round(a, 2), "norm+attn": round(na, 2), "norm": round(no, 2),
            "after norm": round(na - no, 2)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, nargs="+", default=[16, 64, 128, 1024])
    ap.add_argument("--dirs", nargs="+", default=[f"new={ROOT / 'kernels'}"])
    ap.add_argument("--launches", type=int, default=60)
    ap.add_argument("--rows", type=int, nargs="+", default=[1], help="sequences per launch")
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 16], help="most splits (grid z)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rt = open_runtime()
    lib = KernelLibrary(rt)
    results = []
    for spec in a.dirs:
        label, directory = spec.split("=", 1)
        for rows in a.rows:
            for p in a.positions:
                for splits in a.splits:
                    dev = Dev(rt)
                    r = probe(rt, lib, dev, directory, p, splits, a.launches, rows)
                    dev.free()
                    results.append({"kernels": label, "rows": rows, "positions": p,
                                    "splits": splits, **r})  # fmt: skip
                    print(json.dumps(results[-1]), flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "attn_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
