// gemm.hip: prefill products y = x W^T + bias on tensor cores, for many token rows at once.
// Matrices come as linear.hip's descriptors (DESC_LEN int64: W, x, y, bias, type id, K, N,
// row bytes), blockIdx.z picking descriptor `first + z`; here x holds 16-bit activations
// ([R, K] float16, or bfloat16 for BF16 weights) written by act_half. Every type but F32, K % 32 == 0.
//
// act_half: rounds float32 activations like llama.cpp's vec_dot types (modes of act_round in
//   layer.hip: 1 q8 per 32, 2 q8 per 256, 3 float16, 4 bfloat16) and stores them as 16-bit floats
//   (bfloat16 for mode 4). grid = rows, block = 256 threads (32-lane groups take 32/256 chunks).
//   moe_gemm.hip's expert products read its rows too.
// gemm_m128 / gemm_m64: block = 256 threads, grid = (ceil(R / BM), ceil(max N / 128), n_mats) for
//   BM = 128 / 64: a block computes a BM x 128 tile of y (gemm_tile.h).
#include "gemm_tile.h"

// ---- activations ---------------------------------------------------------------------------------

FORGE_DEV float group32_max(float v) {  // over the 32-lane group (half a wavefront on wave64)
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
    return v;
}

FORGE_KERNEL void act_half(const float* __restrict__ x, u16* __restrict__ y, int K, int mode) {
    FORGE_GRID_WAIT();
    const float* xr = x + (i64)blockIdx.x * K;
    u16* yr = y + (i64)blockIdx.x * K;
    if (mode >= 3) {
        for (int i = threadIdx.x; i < K; i += blockDim.x) yr[i] = mode == 3 ? f2h(xr[i]) : f2bf(xr[i]);
        return;
    }
    const int lane = threadIdx.x % 32, grp = threadIdx.x / 32, ngrp = blockDim.x / 32;
    if (mode == 1) {  // q8 per 32: d = amax / 127 (stored as float16), q = rint(x / d)
        for (int c = grp; c < K / 32; c += ngrp) {
            const float v = xr[32 * c + lane];
            const float d = group32_max(fabsf(v)) / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            yr[32 * c + lane] = f2h(rintf(v * inv) * h2f(f2h(d)));
        }
        return;
    }
    // q8 per 256: iscale = -127 / peak. The sign of the peak cancels (q and d both flip), so
    // |peak| serves: the values equal act_round's bit for bit.
    for (int c = grp; c < K / 256; c += ngrp) {
        float v[8], amax = 0.0f;
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            v[l] = xr[256 * c + 32 * l + lane];
            amax = fmaxf(amax, fabsf(v[l]));
        }
        amax = group32_max(amax);
        const float iscale = amax != 0.0f ? -127.0f / amax : 0.0f;
        const float d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
#pragma unroll
        for (int l = 0; l < 8; ++l) yr[256 * c + 32 * l + lane] = f2h(fminf(rintf(v[l] * iscale), 127.0f) * d);
    }
}

template <int BM> FORGE_DEV void gemm_dispatch(const i64* descs, int first, int R, u16* smem) {
    const GMat m = gmat_at(descs + (i64)(first + blockIdx.z) * DESC_LEN);
    const int b0 = blockIdx.x * BM, n0 = blockIdx.y * GB_N;
    if (n0 >= m.N) return;
    TileRows tr;
    tr.gather = nullptr, tr.x0 = tr.y0 = b0, tr.per = 1, tr.count = R - b0;
    PlainOut out;
    out.y = m.y, out.bias = m.bias, out.N = m.N;
    switch (m.type) {
        case T_F16: gemm_tile<T_F16, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_BF16: gemm_tile<T_BF16, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q4_0: gemm_tile<T_Q4_0, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q4_1: gemm_tile<T_Q4_1, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q5_0: gemm_tile<T_Q5_0, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q5_1: gemm_tile<T_Q5_1, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q8_0: gemm_tile<T_Q8_0, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q4_K: gemm_tile<T_Q4_K, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q5_K: gemm_tile<T_Q5_K, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        case T_Q6_K: gemm_tile<T_Q6_K, BM, false>(m, m, m.x, tr, n0, out, smem); break;
        default: gemm_tile<T_GENERIC, BM, false>(m, m, m.x, tr, n0, out, smem); break;
    }
}

FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void gemm_m128(const i64* __restrict__ descs, int first, int R) {
    FORGE_GRID_WAIT();
    __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<128>::WORDS];
    gemm_dispatch<128>(descs, first, R, smem);
}

FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void gemm_m64(const i64* __restrict__ descs, int first, int R) {
    FORGE_GRID_WAIT();
    __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<64>::WORDS];
    gemm_dispatch<64>(descs, first, R, smem);
}
