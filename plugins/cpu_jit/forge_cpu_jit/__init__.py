"""forge_cpu_jit: compiled quantized matmul kernels for the cpu_simd backend (numba)."""
