// mmv.hip: decode products (1..32 token rows). y = x W^T + bias for the matrices of linear.hip's
// descriptors (same layout: [0] W [1] x [2] y [3] bias [4] type id [5] K [6] N [7] row bytes), with
// the activations rounded exactly like llama.cpp's (and our prefill's act_round): 8-bit blocks of
// 32 with an f16 scale for Q4_0..Q8_0 weights (mode 1), 8-bit blocks of 256 scaled by the signed
// peak for the K-quants (mode 2), f16/bf16 for F16/BF16 weights, none for F32. Quantized weights
// meet int8 activations in integer dot products (mmv.h's units); F32/F16/BF16 in float.
//
// mvq_multi_r<RM>(descs, first, count, R, G, x, K, need, items, xg, flags): descriptors first ..
//   first+count-1, which share x [R, K] (R token rows, RM at a time: with R > RM each row group
//   takes rows 0..RM-1, RM..2RM-1, ... in turn, reading its weights again). need: the copies of x
//   their types read (forge_hip.plan.mvq_need; bit 0: Q4_0..Q8_0, blocks of 32; bit 1: K-quants,
//   blocks of 256); items: their row groups (below).
// mvq_glu_r<RM>(descs, first, R, G, x, K, need, items, xg, flags, act): y_gate = act(x W_gate^T)
//   * (x W_up^T) of descriptors first (gate) and first + 1 (up); act 0: SiLU, 1: GELU-tanh.
// Entry points (MVQ_KERNELS): mvq_multi_r1(), mvq_multi_r2(), mvq_multi_r4(), mvq_multi_r8(),
//   mvq_multi_r16(), mvq_multi_r32(), mvq_multi_gen() (RM 8, also Q2_K/Q3_K), mvq_glu_r1(),
//   mvq_glu_r2(), mvq_glu_r4(), mvq_glu_r8(), mvq_glu_r16(), mvq_glu_r32(), mvq_glu_gen().
// Launch: block = any multiple of 32 threads (256 here); G lanes (a power of two <= 32) own one
//   weight row, so a block covers RB = blockDim.x / G rows of one matrix per item. Items are those
//   row groups over all matrices in turn; block b takes items b, b + gridDim.x, ...
//   (grid <= items). In the RM = 8 kernels (r8, gen), with gridDim.y > 1 (R <= 8 gridDim.y),
//   block (b, c) takes x rows 8c .. 8c + 7 only: blocks sharing weight rows keep 8 rows'
//   accumulators each, and all but the first to ask read those rows from L2.
// x: every block first quantizes its rows of x into shared memory (mode 1 copy, then mode 2 copy
//   when both are needed; each R*K int8 + R*K/32 {scale, sum} for R rows), unless xg is given:
//   then mvq_quant already wrote that layout for all R rows there (when it does not fit
//   MVQ_SMEM<RM>).
// flags: bit 0 prefetches the block's first items into L2 while x is quantized; bits 1-2 give
//   how many items ahead of the one computed are prefetched (NVIDIA only; no-ops elsewhere).
#include "add_norm.h"
#include "mmv_rows.h"

// Shared bytes for quantized x (contract.h).
template <int RM> struct MvqSmem {
    enum { bytes = RM == 1 ? MVQ_SMEM_R1 : MVQ_SMEM_RN };
};

// Gate and up rows n of the same type at once (one-row gated products): MVQ_STEP(1) / 2 units
// of each per step, all loaded before any is computed, so the two rows' loads overlap.
#ifndef MVQ_GLU_PAIR
#define MVQ_GLU_PAIR 1
#endif
#define MVQ_ROW2(T, U, X)                                                               \
    {                                                                                   \
        constexpr int S = MVQ_STEP(1) / 2 > 0 ? MVQ_STEP(1) / 2 : 1;                    \
        const int units = (U);                                                          \
        int u = lane;                                                                   \
        for (; u + (S - 1) * G < units; u += S * G) {                                   \
            decltype(ld_##T(row, 0)) w[S], v[S];                                        \
            _Pragma("unroll") for (int s = 0; s < S; ++s) {                             \
                w[s] = ld_##T(row, u + s * G);                                          \
                v[s] = ld_##T(row2, u + s * G);                                         \
            }                                                                           \
            _Pragma("unroll") for (int s = 0; s < S; ++s) {                             \
                add_##T<1>(w[s], u + s * G, X, 1, acc);                                 \
                add_##T<1>(v[s], u + s * G, X, 1, acc2);                                \
            }                                                                           \
        }                                                                               \
        for (; u < units; u += G) {                                                     \
            const auto w = ld_##T(row, u), v = ld_##T(row2, u);                         \
            add_##T<1>(w, u, X, 1, acc);                                                \
            add_##T<1>(v, u, X, 1, acc2);                                               \
        }                                                                               \
        return true;                                                                    \
    }

template <int RM> struct GluPair {  // only one-row products pair their rows
    static FORGE_DEV bool run(const MvMat&, const MvMat&, int, int, int, const XQ&, const XQ&,
                              float*, float*) {
        return false;
    }
};
template <> struct GluPair<1> {
    static FORGE_DEV bool run(const MvMat& m, const MvMat& up, int n, int lane, int G,
                              const XQ& x1, const XQ& x2, float* acc, float* acc2) {
        if (!MVQ_GLU_PAIR || up.type != m.type || up.row_bytes != m.row_bytes) return false;
        const u8* row = m.W + (i64)n * m.row_bytes;
        const u8* row2 = up.W + (i64)n * up.row_bytes;
        const int K = m.K;
        switch (m.type) {
            case T_Q4_0: MVQ_ROW2(q4_0, K / 16, x1)
            case T_Q4_1: MVQ_ROW2(q4_1, K / 16, x1)
            case T_Q5_0: MVQ_ROW2(q5_0, K / 16, x1)
            case T_Q5_1: MVQ_ROW2(q5_1, K / 16, x1)
            case T_Q8_0:
                if (((u64)m.W | (u64)up.W | (u64)m.row_bytes) % 8 == 0) MVQ_ROW2(q8_0, K / 16, x1)
                MVQ_ROW2(q8_0u, K / 16, x1)
            case T_Q4_K: MVQ_ROW2(q4_k, K / 64, x2)
            default: return false;
        }
    }
};


// layer.hip's add_norm folded into a one-row product (the *_r1n kernels): the product's x is
// h = rmsnorm(xin + (w_post ? rmsnorm(o) * w_post : o)) * w_next, computed by every block into
// shared memory with add_norm.h's arithmetic in one warp, lane l taking elements l + warp * j as
// add_norm's one-warp launch does (K <= MVQ_NORM_K): the same bits. Block 0 also stores the
// residual xin + ... into xout (not xin: other blocks are still reading it).
struct MvqNorm {
    const float* xin;
    const float* o;
    const float* w_post;
    const float* w_next;
    float* xout;
    float eps;
};

template <bool NORM> struct MvqNormSmem {  // one float each without NORM
    enum { k = NORM ? MVQ_NORM_K : 1 };
    float h[k], o[k], wp[k], wn[k];
};

// Before the wait: the norm weights into shared memory (no kernel writes them).
template <class S> FORGE_DEV void mvq_norm_weights(const MvqNorm& a, int K, S& s) {
    for (int k = threadIdx.x; k < K; k += blockDim.x) {
        s.wp[k] = a.w_post ? a.w_post[k] : 0.0f;
        s.wn[k] = a.w_next[k];
    }
}

// After the wait: s.h = h (whole block; ends with a barrier).
template <class S> FORGE_DEV void mvq_add_norm(const MvqNorm& a, int K, S& s) {
    for (int k = threadIdx.x; k < K; k += blockDim.x) {  // the whole block loads: one round trip
        s.o[k] = a.o[k];
        s.h[k] = a.xin[k];
    }
    __syncthreads();
    if (threadIdx.x < FORGE_WARP) {
        const int lane = threadIdx.x;
        const bool post = a.w_post != nullptr;
        float ss = 0.0f, inv_o = 1.0f;
        if (post) {
            for (int k = lane; k < K; k += FORGE_WARP) ss = an_sq(ss, s.o[k]);
            inv_o = an_inv(warp_sum(ss), K, a.eps);
        }
        ss = 0.0f;
        for (int k = lane; k < K; k += FORGE_WARP) {
            const float v = an_resid(s.h[k], s.o[k], inv_o, s.wp[k], post);
            s.h[k] = v;
            ss = an_sq(ss, v);
            if (blockIdx.x == 0) a.xout[k] = v;
        }
        const float inv = an_inv(warp_sum(ss), K, a.eps);
        for (int k = lane; k < K; k += FORGE_WARP) s.h[k] = an_out(s.h[k], inv, s.wn[k]);
    }
    __syncthreads();
}

// count matrices (glu: 2, gate and up, over the gate's rows; act >= 0). The host passes what the
// block needs before any descriptor is read: x [R, K], need, items. nm (NORM): x is not read; the
// one row (R = 1, K <= MVQ_NORM_K) is computed from nm, and quantized in-block (xg = 0, need > 0).

template <int RM, bool GEN, bool AL, bool NORM = false>
FORGE_DEV void mvq_body(const i64* descs, int first, int count, int R, int G, const float* x,
                        int K, int need, int items, const u8* xg, int flags, int act,
                        const MvqNorm* nm = nullptr) {
    __shared__ V4 xs[MvqSmem<RM>::bytes / 16];
    __shared__ MvqNormSmem<NORM> ns;
    const bool glu = act >= 0;  // (a template flag here made ptxas spill in mvq_glu_r16)
    const int nmat = glu ? 1 : count, RB = blockDim.x / G, ahead = (flags >> 1) & 3;
    // blockIdx.y (MVQ_SPLIT_RM kernels, gridDim.y > 1, R <= gridDim.y RM): which RM rows of x
    // this block takes, x rows ry ..; else all R rows, RM at a time. (Only those kernels carry
    // the split: in the others it made ptxas spill.)
    constexpr bool split = RM == MVQ_SPLIT_RM;
    const int ry = split && gridDim.y > 1 ? (int)blockIdx.y * RM : 0;
    if ((int)blockIdx.x >= items || (split && ry >= R)) return;
    // Before the wait (the kernel before may still run): only descriptors and weights, which no
    // kernel writes, are read, so the first items' weights move into L2 meanwhile.
    if (flags & 1) {  // the first max(ahead, 1) items of this block
        for (int a = 0; a < max(ahead, 1); ++a) {
            mvq_prefetch_item(descs, first, nmat, glu, RB, blockIdx.x + a * gridDim.x);
        }
    }
    if (NORM) mvq_norm_weights(*nm, K, ns);
    FORGE_GRID_WAIT();
    const int rs = R * K + R * K / 4;
    u8* base = xg ? (u8*)xg : (u8*)xs;
    int off2 = (need & 1) ? rs : 0;
    XQ x1, x2;
    x1.q = (const i8*)base, x1.ds = (const F2*)(base + R * K), x1.K = K;
    x2.q = (const i8*)(base + off2), x2.ds = (const F2*)(base + off2 + R * K), x2.K = K;
    if (split && gridDim.y > 1) {  // this block's rows: ry .. ry + Rb - 1
        // the copies hold Rl rows: all R in xg (mvq_quant's layout), else the Rb quantized here
        const int Rb = min(RM, R - ry), Rl = xg ? R : Rb, r1 = xg ? ry : 0;
        off2 = (need & 1) ? Rl * K + Rl * K / 4 : 0;
        x1.q = (const i8*)base + (i64)r1 * K, x1.ds = (const F2*)(base + Rl * K) + r1 * (K / 32);
        x2.q = (const i8*)(base + off2) + (i64)r1 * K;
        x2.ds = (const F2*)(base + off2 + Rl * K) + r1 * (K / 32);
        x += (i64)ry * K;
        R = Rb;
    }
    if (NORM) {
        mvq_add_norm(*nm, K, ns);
        x = ns.h;
    }
    if (!xg && need) {
        mvq_quantize(x, K, R, need, base, 0, off2, 0, blockDim.x >> 5);
        __syncthreads();
    }
    const int lane = threadIdx.x % G, grp = threadIdx.x / G;
    for (int w = blockIdx.x; w < items; w += gridDim.x) {
        MvMat m;
        int j;
        mvq_item(descs, first, nmat, RB, w, &m, &j);
        const int n = j * RB + grp;
        MvMat up = mv_mat(descs + (i64)(first + (glu ? 1 : 0)) * DESC_LEN);
        if (ahead) mvq_prefetch_item(descs, first, nmat, glu, RB, w + ahead * gridDim.x);
        for (int r0 = 0; r0 < R; r0 += RM) {  // rows ry + r0 .. + RM - 1 (R > RM: in turn)
            const int Rc = min(RM, R - r0);
            XQ c1 = x1, c2 = x2;
            c1.q += (i64)r0 * K, c1.ds += (i64)r0 * (K / 32);
            c2.q += (i64)r0 * K, c2.ds += (i64)r0 * (K / 32);
            float acc[RM], acc2[RM];
#pragma unroll
            for (int r = 0; r < RM; ++r) acc[r] = acc2[r] = 0.0f;
            if (n < m.N) {
                MvMat mc = m;
                mc.x += (i64)(ry + r0) * K;
                MvMat uc = up;
                uc.x += (i64)(ry + r0) * K;
                if (!glu || !GluPair<RM>::run(mc, uc, n, lane, G, c1, c2, acc, acc2)) {
                    row_dot<RM, GEN, AL>(mc, n, lane, G, c1, c2, Rc, acc);
                    if (glu) row_dot<RM, GEN>(uc, n, lane, G, c1, c2, Rc, acc2);
                }
            }
            int row0;
            const bool writer = group_sum_rows<RM>(acc, lane, G, &row0);
            if (glu) group_sum_rows<RM>(acc2, lane, G, &row0);
            const int held = G < RM ? RM / G : 1;
            if (writer && n < m.N) {
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    const int r = row0 + i;
                    if (i < held && r < Rc) {
                        float a = acc[i] + (m.bias ? m.bias[n] : 0.0f);
                        if (glu) a = mvq_act(a, act) * (acc2[i] + (up.bias ? up.bias[n] : 0.0f));
                        m.y[(i64)(ry + r0 + r) * m.N + n] = a;
                    }
                }
            }
        }
    }
}

// __launch_bounds__ blocks per multiprocessor: 4 (at most 64 registers) for 1-2 rows, fewer for
// more rows (their accumulators: sm_90 r16 ~127 registers, r32 ~155 / 210 with glu, no spills);
// MVQ_MIN_BLOCKS overrides all (experiments).
#ifdef MVQ_MIN_BLOCKS
#define MVQ_MINB(B) MVQ_MIN_BLOCKS
#else
#define MVQ_MINB(B) B
#endif
#define MVQ_KERNELS(SUFFIX, RM, GEN, MINB)                                              \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MVQ_MINB(MINB))                            \
        mvq_multi_##SUFFIX(const i64* __restrict__ descs, int first, int count, int R,  \
                           int G, const float* x, int K, int need, int items,           \
                           const u8* xg, int flags) {                                   \
        mvq_body<RM, GEN, true>(descs, first, count, R, G, x, K, need, items, xg, flags, \
                                -1);                                                   \
    }                                                                                   \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MVQ_MINB(MINB))                            \
        mvq_glu_##SUFFIX(const i64* __restrict__ descs, int first, int R, int G,        \
                         const float* x, int K, int need, int items, const u8* xg,      \
                         int flags, int act) {                                          \
        mvq_body<RM, GEN, false>(descs, first, 2, R, G, x, K, need, items, xg, flags,   \
                                 act);                                                  \
    }
MVQ_KERNELS(r1, 1, false, 4)
MVQ_KERNELS(r2, 2, false, 4)
MVQ_KERNELS(r4, 4, false, 3)
MVQ_KERNELS(r8, 8, false, 2)
MVQ_KERNELS(r16, 16, false, 2)
#if defined(FORGE_AMD)
// clang (ROCm 5.2, gfx940) leaves a 32-row unit loop rolled (acc[] in scratch): on AMD the r32
// entry points take 17-32 rows as two passes of 16 (each reading the weights again).
MVQ_KERNELS(r32, 16, false, 1)
#else
MVQ_KERNELS(r32, 32, false, 1)
#endif
MVQ_KERNELS(gen, 8, true, 2)  // any type, R <= 8

// One-row products whose x is add_norm's h (MvqNorm), computed in each block: the decode step's
// add_norm launches fold into the products that read their output.
#define MVQ_NORM_ARGS                                                                        \
    const float *__restrict__ xin, const float *__restrict__ o, const float *__restrict__ w_post, \
        const float *__restrict__ w_next, float *__restrict__ xout, float eps
FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MVQ_MINB(4))
    mvq_multi_r1n(const i64* __restrict__ descs, int first, int count, int R, int G,
                  const float* x, int K, int need, int items, const u8* xg, int flags,
                  MVQ_NORM_ARGS) {
    const MvqNorm nm = {xin, o, w_post, w_next, xout, eps};
    mvq_body<1, false, true, true>(descs, first, count, R, G, x, K, need, items, xg, flags, -1,
                                   &nm);
}
FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MVQ_MINB(4))
    mvq_glu_r1n(const i64* __restrict__ descs, int first, int R, int G, const float* x, int K,
                int need, int items, const u8* xg, int flags, int act, MVQ_NORM_ARGS) {
    const MvqNorm nm = {xin, o, w_post, w_next, xout, eps};
    mvq_body<1, false, false, true>(descs, first, 2, R, G, x, K, need, items, xg, flags, act,
                                    &nm);
}

// add_norm of R rows (grid = R, block row r) for a product reading x quantized (xg): x[r] +=
// post(o[r]) in place (when o: add_norm.h's an_resid, with rmsnorm(o[r]) when w_post), then
// h[r] = rmsnorm(x[r]) * w_next rounded into xg in mvq_quant's layout for R rows (need bits),
// and stored into h when given. The product then starts on x at once, where quantizing it in
// each of its blocks cost them ~2.4 us (one row, H200, llama-8B twin), or a mvq_quant launch.
// Lanes hold mvq_quant's tasks of 256 elements, at most two per 32-lane group: block of at
// least 32 * ceil(K / 512) threads (forge_hip.plan.anq_threads), K <= ANQ_K (K % 32 == 0). The sums of squares run per lane, then over the
// block: other orders than add_norm's, so h may differ from it in the last bits.
FORGE_KERNEL void __launch_bounds__(512, 1)
    add_norm_quant(float* __restrict__ x, const float* __restrict__ o,
                 const float* __restrict__ w_post, const float* __restrict__ w_next,
                 float* __restrict__ h, u8* __restrict__ xg, int K, int need, float eps) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x & 31, grp = threadIdx.x >> 5, groups = blockDim.x >> 5;
    const int r = blockIdx.x, R = gridDim.x;
    x += (i64)r * K;
    if (o) o += (i64)r * K;
    if (h) h += (i64)r * K;
    float v[ANQ_TASKS][8], ov[ANQ_TASKS][8], wp[ANQ_TASKS][8];
    float wn[ANQ_TASKS][8];
#pragma unroll
    for (int t = 0; t < ANQ_TASKS; ++t) {  // the weights, which no kernel writes
        const int k = 256 * (grp + t * groups) + 8 * lane;
#pragma unroll
        for (int e = 0; e < 8; ++e) v[t][e] = ov[t][e] = wp[t][e] = wn[t][e] = 0.0f;
        if (k < K) {
            mvq_load8(w_next + k, wn[t]);
            if (w_post) mvq_load8(w_post + k, wp[t]);
        }
    }
    FORGE_GRID_WAIT();
#pragma unroll
    for (int t = 0; t < ANQ_TASKS; ++t) {
        const int k = 256 * (grp + t * groups) + 8 * lane;
        if (k < K) {
            mvq_load8(x + k, v[t]);
            if (o) mvq_load8(o + k, ov[t]);
        }
    }
    if (o) {
        float inv_o = 1.0f;
        if (w_post) {
            float ss = 0.0f;
#pragma unroll
            for (int t = 0; t < ANQ_TASKS; ++t) {
#pragma unroll
                for (int e = 0; e < 8; ++e) ss = an_sq(ss, ov[t][e]);
            }
            inv_o = an_inv(block_sum(ss, scratch), K, eps);
        }
#pragma unroll
        for (int t = 0; t < ANQ_TASKS; ++t) {
            const int k = 256 * (grp + t * groups) + 8 * lane;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                v[t][e] = an_resid(v[t][e], ov[t][e], inv_o, wp[t][e], w_post != nullptr);
            }
            if (k < K) mvq_store8f(x + k, v[t]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int t = 0; t < ANQ_TASKS; ++t) {
#pragma unroll
        for (int e = 0; e < 8; ++e) ss = an_sq(ss, v[t][e]);
    }
    const float inv = an_inv(block_sum(ss, scratch), K, eps);
    const int off2 = (need & 1) ? R * K + R * K / 4 : 0;
#pragma unroll
    for (int t = 0; t < ANQ_TASKS; ++t) {
        const int task = grp + t * groups, k = 256 * task + 8 * lane;
        if (256 * task < K) {  // the group's task (uniform over its lanes)
#pragma unroll
            for (int e = 0; e < 8; ++e) v[t][e] = an_out(v[t][e], inv, wn[t][e]);
            if (h && k < K) mvq_store8f(h + k, v[t]);
            mvq_quant8(v[t], r, k, k < K, K, R, need, xg, 0, off2);
        }
    }
}

// x [R, K] quantized into xg in mvq_body's layout (for products whose copy does not fit in shared
// memory). need: bit 0 blocks of 32, bit 1 blocks of 256. block = 256, grid = ceil(R * K/256 / 8).
FORGE_KERNEL void mvq_quant(const float* __restrict__ x, u8* __restrict__ xg, int K, int R,
                            int need) {
    FORGE_GRID_WAIT();
    const int rs = R * K + R * K / 4, groups = blockDim.x >> 5;
    mvq_quantize(x, K, R, need, xg, 0, (need & 1) ? rs : 0, blockIdx.x * groups,
                 gridDim.x * groups);
}
