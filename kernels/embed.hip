// embed.hip: out[t, :] = scale * W[ids[t], :] for every weight type (embedding lookup, GGML rows
// decoded as stored). Launch: grid = n_tokens, any block size. Quantized rows need K % 32 == 0.
#include "quants.h"

#define FORGE_EMBED_Q(T, QB, BYTES)                                                         \
    FORGE_KERNEL void embed_##T(const u8* __restrict__ W, const i32* __restrict__ ids,        \
                                float* __restrict__ out, int K, float scale) {               \
        FORGE_GRID_WAIT();                                                                   \
        const u8* row = W + (i64)ids[blockIdx.x] * ((i64)(K / (QB)) * (BYTES));              \
        float* o = out + (i64)blockIdx.x * K;                                                \
        float v[32];                                                                         \
        for (int c = threadIdx.x; c < K / 32; c += blockDim.x) {                             \
            deq32_##T(row, c, v);                                                            \
            _Pragma("unroll") for (int l = 0; l < 32; ++l) o[32 * c + l] = scale * v[l];     \
        }                                                                                    \
    }

#define FORGE_EMBED_F(T, ELEM_BYTES)                                                        \
    FORGE_KERNEL void embed_##T(const u8* __restrict__ W, const i32* __restrict__ ids,        \
                                float* __restrict__ out, int K, float scale) {               \
        FORGE_GRID_WAIT();                                                                   \
        const u8* row = W + (i64)ids[blockIdx.x] * K * (ELEM_BYTES);                         \
        float* o = out + (i64)blockIdx.x * K;                                                \
        for (int k = threadIdx.x; k < K; k += blockDim.x) o[k] = scale * load_##T(row, k);   \
    }

FORGE_EMBED_F(f32, 4)
FORGE_EMBED_F(f16, 2)
FORGE_EMBED_F(bf16, 2)
FORGE_EMBED_Q(q4_0, QK, BYTES_Q4_0)
FORGE_EMBED_Q(q4_1, QK, BYTES_Q4_1)
FORGE_EMBED_Q(q5_0, QK, BYTES_Q5_0)
FORGE_EMBED_Q(q5_1, QK, BYTES_Q5_1)
FORGE_EMBED_Q(q8_0, QK, BYTES_Q8_0)
FORGE_EMBED_Q(q2_k, QK_K, BYTES_Q2_K)
FORGE_EMBED_Q(q3_k, QK_K, BYTES_Q3_K)
FORGE_EMBED_Q(q4_k, QK_K, BYTES_Q4_K)
FORGE_EMBED_Q(q5_k, QK_K, BYTES_Q5_K)
FORGE_EMBED_Q(q6_k, QK_K, BYTES_Q6_K)
