// layer.hip: the fused non-matmul steps of a transformer layer, over R token rows at once.
//
// Per-row metadata lives in device memory (int32, written by one host->device copy per step, so a
// captured graph replays with new values): pos[r] (the row's position), slot[r] (its KV-cache slot),
// btoff[r] (offset of its sequence's block table in the flat table array bt).
// KV caches: kc [n_slots, n_kv_head, D], vc [n_slots, n_kv_head, Dv], float16 (kv_f16 = 1) or f32.
#include "forge_hip.h"

#define LAYER_MAX_D 512
#define ATT_THREADS 128
#define ATT_TILE 64
#define ATT_ACC (LAYER_MAX_D / ATT_THREADS)

// x[r] += (w_post ? rmsnorm(o[r]) * w_post : o[r])   (when o is given)
// h[r] = rmsnorm(x[r]) * w_next                        (when w_next is given)
// Launch: grid = R, block = any multiple of the warp size up to 1024.
// Each thread touches only its own elements, so no barrier is needed between the steps.
FORGE_KERNEL void add_norm(float* __restrict__ x, const float* __restrict__ o,
                           const float* __restrict__ w_post, const float* __restrict__ w_next,
                           float* __restrict__ h, int n, float eps) {
    __shared__ float scratch[32];
    float* xr = x + (i64)blockIdx.x * n;
    if (o) {
        const float* orow = o + (i64)blockIdx.x * n;
        float inv = 1.0f;
        if (w_post) {
            float ss = 0.0f;
            for (int i = threadIdx.x; i < n; i += blockDim.x) ss += orow[i] * orow[i];
            inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            xr[i] += w_post ? orow[i] * inv * w_post[i] : orow[i];
        }
    }
    if (w_next) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
        const float inv = rsqrtf(block_sum(ss, scratch) / (float)n + eps);
        float* hr = h + (i64)blockIdx.x * n;
        for (int i = threadIdx.x; i < n; i += blockDim.x) hr[i] = xr[i] * inv * w_next[i];
    }
}

// Per head of each row: Q heads get (optional) RMSNorm and RoPE in place; K heads get the same and
// are stored to the cache; V heads are stored. q [R, H, D], k [R, Hkv, D], v [R, Hkv, Dv].
// Launch: grid = (H + 2 * Hkv, R), block = ATT_THREADS.
FORGE_KERNEL void qk_rope_store(float* __restrict__ q, float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ qnw,
                                const float* __restrict__ knw, const i32* __restrict__ pos,
                                const i32* __restrict__ slots, void* kc, void* vc, int H, int Hkv,
                                int D, int Dv, int n_rot, int neox, float base, float freq_scale,
                                float eps, int kv_f16) {
    __shared__ float hs[LAYER_MAX_D];
    __shared__ float scratch[32];
    const int j = blockIdx.x, r = blockIdx.y;
    const i64 slot = slots[r];
    if (j >= H + Hkv) {  // a V head: store only
        const int vh = j - H - Hkv;
        const float* src = v + ((i64)r * Hkv + vh) * Dv;
        const i64 dst = (slot * Hkv + vh) * Dv;
        for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
            if (kv_f16) ((u16*)vc)[dst + d] = f2h(src[d]);
            else ((float*)vc)[dst + d] = src[d];
        }
        return;
    }
    const bool is_q = j < H;
    float* xh = is_q ? q + ((i64)r * H + j) * D : k + ((i64)r * Hkv + (j - H)) * D;
    const float* nw = is_q ? qnw : knw;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        hs[d] = xh[d];
        ss += hs[d] * hs[d];
    }
    const float inv = nw ? rsqrtf(block_sum(ss, scratch) / (float)D + eps) : 1.0f;
    __syncthreads();
    const float p = (float)pos[r] * freq_scale;
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        if (i < half) {
            const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float theta = p * powf(base, -2.0f * (float)i / (float)n_rot);
            const float c = cosf(theta), s = sinf(theta);
            float x0 = hs[a], x1 = hs[b];
            if (nw) {
                x0 *= inv * nw[a];
                x1 *= inv * nw[b];
            }
            xh[a] = x0 * c - x1 * s;
            xh[b] = x0 * s + x1 * c;
        } else if (i >= 2 * half) {  // dims past the rotated ones
            xh[i] = nw ? hs[i] * inv * nw[i] : hs[i];
        }
    }
    if (is_q) return;
    __syncthreads();  // the stores below read what other threads rotated
    const i64 dst = (slot * Hkv + (j - H)) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        if (kv_f16) ((u16*)kc)[dst + d] = f2h(xh[d]);
        else ((float*)kc)[dst + d] = xh[d];
    }
}

FORGE_DEV float kv_load(const void* c, i64 i, int f16) {
    return f16 ? h2f(((const u16*)c)[i]) : ((const float*)c)[i];
}

FORGE_DEV i64 slot_at(const i32* bt, int block_size, int p) {
    return (i64)bt[p / block_size] * block_size + p % block_size;
}

// Causal attention of each row's query over its sequence's cached positions 0..pos[r] (the last
// `window` of them when window > 0), split over the positions: grid = (H, R, n_splits),
// block = ATT_THREADS. Writes unnormalised o[Dv] and (max, sum) per (row, head, split).
FORGE_KERNEL void attn_partial(const float* __restrict__ q, const void* kc, const void* vc,
                               const i32* __restrict__ bt, const i32* __restrict__ btoff,
                               const i32* __restrict__ pos, float* __restrict__ part_o,
                               float* __restrict__ part_ml, int Hkv, int D, int Dv,
                               int block_size, float scale, int window, int kv_f16) {
    __shared__ float qs[LAYER_MAX_D];
    __shared__ float sc[ATT_TILE];
    __shared__ i64 sl[ATT_TILE];  // cache slot of each position of the tile
    __shared__ float scratch[32];
    const int h = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
    const int H = gridDim.x, n_splits = gridDim.z;
    const int kvh = h / (H / Hkv);
    const int tid = threadIdx.x, lane = tid % FORGE_WARP, warp = tid / FORGE_WARP;
    const int nwarps = blockDim.x / FORGE_WARP;
    const i32* table = bt + btoff[r];
    for (int d = tid; d < D; d += blockDim.x) qs[d] = q[((i64)r * H + h) * D + d] * scale;
    const int n_kv = pos[r] + 1;
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
            const i64 slot = slot_at(table, block_size, t0 + t);
            const i64 base = (slot * Hkv + kvh) * D;
            float dot = 0.0f;
            for (int d = lane; d < D; d += FORGE_WARP) dot += qs[d] * kv_load(kc, base + d, kv_f16);
            dot = warp_sum(dot);
            if (lane == 0) {
                sc[t] = dot;
                sl[t] = slot;
            }
        }
        __syncthreads();
        const float m_new = fmaxf(m, block_max(tid < n ? sc[tid] : -3.402823466e38f, scratch));
        const float factor = expf(m - m_new);
        __syncthreads();
        float psum = 0.0f;
        if (tid < n) {
            const float p = expf(sc[tid] - m_new);
            sc[tid] = p;
            psum = p;
        }
        psum = block_sum(psum, scratch);  // its barriers also publish sc
        l = l * factor + psum;
        m = m_new;
#pragma unroll
        for (int j = 0; j < ATT_ACC; ++j) {
            const int d = tid + j * ATT_THREADS;
            if (d < Dv) {
                float a = acc[j] * factor;
#pragma unroll 8
                for (int t = 0; t < n; ++t) a += sc[t] * kv_load(vc, (sl[t] * Hkv + kvh) * Dv + d, kv_f16);
                acc[j] = a;
            }
        }
        __syncthreads();
    }
    const i64 part = ((i64)r * H + h) * n_splits + s;
#pragma unroll
    for (int j = 0; j < ATT_ACC; ++j) {
        const int d = tid + j * ATT_THREADS;
        if (d < Dv) part_o[part * Dv + d] = acc[j];
    }
    if (tid == 0) {
        part_ml[2 * part] = m;
        part_ml[2 * part + 1] = l;
    }
}

// out[r, h, :] = merged partial results. grid = (H, R), block = any.
FORGE_KERNEL void attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                               float* __restrict__ out, int Dv, int n_splits) {
    const int h = blockIdx.x, r = blockIdx.y, H = gridDim.x;
    const i64 base = ((i64)r * H + h) * n_splits;
    const float* ml = part_ml + 2 * base;
    float mx = -3.402823466e38f;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, ml[2 * s]);
    float total = 0.0f;
    for (int s = 0; s < n_splits; ++s) total += ml[2 * s + 1] * expf(ml[2 * s] - mx);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; ++s) o += part_o[(base + s) * Dv + d] * expf(ml[2 * s] - mx);
        out[((i64)r * H + h) * Dv + d] = o / total;
    }
}

// dst[i, :] = src[idx[i], :] (rows of n floats). grid = n_rows, block = any.
FORGE_KERNEL void gather_rows(const float* __restrict__ src, const i32* __restrict__ idx,
                              float* __restrict__ dst, int n) {
    const float* s = src + (i64)idx[blockIdx.x] * n;
    float* d = dst + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// y[r, :] += bias[:] over R rows of n. grid = R, block = any (for matmul kernels without bias).
FORGE_KERNEL void add_bias(float* __restrict__ y, const float* __restrict__ bias, int n) {
    float* yr = y + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] += bias[i];
}

// y = x rounded the way llama.cpp's CPU matrix products round activations for a weight type
// (mode 1: 8-bit blocks of 32 with an f16 scale, as Q8_0; 2: 8-bit blocks of 256 scaled by the
// signed peak, as Q8_K; 3: f16; 4: bf16). Rows of n. grid = R, block = any.
FORGE_KERNEL void act_round(const float* __restrict__ x, float* __restrict__ y, int n, int mode) {
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    if (mode >= 3) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            yr[i] = mode == 3 ? h2f(f2h(xr[i])) : bf2f(f2bf(xr[i]));
        }
        return;
    }
    const int len = mode == 1 ? 32 : 256;
    for (int b = threadIdx.x; b < n / len; b += blockDim.x) {
        const float* xb = xr + (i64)b * len;
        float* yb = yr + (i64)b * len;
        float peak = 0.0f, amax = 0.0f;
        for (int i = 0; i < len; ++i) {
            if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); peak = xb[i]; }
        }
        if (mode == 1) {
            const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            const float dh = h2f(f2h(d));
            for (int i = 0; i < len; ++i) yb[i] = rintf(xb[i] * inv) * dh;
        } else {
            const float iscale = peak != 0.0f ? -127.0f / peak : 0.0f;
            const float d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
            for (int i = 0; i < len; ++i) yb[i] = fminf(rintf(xb[i] * iscale), 127.0f) * d;
        }
    }
}
