// matvec.hip: a third-party "matmul" kernel for the hip backend, as a plugin would ship it (its
// own directory; forge's headers included from forge's kernel directory). The tests register it
// through the kernel table to check that the plan launches a replaced product kernel.
// y[b, n] = sum_k W[n, k] * x[b, k] for every GGML weight type, weights read as placed
// (forge_hip.arena.device_rows). W has N rows of `row_bytes` bytes; x is float32 [B, K]; y is float32 [B, N].
// Launch: block = ROWS warps (blockDim.x = ROWS * warp size), grid = (ceil(N / ROWS), B).
// One warp owns one output row; its lanes take 32-element chunks in turn (quantized types,
// K a multiple of the block size) or single elements (float types, any K).
#include "quants.h"

#define FORGE_MATVEC_Q(T, QB, BYTES)                                                        \
    FORGE_KERNEL void matvec_##T(const u8* __restrict__ W, const float* __restrict__ x,       \
                                 float* __restrict__ y, int K, int N) {                      \
        FORGE_GRID_WAIT();                                                                   \
        int lane = threadIdx.x % FORGE_WARP;                                                 \
        int n = blockIdx.x * (blockDim.x / FORGE_WARP) + threadIdx.x / FORGE_WARP;           \
        if (n >= N) return;                                                                  \
        const i64 row_bytes = (i64)(K / (QB)) * (BYTES);                                     \
        const u8* row = W + (i64)n * row_bytes;                                              \
        const float* xb = x + (i64)blockIdx.y * K;                                           \
        float acc = 0.0f, v[32];                                                             \
        for (int c = lane; c < K / 32; c += FORGE_WARP) {                                    \
            deq32_##T(row, c, v);                                                            \
            const float* xc = xb + 32 * c;                                                   \
            _Pragma("unroll") for (int l = 0; l < 32; ++l) acc += v[l] * xc[l];              \
        }                                                                                    \
        acc = warp_sum(acc);                                                                 \
        if (lane == 0) y[(i64)blockIdx.y * N + n] = acc;                                     \
    }

#define FORGE_MATVEC_F(T, ELEM_BYTES)                                                       \
    FORGE_KERNEL void matvec_##T(const u8* __restrict__ W, const float* __restrict__ x,       \
                                 float* __restrict__ y, int K, int N) {                      \
        FORGE_GRID_WAIT();                                                                   \
        int lane = threadIdx.x % FORGE_WARP;                                                 \
        int n = blockIdx.x * (blockDim.x / FORGE_WARP) + threadIdx.x / FORGE_WARP;           \
        if (n >= N) return;                                                                  \
        const u8* row = W + (i64)n * K * (ELEM_BYTES);                                       \
        const float* xb = x + (i64)blockIdx.y * K;                                           \
        float acc = 0.0f;                                                                    \
        for (int k = lane; k < K; k += FORGE_WARP) acc += load_##T(row, k) * xb[k];          \
        acc = warp_sum(acc);                                                                 \
        if (lane == 0) y[(i64)blockIdx.y * N + n] = acc;                                     \
    }

FORGE_MATVEC_F(f32, 4)
FORGE_MATVEC_F(f16, 2)
FORGE_MATVEC_F(bf16, 2)
FORGE_MATVEC_Q(q4_0, QK, BYTES_Q4_0)
FORGE_MATVEC_Q(q4_1, QK, BYTES_Q4_1)
FORGE_MATVEC_Q(q5_0, QK, BYTES_Q5_0)
FORGE_MATVEC_Q(q5_1, QK, BYTES_Q5_1)
FORGE_MATVEC_Q(q8_0, QK, BYTES_Q8_0)
FORGE_MATVEC_Q(q2_k, QK_K, BYTES_Q2_K)
FORGE_MATVEC_Q(q3_k, QK_K, BYTES_Q3_K)
FORGE_MATVEC_Q(q4_k, QK_K, BYTES_Q4_K)
FORGE_MATVEC_Q(q5_k, QK_K, BYTES_Q5_K)
FORGE_MATVEC_Q(q6_k, QK_K, BYTES_Q6_K)
