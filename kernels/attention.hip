// attention.hip: decode attention (one query token per sequence) over a paged float16 KV cache,
// split over the KV length ("flash decoding"), with grouped-query heads and a sliding window.
//
// Cache layout: kc, vc are u16 (IEEE half) [n_slots, n_kv_head, D]; position p of the sequence
// lives in slot block_table[p / block_size] * block_size + p % block_size.
// The number of cached positions n_kv (the query's own included) is read from device memory so a
// captured graph replays for every step. Window w > 0 keeps only the last w positions.
//
// Step 1, attn_decode_partial: grid = (n_head, n_splits), block = ATT_THREADS threads.
//   Writes, per (head, split), unnormalised o[D] and (max, sum) of its share of the positions.
// Step 2, attn_decode_combine: grid = n_head, block = any; out[h, :] = merged softmax(q.K) V.
#include "forge_hip.h"

#define ATT_THREADS 128
#define ATT_TILE 64
#define ATT_MAX_D 512
#define ATT_ACC (ATT_MAX_D / ATT_THREADS)

FORGE_KERNEL void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                           u16* __restrict__ kc, u16* __restrict__ vc,
                           const i32* __restrict__ slots, int row) {
    // k, v: float [n_tokens, row]; token t goes to cache slot slots[t]. grid = n_tokens.
    i64 src = (i64)blockIdx.x * row, dst = (i64)slots[blockIdx.x] * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        kc[dst + i] = f2h(k[src + i]);
        vc[dst + i] = f2h(v[src + i]);
    }
}

FORGE_DEV i64 slot_of(const i32* bt, int block_size, int p) {
    return (i64)bt[p / block_size] * block_size + p % block_size;
}

FORGE_KERNEL void attn_decode_partial(const float* __restrict__ q, const u16* __restrict__ kc,
                                      const u16* __restrict__ vc, const i32* __restrict__ bt,
                                      const i32* __restrict__ n_kv_ptr, float* __restrict__ part_o,
                                      float* __restrict__ part_ml, int n_kv_head, int D,
                                      int block_size, float scale, int window) {
    __shared__ float qs[ATT_MAX_D];
    __shared__ float sc[ATT_TILE];
    __shared__ float scratch[32];
    const int h = blockIdx.x, s = blockIdx.y, n_head = gridDim.x, n_splits = gridDim.y;
    const int kvh = h / (n_head / n_kv_head);
    const int tid = threadIdx.x, lane = tid % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nwarps = blockDim.x / FORGE_WARP;
    const i64 row = (i64)n_kv_head * D;

    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[(i64)h * D + d] * scale;
    const int n_kv = *n_kv_ptr;
    const int lo = window > 0 && n_kv > window ? n_kv - window : 0;
    const int per = (n_kv - lo + n_splits - 1) / n_splits;
    const int begin = lo + s * per;
    const int end = begin + per < n_kv ? begin + per : n_kv;

    float m = -3.402823466e38f, l = 0.0f, acc[ATT_ACC];
#pragma unroll
    for (int j = 0; j < ATT_ACC; ++j) acc[j] = 0.0f;
    __syncthreads();

    for (int t0 = begin; t0 < end; t0 += ATT_TILE) {
        const int n = end - t0 < ATT_TILE ? end - t0 : ATT_TILE;
        for (int t = warp; t < n; t += nwarps) {  // one warp per position: q . k
            const u16* kr = kc + slot_of(bt, block_size, t0 + t) * row + (i64)kvh * D;
            float dot = 0.0f;
            for (int d = lane; d < D; d += FORGE_WARP) dot += qs[d] * h2f(kr[d]);
            dot = warp_sum(dot);
            if (lane == 0) sc[t] = dot;
        }
        __syncthreads();
        float tmax = block_max(tid < n ? sc[tid] : -3.402823466e38f, scratch);
        const float m_new = fmaxf(m, tmax);
        const float factor = expf(m - m_new);
        __syncthreads();
        float psum = 0.0f;
        if (tid < n) {
            float p = expf(sc[tid] - m_new);
            sc[tid] = p;
            psum = p;
        }
        psum = block_sum(psum, scratch);  // its barriers also publish sc
        l = l * factor + psum;
        m = m_new;
#pragma unroll
        for (int j = 0; j < ATT_ACC; ++j) {
            const int d = threadIdx.x + j * ATT_THREADS;
            if (d < D) {
                float a = acc[j] * factor;
                for (int t = 0; t < n; ++t) {
                    a += sc[t] * h2f(vc[slot_of(bt, block_size, t0 + t) * row + (i64)kvh * D + d]);
                }
                acc[j] = a;
            }
        }
        __syncthreads();
    }
    const i64 part = (i64)h * n_splits + s;
#pragma unroll
    for (int j = 0; j < ATT_ACC; ++j) {
        const int d = threadIdx.x + j * ATT_THREADS;
        if (d < D) part_o[part * D + d] = acc[j];
    }
    if (threadIdx.x == 0) {
        part_ml[2 * part] = m;
        part_ml[2 * part + 1] = l;
    }
}

FORGE_KERNEL void attn_decode_combine(const float* __restrict__ part_o,
                                      const float* __restrict__ part_ml, float* __restrict__ out,
                                      int D, int n_splits) {
    const int h = blockIdx.x;
    const float* ml = part_ml + (i64)h * n_splits * 2;
    float mx = -3.402823466e38f;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, ml[2 * s]);
    float total = 0.0f;
    for (int s = 0; s < n_splits; ++s) total += ml[2 * s + 1] * expf(ml[2 * s] - mx);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; ++s) {
            o += part_o[((i64)h * n_splits + s) * D + d] * expf(ml[2 * s] - mx);
        }
        out[(i64)h * D + d] = o / total;
    }
}
