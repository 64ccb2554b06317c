// gemm_tile.h: the tensor-core tile of the prefill products, shared by gemm.hip (dense matrices)
// and moe_gemm.hip (one expert's matrix for the token rows routed to it). A block of GB_THREADS
// threads computes a BM x GB_N tile of y = x W^T: per step of 32 k, the 16-bit activations are
// copied (cp.async) and the GB_N x 32 weights decoded to float16 (bfloat16 for BF16) into shared
// memory, double buffered (the next step's loads and decode overlap this step's products); 8 warps
// (2 along rows x 4 along N) run mma.sync m16n8k16 with float32 accumulators. Products of 16-bit
// values are exact in float32; weights of quantized types are rounded to float16 once (relative
// 2^-11). On AMD the same tiles are multiplied by a portable SIMT loop.
//
// TileRows says which x rows a tile reads and which y rows it writes; a gated tile (GLU) takes
// GB_N / 2 rows of the gate matrix and the same rows of the up matrix, so each thread holds both
// products of its outputs for the epilogue.
#pragma once
#include "gemm_weights.h"
#include "mat_desc.h"

#define GB_K 32   // k per pipeline step
#define GB_LD 40  // shared row stride in 16-bit words: 80 bytes put ldmatrix rows on distinct banks

typedef MatDesc<u16> GMat;  // (x: 16-bit activations)

FORGE_DEV GMat gmat_at(const i64* d) { return mat_desc<u16>(d); }

// ---- the tile product ------------------------------------------------------------------------------

// Tile row r < count reads x row (gather ? gather[x0 + r] / per : x0 + r) and writes y row y0 + r.
struct TileRows {
    const int* gather;
    int x0, per, count, y0;
};

// y = x W^T + bias, row-major [*, N].
struct PlainOut {
    float* y;
    const float* bias;
    int N;
    FORGE_DEV void operator()(int row, int n, float v, float) const {
        y[(i64)row * N + n] = v + (bias ? bias[n] : 0.0f);
    }
};

// Shared memory of one pipeline stage: activations [BM][GB_LD], then weights [GB_N][GB_LD].
template <int BM> struct Stage {
    static const int A = BM * GB_LD, WORDS = (BM + GB_N) * GB_LD;
};

#if defined(FORGE_NV)
template <bool BF> FORGE_DEV void mma16816(float* c, const u32* a, const u32* b) {
    if (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}
#endif

// This thread's 16-byte pieces of a BM x 32 activation step: their rows' starts (null past the
// tile's rows: zeros), found once per tile.
template <int BM> struct ActRows {
    static const int Q = (BM * 4 + GB_THREADS - 1) / GB_THREADS;
    const u16* src[Q];
    const u16* base;  // (a valid address for the zero-filling copies)
};

template <int BM> FORGE_DEV ActRows<BM> act_rows(const u16* x, int K, const TileRows& tr) {
    ActRows<BM> a;
    a.base = x;
#pragma unroll
    for (int q = 0; q < ActRows<BM>::Q; ++q) {
        const int p = threadIdx.x + q * GB_THREADS, r = p >> 2;
        const bool in = p < BM * 4 && r < tr.count;
        const int xr = !in ? 0 : tr.gather ? tr.gather[tr.x0 + r] / tr.per : tr.x0 + r;
        a.src[q] = in ? x + (i64)xr * K + (p & 3) * 8 : nullptr;
    }
    return a;
}

// Activations of step k0 into stage `st`: BM rows x 32 values, 16 bytes a piece.
template <int BM> FORGE_DEV void load_act(const ActRows<BM>& a, int k0, u16* st) {
#pragma unroll
    for (int q = 0; q < ActRows<BM>::Q; ++q) {
        const int p = threadIdx.x + q * GB_THREADS;
        if (p >= BM * 4) break;
        const bool valid = a.src[q] != nullptr;
        const u16* src = valid ? a.src[q] + k0 : a.base;
        u16* dst = st + (p >> 2) * GB_LD + (p & 3) * 8;
#if defined(FORGE_NV)
        cp_async16(dst, src, valid);
#else
        uint4 v = {0u, 0u, 0u, 0u};
        if (valid) v = *(const uint4*)src;
        *(uint4*)dst = v;
#endif
    }
}

// The weight row this thread loads and decodes (p null past N: zeros): row t >> 1 of the tile's
// GB_N (a half each), or for the generic types row t < GB_N whole. A gated tile's rows GB_N / 2 ..
// are the up matrix's rows n0 ...
struct WRow {
    const u8* p;
    int type;
};

template <int T, bool GLU> FORGE_DEV WRow weight_row(const GMat& m, const GMat& up, int n0) {
    const int wr = T == T_GENERIC ? (int)threadIdx.x : (int)threadIdx.x >> 1;
    const bool second = GLU && wr >= GB_N / 2;
    const u8* W = second ? up.W : m.W;
    const i64 rb = second ? up.row_bytes : m.row_bytes;
    const int n = n0 + (GLU ? wr % (GB_N / 2) : wr), N = second ? up.N : m.N;
    WRow w;
    w.type = second ? up.type : m.type;
    w.p = wr < GB_N && n < N ? W + (i64)n * rb : nullptr;
    return w;
}

// Weights of chunk kc into stage `st`: thread t decodes half t & 1 of its row from the raw bytes
// it loaded (generic types: threads < GB_N decode whole chunks here).
template <int T> FORGE_DEV void store_weights(const WRow& w, int kc, const Raw& raw, u16* st) {
    const int t = threadIdx.x;
    if (T == T_GENERIC) {
        if (t < GB_N) {
            u32 o[16];
            if (w.p) {
                float v[32];
                deq32_generic(w.type, w.p, kc, v);
#pragma unroll
                for (int i = 0; i < 16; ++i) o[i] = pack_h2(v[2 * i], v[2 * i + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) o[i] = 0u;
            }
            uint4* dst = (uint4*)(st + t * GB_LD);
#pragma unroll
            for (int i = 0; i < 4; ++i) dst[i] = make_uint4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
        }
        return;
    }
    const int r = t >> 1, h = t & 1;
    u32 o[8];
    if (w.p) {
        raw_decode<T>(raw, kc, h, o);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = 0u;
    }
    uint4* dst = (uint4*)(st + r * GB_LD + 16 * h);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

template <int T> FORGE_DEV void load_weights(const WRow& w, int kc, Raw& raw) {
    if (T != T_GENERIC && w.p) raw_load<T>(w.p, kc, threadIdx.x & 1, raw);
}

// The tile of x rows `tr` (16-bit, [*, m.K] at x) and output columns n0 .. (GB_N of one matrix, or
// GB_N / 2 of the gate and up matrices when GLU): out(y row, column, product, up product) for each
// of its outputs. `smem`: two stages.
template <int T, int BM, bool GLU, class Out>
FORGE_DEV void gemm_tile(const GMat& m, const GMat& up, const u16* x, const TileRows& tr, int n0,
                         const Out& out, u16* smem) {
    const bool bf = T == T_BF16;
    const int nk = m.K / GB_K;
    float acc[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
    Raw raw;
    raw.a = raw.b = raw.c = make_uint4(0u, 0u, 0u, 0u);
    raw.e = 0u;
    const ActRows<BM> ar = act_rows<BM>(x, m.K, tr);
    const WRow wrow = weight_row<T, GLU>(m, up, n0);

    load_act<BM>(ar, 0, smem);
    load_weights<T>(wrow, 0, raw);
    store_weights<T>(wrow, 0, raw, smem + Stage<BM>::A);
#if defined(FORGE_NV)
    cp_async_commit();
    cp_async_wait<0>();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = warp >> 2, wn = warp & 3;  // warp tile: rows wm * BM/2 .., columns wn * 32 ..
    const int MT = BM / 32;                   // 16-row tiles per warp
#endif
    __syncthreads();

    for (int kt = 0; kt < nk; ++kt) {
        u16* cur = smem + (kt & 1) * Stage<BM>::WORDS;
        u16* nxt = smem + ((kt + 1) & 1) * Stage<BM>::WORDS;
        const bool more = kt + 1 < nk;
#if defined(FORGE_NV)
        if (more) {
            load_act<BM>(ar, (kt + 1) * GB_K, nxt);
            cp_async_commit();
            load_weights<T>(wrow, kt + 1, raw);
        }
        const u16* As = cur;
        const u16* Bs = cur + Stage<BM>::A;
#pragma unroll
        for (int kk = 0; kk < GB_K; kk += 16) {
            u32 a[BM / 32][4], b[4][2];
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldsm_x4(As + (wm * (BM / 2) + 16 * i + (lane & 15)) * GB_LD + kk + (lane >> 4) * 8, a[i]);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {
                // a gated tile's warp takes 16 gate rows (jj 0) and the same 16 up rows (jj 1)
                const int c0 = GLU ? jj * (GB_N / 2) + wn * 16 : wn * 32 + 16 * jj;
                u32 q[4];
                ldsm_x4(Bs + (c0 + (lane & 7) + ((lane >> 4) << 3)) * GB_LD + kk + ((lane >> 3) & 1) * 8, q);
                b[2 * jj][0] = q[0], b[2 * jj][1] = q[1], b[2 * jj + 1][0] = q[2], b[2 * jj + 1][1] = q[3];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816<bf>(acc + (i * 4 + j) * 4, a[i], b[j]);
        }
        if (more) store_weights<T>(wrow, kt + 1, raw, nxt + Stage<BM>::A);
        cp_async_wait<0>();
#else
        // Portable path: thread (tm, tn) = (t / 16, t % 16) owns rows tm + 16 i, columns tn + 16 j.
        const u16* As = cur;
        const u16* Bs = cur + Stage<BM>::A;
        const int tm = threadIdx.x / 16, tn = threadIdx.x % 16;
        for (int kk = 0; kk < GB_K; ++kk) {
            float av[BM / 16], bv[8];
#pragma unroll
            for (int i = 0; i < BM / 16; ++i) {
                const u16 w = As[(tm + 16 * i) * GB_LD + kk];
                av[i] = bf ? bf2f(w) : h2f(w);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const u16 w = Bs[(tn + 16 * j) * GB_LD + kk];
                bv[j] = bf ? bf2f(w) : h2f(w);
            }
#pragma unroll
            for (int i = 0; i < BM / 16; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i * 8 + j] += av[i] * bv[j];
        }
        if (more) {
            load_act<BM>(ar, (kt + 1) * GB_K, nxt);
            load_weights<T>(wrow, kt + 1, raw);
            store_weights<T>(wrow, kt + 1, raw, nxt + Stage<BM>::A);
        }
#endif
        __syncthreads();
    }

#if defined(FORGE_NV)
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < (GLU ? 2 : 4); ++j) {
            const float* c = acc + (i * 4 + j) * 4;
            const float* cu = acc + (i * 4 + (GLU ? j + 2 : j)) * 4;  // (the up products)
            const int r = wm * (BM / 2) + 16 * i + (lane >> 2);
            const int n = n0 + (GLU ? wn * 16 : wn * 32) + 8 * j + 2 * (lane & 3);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = r + 8 * (e >> 1), nn = n + (e & 1);
                if (rr < tr.count && nn < m.N) out(tr.y0 + rr, nn, c[e], cu[e]);
            }
        }
    }
#else
    const int tm = threadIdx.x / 16, tn = threadIdx.x % 16;
    for (int i = 0; i < BM / 16; ++i) {
        for (int j = 0; j < (GLU ? 4 : 8); ++j) {
            const int rr = tm + 16 * i, nn = n0 + tn + 16 * j;
            if (rr < tr.count && nn < m.N) out(tr.y0 + rr, nn, acc[i * 8 + j], acc[i * 8 + (GLU ? j + 4 : j)]);
        }
    }
#endif
}
