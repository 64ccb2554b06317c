// attention.hip: the attention of a transformer layer over a paged KV cache, R token rows at once.
//
// Per-row metadata lives in device memory (int32, written by one host->device copy per step, so a
// captured graph replays with new values): pos[r] (the row's position), slots[r] (its KV-cache
// slot), btoff[r] (offset of its sequence's block table in the flat table array bt).
// KV caches: kc [n_slots, n_kv_head, D], vc [n_slots, n_kv_head, Dv], float16 (kv_f16 = 1) or f32;
// position p of a sequence lives in slot bt[p / block_size] * block_size + p % block_size.
//
// Kernels:
//   qk_rope_store  Q/K RMSNorm + RoPE in place, K/V into the cache (prefill and mixed batches)
//   attn_rows      causal attention of each row over its cached positions (after qk_rope_store)
//   attn_decode    one token per sequence: norm + RoPE of its Q/K, the K/V store and attention
//                  in one launch (the row's own K/V come from registers, not from the cache)
// Both attention kernels split the positions over blockIdx.z (flash decoding) into as many splits
// as the length needs (ATT_SPLIT_MIN positions each at least, gridDim.z at most), decided on the
// device so a captured graph serves every length. One split writes the output directly; with more,
// each block writes its partial (o, max, sum) and the last block of a (row, head) to finish, found
// through an atomic counter (cnt, zero between launches), merges them: no combine launch.
#include "forge_hip.h"

#define LAYER_MAX_D 512
#define ATT_MAX_WARPS 8  // blocks of up to 256 threads (8 warps on NVIDIA, 4 on wave64 AMD)
#define ATT_CHUNK 16  // positions a warp takes at once (their cache slots are looked up together)
#define ATT_SPLIT_MIN 128  // positions per split at least
#define ATT_NEG (-3.402823466e38f)

// rc[2 i], rc[2 i + 1] = cos, sin of rotation i of n_rot / 2 at position p (the whole block
// calls it; no barrier: norm_rope's first barrier orders it before any use).
FORGE_DEV void rope_table(float* rc, int n_rot, float p, float base) {
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        const float theta = rope_theta(i, n_rot, p, base);
        rc[2 * i] = cosf(theta);
        rc[2 * i + 1] = sinf(theta);
    }
}

// dst[i] = post * rope(rmsnorm(src) * nw)[i] over one head of D (norm only when nw, rotation of
// the first n_rot dims at position p, or by the rope_table rc when given). The whole block calls
// it; hs is D floats of shared scratch (not dst); ends with a barrier. dst may be global or shared.
FORGE_DEV void norm_rope(const float* src, const float* nw, float* hs, float* dst, float* scratch,
                         int D, int n_rot, int neox, float p, float base, float eps, float post,
                         const float* rc = nullptr) {
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        hs[d] = src[d];
        ss += hs[d] * hs[d];
    }
    const float inv = nw ? rsqrtf(block_sum(ss, scratch) / (float)D + eps) : 1.0f;
    __syncthreads();
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        if (i < half) {
            const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            float c, s;
            if (rc) {
                c = rc[2 * i];
                s = rc[2 * i + 1];
            } else {
                const float theta = rope_theta(i, n_rot, p, base);
                c = cosf(theta);
                s = sinf(theta);
            }
            float x0 = hs[a], x1 = hs[b];
            if (nw) {
                x0 *= inv * nw[a];
                x1 *= inv * nw[b];
            }
            dst[a] = (x0 * c - x1 * s) * post;
            dst[b] = (x0 * s + x1 * c) * post;
        } else if (i >= 2 * half) {  // dims past the rotated ones
            dst[i] = (nw ? hs[i] * inv * nw[i] : hs[i]) * post;
        }
    }
    __syncthreads();
}

// Per head of each row: Q heads get (optional) RMSNorm and RoPE in place; K heads get the same and
// are stored to the cache; V heads are stored. q [R, H, D], k [R, Hkv, D], v [R, Hkv, Dv].
// Launch: grid = (H + 2 * Hkv, R), block = any multiple of the warp size.
FORGE_KERNEL void qk_rope_store(float* __restrict__ q, float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ qnw,
                                const float* __restrict__ knw, const i32* __restrict__ pos,
                                const i32* __restrict__ slots, void* kc, void* vc, int H, int Hkv,
                                int D, int Dv, int n_rot, int neox, float base, float freq_scale,
                                float eps, int kv_f16) {
    FORGE_GRID_WAIT();
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
    norm_rope(xh, is_q ? qnw : knw, hs, xh, scratch, D, n_rot, neox, (float)pos[r] * freq_scale,
              base, eps, 1.0f);
    if (is_q) return;
    const i64 dst = (slot * Hkv + (j - H)) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        if (kv_f16) ((u16*)kc)[dst + d] = f2h(xh[d]);
        else ((float*)kc)[dst + d] = xh[d];
    }
}

FORGE_DEV int shfl_idx(int v, int src) {
#if defined(FORGE_AMD)
    return __shfl(v, src, FORGE_WARP);
#else
    return __shfl_sync(0xffffffffu, v, src, FORGE_WARP);
#endif
}

// Which positions block s of a row attends to: [begin, end) of lo .. n_kv - 1.
struct AttSplit {
    int n_eff, begin, end;
};

FORGE_DEV AttSplit att_split(int n_kv, int window, int s, int n_grid) {
    const int lo = window > 0 && n_kv > window ? n_kv - window : 0;
    const int len = n_kv - lo;
    int n_eff = (len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN;
    n_eff = n_eff < 1 ? 1 : (n_eff > n_grid ? n_grid : n_eff);
    const int per = (len + n_eff - 1) / n_eff;
    AttSplit a;
    a.n_eff = n_eff;
    a.begin = lo + s * per;
    a.end = a.begin + per < n_kv ? a.begin + per : n_kv;
    return a;
}

struct AttArgs {
    const void* kc;
    const void* vc;
    const i32* table;  // the row's block table
    int block_size, Hkv, kvh, D, Dv, begin, end;  // cached positions [begin, end)
};

struct alignas(16) V4 {
    u32 x, y, z, w;
};

FORGE_DEV u32 word(const V4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// Element i of a lane's slice, from its 16-byte words (8 halves or 4 floats each).
template <bool F16>
FORGE_DEV float elem(const V4* w, int i) {
    if (F16) {
        const u32 x = word(w[i / 8], (i % 8) / 2);
        return h2f((u16)(i % 2 ? x >> 16 : x & 0xffffu));
    }
    return bits_to_float(word(w[i / 4], i % 4));
}

// Start moving the cached K and V rows of positions [begin, end) of KV head kvh into L2 (the
// whole block shares the work; NVIDIA only, a no-op elsewhere). eb: bytes per cache element.
FORGE_DEV void att_prefetch(const AttArgs& a, int eb) {
#if defined(FORGE_NV)
    const int kl = (a.D * eb + 127) / 128, vl = (a.Dv * eb + 127) / 128, per = kl + vl;
    for (int t = threadIdx.x; t < (a.end - a.begin) * per; t += blockDim.x) {
        const int p = a.begin + t / per, line = t % per;
        const i64 slot = (i64)a.table[p / a.block_size] * a.block_size + p % a.block_size;
        const char* at = line < kl ? (const char*)a.kc + ((slot * a.Hkv + a.kvh) * a.D) * eb
                                          + 128 * line
                                   : (const char*)a.vc + ((slot * a.Hkv + a.kvh) * a.Dv) * eb
                                          + 128 * (line - kl);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    }
#else
    (void)a;
    (void)eb;
#endif
}

// Online-softmax attention of each warp over its chunks of [begin, end). A warp holds
// G = FORGE_WARP / LPP positions at once, LPP lanes each; lane e (= lane % LPP) of a group owns
// elements 8 * LPP * v + 8 e .. + 7 (v < VPL) of the K and V rows, loaded as 16-byte words. Each
// group keeps its running max m, sum l and output acc; the groups of a warp merge at the end,
// which leaves (m, l, acc) in wm[warp], wl[warp], wacc[warp * LAYER_MAX_D + d].
// qs: the scaled query. Needs D and Dv multiples of 8 and at most 8 * LPP * VPL.
template <int LPP, int VPL, bool F16>
FORGE_DEV void attend(const AttArgs& a, const float* qs, float* wm, float* wl, float* wacc) {
    constexpr int G = FORGE_WARP / LPP, E = 8 * VPL, NW = F16 ? VPL : 2 * VPL;
    // position steps loaded at once: 8 when a warp holds one position (wide heads) of a float16
    // cache, so that a 16-position chunk takes two rounds of loads, not four
    constexpr int U = VPL == 2 ? 2 : (G == 1 && F16 ? 8 : 4);
    constexpr int CH = G * U > 16 ? G * U : 16;  // positions a warp takes at once
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nwarps = blockDim.x / FORGE_WARP, e = lane % LPP, grp = lane / LPP;
    float q[E], acc[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
        const int d = (i / 8) * 8 * LPP + 8 * e + i % 8;
        q[i] = d < a.D ? qs[d] : 0.0f;
        acc[i] = 0.0f;
    }
    bool kon[VPL], von[VPL];  // which of the lane's 8-element pieces exist
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
        kon[v] = v * 8 * LPP + 8 * e < a.D;
        von[v] = v * 8 * LPP + 8 * e < a.Dv;
    }
    const i64 kstride = (i64)a.Hkv * a.D, vstride = (i64)a.Hkv * a.Dv;
    const int per_elem = F16 ? 8 : 4;  // elements per 16-byte word
    float m = ATT_NEG, l = 0.0f;
    for (int c0 = a.begin + warp * CH; c0 < a.end; c0 += nwarps * CH) {
        const int cn = a.end - c0 < CH ? a.end - c0 : CH;
        int my = 0;  // cache slot of position c0 + lane (slot 0 stands in past the end)
        if (lane < cn) {
            const int p = c0 + lane;
            my = a.table[p / a.block_size] * a.block_size + p % a.block_size;
        }
        for (int t0 = 0; t0 < cn; t0 += G * U) {
            V4 kr[U][NW], vr[U][NW];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const i64 slot = shfl_idx(my, (t0 + u * G + grp) % FORGE_WARP);
                const i64 kb = slot * kstride + (i64)a.kvh * a.D + 8 * e;
                const i64 vb = slot * vstride + (i64)a.kvh * a.Dv + 8 * e;
#pragma unroll
                for (int w = 0; w < NW; ++w) {
                    const int v = w * per_elem / 8;  // which 8-element piece
                    const int off = v * 8 * LPP + (w * per_elem) % 8;
                    const V4 z = {0u, 0u, 0u, 0u};
                    kr[u][w] = kon[v] ? *(const V4*)((F16 ? (const char*)a.kc + 2 * (kb + off)
                                                          : (const char*)a.kc + 4 * (kb + off)))
                                      : z;
                    vr[u][w] = von[v] ? *(const V4*)((F16 ? (const char*)a.vc + 2 * (vb + off)
                                                          : (const char*)a.vc + 4 * (vb + off)))
                                      : z;
                }
            }
            float sc[U], mx = m;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < E; ++i) dot += q[i] * elem<F16>(kr[u], i);
#pragma unroll
                for (int o = LPP / 2; o > 0; o >>= 1) dot += shfl_xor(dot, o);
                sc[u] = t0 + u * G + grp < cn ? dot : ATT_NEG;
                mx = fmaxf(mx, sc[u]);
            }
            const float f = expf(m - mx);
            l *= f;
#pragma unroll
            for (int i = 0; i < E; ++i) acc[i] *= f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float pu = t0 + u * G + grp < cn ? expf(sc[u] - mx) : 0.0f;
                l += pu;
#pragma unroll
                for (int i = 0; i < E; ++i) acc[i] += pu * elem<F16>(vr[u], i);
            }
            m = mx;
        }
    }
#pragma unroll
    for (int o = LPP; o < FORGE_WARP; o <<= 1) {  // merge the warp's groups
        const float mo = shfl_xor(m, o), lo = shfl_xor(l, o);
        const float mm = fmaxf(m, mo), fa = expf(m - mm), fb = expf(mo - mm);
        l = l * fa + lo * fb;
#pragma unroll
        for (int i = 0; i < E; ++i) acc[i] = acc[i] * fa + shfl_xor(acc[i], o) * fb;
        m = mm;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    if (grp == 0) {
#pragma unroll
        for (int i = 0; i < E; ++i) {
            const int d = (i / 8) * 8 * LPP + 8 * e + i % 8;
            if (d < a.Dv) wacc[warp * LAYER_MAX_D + d] = acc[i];
        }
    }
}

template <bool F16>
FORGE_DEV void attend_any(const AttArgs& a, const float* qs, float* wm, float* wl, float* wacc) {
    const int widest = a.D > a.Dv ? a.D : a.Dv;
    if (widest <= 64) attend<8, 1, F16>(a, qs, wm, wl, wacc);
    else if (widest <= 128) attend<16, 1, F16>(a, qs, wm, wl, wacc);
    else if (widest <= 256) attend<32, 1, F16>(a, qs, wm, wl, wacc);
    else attend<(FORGE_WARP >= 64 ? 64 : 32), (FORGE_WARP >= 64 ? 1 : 2), F16>(a, qs, wm, wl, wacc);
}

// Merge the block's entries (its warps, plus the row's own position when given as one more),
// then write the output (one split) or the block's partial; the last block of the (row, head) to
// finish merges the partials. rh = r * H + h.
FORGE_DEV void att_finish(const float* wm, const float* wl, const float* wacc, int n_ent, int Dv,
                          int n_eff, int s, int n_grid, i64 rh, float* part_o, float* part_ml,
                          u32* cnt, float* out, int* flag) {
    __syncthreads();  // every entry's wm, wl, wacc
    float mx = ATT_NEG;
    for (int w = 0; w < n_ent; ++w) mx = fmaxf(mx, wm[w]);
    float fw[ATT_MAX_WARPS + 1], total = 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_MAX_WARPS + 1; ++w) {
        fw[w] = w < n_ent ? expf(wm[w] - mx) : 0.0f;
        total += w < n_ent ? wl[w] * fw[w] : 0.0f;
    }
    float* orow = out + rh * Dv;
    const i64 part = rh * n_grid + s;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_MAX_WARPS + 1; ++w) {
            if (w < n_ent) o += wacc[w * LAYER_MAX_D + d] * fw[w];
        }
        if (n_eff == 1) orow[d] = o / total;
        else part_o[part * Dv + d] = o;
    }
    if (n_eff == 1) return;
    if (threadIdx.x == 0) {
        part_ml[2 * part] = mx;
        part_ml[2 * part + 1] = total;
    }
    __threadfence();  // the partial is visible device-wide before the counter says so
    __syncthreads();
    if (threadIdx.x == 0) *flag = atomicAdd(cnt + rh, 1u) == (u32)(n_eff - 1);
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    const volatile float* po = part_o + rh * n_grid * Dv;
    const volatile float* pm = part_ml + 2 * rh * n_grid;
    float gm = ATT_NEG;
    for (int i = 0; i < n_eff; ++i) gm = fmaxf(gm, pm[2 * i]);
    float gl = 0.0f;
    for (int i = 0; i < n_eff; ++i) gl += pm[2 * i + 1] * expf(pm[2 * i] - gm);
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
        for (int i = 0; i < n_eff; ++i) o += po[(i64)i * Dv + d] * expf(pm[2 * i] - gm);
        orow[d] = o / gl;
    }
    if (threadIdx.x == 0) cnt[rh] = 0u;  // every other block of this (row, head) has counted
}

// Causal attention of each row's query (already normed and rotated) over its sequence's cached
// positions 0..pos[r] (the last `window` of them when window > 0). q [R, H, D] -> out [R, H, Dv].
// grid = (H, R, max splits), block = up to ATT_MAX_WARPS warps. part_o [R * H * max splits, Dv],
// part_ml [R * H * max splits, 2], cnt [R * H] (zero). D and Dv: multiples of 8, at most 512.
FORGE_KERNEL void __launch_bounds__(256) attn_rows(const float* __restrict__ q, const void* kc,
    const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* part_o, float* part_ml, u32* cnt, float* out, int Hkv,
    int D, int Dv, int block_size, float scale, int window, int kv_f16) {
    FORGE_GRID_WAIT();
    __shared__ float qs[LAYER_MAX_D];
    __shared__ float wm[ATT_MAX_WARPS + 1], wl[ATT_MAX_WARPS + 1];
    __shared__ float wacc[(ATT_MAX_WARPS + 1) * LAYER_MAX_D];
    __shared__ int flag;
    const int h = blockIdx.x, r = blockIdx.y, s = blockIdx.z, H = gridDim.x;
    const AttSplit sp = att_split(pos[r] + 1, window, s, gridDim.z);
    if (s >= sp.n_eff) return;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[((i64)r * H + h) * D + d] * scale;
    __syncthreads();
    AttArgs a;
    a.kc = kc;
    a.vc = vc;
    a.table = bt + btoff[r];
    a.block_size = block_size;
    a.Hkv = Hkv;
    a.kvh = h / (H / Hkv);
    a.D = D;
    a.Dv = Dv;
    a.begin = sp.begin;
    a.end = sp.end;
    if (kv_f16) attend_any<true>(a, qs, wm, wl, wacc);
    else attend_any<false>(a, qs, wm, wl, wacc);
    att_finish(wm, wl, wacc, blockDim.x / FORGE_WARP, Dv, sp.n_eff, s, gridDim.z,
               (i64)r * H + h, part_o, part_ml, cnt, out, &flag);
}

// Decode: each row is one new token of its own sequence. q [R, H, D], k [R, Hkv, D], v [R, Hkv, Dv]
// as the QKV product left them (not normed, not rotated). Every block norms and rotates its query
// head; the blocks whose split holds the row's own position do the same for the K head, add that
// position to their merge from registers (not from the cache), and for the first query head of
// each KV group store K and V into the cache (nothing else in this launch reads that slot).
// grid = (H, R, max splits), block = up to ATT_MAX_WARPS warps. D, Dv as for attn_rows.
FORGE_KERNEL void __launch_bounds__(256) attn_decode(const float* __restrict__ q,
    const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ qnw,
    const float* __restrict__ knw, const i32* __restrict__ pos, const i32* __restrict__ slots,
    const i32* __restrict__ bt, const i32* __restrict__ btoff, void* kc, void* vc, float* part_o,
    float* part_ml, u32* cnt, float* out, int Hkv, int D, int Dv, int n_rot, int neox, float base,
    float freq_scale, float eps, int block_size, float scale, int window, int kv_f16) {
    __shared__ float hs[LAYER_MAX_D], qs[LAYER_MAX_D], ks[LAYER_MAX_D], rc[LAYER_MAX_D];
    __shared__ float scratch[32];
    __shared__ float wm[ATT_MAX_WARPS + 1], wl[ATT_MAX_WARPS + 1];
    __shared__ float wacc[(ATT_MAX_WARPS + 1) * LAYER_MAX_D];
    __shared__ int flag;
    const int h = blockIdx.x, r = blockIdx.y, s = blockIdx.z, H = gridDim.x;
    const int n_kv = pos[r] + 1, group = H / Hkv, kvh = h / group;
    const int nwarps = blockDim.x / FORGE_WARP;
    const AttSplit sp = att_split(n_kv, window, s, gridDim.z);
    const bool has_self = sp.begin < sp.end && sp.end == n_kv;  // uniform over the block
    AttArgs a;
    a.kc = kc;
    a.vc = vc;
    a.table = bt + btoff[r];
    a.block_size = block_size;
    a.Hkv = Hkv;
    a.kvh = kvh;
    a.D = D;
    a.Dv = Dv;
    a.begin = sp.begin;
    a.end = has_self ? n_kv - 1 : sp.end;  // cached positions only
    const float p = (float)pos[r] * freq_scale;
    // Before the wait, while the Q/K/V product still runs: only the step's metadata (copied in
    // before the graph) and K/V rows of earlier positions (final since their steps) are read.
    if (s < sp.n_eff) {
        att_prefetch(a, kv_f16 ? 2 : 4);
        rope_table(rc, n_rot, p, base);
    }
    FORGE_GRID_WAIT();
    if (s >= sp.n_eff) return;
    // the row's q head, and its k and v heads when this block holds its position, in one round
    // trip (each thread reads back only the elements it stored here)
    const float* qsrc = q + ((i64)r * H + h) * D;
    const float* ksrc = k + ((i64)r * Hkv + kvh) * D;
    const float* vsrc = v + ((i64)r * Hkv + kvh) * Dv;
    float* vs = wacc + nwarps * LAYER_MAX_D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        qs[d] = qsrc[d];
        if (has_self) ks[d] = ksrc[d];
    }
    if (has_self) {
        for (int d = threadIdx.x; d < Dv; d += blockDim.x) vs[d] = vsrc[d];
    }
    norm_rope(qs, qnw, hs, qs, scratch, D, n_rot, neox, p, base, eps, scale, rc);
    if (has_self) {  // the row's own K/V: one more entry of the merge, index nwarps
        norm_rope(ks, knw, hs, ks, scratch, D, n_rot, neox, p, base, eps, 1.0f, rc);
        const i64 slot = slots[r];
        const bool store = h % group == 0;
        float dot = 0.0f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {  // the cache's rounding, as read back
            const float x = kv_f16 ? h2f(f2h(ks[d])) : ks[d];
            dot += qs[d] * x;
            if (store && kv_f16) ((u16*)kc)[(slot * Hkv + kvh) * D + d] = f2h(x);
            else if (store) ((float*)kc)[(slot * Hkv + kvh) * D + d] = x;
        }
        for (int d = threadIdx.x; d < Dv; d += blockDim.x) {  // vs[d]: this thread's own
            const float y = kv_f16 ? h2f(f2h(vs[d])) : vs[d];
            vs[d] = y;
            if (store && kv_f16) ((u16*)vc)[(slot * Hkv + kvh) * Dv + d] = f2h(y);
            else if (store) ((float*)vc)[(slot * Hkv + kvh) * Dv + d] = y;
        }
        dot = block_sum(dot, scratch);
        if (threadIdx.x == 0) {
            wm[nwarps] = dot;
            wl[nwarps] = 1.0f;
        }
    }
    if (kv_f16) attend_any<true>(a, qs, wm, wl, wacc);
    else attend_any<false>(a, qs, wm, wl, wacc);
    att_finish(wm, wl, wacc, nwarps + (has_self ? 1 : 0), Dv, sp.n_eff, s, gridDim.z,
               (i64)r * H + h, part_o, part_ml, cnt, out, &flag);
}
