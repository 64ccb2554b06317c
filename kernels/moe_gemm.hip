// moe_gemm.hip: the expert products of a prefill pass on 16-bit tensor cores (gemm_tile.h), for
// the (token row, chosen expert) pairs that moe.hip's moe_route sorted by expert and cut into
// tiles of at most BM pairs of one expert (tiles: (expert, first sorted pair, pairs) each).
// Where moe.hip's int8 "mma" tiles scale every 32-value block's integer sums in float (the
// epilogue of each mma), these accumulate whole rows in float32, as gemm.hip's dense products do,
// and every weight of a tile is decoded once into shared memory for all its rows.
//
// Descriptors as moe.hip's: expert 0's matrix, expert e's rows following at e N rows (bias [E, N]).
// xh: 16-bit activations written by gemm.hip's act_half in the rounding of the experts' type.
//
// moe_gemm_glu_m<BM>: xh holds the R token rows [R, K]; tile row r reads token order[s0 + r] / kk
//   and writes act(gate, up) to the gate descriptor's y at sorted row s0 + r. grid =
//   (ceil(N / (GB_N / 2)), max_tiles), block GB_THREADS. Gate and up share one weight type.
// moe_gemm_down_m<BM>: xh holds the pairs' rows in sorted order [P, K]; y row s0 + r.
//   grid = (ceil(N / GB_N), max_tiles), block GB_THREADS.
#include "gemm_tile.h"
#include "glu_act.h"

struct GluOut {
    float* y;
    const float *bg, *bu;
    int N, act;
    float alpha, limit;
    FORGE_DEV void operator()(int row, int n, float g, float u) const {
        y[(i64)row * N + n] = moe_act(g + (bg ? bg[n] : 0.0f), u + (bu ? bu[n] : 0.0f), act, alpha, limit);
    }
};

FORGE_DEV GMat moe_gmat(const i64* d, int e) {
    GMat m = gmat_at(d);
    m.W += (i64)e * m.N * m.row_bytes;
    if (m.bias) m.bias += (i64)e * m.N;
    return m;
}

template <int BM, bool GLU, class Out>
FORGE_DEV void moe_gemm_type(const GMat& m, const GMat& up, const u16* xh, const TileRows& tr, int n0,
                             const Out& out, u16* smem) {
    switch (m.type) {
        case T_Q4_0: gemm_tile<T_Q4_0, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q4_1: gemm_tile<T_Q4_1, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q5_0: gemm_tile<T_Q5_0, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q5_1: gemm_tile<T_Q5_1, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q8_0: gemm_tile<T_Q8_0, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q4_K: gemm_tile<T_Q4_K, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q5_K: gemm_tile<T_Q5_K, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_Q6_K: gemm_tile<T_Q6_K, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        case T_MXFP4: gemm_tile<T_MXFP4, BM, GLU>(m, up, xh, tr, n0, out, smem); break;
        default: break;  // (forge_hip.experts takes these kernels for the types above only)
    }
}

template <int BM, bool GLU>
FORGE_DEV void moe_gemm_body(const i64* descs, int first, const int* tiles, const u16* xh, const int* order,
                             int kk, int act, float alpha, float limit, u16* smem) {
    const int* tl = tiles + 3 * blockIdx.y;
    const int e = tl[0], s0 = tl[1], cnt = tl[2];
    const int n0 = blockIdx.x * (GLU ? GB_N / 2 : GB_N);
    if (cnt == 0) return;
    const GMat m = moe_gmat(descs + (i64)first * DESC_LEN, e);
    if (n0 >= m.N) return;
    TileRows tr;
    tr.gather = order, tr.x0 = tr.y0 = s0, tr.per = kk, tr.count = cnt;
    if (GLU) {
        const GMat up = moe_gmat(descs + (i64)(first + 1) * DESC_LEN, e);
        GluOut out;
        out.y = m.y, out.bg = m.bias, out.bu = up.bias, out.N = m.N, out.act = act;
        out.alpha = alpha, out.limit = limit;
        moe_gemm_type<BM, true>(m, up, xh, tr, n0, out, smem);
    } else {
        PlainOut out;
        out.y = m.y, out.bias = m.bias, out.N = m.N;
        moe_gemm_type<BM, false>(m, m, xh, tr, n0, out, smem);
    }
}

#define MOE_GEMM_KERNELS(BM)                                                                           \
    FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void moe_gemm_glu_m##BM(                             \
        const i64* __restrict__ descs, int first, const int* __restrict__ tiles, const u16* __restrict__ xh, \
        const int* __restrict__ order, int kk, int act, float alpha, float limit) {                    \
        FORGE_GRID_WAIT();                                                                             \
        __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<BM>::WORDS];                        \
        moe_gemm_body<BM, true>(descs, first, tiles, xh, order, kk, act, alpha, limit, smem);          \
    }                                                                                                  \
    FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void moe_gemm_down_m##BM(                            \
        const i64* __restrict__ descs, int first, const int* __restrict__ tiles, const u16* __restrict__ xh) { \
        FORGE_GRID_WAIT();                                                                             \
        __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<BM>::WORDS];                        \
        moe_gemm_body<BM, false>(descs, first, tiles, xh, nullptr, 1, 0, 0.0f, 0.0f, smem);            \
    }
MOE_GEMM_KERNELS(64)
MOE_GEMM_KERNELS(128)
