"""What a compiled few-row product would give cpu_simd: a probe, not a forge kernel.

cpu_simd's 8-row products (OpenBLAS's small-matrix sgemm, see forge_cpu_simd/matmul.py) pull
~11 GB/s per core from memory while computing, where a plain read pulls ~18. This script builds
a plain C kernel for y = x W^T with 8 rows of x (AVX-512, the weight rows prefetched a few rows
ahead, OpenMP over the cores) with the machine's gcc, checks it against NumPy, and times it
beside cpu_simd's product on the default model's shapes, weights streamed from memory. It
answers one question for the "compiled kernel plugin or not" decision (DESIGN.md keeps cpu_simd
to NumPy); forge does not use it.

    python benchmarks/cpu_compiled_probe.py [--json-out FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins" / "cpu_simd"))

from forge_cpu_simd.matmul import product  # noqa: E402

ROWS = 8
KERNEL = r"""
#include <immintrin.h>
// y[8][N] = x[8][K] . W[N][K]^T; K a multiple of 16, N even; weight rows `pf` rows ahead are
// prefetched into L1 while two rows are multiplied.
void rows8(const float* x, const float* W, float* y, long N, long K, int threads, int pf) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n += 2) {
        const float* w0 = W + n * K;
        const float* w1 = w0 + K;
        __m512 a[2][8];
        for (int r = 0; r < 8; ++r) a[0][r] = a[1][r] = _mm512_setzero_ps();
        for (long k = 0; k < K; k += 16) {
            if (pf) {
                _mm_prefetch((const char*)(w0 + pf * K + k), _MM_HINT_T0);
                _mm_prefetch((const char*)(w1 + pf * K + k), _MM_HINT_T0);
            }
            const __m512 u = _mm512_loadu_ps(w0 + k), v = _mm512_loadu_ps(w1 + k);
            for (int r = 0; r < 8; ++r) {
                const __m512 xv = _mm512_loadu_ps(x + r * K + k);
                a[0][r] = _mm512_fmadd_ps(u, xv, a[0][r]);
                a[1][r] = _mm512_fmadd_ps(v, xv, a[1][r]);
            }
        }
        for (int r = 0; r < 8; ++r) {
            y[r * N + n] = _mm512_reduce_add_ps(a[0][r]);
            y[r * N + n + 1] = _mm512_reduce_add_ps(a[1][r]);
        }
    }
}
"""
# (name, weight rows, K, copies streamed per timing: enough to exceed the caches)
SHAPES = [("gate/up", 4096, 640, 40), ("head", 262144, 640, 1)]


def build(work: Path):
    gcc = shutil.which("gcc")
    if gcc is None:
        sys.exit("gcc not found: this probe compiles a C kernel")
    src, lib = work / "rows8.c", work / "rows8.so"
    src.write_text(KERNEL)
    cmd = [gcc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(lib), str(src)]
    subprocess.run(cmd, check=True)
    fn = ctypes.CDLL(str(lib)).rows8  # ctypes releases the GIL during the call
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return fn


def best_ms(f, reps: int = 5) -> float:
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def measure(rows8, rng, name: str, n: int, k: int, copies: int) -> dict:
    """ms per weight copy: cpu_simd's product at 1 and 8 rows, the compiled kernel at 8 rows
    prefetching 0, 4 or 8 weight rows ahead."""
    w = rng.standard_normal((copies, n, k), dtype=np.float32)
    x = rng.standard_normal((ROWS, k), dtype=np.float32)
    y = np.empty((ROWS, n), np.float32)

    def compiled(pf: int) -> None:
        for c in range(copies):
            rows8(x.ctypes.data, w[c].ctypes.data, y.ctypes.data, n, k, 2, pf)

    compiled(4)
    ref = product(w[-1], x)
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    if err > 1e-5:
        sys.exit(f"{name}: the compiled kernel disagrees with NumPy (max rel {err:.2e})")
    times = {
        "numpy_1_row_ms": best_ms(lambda: [product(w[c], x[:1]) for c in range(copies)]),
        "numpy_8_rows_ms": best_ms(lambda: [product(w[c], x) for c in range(copies)]),
    }
    for pf in (0, 4, 8):
        times[f"compiled_8_rows_pf{pf}_ms"] = best_ms(lambda pf=pf: compiled(pf))
    return {
        "shape": f"{name} {n}x{k}",
        "weight_MB": round(n * k * 4 / 1e6, 1),
        **{key: round(v / copies, 4) for key, v in times.items()},
        "max_rel_err": err,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json-out")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        rows8 = build(Path(tmp))
        results = [measure(rows8, rng, *shape) for shape in SHAPES]
    print(json.dumps(results, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))
    cols = ("1 row", "8 rows", "C pf0", "C pf4", "C pf8")
    print(f"\n{'shape (ms per copy)':>20} " + " ".join(f"{c:>8}" for c in cols))
    keys = ("numpy_1_row_ms", "numpy_8_rows_ms", "compiled_8_rows_pf0_ms",
            "compiled_8_rows_pf4_ms", "compiled_8_rows_pf8_ms")  # fmt: skip
    for r in results:
        print(f"{r['shape']:>20} " + " ".join(f"{r[key]:>8.3f}" for key in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
