// gemm_weights.h: gemm_tile.h's weight decoders. A thread loads the raw bytes of 16 values of a
// weight row (raw_load: half h of 32-value chunk kc) before a pipeline step's products and
// decodes them into 8 words of packed float16 (raw_decode) after, so the loads' latency hides
// behind the products. T_GENERIC: the types decoded whole chunks at a time through quants.h.
#pragma once
#include "quants.h"

#define T_GENERIC 100  // the other quantized types: decoded through quants.h, 128 threads

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

// The 16 values of chunk kc of a Q4_K / Q5_K block: the sub-block's nibble plane (Q5_K: with
// its bit of qh in r.c as bit 4) times the sub-block's scale, less its minimum.
FORGE_DEV void k4_out(const Raw& r, int kc, bool high, u32* o) {
    const int s = kc & 7;
    float dl, ml;
    k4_scale_min_r(r.a, s, &dl, &ml);
    const float c = -MAGIC * dl;  // (2^23 + q) dl - 2^23 dl = q dl exactly
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u32 w = (word_at(r.b, i) >> (4 * (s & 1))) & 0x0f0f0f0fu;
        if (high) w |= ((word_at(r.c, i) >> s) & 0x01010101u) << 4;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaf(magic_f((w >> (8 * j)) & 0xffu), dl, c) - ml;
        o[2 * i] = pack_h2(v[0], v[1]);
        o[2 * i + 1] = pack_h2(v[2], v[3]);
    }
}

template <> FORGE_DEV void raw_load<T_Q4_K>(const u8* row, int kc, int h, Raw& r) {
    const u8* b = row + (i64)(kc >> 3) * BYTES_Q4_K;
    r.a = *(const uint4*)b;
    r.b = *(const uint4*)(b + 16 + 32 * ((kc & 7) >> 1) + 16 * h);
}
template <> FORGE_DEV void raw_decode<T_Q4_K>(const Raw& r, int kc, int, u32* o) { k4_out(r, kc, false, o); }

template <> FORGE_DEV void raw_load<T_Q5_K>(const u8* row, int kc, int h, Raw& r) {
    const u8* b = row + (i64)(kc >> 3) * BYTES_Q5_K;
    r.a = *(const uint4*)b;
    r.b = *(const uint4*)(b + 48 + 32 * ((kc & 7) >> 1) + 16 * h);
    r.c = *(const uint4*)(b + 16 + 16 * h);
}
template <> FORGE_DEV void raw_decode<T_Q5_K>(const Raw& r, int kc, int, u32* o) { k4_out(r, kc, true, o); }

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
