"""cpu_simd on the default model: load-to-first-token, peak RSS, prefill and decode speed, and
the distance from the float32 memory-bandwidth limit. Prints JSON, then a short table.

    python benchmarks/cpu_default_model.py [--reps 5] [--json-out FILE]

The load is measured in a fresh subprocess (import, parse, dequantize, first token), so neither
the page cache of this process nor earlier allocations flatter it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

FIRST_TOKEN = r"""
import resource, sys, time, json
t0 = time.perf_counter()
import forge
m = forge.load(backend="cpu_simd", n_ctx=512)
next(iter(m.generate("The capital of France is", max_tokens=1, temperature=0)))
print(json.dumps({"load_to_first_token_s": time.perf_counter() - t0,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def gemv_bandwidth(rows: int = 262144, cols: int = 640, reps: int = 10) -> float:
    """GB/s that NumPy's float32 matrix-vector product streams a large matrix at."""
    w = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    x = np.ones(cols, np.float32)
    w @ x
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        w @ x
        times.append(time.perf_counter() - t)
    return w.nbytes / float(np.median(times)) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-out")
    args = ap.parse_args()

    first = json.loads(subprocess.run([sys.executable, "-c", FIRST_TOKEN], check=True,
                                      capture_output=True, text=True).stdout)  # fmt: skip
    import forge
    from forge.bench import bench_decode, bench_prefill

    model = forge.load(backend="cpu_simd", n_ctx=512)
    pp = bench_prefill(model, 128, args.reps)
    tg = bench_decode(model, 32, args.reps)
    weight_bytes = model.runner.memory_estimate()["weights"]
    bw = gemv_bandwidth()
    floor_tok_s = bw * 1e9 / weight_bytes
    result = {
        "model": model.path.rsplit("/", 1)[-1],
        **first,
        "prefill_128_tok_s": pp.median_tok_s,
        "decode_tok_s": tg.median_tok_s,
        "float32_weight_bytes_per_token": weight_bytes,
        "gemv_bandwidth_gb_s": bw,
        "decode_bandwidth_limit_tok_s": floor_tok_s,
        "decode_fraction_of_limit": tg.median_tok_s / floor_tok_s,
    }
    print(json.dumps(result, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    rows = [
        ("load to first token", f"{first['load_to_first_token_s']:.2f} s", "<= 3 s"),
        ("peak RSS", f"{first['peak_rss_gb']:.2f} GiB", "<= 2.5 GB"),
        ("prefill 128 tokens", f"{pp.median_tok_s:.0f} tok/s", ">= 700 (llama.cpp 631)"),
        ("decode", f"{tg.median_tok_s:.1f} tok/s", ">= 20 (llama.cpp 67)"),
        ("decode limit (f32 bytes / GEMV bandwidth)", f"{floor_tok_s:.1f} tok/s",
         f"{bw:.1f} GB/s, {weight_bytes / 1e9:.2f} GB/token"),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>14}  {note}")


if __name__ == "__main__":
    main()
