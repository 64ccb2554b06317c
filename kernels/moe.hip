// moe.hip: the mixture-of-experts FFN of one layer for R token rows, on the router's logits
// [R, E] (moe_router below, or a plain product, before these launches):
//
// moe_route: each row's k experts and their weights (gating 0 "softmax": softmax over all E,
//   the k most probable, renormalised to sum 1 when norm_w; gating 1 "softmax_chosen": the k
//   largest logits, softmax over those; both times `scale`; ties go to the lower expert id),
//   then the P = R k (row, slot) pairs p = r k + j sorted by expert (in any order within an
//   expert): order[i] = p and pos[p] = i. The sorted pairs of an expert are cut into tiles of
//   at most RM pairs {expert, first sorted pair, pairs} (tiles past the last get 0 pairs). One
//   block. With `chosen`, the rows' experts and weights are already in ids/wts (moe_topk) and
//   only the sorting runs.
// moe_topk: each row's k experts and weights as moe_route picks them, a warp per row over many
//   blocks (a pass of many rows: one block would take them 32 rows at a time).
// moe_quant: x rows order[i] / kk (order null: row i) rounded to int8 blocks into xg for P rows,
//   mvq_quant's layout: the sorted copy of the tokens' rows each expert reads.
// moe_glu_<V> / moe_down_<V>: one launch for all chosen experts' products. Descriptor `first`
//   (glu: and first + 1, the up matrix) describes expert 0 (W, its rows' type, K, N per
//   expert, row bytes; BIAS: [E, N] or 0; Y: [P, N]); expert e's rows follow at e N rows.
//   Block (b, t) takes weight rows b RB .. of tile t's expert against the tile's rows of xg
//   (mmv.h's units, as the decode products), writing y rows of the sorted pairs. glu: y = act(x
//   Wg^T + bg) (x Wu^T + bu), act 0 SiLU, 1 GELU-tanh, 2 gpt-oss's clamped SwiGLU (alpha,
//   limit). V: r1, r8 (RM pairs per tile: mmv.h's dot products), gen (RM 8, also Q2_K/Q3_K),
//   mma (tiles of 32 pairs on int8 tensor cores: mmq.h's types, the others but Q2_K/Q3_K).
// moe_combine: out[r] = sum_j w[r k + j] y[pos[r k + j]] in slot order (no atomics: the same
//   bits whatever the launch).
// moe_router: the router's logits of a few rows when its matrix is float32 (what llama.cpp's
//   quantizer leaves it): a block per expert instead of a warp per expert row (mvq_multi's), so
//   a 128-expert router spreads over 128 blocks.
#define FORGE_MXFP4 1  // the expert products read MXFP4 (mmv_rows.h's and mmq.h's cases)
#include "mmq.h"
#include "mmv_rows.h"

#define MOE_NEG (-3.402823466e38f)

FORGE_DEV bool moe_better(float v, int e, float bv, int be) {
    return v > bv || (v == bv && e < be);
}

// Row r of the logits by one warp: lane j < k ends with pick j (its expert and weight), written
// to ids/wts and to sid (the pairs' experts). Lane l owns experts l + FORGE_WARP i, i < NV (NV
// FORGE_WARP >= E): their values (probabilities for gating 0) are computed once into registers,
// then each of the k picks is a warp arg-max over them.
template <int NV>
FORGE_DEV void moe_route_row_n(const float* l, int E, int k, int gating, int norm_w, float scale,
                               int* ids, float* wts, int* sid) {
    const int lane = threadIdx.x % FORGE_WARP;
    float v[NV];
    float mx = MOE_NEG, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        const int e = lane + FORGE_WARP * i;
        v[i] = e < E ? l[e] : MOE_NEG;
        mx = fmaxf(mx, v[i]);
    }
    mx = warp_max(mx);
    if (gating == 0) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            if (lane + FORGE_WARP * i < E) sum += expf(v[i] - mx);
        }
        sum = warp_sum(sum);
#pragma unroll
        for (int i = 0; i < NV; ++i) v[i] = expf(v[i] - mx) / sum;
    }
    u32 used = 0u;  // bit i: this lane's expert lane + FORGE_WARP i is picked
    float mine = 0.0f;
    int mine_e = 0;
    for (int j = 0; j < k; ++j) {
        float bv = MOE_NEG;
        int be = E;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            const int e = lane + FORGE_WARP * i;
            if (e < E && !((used >> i) & 1u) && moe_better(v[i], e, bv, be)) bv = v[i], be = e;
        }
        for (int s = FORGE_WARP / 2; s > 0; s >>= 1) {
            const float o = shfl_xor(bv, s);
            const int e = shfl_xor_int(be, s);
            if (moe_better(o, e, bv, be)) bv = o, be = e;
        }
        if (be >= E) be = 0;  // (only rows of NaN logits pick nothing)
        if (be % FORGE_WARP == lane) used |= 1u << (be / FORGE_WARP);
        if (lane == j) mine = bv, mine_e = be;
    }
    const float top = warp_max(lane < k ? mine : MOE_NEG);  // (pick 0's)
    const float w = gating == 0 ? mine : expf(mine - top);
    const float total = warp_sum(lane < k ? w : 0.0f);
    // llama.cpp clamps the sum at the smallest f16 normal before dividing
    const float div = gating == 1 ? total : norm_w ? fmaxf(total, 6.103515625e-5f) : 1.0f;
    if (lane < k) {
        ids[lane] = mine_e;
        wts[lane] = w / div * scale;
        sid[lane] = mine_e;
    }
}

FORGE_DEV void moe_route_row(const float* l, int E, int k, int gating, int norm_w, float scale,
                             int* ids, float* wts, int* sid) {
    constexpr int W = FORGE_WARP;
    if (E <= W) moe_route_row_n<1>(l, E, k, gating, norm_w, scale, ids, wts, sid);
    else if (E <= 2 * W) moe_route_row_n<2>(l, E, k, gating, norm_w, scale, ids, wts, sid);
    else if (E <= 4 * W) moe_route_row_n<4>(l, E, k, gating, norm_w, scale, ids, wts, sid);
    else if (E <= 8 * W) moe_route_row_n<8>(l, E, k, gating, norm_w, scale, ids, wts, sid);
    else moe_route_row_n<MOE_MAX_EXPERTS / W>(l, E, k, gating, norm_w, scale, ids, wts, sid);
}

// Launch: one block of whole warps, E <= blockDim.x <= MOE_THREADS (experts.route_threads);
// R k <= MOE_MAX_PAIRS, E <= MOE_MAX_EXPERTS,
// k <= MOE_MAX_USED; tiles holds 3 max_tiles ints (max_tiles >= ceil(R k / RM) + min(E, R k)).
// The order of an expert's pairs among themselves is not fixed (atomic cursors; one-pair tiles
// of at most a warp's pairs: by pair index): no result depends on it (each pair's products are
// its own; moe_combine sums in slot order).
FORGE_KERNEL void __launch_bounds__(MOE_THREADS)
    moe_route(const float* __restrict__ logits, int R, int E, int k, int gating, int norm_w,
              float scale, int RM, int max_tiles, int chosen, int* __restrict__ ids,
              float* __restrict__ wts, int* __restrict__ order, int* __restrict__ pos,
              int* __restrict__ tiles) {
    FORGE_GRID_WAIT();
    __shared__ int sid[MOE_MAX_PAIRS];
    __shared__ int cnt[MOE_MAX_EXPERTS], start[MOE_MAX_EXPERTS], tile0[MOE_MAX_EXPERTS];
    const int warps = blockDim.x / FORGE_WARP, P = R * k, t = threadIdx.x;
    for (int e = t; e < E; e += blockDim.x) cnt[e] = 0;
    if (chosen) {
        for (int p = t; p < P; p += blockDim.x) sid[p] = ids[p];
    } else {
        for (int r = t / FORGE_WARP; r < R; r += warps) {
            moe_route_row(logits + (i64)r * E, E, k, gating, norm_w, scale, ids + r * k,
                          wts + r * k, sid + r * k);
        }
    }
    __syncthreads();
    if (RM == 1 && P <= FORGE_WARP) {  // (decode steps) a pair's place is its rank, by one warp
        if (t < FORGE_WARP) {
            const int me = t < P ? sid[t] : 0;
            int rank = 0;
            for (int q = 0; q < P; ++q) {
                const int o = sid[q];
                rank += o < me || (o == me && q < t);
            }
            if (t < P) {
                order[rank] = t;
                pos[t] = rank;
                tiles[3 * rank] = me;
                tiles[3 * rank + 1] = rank;
                tiles[3 * rank + 2] = 1;
            }
            for (int q = P + t; q < max_tiles; q += FORGE_WARP) tiles[3 * q + 2] = 0;
        }
        return;
    }
    for (int p = t; p < P; p += blockDim.x) atomicAdd(&cnt[sid[p]], 1);
    __syncthreads();
    // inclusive scans of the counts and tile counts (Hillis-Steele, E <= blockDim.x)
    const int c = t < E ? cnt[t] : 0, ct = (c + RM - 1) / RM;
    if (t < E) start[t] = c, tile0[t] = ct;
    __syncthreads();
    for (int d = 1; d < E; d <<= 1) {
        const int a = t < E && t >= d ? start[t - d] : 0, b = t < E && t >= d ? tile0[t - d] : 0;
        __syncthreads();
        if (t < E) start[t] += a, tile0[t] += b;
        __syncthreads();
    }
    const int n_tiles = tile0[E - 1];
    if (t < E) {
        const int first = start[t] - c, tfirst = tile0[t] - ct;  // exclusive prefixes
        for (int i = 0; i < ct; ++i) {
            int* tl = tiles + 3 * (tfirst + i);
            tl[0] = t;
            tl[1] = first + i * RM;
            tl[2] = min(RM, c - i * RM);
        }
        cnt[t] = first;  // the expert's cursor from here on
    }
    __syncthreads();
    for (int p = t; p < P; p += blockDim.x) {
        const int i = atomicAdd(&cnt[sid[p]], 1);
        order[i] = p;
        pos[p] = i;
    }
    for (int q = n_tiles + t; q < max_tiles; q += blockDim.x) tiles[3 * q + 2] = 0;
}

// Launch: grid ceil(R / (blockDim.x / FORGE_WARP)), any block of whole warps; a warp per row.
FORGE_KERNEL void moe_topk(const float* __restrict__ logits, int R, int E, int k, int gating,
                           int norm_w, float scale, int* __restrict__ ids,
                           float* __restrict__ wts) {
    FORGE_GRID_WAIT();
    const int r = blockIdx.x * (blockDim.x / FORGE_WARP) + threadIdx.x / FORGE_WARP;
    if (r < R) {
        moe_route_row(logits + (i64)r * E, E, k, gating, norm_w, scale, ids + r * k,
                      wts + r * k, ids + r * k);
    }
}

// Launch: as mvq_quant (blocks of 32-lane groups, a 256-element task per group at a time).
FORGE_KERNEL void moe_quant(const float* __restrict__ x, const int* __restrict__ order, int kk,
                            u8* __restrict__ xg, int K, int P, int need) {
    FORGE_GRID_WAIT();
    const int lane = threadIdx.x & 31, T = (K + 255) >> 8, groups = blockDim.x >> 5;
    const int off2 = (need & 1) ? P * K + P * K / 4 : 0;
    for (int task = blockIdx.x * groups + (int)(threadIdx.x >> 5); task < P * T;
         task += gridDim.x * groups) {
        const int r = task / T, k = 256 * (task % T) + 8 * lane;
        const int src = order ? order[r] / kk : r;
        const bool in = k < K;
        float v[8];
        if (in) {
            mvq_load8(x + (i64)src * K + k, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        }
        mvq_quant8(v, r, k, in, K, P, need, xg, 0, off2);
    }
}

FORGE_DEV MvMat moe_expert(const i64* d, int e) {
    MvMat m = mv_mat(d);
    m.W += (i64)e * m.N * m.row_bytes;
    if (m.bias) m.bias += (i64)e * m.N;
    return m;
}

// One-row gated products of an expert of the typed kernels' types: this lane's units of the
// gate row and of the up row n loaded together, S of each a round before any is computed (those
// past the row's end predicated off), where row_dot takes the gate row, then the up row, each in
// runs of 4 units and a remainder one unit at a time (the sums keep their order, so their bits).
// gpt-oss's MXFP4 rows of 2,880 values are 180 units: two rounds of a 32-lane row at S = 4 (H200,
// gpt-oss-20b twin, tg128 437.1 -> 447.6 tok/s; S = 6, one round, needed 79 registers and three
// blocks an SM: 436.8); Qwen3-30B-A3B's Q4_K rows of 2,048 are 32 units, one round at S = 1.
#define MOE_GLU_ROW(T, DIV, XS, S)                                                             \
    FORGE_DEV void moe_glu_row_##T(const MvMat& g, const MvMat& up, int n, int lane, int G,    \
                                   const XQ& x1, const XQ& x2, float* acc, float* acc2) {     \
        const u8* rg = g.W + (i64)n * g.row_bytes;                                             \
        const u8* ru = up.W + (i64)n * up.row_bytes;                                           \
        const int units = g.K / (DIV);                                                         \
        (void)x1;                                                                              \
        (void)x2; /* (each type reads one of them) */                                          \
        for (int u = lane; u < units; u += (S) * G) {                                          \
            decltype(ld_##T(rg, 0)) wg[S], wu[S];                                              \
            _Pragma("unroll") for (int s = 0; s < (S); ++s) {                                  \
                if (u + s * G < units) {                                                       \
                    wg[s] = ld_##T(rg, u + s * G);                                             \
                    wu[s] = ld_##T(ru, u + s * G);                                             \
                }                                                                              \
            }                                                                                  \
            _Pragma("unroll") for (int s = 0; s < (S); ++s) {                                  \
                if (u + s * G < units) {                                                       \
                    add_##T<1>(wg[s], u + s * G, XS, 1, acc);                                  \
                    add_##T<1>(wu[s], u + s * G, XS, 1, acc2);                                 \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
MOE_GLU_ROW(mxfp4, 16, x1, 4)
MOE_GLU_ROW(q4_k, 64, x2, 1)

// x of a tile's pairs: rows s0 .. of xg's rounded copies of P rows (mvq_quant's layout); with
// `order` (one-pair tiles only) the row of pair order[s0]'s token, order[s0] / kk, of xg's P
// token rows (rounded once, not once per pair).
template <int RM, bool GEN, int TT = -1>
FORGE_DEV void moe_body(const i64* descs, int first, bool glu, const int* tiles, const u8* xg,
                        int P, int K, int need, int G, int act, float alpha, float limit,
                        const int* order = nullptr, int kk = 1) {
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], s0 = tl[1], cnt = tl[2];
    if (cnt == 0) return;
    const int lane = threadIdx.x % G, n = blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
    const MvMat m = moe_expert(descs + (i64)first * DESC_LEN, e);
    const MvMat up = glu ? moe_expert(descs + (i64)(first + 1) * DESC_LEN, e) : m;
    const int xr = order ? order[s0] / kk : s0;
    const i64 rs = (i64)P * K + (i64)P * K / 4, off2 = (need & 1) ? rs : 0;
    XQ x1, x2;
    x1.q = (const i8*)xg + (i64)xr * K, x1.ds = (const F2*)(xg + (i64)P * K) + (i64)xr * (K / 32);
    x2.q = (const i8*)(xg + off2) + (i64)xr * K;
    x2.ds = (const F2*)(xg + off2 + (i64)P * K) + (i64)xr * (K / 32);
    x1.K = x2.K = K;
    for (int r0 = 0; r0 < cnt; r0 += RM) {  // (tiles of more than RM pairs: RM at a time)
        const int rc = min(RM, cnt - r0);
        XQ c1 = x1, c2 = x2;
        c1.q += (i64)r0 * K, c1.ds += (i64)r0 * (K / 32);
        c2.q += (i64)r0 * K, c2.ds += (i64)r0 * (K / 32);
        float acc[RM], acc2[RM];
#pragma unroll
        for (int r = 0; r < RM; ++r) acc[r] = acc2[r] = 0.0f;
        if (n < m.N) {
            if (TT == T_MXFP4 && RM == 1 && glu) {
                moe_glu_row_mxfp4(m, up, n, lane, G, c1, c2, acc, acc2);
            } else if (TT == T_Q4_K && RM == 1 && glu) {
                moe_glu_row_q4_k(m, up, n, lane, G, c1, c2, acc, acc2);
            } else {
                row_dot<RM, GEN, false, TT>(m, n, lane, G, c1, c2, rc, acc);
                if (glu) row_dot<RM, GEN, false, TT>(up, n, lane, G, c1, c2, rc, acc2);
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
                if (i < held && r < rc) {
                    float a = acc[i] + (m.bias ? m.bias[n] : 0.0f);
                    if (glu) a = moe_act(a, acc2[i] + (up.bias ? up.bias[n] : 0.0f), act, alpha,
                                         limit);
                    m.y[(i64)(s0 + r0 + r) * m.N + n] = a;
                }
            }
        }
    }
}

// Launch: grid (ceil(N / RB), max_tiles) with RB = blockDim.x / G weight rows per block (G lanes
// a row, a power of two <= 32), block MVQ_THREADS. TT: the expert type (-1: any, from the
// descriptors); the typed r1 kernels (moe_glu_r1_<type>) hold only that type's unit, so they fit
// more blocks on a compute unit (MINB) than the kernels for every type. glu's `order` (null:
// none) as moe_body's, for RM = 1 only.
#define MOE_KERNELS(SUFFIX, RM, GEN, MINB, TT)                                                    \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MINB)                                    \
        moe_glu_##SUFFIX(const i64* __restrict__ descs, int first, const int* __restrict__ tiles, \
                         const u8* __restrict__ xg, int P, int K, int need, int G, int act,   \
                         float alpha, float limit, const int* __restrict__ order, int kk) {   \
        FORGE_GRID_WAIT();                                                                    \
        moe_body<RM, GEN, TT>(descs, first, true, tiles, xg, P, K, need, G, act, alpha, limit, \
                              order, kk);                                                     \
    }                                                                                         \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MINB)                                    \
        moe_down_##SUFFIX(const i64* __restrict__ descs, int first, const int* __restrict__ tiles, \
                          const u8* __restrict__ xg, int P, int K, int need, int G) {         \
        FORGE_GRID_WAIT();                                                                    \
        moe_body<RM, GEN, TT>(descs, first, false, tiles, xg, P, K, need, G, 0, 0.0f, 0.0f);  \
    }
MOE_KERNELS(r1, 1, false, 3, -1)
MOE_KERNELS(r8, 8, false, 2, -1)
MOE_KERNELS(gen, 8, true, 2, -1)
// (MINB: the most blocks these fit without spilling registers, ptxas for sm_90, or a few bytes;
// the gated r1_mxfp4 and r1_q4_k hold both rows' units)
MOE_KERNELS(r1_mxfp4, 1, false, 4, T_MXFP4)
MOE_KERNELS(r1_q4_k, 1, false, 4, T_Q4_K)
MOE_KERNELS(r1_q6_k, 1, false, 4, T_Q6_K)
MOE_KERNELS(r1_q8_0, 1, false, 4, T_Q8_0)

// Launch: grid (R, ceil(N / blockDim.x)), any block size; k <= MOE_MAX_USED. The k slots'
// positions and weights are read first, then their k outputs at once (independent loads).
FORGE_KERNEL void moe_combine(const float* __restrict__ y, const int* __restrict__ pos,
                              const float* __restrict__ wts, int k, int N,
                              float* __restrict__ out) {
    FORGE_GRID_WAIT();
    const int r = blockIdx.x, n = blockIdx.y * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int at[MOE_MAX_USED];
    float w[MOE_MAX_USED], v[MOE_MAX_USED];
#pragma unroll
    for (int j = 0; j < MOE_MAX_USED; ++j) {
        at[j] = j < k ? pos[r * k + j] : 0;
        w[j] = j < k ? wts[r * k + j] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < MOE_MAX_USED; ++j) v[j] = j < k ? y[(i64)at[j] * N + n] : 0.0f;
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_MAX_USED; ++j) {
        if (j < k) a += w[j] * v[j];
    }
    out[(i64)r * N + n] = a;
}

// logits [R, E] = x [R, K] W^T (+ bias [E]) for a float32 router W [E, K]. Block e holds row e
// of W in registers, read before the grid wait (weights do not depend on earlier launches),
// and sums each x row's dot product over the block: per thread, then per warp, then the warps
// in order.
// Launch: grid E, block MOE_ROUTER_THREADS; R <= MOE_ROUTER_ROWS, K % 4 == 0,
// K <= 4 MOE_ROUTER_THREADS MOE_ROUTER_VEC.
FORGE_KERNEL void __launch_bounds__(MOE_ROUTER_THREADS)
    moe_router(const float* __restrict__ W, const float* __restrict__ bias,
               const float* __restrict__ x, int R, int K, int E, float* __restrict__ logits) {
    __shared__ float part[MOE_ROUTER_THREADS / 32][MOE_ROUTER_ROWS];
    const int e = blockIdx.x, t = threadIdx.x, k4 = K / 4;
    const float4* wr = (const float4*)(W + (i64)e * K);
    float4 w[MOE_ROUTER_VEC];
#pragma unroll
    for (int i = 0; i < MOE_ROUTER_VEC; ++i) {
        const int c = t + i * MOE_ROUTER_THREADS;
        w[i] = c < k4 ? wr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    FORGE_GRID_WAIT();
    const int lane = t % FORGE_WARP, warp = t / FORGE_WARP, warps = blockDim.x / FORGE_WARP;
    for (int r0 = 0; r0 < R; r0 += 4) {  // four rows at a time: their loads in flight together
        float s[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float4* xr = (const float4*)(x + (i64)min(r0 + q, R - 1) * K);
            s[q] = 0.0f;
#pragma unroll
            for (int i = 0; i < MOE_ROUTER_VEC; ++i) {
                const int c = t + i * MOE_ROUTER_THREADS;
                if (c < k4) {
                    const float4 v = xr[c];
                    s[q] += w[i].x * v.x + w[i].y * v.y + w[i].z * v.z + w[i].w * v.w;
                }
            }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const float v = warp_sum(s[q]);
            if (lane == 0 && r0 + q < R) part[warp][r0 + q] = v;
        }
    }
    __syncthreads();
    for (int r = t; r < R; r += blockDim.x) {
        float s = 0.0f;
        for (int j = 0; j < warps; ++j) s += part[j][r];
        logits[(i64)r * E + e] = s + (bias ? bias[e] : 0.0f);
    }
}

// The mma variant: mmq.h's fragments for tiles of up to 16 MT pairs; warp w of block (b, t)
// takes weight rows 16 (8 b + w) .. + 15 of tile t's expert over the whole of K.
template <int MT, bool GLU>
FORGE_DEV void moe_mma_body(const i64* descs, int first, const int* tiles, const u8* xg, int P,
                            int K, int need, int act, float alpha, float limit) {
    constexpr int NM = GLU ? 2 : 1;
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], s0 = tl[1], cnt = tl[2];
    if (cnt == 0) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const MvMat m = moe_expert(descs + (i64)first * DESC_LEN, e);
    const MvMat up = GLU ? moe_expert(descs + (i64)(first + 1) * DESC_LEN, e) : m;
    const i64 off2 = (need & 1) ? (i64)P * K + (i64)P * K / 4 : 0;
    XQ x1, x2;
    x1.q = (const i8*)xg, x1.ds = (const F2*)(xg + (i64)P * K), x1.K = K;
    x2.q = (const i8*)(xg + off2), x2.ds = (const F2*)(xg + off2 + (i64)P * K), x2.K = K;
    int xo[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i) xo[i] = (s0 + min(16 * (i >> 1) + g + 8 * (i & 1), cnt - 1)) * K;
    const int n0 = (blockIdx.x * MMQ_WARPS + warp) * 16;
    if (n0 >= m.N) return;  // (no block-wide step follows)
    float acc[NM][MT][2][4];
#pragma unroll
    for (int a = 0; a < NM; ++a)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[a][i][j][c] = 0.0f;
    mmq_rows<MT>(m, n0, 0, 1, x1, x2, xo, acc[0]);
    if (GLU) mmq_rows<MT>(up, n0, 0, 1, x1, x2, xo, acc[NM - 1]);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int r = 16 * i + g + 8 * (c >> 1), n = n0 + 8 * j + 2 * t + (c & 1);
                if (r < cnt && n < m.N) {
                    float y = acc[0][i][j][c] + (m.bias ? m.bias[n] : 0.0f);
                    if (GLU) {
                        const float u = acc[NM - 1][i][j][c] + (up.bias ? up.bias[n] : 0.0f);
                        y = moe_act(y, u, act, alpha, limit);
                    }
                    m.y[(i64)(s0 + r) * m.N + n] = y;
                }
            }
        }
    }
}

// Launch: grid (ceil(N / (16 MMQ_WARPS)), max_tiles), block MVQ_THREADS; G is not read (the
// arguments of the other variants).
FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, 2)
    moe_glu_mma(const i64* __restrict__ descs, int first, const int* __restrict__ tiles,
                const u8* __restrict__ xg, int P, int K, int need, int G, int act, float alpha,
                float limit) {
    FORGE_GRID_WAIT();
    (void)G;
    moe_mma_body<2, true>(descs, first, tiles, xg, P, K, need, act, alpha, limit);
}
FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, 2)
    moe_down_mma(const i64* __restrict__ descs, int first, const int* __restrict__ tiles,
                 const u8* __restrict__ xg, int P, int K, int need, int G) {
    FORGE_GRID_WAIT();
    (void)G;
    moe_mma_body<2, false>(descs, first, tiles, xg, P, K, need, 0, 0.0f, 0.0f);
}
