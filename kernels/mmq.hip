// mmq.hip: products of 2..64 token rows per launch on int8 tensor cores. y = x W^T + bias for the
// matrices of linear.hip's descriptors (mmv.hip's contract), with x already quantized by mmv.hip's
// mvq_quant into xg (its layout and llama.cpp's roundings: a copy in blocks of 32 when need bit 0,
// then one in blocks of 256 when bit 1). Types: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K
// (forge_hip.plan.MMQ_TYPES); the others stay on mmv.hip / gemm.hip.
//
// The mvq kernels do 4 multiply-adds per dp4a for every x row; here a warp's mma m16n8k16 does 2048
// at once. A warp owns 16 weight rows (two n8 tiles) and every x row (MT m16 tiles) over a slice of
// each row's chunks: the ks warps of a row group take chunks kw, kw + ks, ... and add their partial
// sums in shared memory at the end. Per 32-element block of a weight row, the lanes of a quad
// expand its quants to int8 in registers, two mmas (16 elements each) give int32 block sums for
// every (x row, weight row), and the block's scales are applied to them in float32 as mmv.h's units
// apply them. Lane t of a quad holds the block's elements 8t..8t+7 (CONTIG: Q8_0, Q4_K, Q5_K) or
// 4t..4t+3 and 16+4t..16+4t+3 (SPLIT: Q4_0..Q5_1, Q6_K, whose scales cover 16 elements) and reads
// x at the same positions: a dot product does not depend on the order of its terms.
// Elsewhere than NVIDIA (or with MMQ_EMULATE defined) the same fragments are multiplied with warp
// shuffles and dp4a, so one body serves both.
//
// mmq_multi_m<MT>(descs, first, count, R, r0, xg, K, need, items, ks, pf): descriptors first ..
//   first + count - 1, which share x [R, K] (quantized in xg), R <= 16 MT gridDim.y, written to
//   rows r0 .. r0 + R - 1 of each y (more rows: one launch per 64 with its own xg). Blocks
//   (b, c) take x rows 16 MT c .. 16 MT (c + 1) - 1: two row halves share each weight row
//   group's reads (the second finds them in L2). items: row groups of 16 * (8 / ks) weight
//   rows over the matrices in turn (mmv.h mvq_item); block (b, c) takes items b, b + gridDim.x,
//   ... block = 256 threads; ks in {1, 2, 4, 8}.
// mmq_glu_m<MT>(descs, first, R, r0, xg, K, need, items, ks, act, pf): y_gate = act(x Wg^T + bg) *
//   (x Wu^T + bu) for descriptors first (gate) and first + 1 (up); act 0 SiLU, 1 GELU-tanh.
// pf (both; NVIDIA only, a no-op elsewhere): 1 moves the block's first item's weights into L2
//   before the grid wait, while the kernel before still runs (the weights come from HBM every
//   step: the output head alone outgrows L2), so that the warps' first chunk loads, the ones
//   no earlier work hides, find them there.
#include "mmq.h"

template <int MT, bool GLU>
FORGE_DEV void mmq_body(const i64* descs, int first, int count, int R, int r0, const u8* xg,
                        int K, int need, int items, int ks, int act, int pf) {
    constexpr int NM = GLU ? 2 : 1, V = NM * MT * 8;  // accumulators per lane
    // the cross-warp sums go through shared memory VR per lane at a time (V is at most 32 for
    // the kernels built here, 28 KB; 64 sums would need 56 KB, past the 48 KB a block may declare)
    constexpr int VR = V > 32 ? 32 : V;
    __shared__ float red[MMQ_WARPS - 1][VR][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int groups = MMQ_WARPS / ks, rw = warp / ks, kw = warp % ks, RG = 16 * groups;
    const int nmat = GLU ? 1 : count;
    if (pf && (int)blockIdx.x < items) mvq_prefetch_item(descs, first, nmat, GLU, RG, blockIdx.x);
    FORGE_GRID_WAIT();  // (before it: descriptors and weights only, which no kernel writes)
    const int rs = R * K + R * K / 4, off2 = (need & 1) ? rs : 0;
    const int ry = 16 * MT * blockIdx.y, Rb = min(16 * MT, R - ry);  // this block's rows of x
    XQ x1, x2;
    x1.q = (const i8*)xg, x1.ds = (const F2*)(xg + R * K), x1.K = K;
    x2.q = (const i8*)(xg + off2), x2.ds = (const F2*)(xg + off2 + R * K), x2.K = K;
    int xo[2 * MT];
#pragma unroll
    for (int i = 0; i < 2 * MT; ++i)
        xo[i] = (ry + min(16 * (i >> 1) + g + 8 * (i & 1), Rb - 1)) * K;
    for (int w = blockIdx.x; w < items; w += gridDim.x) {
        MvMat m;
        int j0;
        mvq_item(descs, first, nmat, RG, w, &m, &j0);
        const int n0 = j0 * RG + 16 * rw;
        float acc[NM][MT][2][4];
#pragma unroll
        for (int a = 0; a < NM; ++a)
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[a][i][j][e] = 0.0f;
        const MvMat up = mv_mat(descs + (i64)(first + (GLU ? 1 : 0)) * DESC_LEN);
        if (n0 < m.N) {
            mmq_rows<MT>(m, n0, kw, ks, x1, x2, xo, acc[0]);
            if (GLU) mmq_rows<MT>(up, n0, kw, ks, x1, x2, xo, acc[NM - 1]);
        }
        float* a = &acc[0][0][0][0];
        if (ks > 1) {  // warps kw > 0 hand their sums to warp kw = 0 of their row group
            const int slot = rw * (ks - 1) + kw - 1;
#pragma unroll
            for (int v0 = 0; v0 < V; v0 += VR) {  // VR sums per lane at a time
                if (kw > 0) {
#pragma unroll
                    for (int v = 0; v < VR; ++v) red[slot][v][lane] = a[v0 + v];
                }
                __syncthreads();
                if (kw == 0) {
                    for (int k = 0; k < ks - 1; ++k) {
#pragma unroll
                        for (int v = 0; v < VR; ++v) a[v0 + v] += red[rw * (ks - 1) + k][v][lane];
                    }
                }
                __syncthreads();
            }
        }
        if (kw == 0 && n0 < m.N) {
#pragma unroll
            for (int i = 0; i < MT; ++i) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int r = 16 * i + g + 8 * (e >> 1), n = n0 + 8 * j + 2 * t + (e & 1);
                        if (r < Rb && n < m.N) {
                            float y = acc[0][i][j][e] + (m.bias ? m.bias[n] : 0.0f);
                            if (GLU) {
                                const float b = up.bias ? up.bias[n] : 0.0f;
                                y = mvq_act(y, act) * (acc[NM - 1][i][j][e] + b);
                            }
                            m.y[(i64)(r0 + ry + r) * m.N + n] = y;
                        }
                    }
                }
            }
        }
    }
}

#define MMQ_KERNELS(MT, MINB)                                                                \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MINB)                                           \
        mmq_multi_m##MT(const i64* __restrict__ descs, int first, int count, int R, int r0,  \
                        const u8* xg, int K, int need, int items, int ks, int pf) {          \
        mmq_body<MT, false>(descs, first, count, R, r0, xg, K, need, items, ks, -1, pf);     \
    }                                                                                        \
    FORGE_KERNEL void __launch_bounds__(MVQ_THREADS, MINB)                                           \
        mmq_glu_m##MT(const i64* __restrict__ descs, int first, int R, int r0, const u8* xg, \
                      int K, int need, int items, int ks, int act, int pf) {                 \
        mmq_body<MT, true>(descs, first, 2, R, r0, xg, K, need, items, ks, act, pf);         \
    }
MMQ_KERNELS(1, 2)
// 17-32 rows: m1 blocks over two row halves, 33-64: m2 over two (forge_hip.plan.mmq_shape), not m4
// kernels: those held 226 / 255 registers on sm_90, one block per SM, and took longer.
MMQ_KERNELS(2, 2)
