// gemm.hip: prefill products y = x W^T + bias on tensor cores, for many token rows at once.
// Matrices come as linear.hip's descriptors (DESC_LEN int64: W, x, y, bias, type id, K, N,
// row bytes), blockIdx.z picking descriptor `first + z`; here x holds 16-bit activations
// ([R, K] float16, or bfloat16 for BF16 weights) written by act_half. Every type but F32, K % 32 == 0.
//
// act_half: rounds float32 activations like llama.cpp's vec_dot types (modes of act_round in
//   layer.hip: 1 q8 per 32, 2 q8 per 256, 3 float16, 4 bfloat16) and stores them as 16-bit floats
//   (bfloat16 for mode 4). grid = rows, block = 256 threads (32-lane groups take 32/256 chunks).
// gemm_m128 / gemm_m64: block = 256 threads, grid = (ceil(R / BM), ceil(max N / 128), n_mats) for
//   BM = 128 / 64. A block computes a BM x 128 tile of y: per step of 32 k, the activations are
//   copied (cp.async) and the 128 x 32 weights decoded to float16 into shared memory (double
//   buffered: the next step's loads and decode overlap this step's products), then 8 warps
//   (2 along rows x 4 along N) run mma.sync m16n8k16 with float32 accumulators.
//   Products of 16-bit values are exact in float32; weights of quantized types are rounded to
//   float16 once (relative 2^-11). On AMD the same tiles are multiplied by a portable SIMT loop.
#include "quants.h"

#define T_GENERIC 100  // the other quantized types: decoded through quants.h, 128 threads

#define GB_K 32   // k per pipeline step
#define GB_LD 40  // shared row stride in 16-bit words: 80 bytes put ldmatrix rows on distinct banks

struct GMat {
    const u8* W;
    const u16* x;
    float* y;
    const float* bias;
    int type, K, N;
    i64 row_bytes;
};

FORGE_DEV GMat gmat_at(const i64* d) {
    GMat m;
    m.W = (const u8*)d[DESC_W];
    m.x = (const u16*)d[DESC_X];
    m.y = (float*)d[DESC_Y];
    m.bias = (const float*)d[DESC_BIAS];
    m.type = (int)d[DESC_TYPE];
    m.K = (int)d[DESC_K];
    m.N = (int)d[DESC_N];
    m.row_bytes = d[DESC_ROW_BYTES];
    return m;
}

// ---- activations ---------------------------------------------------------------------------------

FORGE_DEV float group32_max(float v) {  // over the 32-lane group (half a wavefront on wave64)
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
    return v;
}

FORGE_KERNEL void act_half(const float* __restrict__ x, u16* __restrict__ y, int K, int mode) {
    FORGE_GRID_WAIT();
    const float* xr = x + (i64)blockIdx.x * K;
    u16* yr = y + (i64)blockIdx.x * K;
    if (mode >= 3) {
        for (int i = threadIdx.x; i < K; i += blockDim.x) yr[i] = mode == 3 ? f2h(xr[i]) : f2bf(xr[i]);
        return;
    }
    const int lane = threadIdx.x % 32, grp = threadIdx.x / 32, ngrp = blockDim.x / 32;
    if (mode == 1) {  // q8 per 32: d = amax / 127 (stored as float16), q = rint(x / d)
        for (int c = grp; c < K / 32; c += ngrp) {
            const float v = xr[32 * c + lane];
            const float d = group32_max(fabsf(v)) / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            yr[32 * c + lane] = f2h(rintf(v * inv) * h2f(f2h(d)));
        }
        return;
    }
    // q8 per 256: iscale = -127 / peak. The sign of the peak cancels (q and d both flip), so
    // |peak| serves: the values equal act_round's bit for bit.
    for (int c = grp; c < K / 256; c += ngrp) {
        float v[8], amax = 0.0f;
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            v[l] = xr[256 * c + 32 * l + lane];
            amax = fmaxf(amax, fabsf(v[l]));
        }
        amax = group32_max(amax);
        const float iscale = amax != 0.0f ? -127.0f / amax : 0.0f;
        const float d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
#pragma unroll
        for (int l = 0; l < 8; ++l) yr[256 * c + 32 * l + lane] = f2h(fminf(rintf(v[l] * iscale), 127.0f) * d);
    }
}

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

// Activations of step k0 into stage `st`: BM rows x 32 values, 16 bytes a piece (zeros past R).
template <int BM> FORGE_DEV void load_act(const GMat& m, int b0, int R, int k0, u16* st) {
#pragma unroll
    for (int q = 0; q < BM * 4 / GB_THREADS; ++q) {
        const int p = threadIdx.x + q * GB_THREADS, r = p >> 2, c8 = (p & 3) * 8;
        const bool valid = b0 + r < R;
        const u16* src = m.x + (valid ? (i64)(b0 + r) * m.K + k0 + c8 : 0);
        u16* dst = st + r * GB_LD + c8;
#if defined(FORGE_NV)
        cp_async16(dst, src, valid);
#else
        uint4 v = {0u, 0u, 0u, 0u};
        if (valid) v = *(const uint4*)src;
        *(uint4*)dst = v;
#endif
    }
}

// Weights of chunk kc into stage `st` (rows n0 .. n0 + 127): thread t decodes half h = t & 1 of
// row t >> 1 from the raw bytes it loaded (generic types: threads < 128 decode whole chunks here).
template <int T> FORGE_DEV void store_weights(const GMat& m, int n0, int kc, const Raw& raw, u16* st) {
    const int t = threadIdx.x;
    if (T == T_GENERIC) {
        if (t < GB_N) {
            u32 o[16];
            if (n0 + t < m.N) {
                float v[32];
                deq32_generic(m.type, m.W + (i64)(n0 + t) * m.row_bytes, kc, v);
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
    if (n0 + r < m.N) {
        raw_decode<T>(raw, kc, h, o);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = 0u;
    }
    uint4* dst = (uint4*)(st + r * GB_LD + 16 * h);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

template <int T> FORGE_DEV void load_weights(const GMat& m, int n0, int kc, Raw& raw) {
    const int r = threadIdx.x >> 1;
    if (T != T_GENERIC && n0 + r < m.N) raw_load<T>(m.W + (i64)(n0 + r) * m.row_bytes, kc, threadIdx.x & 1, raw);
}

// y[b0 .. b0 + BM, n0 .. n0 + 128] of one matrix. `smem`: two stages.
template <int T, int BM> FORGE_DEV void gemm_tile(const GMat& m, int b0, int n0, int R, u16* smem) {
    const bool bf = T == T_BF16;
    const int nk = m.K / GB_K;
    float acc[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) acc[i] = 0.0f;
    Raw raw;
    raw.a = raw.b = raw.c = make_uint4(0u, 0u, 0u, 0u);
    raw.e = 0u;

    load_act<BM>(m, b0, R, 0, smem);
    load_weights<T>(m, n0, 0, raw);
    store_weights<T>(m, n0, 0, raw, smem + Stage<BM>::A);
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
            load_act<BM>(m, b0, R, (kt + 1) * GB_K, nxt);
            cp_async_commit();
            load_weights<T>(m, n0, kt + 1, raw);
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
                u32 q[4];
                ldsm_x4(Bs + (wn * 32 + 16 * jj + (lane & 7) + ((lane >> 4) << 3)) * GB_LD + kk +
                            ((lane >> 3) & 1) * 8,
                        q);
                b[2 * jj][0] = q[0], b[2 * jj][1] = q[1], b[2 * jj + 1][0] = q[2], b[2 * jj + 1][1] = q[3];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) mma16816<bf>(acc + (i * 4 + j) * 4, a[i], b[j]);
        }
        if (more) store_weights<T>(m, n0, kt + 1, raw, nxt + Stage<BM>::A);
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
            load_act<BM>(m, b0, R, (kt + 1) * GB_K, nxt);
            load_weights<T>(m, n0, kt + 1, raw);
            store_weights<T>(m, n0, kt + 1, raw, nxt + Stage<BM>::A);
        }
#endif
        __syncthreads();
    }

#if defined(FORGE_NV)
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float* c = acc + (i * 4 + j) * 4;
            const int r = b0 + wm * (BM / 2) + 16 * i + (lane >> 2);
            const int n = n0 + wn * 32 + 8 * j + 2 * (lane & 3);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int rr = r + 8 * (e >> 1), nn = n + (e & 1);
                if (rr < R && nn < m.N) m.y[(i64)rr * m.N + nn] = c[e] + (m.bias ? m.bias[nn] : 0.0f);
            }
        }
    }
#else
    const int tm = threadIdx.x / 16, tn = threadIdx.x % 16;
    for (int i = 0; i < BM / 16; ++i) {
        for (int j = 0; j < 8; ++j) {
            const int rr = b0 + tm + 16 * i, nn = n0 + tn + 16 * j;
            if (rr < R && nn < m.N) m.y[(i64)rr * m.N + nn] = acc[i * 8 + j] + (m.bias ? m.bias[nn] : 0.0f);
        }
    }
#endif
}

template <int BM> FORGE_DEV void gemm_dispatch(const i64* descs, int first, int R, u16* smem) {
    const GMat m = gmat_at(descs + (i64)(first + blockIdx.z) * DESC_LEN);
    const int b0 = blockIdx.x * BM, n0 = blockIdx.y * GB_N;
    if (n0 >= m.N) return;
    switch (m.type) {
        case T_F16: gemm_tile<T_F16, BM>(m, b0, n0, R, smem); break;
        case T_BF16: gemm_tile<T_BF16, BM>(m, b0, n0, R, smem); break;
        case T_Q4_0: gemm_tile<T_Q4_0, BM>(m, b0, n0, R, smem); break;
        case T_Q4_1: gemm_tile<T_Q4_1, BM>(m, b0, n0, R, smem); break;
        case T_Q5_0: gemm_tile<T_Q5_0, BM>(m, b0, n0, R, smem); break;
        case T_Q5_1: gemm_tile<T_Q5_1, BM>(m, b0, n0, R, smem); break;
        case T_Q8_0: gemm_tile<T_Q8_0, BM>(m, b0, n0, R, smem); break;
        case T_Q4_K: gemm_tile<T_Q4_K, BM>(m, b0, n0, R, smem); break;
        case T_Q5_K: gemm_tile<T_Q5_K, BM>(m, b0, n0, R, smem); break;
        case T_Q6_K: gemm_tile<T_Q6_K, BM>(m, b0, n0, R, smem); break;
        default: gemm_tile<T_GENERIC, BM>(m, b0, n0, R, smem); break;
    }
}

FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void gemm_m128(const i64* __restrict__ descs, int first, int R) {
    FORGE_GRID_WAIT();
    __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<128>::WORDS];
    gemm_dispatch<128>(descs, first, R, smem);
}

FORGE_KERNEL __launch_bounds__(GB_THREADS, 2) void gemm_m64(const i64* __restrict__ descs, int first, int R) {
    FORGE_GRID_WAIT();
    __shared__ __attribute__((aligned(16))) u16 smem[2 * Stage<64>::WORDS];
    gemm_dispatch<64>(descs, first, R, smem);
}
