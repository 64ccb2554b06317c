"""attn_prefill alone at depth: microseconds per launch inside a captured graph (launches back to
back, as a prompt's layers run them) and the multiply-add rate of its two products, for a prompt
piece of R rows after `depth` cached positions, per cache format and most splits of the key
range. Default heads: Llama-3-8B's (32 query heads, 8 KV heads of 128), R = 256 (hip's prompt
piece is 512).

  python benchmarks/attn_prefill_probe.py [--heads 32 8 128] [--rows 256]
      [--depths 0 4096 16384 32768] [--splits 1 2 4 8] [--formats f16 q8_0]
      [--dirs new=kernels old=DIR] [--out DIR]

--dirs compares kernel sources (an A/B of attn_prefill.hip): label=directory each; a source
whose kernels take no split arguments (before splits) runs with one split.

Prints one JSON line per case: us per launch and TFLOP/s (2 x (D + Dv) flops per (row, head,
visible key)), against the causal attention's own count.
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

from forge_hip.attention_part import AP_TENSOR_CORES, AP_THREADS, prefill_blocks  # noqa: E402
from forge_hip.kv import KV_FORMAT_IDS  # noqa: E402
from forge_hip.library import PREFILL_WIDTHS, KernelLibrary, ap_shared_bytes  # noqa: E402
from forge_hip.runtime import open_runtime  # noqa: E402

from benchmarks.attn_decode_probe import chain_us, kernel  # noqa: E402
from forge.kv_cache import KvFormat  # noqa: E402
from tests.support.gpu_helpers import Dev  # noqa: E402
from tests.support.kv_rows import pack  # noqa: E402

BS = 16  # cache block size (the engine's)


def probe(rt, lib, dev, directory: str, heads, rows: int, depth: int, splits: int,
          fmt: KvFormat, n: int) -> dict:  # fmt: skip
    H, KVH, D = heads
    rng = np.random.default_rng(0)
    n_pos = depth + rows
    n_blocks = -(-n_pos // BS)
    kv = [dev.put(pack(fmt, rng.standard_normal((n_blocks * BS, KVH, D)).astype(np.float32)))
          for _ in range(2)]  # fmt: skip
    q = dev.put(rng.standard_normal((rows, H, D)).astype(np.float32))
    pos = dev.put(np.arange(depth, n_pos, dtype=np.int32))
    btoff = dev.put(np.zeros(rows, np.int32))
    bt = dev.put(np.arange(n_blocks, dtype=np.int32))
    out = dev.poisoned(rows * H * D * 4)
    dp = next(p for p in PREFILL_WIDTHS if D <= p)
    blocks = prefill_blocks(rows, H, KVH, D, dp)
    quantized = fmt.block > 1
    k = kernel(lib, f"attn_prefill_{'q' if quantized else ''}{dp}", directory)
    if rt.platform == "cuda":  # `directory`'s ring (sources before it: static shared memory only)
        try:
            k = rt.reserve_shared(k, ap_shared_bytes(dp, quantized, str(Path(directory).resolve())))
        except KeyError:
            k = replace(k, shared=0)
    args = [q, *kv, bt, btoff, pos, out, rows, H, KVH, D, D, BS, D**-0.5, 0,
            KV_FORMAT_IDS[fmt] | AP_TENSOR_CORES, 0]  # fmt: skip
    takes_splits = len(k.signature) > len(args)
    if takes_splits:
        args += [dev.poisoned(rows * H * splits * D * 4), dev.poisoned(rows * H * splits * 8),
                 dev.put(np.zeros(blocks[0] * KVH, np.uint32)), splits]  # fmt: skip
    else:
        splits = 1
    grid = (*blocks[:2], blocks[2] * splits)
    us = chain_us(rt, rt.stream(), (k, grid, (AP_THREADS,), args), n)
    keys = rows * depth + rows * (rows + 1) // 2  # (row, visible key) pairs
    flops = 2 * keys * H * (D + D)
    return {"format": fmt.value, "rows": rows, "depth": depth, "splits": splits,
            "us": round(us, 1), "TFLOP/s": round(flops / us / 1e6, 1)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, nargs=3, default=[32, 8, 128], metavar=("H", "KVH", "D"))
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 4096, 16384, 32768])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--formats", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--launches", type=int, default=8)
    ap.add_argument("--dirs", nargs="+", default=[f"new={ROOT / 'kernels'}"])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rt = open_runtime()
    lib = KernelLibrary(rt)
    results = []
    for label, directory in (d.split("=", 1) for d in a.dirs):
        for fmt in map(KvFormat, a.formats):
            for depth in a.depths:
                for k, splits in enumerate(a.splits):
                    dev = Dev(rt)
                    r = probe(rt, lib, dev, directory, a.heads, a.rows, depth, splits, fmt,
                              a.launches)  # fmt: skip
                    dev.free()
                    if k and r["splits"] < splits:  # a source without splits: shown once
                        break
                    results.append({"kernels": label, **r})
                    print(json.dumps(results[-1]), flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "attn_prefill_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
