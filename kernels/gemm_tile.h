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
#include "mat_desc.h"
#include "quants.h"

#define T_GENERIC 100  // the other quantized types: decoded through quants.h, 128 threads

#define GB_K 32   // k per pipeline step
#define GB_LD 40  // shared row stride in 16-bit words: 80 bytes put ldmatrix rows on distinct banks

typedef MatDesc<u16> GMat;  // (x: 16-bit activations)

FORGE_DEV GMat gmat_at(const i64* d) { return mat_desc<u16>(d); }


// ---- weight decoding: 16 values of a row into 8 words of packed float16 ---------------------------

// 2^23 + b as a float, for a byte value b: integer to float without a conversion instruction.
FORGE_DEV float magic_f(u32 b) { return bits_to_float(0x4B000000u | b); }
#define MAGIC 8388608.0f

// 16 bytes from a 2-byte aligned address: aligned words, realigned by a funnel shift; one load
// where p is 16-aligned (the arena's Q8_0 / Q6_K rows of K % 256 / K % 2048 == 0 elements).
FORGE_DEV uint4 load16_a2(const u8* p) {
    if (((u64)p & 15u) == 0) return *(const uint4*)p;
    const u32* w = (const u32*)((u64)p & ~(u64)3);
    const u32 sh = ((u32)(u64)p & 2u) * 8u;
    const u32 w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = sh ? w[4] : 0u;
    uint4 r;
    r.x = (u32)((((u64)w1 << 32) | w0) >> sh);
    r.y = (u32)((((u64)w2 << 32) | w1) >> sh);
    r.z = (u32)((((u64)w3 << 32) | w2) >> sh);
    r.w = (u32)((((u64)w4 << 32) | w3) >> sh);
    return r;
}

FORGE_DEV u32 word_at(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// Raw bytes a thread holds between the load and the decode of its 16 weights.
struct Raw {
    uint4 a, b, c;
    u32 e;
};

// Loads of the 16 values [16 h, 16 h + 16) of chunk kc (elements 32 kc ..) of row `row`.
template <int T> FORGE_DEV void raw_load(const u8* row, int kc, int h, Raw& r);
template <int T> FORGE_DEV void raw_decode(const Raw& r, int kc, int h, u32* o);

template <> FORGE_DEV void raw_load<T_F16>(const u8* row, int kc, int h, Raw& r) {
    const uint4* p = (const uint4*)(row + 64 * (i64)kc + 32 * h);
    r.a = p[0];
    r.b = p[1];
}
template <> FORGE_DEV void raw_decode<T_F16>(const Raw& r, int, int, u32* o) {
    o[0] = r.a.x, o[1] = r.a.y, o[2] = r.a.z, o[3] = r.a.w;
    o[4] = r.b.x, o[5] = r.b.y, o[6] = r.b.z, o[7] = r.b.w;
}
template <> FORGE_DEV void raw_load<T_BF16>(const u8* row, int kc, int h, Raw& r) {
    raw_load<T_F16>(row, kc, h, r);
}
template <> FORGE_DEV void raw_decode<T_BF16>(const Raw& r, int kc, int h, u32* o) {
    raw_decode<T_F16>(r, kc, h, o);
}

// Four bytes of `w` (values 0..255 each) as floats b - off, times s.
FORGE_DEV void bytes4(u32 w, float off, float s, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = (magic_f((w >> (8 * i)) & 0xffu) - off) * s;
}

template <> FORGE_DEV void raw_load<T_Q8_0>(const u8* row, int kc, int h, Raw& r) {
    r.e = *(const u16*)(row - 2 * ((i64)kc + 1));  // quants.h's deq32_q8_0 layout
    r.a = load16_a2(row + 32 * (i64)kc + 16 * h);
}
template <> FORGE_DEV void raw_decode<T_Q8_0>(const Raw& r, int, int, u32* o) {
    const float d = h2f((u16)r.e);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float v[4];
        bytes4(word_at(r.a, i) ^ 0x80808080u, MAGIC + 128.0f, d, v);  // int8 -> uint8 + 128
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_Q4_0>(const u8* row, int kc, int, Raw& r) {
    const u8* b = row + (i64)kc * BYTES_Q4_0;
    r.e = *(const u16*)b;
    r.a = load16_a2(b + 2);
}
template <> FORGE_DEV void raw_decode<T_Q4_0>(const Raw& r, int, int h, u32* o) {
    const float d = h2f((u16)r.e);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float v[4];
        bytes4((word_at(r.a, i) >> (4 * h)) & 0x0f0f0f0fu, MAGIC + 8.0f, d, v);
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

// Q4_1 / Q5_0 / Q5_1: 16 nibbles (the half's 4-bit plane) and, for the 5-bit types, 16 bits of qh.
FORGE_DEV u32 spread4(u32 x) {  // bits 0..3 of x to bit 4 of bytes 0..3
    return ((x & 1u) << 4) | ((x & 2u) << 11) | ((x & 4u) << 18) | ((x & 8u) << 25);
}

FORGE_DEV void nibbles_out(const Raw& r, int h, u32 qh16, float off, float d, float m, u32* o) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w = ((word_at(r.a, i) >> (4 * h)) & 0x0f0f0f0fu) | spread4(qh16 >> (4 * i));
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaf(magic_f((w >> (8 * j)) & 0xffu) - off, d, m);
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_Q4_1>(const u8* row, int kc, int, Raw& r) {
    const u8* b = row + (i64)kc * BYTES_Q4_1;
    const u32* p = (const u32*)b;  // d, m, qs (blocks of 20 bytes: 4-byte aligned)
    r.e = p[0];
    r.a = make_uint4(p[1], p[2], p[3], p[4]);
}
template <> FORGE_DEV void raw_decode<T_Q4_1>(const Raw& r, int, int h, u32* o) {
    nibbles_out(r, h, 0u, MAGIC, h2f((u16)(r.e & 0xffffu)), h2f((u16)(r.e >> 16)), o);
}

template <> FORGE_DEV void raw_load<T_Q5_0>(const u8* row, int kc, int, Raw& r) {
    const u8* b = row + (i64)kc * BYTES_Q5_0;
    const u16* p = (const u16*)b;
    r.e = p[0];
    r.b.x = (u32)p[1] | ((u32)p[2] << 16);  // qh
    r.a = load16_a2(b + 6);
}
template <> FORGE_DEV void raw_decode<T_Q5_0>(const Raw& r, int, int h, u32* o) {
    nibbles_out(r, h, r.b.x >> (16 * h), MAGIC + 16.0f, h2f((u16)r.e), 0.0f, o);
}

template <> FORGE_DEV void raw_load<T_Q5_1>(const u8* row, int kc, int, Raw& r) {
    const u8* b = row + (i64)kc * BYTES_Q5_1;  // 24-byte blocks: 8-byte aligned
    const u32* p = (const u32*)b;
    r.e = p[0];
    r.b.x = p[1];
    r.a = make_uint4(p[2], p[3], p[4], p[5]);
}
template <> FORGE_DEV void raw_decode<T_Q5_1>(const Raw& r, int, int h, u32* o) {
    nibbles_out(r, h, r.b.x >> (16 * h), MAGIC, h2f((u16)(r.e & 0xffffu)), h2f((u16)(r.e >> 16)), o);
}

// Q4_K / Q5_K: the 16-byte head (d, dmin, 12 bytes of 6-bit scales and mins) is 16-byte aligned.
FORGE_DEV u32 head_byte(const uint4& hd, int i) { return (word_at(hd, 1 + (i >> 2)) >> (8 * (i & 3))) & 0xffu; }
FORGE_DEV void k4_scale_min_r(const uint4& hd, int s, float* dl, float* ml) {
    int sc, m;
    if (s < 4) {
        sc = head_byte(hd, s) & 63;
        m = head_byte(hd, s + 4) & 63;
    } else {
        sc = (head_byte(hd, s + 4) & 0xf) | ((head_byte(hd, s - 4) >> 6) << 4);
        m = (head_byte(hd, s + 4) >> 4) | ((head_byte(hd, s) >> 6) << 4);
    }
    *dl = h2f((u16)(hd.x & 0xffffu)) * (float)sc;
    *ml = h2f((u16)(hd.x >> 16)) * (float)m;
}

template <> FORGE_DEV void raw_load<T_Q4_K>(const u8* row, int kc, int h, Raw& r) {
    const u8* b = row + (i64)(kc >> 3) * BYTES_Q4_K;
    r.a = *(const uint4*)b;
    r.b = *(const uint4*)(b + 16 + 32 * ((kc & 7) >> 1) + 16 * h);
}
template <> FORGE_DEV void raw_decode<T_Q4_K>(const Raw& r, int kc, int, u32* o) {
    const int s = kc & 7;
    float dl, ml;
    k4_scale_min_r(r.a, s, &dl, &ml);
    const float c = -MAGIC * dl;  // (2^23 + q) dl - 2^23 dl = q dl exactly
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w = (word_at(r.b, i) >> (4 * (s & 1))) & 0x0f0f0f0fu;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaf(magic_f((w >> (8 * j)) & 0xffu), dl, c) - ml;
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_Q5_K>(const u8* row, int kc, int h, Raw& r) {
    const u8* b = row + (i64)(kc >> 3) * BYTES_Q5_K;
    r.a = *(const uint4*)b;
    r.b = *(const uint4*)(b + 48 + 32 * ((kc & 7) >> 1) + 16 * h);
    r.c = *(const uint4*)(b + 16 + 16 * h);
}
template <> FORGE_DEV void raw_decode<T_Q5_K>(const Raw& r, int kc, int, u32* o) {
    const int s = kc & 7;
    float dl, ml;
    k4_scale_min_r(r.a, s, &dl, &ml);
    const float c = -MAGIC * dl;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w = ((word_at(r.b, i) >> (4 * (s & 1))) & 0x0f0f0f0fu) |
                      (((word_at(r.c, i) >> s) & 0x01010101u) << 4);
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaf(magic_f((w >> (8 * j)) & 0xffu), dl, c) - ml;
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_Q6_K>(const u8* row, int kc, int h, Raw& r) {
    const i64 blk = kc >> 3;  // quants.h's deq32_q6_k layout
    const u8* b = row + 192 * blk;
    const u8* aux = row - 18 * (blk + 1);
    const int s = kc & 7, hs = s >> 2, j = s & 3;
    r.a = load16_a2(b + 64 * hs + 32 * (j & 1) + 16 * h);  // ql
    r.b = load16_a2(b + 128 + 32 * hs + 16 * h);           // qh
    r.e = (u32)aux[8 * hs + 2 * j + h] | ((u32)(*(const u16*)(aux + 16)) << 16);
}
template <> FORGE_DEV void raw_decode<T_Q6_K>(const Raw& r, int kc, int, u32* o) {
    const int j = kc & 3;
    const float ds = h2f((u16)(r.e >> 16)) * (float)(i8)(r.e & 0xffu);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w = ((word_at(r.a, i) >> (4 * (j >> 1))) & 0x0f0f0f0fu) |
                      (((word_at(r.b, i) >> (2 * j)) & 0x03030303u) << 4);
        float v[4];
        bytes4(w, MAGIC + 32.0f, ds, v);
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

// MXFP4 (quants.h's deq32_mxfp4 layout): the half's 16 codes are one nibble plane of the chunk's
// 16 code bytes. Doubled E2M1 values times 2^(e - 128) are exact in float16 for e in 114 .. 140
// (scales 2^-14 .. 2^12; real weights' blocks lie well inside).
template <> FORGE_DEV void raw_load<T_MXFP4>(const u8* row, int kc, int, Raw& r) {
    r.e = row[-((i64)kc + 1)];
    r.a = *(const uint4*)(row + 16 * (i64)kc);
}
template <> FORGE_DEV void raw_decode<T_MXFP4>(const Raw& r, int, int h, u32* o) {
#if defined(FORGE_NV)
    // A code's three magnitude bits at float16 bits 9..11 and its sign at bit 15 are its E2M1
    // value times 2^-14 (code 1, E2M1's 0.5, lands on a subnormal); one product by the pair
    // 2^(e - 113) then scales two values, exactly, where that power is a normal float16: the
    // values of the float path below (code 8 gives -0 here), in a fifth of its instructions.
    if (r.e >= 99 && r.e <= 128) {
        const u32 p = (r.e - 98) << 10, d2 = p | (p << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 w = (word_at(r.a, i) >> (4 * h)) & 0x0f0f0f0fu;
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const u32 t = __byte_perm(w, 0u, j ? 0x4342u : 0x4140u);  // codes 2j, 2j + 1 as halves
                u32 v = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
                asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(v) : "r"(v), "r"(d2));
                o[2 * i + j] = v;
            }
        }
        return;
    }
#endif
    const float d = e8m0_half(r.e);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 w = (word_at(r.a, i) >> (4 * h)) & 0x0f0f0f0fu;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = (float)e2m1_twice((w >> (8 * j)) & 0xfu) * d;
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_GENERIC>(const u8*, int, int, Raw&) {}
template <> FORGE_DEV void raw_decode<T_GENERIC>(const Raw&, int, int, u32*) {}

FORGE_DEV void deq32_generic(int type, const u8* row, int kc, float* v) {
    if (type == T_Q2_K) {
        deq32_q2_k(row, kc, v);
    } else {
        deq32_q3_k(row, kc, v);
    }
}


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
