// attn_heads.h: one attention head in a warp's registers: load, RMSNorm, RoPE and the store into
// a KV cache row of any format (kv_format.h). qk_rope_store (attention.hip), attn_decode and
// attn_decode_tc.hip's fused prologue all go through these, so every path stores the same K bits
// and rotates Q alike.
#pragma once
#include "kv_format.h"

FORGE_DEV void warp_sync() {  // orders a warp's shared-memory writes before its later reads
#if defined(FORGE_AMD)
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
    __syncwarp();
#endif
}

struct alignas(16) V4 {
    u32 x, y, z, w;
};

struct alignas(16) F4 {
    float x, y, z, w;
};

// ---- one head in a warp's registers ----
// A warp holds a head of D elements in G = FORGE_WARP / LPP groups of LPP lanes, each group the
// whole head: lane e = lane % LPP holds E = 8 VPL elements, register i being element
// hd(i, e) = (i / 8) 8 LPP + 8 e + i % 8 (8 consecutive elements per 8 registers, so 16-byte
// loads). attend() keeps q and its output in this layout; the decode kernel norms and rotates
// Q/K heads in it without block barriers, and qk_rope_store does the same so that both paths
// store the same K bits.
template <int LPP> FORGE_DEV int hd(int i, int e) { return (i / 8) * 8 * LPP + 8 * e + i % 8; }

// x[i] = src[hd(i, e)], 0 past n (n a multiple of 8, src 16-byte aligned).
template <int LPP, int VPL> FORGE_DEV void head_load(const float* src, int n, int e, float* x) {
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
        const int d = hd<LPP>(8 * v, e);
        F4 a = {0.0f, 0.0f, 0.0f, 0.0f}, b = a;
        if (d < n) {
            a = *(const F4*)(src + d);
            b = *(const F4*)(src + d + 4);
        }
        x[8 * v] = a.x, x[8 * v + 1] = a.y, x[8 * v + 2] = a.z, x[8 * v + 3] = a.w;
        x[8 * v + 4] = b.x, x[8 * v + 5] = b.y, x[8 * v + 6] = b.z, x[8 * v + 7] = b.w;
    }
}

// rc[2 i], rc[2 i + 1] = mscale cos, mscale sin of rotation i of n_rot / 2 at position p,
// computed by the whole block (one angle per thread: a warp computing all of a head's is several
// times slower); the caller puts a barrier between this and the reads. Reads no kernel output
// (callable before the wait). freqs (YaRN, Llama 3.1: forge.models.rope's per-pair frequencies)
// replaces base^(-2i / n_rot) when given.
FORGE_DEV void rope_table(float* rc, int n_rot, float p, float base, const float* freqs,
                          float mscale) {
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        const float theta = freqs ? p * freqs[i] : rope_theta(i, n_rot, p, base);
        rc[2 * i] = cosf(theta) * mscale;
        rc[2 * i + 1] = sinf(theta) * mscale;
    }
}

// RoPE of this lane's elements from rope_table's rc: out = x c + x[partner] s (s carries the
// sign); c = 1, s = 0 past the n_rot rotated dims.
template <int LPP, int VPL>
FORGE_DEV void head_rope_coef(const float* rc, float* c, float* s, int e, int n_rot, int neox) {
    const int half = n_rot / 2;
#pragma unroll
    for (int i = 0; i < 8 * VPL; ++i) {
        const int d = hd<LPP>(i, e);
        c[i] = 1.0f;
        s[i] = 0.0f;
        if (d < 2 * half) {
            const bool first = neox ? d < half : (d & 1) == 0;
            const int ri = neox ? (first ? d : d - half) : d / 2;
            c[i] = rc[2 * ri];
            s[i] = first ? -rc[2 * ri + 1] : rc[2 * ri + 1];
        }
    }
}

// x = post * rope(rmsnorm(x) * w) over one head (the norm only when `norm`; w: this lane's
// weights). c, s from head_rope_coef. xch: D floats of shared memory private to the warp (the
// rotation's partners cross lanes); `writer`: the lane's group is the one that fills it.
template <int LPP, int VPL>
FORGE_DEV void head_norm_rope(float* x, const float* w, bool norm, const float* c, const float* s,
                              float* xch, int D, int n_rot, int neox, float eps, float post, int e,
                              bool writer) {
    constexpr int E = 8 * VPL;
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < E; ++i) ss += x[i] * x[i];
#pragma unroll
        for (int o = LPP / 2; o > 0; o >>= 1) ss += shfl_xor(ss, o);
        const float inv = rsqrtf(ss / (float)D + eps);
#pragma unroll
        for (int i = 0; i < E; ++i) x[i] = x[i] * inv * w[i];
    }
    const int half = n_rot / 2;
    if (half > 0) {
        if (writer) {
#pragma unroll
            for (int i = 0; i < E; ++i) {
                if (hd<LPP>(i, e) < 2 * half) xch[hd<LPP>(i, e)] = x[i];
            }
        }
        warp_sync();
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const int d = hd<LPP>(i, e);
            if (d < 2 * half) {
                const int pd = neox ? (d < half ? d + half : d - half) : d ^ 1;
                x[i] = x[i] * c[i] + xch[pd] * s[i];
            }
        }
        warp_sync();  // xch may be written again
    }
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] *= post;
}

// The lane's norm weights (1 without a norm).
template <int LPP, int VPL> FORGE_DEV void head_weights(const float* nw, int D, int e, float* w) {
    if (nw) head_load<LPP, VPL>(nw, D, e, w);
    else {
#pragma unroll
        for (int i = 0; i < 8 * VPL; ++i) w[i] = 1.0f;
    }
}

// The block of 32 values holding this lane's 8 values: max |x| over the block, and for Q4_0 the
// value of largest magnitude (GGML's: the first of its block when two tie), through the 4 lanes
// that hold the block (e, e ^ 1, e ^ 2, e ^ 3: consecutive 8-value pieces, reduced by xor 1 and 2).
// Every lane of the warp calls.
FORGE_DEV void kv_block_max(const float* y, int first, float& amax, float& vmax) {
    int at = 0x7fffffff;
    amax = 0.0f;
    vmax = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (amax < fabsf(y[k])) {
            amax = fabsf(y[k]);
            vmax = y[k];
            at = first + k;
        }
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        const float a2 = shfl_xor(amax, o), v2 = shfl_xor(vmax, o);
        const int at2 = shfl_xor_int(at, o);
        if (a2 > amax || (a2 == amax && at2 < at)) {
            amax = a2;
            vmax = v2;
            at = at2;
        }
    }
}

// Round a head (this lane's values, zeros past n) to what a cache of format `fmt` holds, in place,
// and with `store`, write this lane's values below n into cache row `row`. Quantized formats round
// as GGML's reference quantizers do (Q8_0: scale max|x| / 127, values rounded half away from zero
// after multiplying by 1 / scale; Q4_0: scale = (value of largest magnitude) / -8, values
// truncated from x / scale + 8.5, at most 15; the scale stored as f16). Every lane of the warp
// calls (the quantized formats reduce over lanes).
template <int LPP, int VPL>
FORGE_DEV void head_put(float* x, void* cache, i64 row, int n, int e, int fmt, bool store) {
    char* base = (char*)cache + row * kv_row_bytes(fmt, n);
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
        const int d = hd<LPP>(8 * v, e);
        float* y = x + 8 * v;
        const bool put = store && d < n;
        if (fmt == KV_F32) {
            if (put) {
                const F4 a = {y[0], y[1], y[2], y[3]}, b = {y[4], y[5], y[6], y[7]};
                *(F4*)(base + 4 * d) = a;
                *(F4*)(base + 4 * d + 16) = b;
            }
            continue;
        }
        if (fmt == KV_F16 || fmt == KV_BF16) {
            u16 h[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                h[k] = fmt == KV_F16 ? f2h(y[k]) : f2bf(y[k]);
                y[k] = fmt == KV_F16 ? h2f(h[k]) : bf2f(h[k]);
            }
            if (put) {
                V4 w;
                w.x = (u32)h[0] | ((u32)h[1] << 16);
                w.y = (u32)h[2] | ((u32)h[3] << 16);
                w.z = (u32)h[4] | ((u32)h[5] << 16);
                w.w = (u32)h[6] | ((u32)h[7] << 16);
                *(V4*)(base + 2 * d) = w;
            }
            continue;
        }
        float amax, vmax;
        kv_block_max(y, d, amax, vmax);
        const bool q8 = fmt == KV_Q8_0;
        const float scale = q8 ? amax / 127.0f : vmax / -8.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        const u16 sh = f2h(scale);
        const float sr = h2f(sh);  // the scale as stored
        u32 lo = 0u, hi = 0u;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            int c;
            if (q8) c = (int)roundf(y[k] * inv);
            else {
                c = (int)(mul_rn(y[k], inv) + 8.5f);
                c = c < 15 ? c : 15;
            }
            y[k] = (float)(q8 ? c : c - 8) * sr;
            if (q8) {
                if (k < 4) lo |= ((u32)c & 0xffu) << (8 * k);
                else hi |= ((u32)c & 0xffu) << (8 * (k - 4));
            } else {
                lo |= (u32)c << (4 * k);
            }
        }
        if (!put) continue;
        if (q8) {
            *(u32*)(base + d) = lo;
            *(u32*)(base + d + 4) = hi;
        } else {
            *(u32*)(base + d / 2) = lo;
        }
        if (d % KV_BLOCK == 0) *(u16*)(base + (q8 ? n : n / 2) + 2 * (d / KV_BLOCK)) = sh;
    }
}

// Dispatch on the head width: the (LPP, VPL) layout attend() uses for heads of D and Dv.
#define ATT_LAYOUT(D, Dv, CALL)                                                              \
    do {                                                                                     \
        const int widest_ = (D) > (Dv) ? (D) : (Dv);                                         \
        if (widest_ <= 64) CALL(8, 1);                                                       \
        else if (widest_ <= 128) CALL(16, 1);                                                \
        else if (widest_ <= 256) CALL(32, 1);                                                \
        else CALL((FORGE_WARP >= 64 ? 64 : 32), (FORGE_WARP >= 64 ? 1 : 2));                 \
    } while (0)

// Dispatch on the cache's format: CALL(L, V, KV_*) for the runtime format fmt.
#define KV_DISPATCH(fmt, CALL, L, V)                    \
    do {                                                \
        switch (fmt) {                                  \
        case KV_F16: CALL(L, V, KV_F16); break;         \
        case KV_BF16: CALL(L, V, KV_BF16); break;       \
        case KV_Q8_0: CALL(L, V, KV_Q8_0); break;       \
        case KV_Q4_0: CALL(L, V, KV_Q4_0); break;       \
        default: CALL(L, V, KV_F32);                    \
        }                                               \
    } while (0)

// One Q or K head of qk_rope_store, in one warp: norm and RoPE of src into dst (null: not kept;
// qk_rope_store writes in place), a K head also into the cache.
template <int LPP, int VPL>
FORGE_DEV void qk_head(const float* src, float* dst, const float* nw, void* kc, i64 row, bool is_q,
                       int D, int n_rot, int neox, const float* rc, float eps, int kv_fmt,
                       float* xch) {
    const int lane = threadIdx.x % FORGE_WARP, e = lane % LPP, grp = lane / LPP;
    float x[8 * VPL], w[8 * VPL], c[8 * VPL], s[8 * VPL];
    head_weights<LPP, VPL>(nw, D, e, w);
    head_rope_coef<LPP, VPL>(rc, c, s, e, n_rot, neox);
    head_load<LPP, VPL>(src, D, e, x);
    head_norm_rope<LPP, VPL>(x, w, nw != nullptr, c, s, xch, D, n_rot, neox, eps, 1.0f, e,
                             grp == 0);
    if (dst && grp == 0) {
#pragma unroll
        for (int i = 0; i < 8 * VPL; ++i) {
            if (hd<LPP>(i, e) < D) dst[hd<LPP>(i, e)] = x[i];
        }
    }
    if (!is_q) head_put<LPP, VPL>(x, kc, row, D, e, kv_fmt, grp == 0);
}

// One V head of qk_rope_store (and of attn_decode_tc's fused store), in one warp: into the cache,
// any format.
template <int LPP, int VPL>
FORGE_DEV void v_head(const float* src, void* vc, i64 row, int Dv, int kv_fmt) {
    const int lane = threadIdx.x % FORGE_WARP, e = lane % LPP;
    float x[8 * VPL];
    head_load<LPP, VPL>(src, Dv, e, x);
    head_put<LPP, VPL>(x, vc, row, Dv, e, kv_fmt, lane < LPP);
}
