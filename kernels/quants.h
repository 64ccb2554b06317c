// quants.h: decoders for GGML weight blocks. Each deq32_<type>(row, c, v) writes the 32 values of
// chunk c (elements 32c .. 32c+31) of one row into v. Rows are sequences of GGML blocks:
// 32 elements per block for Q4_0..Q8_0, 256 per super-block (8 chunks) for the K-quants.
// Layouts follow GGML's block structs (Q8_0, Q6_K: see their decoders); multi-byte fields are
// little-endian.
#pragma once
#include "forge_hip.h"

#define QK 32
#define QK_K 256

// bytes per block (32 elements, or 256 for K-quants)
#define BYTES_Q4_0 18
#define BYTES_Q4_1 20
#define BYTES_Q5_0 22
#define BYTES_Q5_1 24
#define BYTES_Q8_0 34
#define BYTES_Q2_K 84
#define BYTES_Q3_K 110
#define BYTES_Q4_K 144
#define BYTES_Q5_K 176
#define BYTES_Q6_K 210
#define BYTES_MXFP4 17

FORGE_DEV void deq32_q4_0(const u8* row, int c, float* v) {  // d, qs[16]
    const u8* b = row + (i64)c * BYTES_Q4_0;
    float d = h2f(load_u16(b));
    const u8* qs = b + 2;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        v[j] = d * (float)((qs[j] & 0xf) - 8);
        v[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

FORGE_DEV void deq32_q4_1(const u8* row, int c, float* v) {  // d, m, qs[16]
    const u8* b = row + (i64)c * BYTES_Q4_1;
    float d = h2f(load_u16(b)), m = h2f(load_u16(b + 2));
    const u8* qs = b + 4;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        v[j] = d * (float)(qs[j] & 0xf) + m;
        v[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

FORGE_DEV void deq32_q5_0(const u8* row, int c, float* v) {  // d, qh[4], qs[16]
    const u8* b = row + (i64)c * BYTES_Q5_0;
    float d = h2f(load_u16(b));
    u32 qh = load_u32(b + 2);
    const u8* qs = b + 6;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        int lo = (qs[j] & 0xf) | (((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        v[j] = d * (float)(lo - 16);
        v[j + 16] = d * (float)(hi - 16);
    }
}

FORGE_DEV void deq32_q5_1(const u8* row, int c, float* v) {  // d, m, qh[4], qs[16]
    const u8* b = row + (i64)c * BYTES_Q5_1;
    float d = h2f(load_u16(b)), m = h2f(load_u16(b + 2));
    u32 qh = load_u32(b + 4);
    const u8* qs = b + 8;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        int lo = (qs[j] & 0xf) | (((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        v[j] = d * (float)lo + m;
        v[j + 16] = d * (float)hi + m;
    }
}

// Q8_0 as the GPU arena stores it (forge_hip.arena.q8_0_rows): a row pointer addresses the row's
// int8 quants (qs[32c ..] for block c); the f16 block scales sit just before it, in reverse
// order (block c's at row - 2 (c + 1)), so no decoder needs the row length to find them and the
// quants stay as aligned as the row.
FORGE_DEV void deq32_q8_0(const u8* row, int c, float* v) {
    float d = h2f(load_u16(row - 2 * ((i64)c + 1)));
    const i8* qs = (const i8*)(row + 32 * (i64)c);
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = d * (float)qs[j];
}

// MXFP4 (GGML's block_mxfp4: an E8M0 exponent e, then 16 bytes of E2M1 codes, low nibbles
// elements 0..15, high nibbles 16..31) as the GPU arena stores it (forge_hip.arena.mxfp4_rows):
// a row pointer addresses the row's codes (block c's at row + 16 c), the exponents sit just
// before it in reverse order (block c's at row - (c + 1)). Values are GGML's kvalues_mxfp4
// (twice the E2M1 value) times e8m0_half(e) = 2^(e - 128). Zero bytes pad the exponents in front
// to a multiple of 16 bytes, so rows and codes stay 16-byte aligned.
FORGE_DEV float e8m0_half(u32 e) { return bits_to_float(e < 2 ? 0x00200000u << e : (e - 1) << 23); }

FORGE_DEV int e2m1_twice(u32 code) {  // 0 1 2 3 4 6 8 12, negated when bit 3 is set
    const int m = (int)(code & 7u), v = m < 4 ? m : (2 + (m & 1)) << ((m >> 1) - 1);
    return code & 8u ? -v : v;
}

FORGE_DEV void deq32_mxfp4(const u8* row, int c, float* v) {
    const float d = e8m0_half(row[-((i64)c + 1)]);
    const u8* qs = row + 16 * (i64)c;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        v[j] = d * (float)e2m1_twice(qs[j] & 0xfu);
        v[j + 16] = d * (float)e2m1_twice(qs[j] >> 4);
    }
}

// K-quants: chunk c is sub-range s = c % 8 of super-block c / 8.

FORGE_DEV void deq32_q2_k(const u8* row, int c, float* v) {  // scales[16], qs[64], d, dmin
    const u8* b = row + (i64)(c >> 3) * BYTES_Q2_K;
    int s = c & 7, h = s >> 2, j = s & 3;  // half (128 values), 2-bit plane
    float d = h2f(load_u16(b + 80)), dmin = h2f(load_u16(b + 82));
    const u8* qs = b + 16 + 32 * h;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        u8 sc = b[8 * h + 2 * j + half];
        float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            v[16 * half + l] = dl * (float)((qs[16 * half + l] >> (2 * j)) & 3) - ml;
        }
    }
}

// 6-bit scale i (0..15) of Q3_K, packed in 12 bytes, stored offset by 32.
FORGE_DEV int q3k_scale(const u8* s, int i) {
    int lo = i < 8 ? (s[i] & 0xf) : (s[i - 8] >> 4);
    int hi = (s[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

FORGE_DEV void deq32_q3_k(const u8* row, int c, float* v) {  // hmask[32], qs[64], scales[12], d
    const u8* b = row + (i64)(c >> 3) * BYTES_Q3_K;
    int s = c & 7, h = s >> 2, j = s & 3;
    float d = h2f(load_u16(b + 108));
    const u8* hm = b;
    const u8* qs = b + 32 + 32 * h;
    const u8* sc = b + 96;
    int bit = 1 << (4 * h + j);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float dl = d * (float)q3k_scale(sc, 8 * h + 2 * j + half);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            int k = 16 * half + l;
            int q = ((qs[k] >> (2 * j)) & 3) - ((hm[k] & bit) ? 0 : 4);
            v[k] = dl * (float)q;
        }
    }
}

// 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K, packed in 12 bytes.
FORGE_DEV void k4_scale_min(const u8* q, int j, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

FORGE_DEV void deq32_q4_k(const u8* row, int c, float* v) {  // d, dmin, scales[12], qs[128]
    const u8* b = row + (i64)(c >> 3) * BYTES_Q4_K;
    int s = c & 7, pair = s >> 1, hi = s & 1;
    float d = h2f(load_u16(b)), dmin = h2f(load_u16(b + 2));
    int sc, m;
    k4_scale_min(b + 4, s, &sc, &m);
    float dl = d * (float)sc, ml = dmin * (float)m;
    const u8* qs = b + 16 + 32 * pair;
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = dl * (float)((qs[l] >> (4 * hi)) & 0xf) - ml;
}

FORGE_DEV void deq32_q5_k(const u8* row, int c, float* v) {  // d, dmin, scales[12], qh[32], qs[128]
    const u8* b = row + (i64)(c >> 3) * BYTES_Q5_K;
    int s = c & 7, pair = s >> 1, hi = s & 1;
    float d = h2f(load_u16(b)), dmin = h2f(load_u16(b + 2));
    int sc, m;
    k4_scale_min(b + 4, s, &sc, &m);
    float dl = d * (float)sc, ml = dmin * (float)m;
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * pair;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        int q = ((qs[l] >> (4 * hi)) & 0xf) | (((qh[l] >> s) & 1) << 4);
        v[l] = dl * (float)q - ml;
    }
}

// Q6_K as the GPU arena stores it (forge_hip.arena.q6_k_rows): block b's quants (ql[128], then
// qh[64]) at row + 192 b; its scales[16] (int8) and d (f16) 18 (b + 1) bytes before the row,
// so the quants stay as aligned as the row and no decoder needs the row length.
FORGE_DEV void deq32_q6_k(const u8* row, int c, float* v) {
    const i64 blk = c >> 3;
    const u8* b = row + 192 * blk;
    const u8* aux = row - 18 * (blk + 1);
    int s = c & 7, h = s >> 2, j = s & 3;
    float d = h2f(load_u16(aux + 16));
    const u8* ql = b + 64 * h + 32 * (j & 1);
    const u8* qh = b + 128 + 32 * h;
    const i8* sc = (const i8*)aux + 8 * h + 2 * j;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        int q = ((ql[l] >> (4 * (j >> 1))) & 0xf) | (((qh[l] >> (2 * j)) & 3) << 4);
        v[l] = d * (float)sc[l >> 4] * (float)(q - 32);
    }
}

// Unquantized rows, chunked the same way (32 consecutive elements).
FORGE_DEV void deq32_f32(const u8* row, int c, float* v) {
    const float* p = (const float*)row + 32 * (i64)c;
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = p[l];
}

FORGE_DEV void deq32_f16(const u8* row, int c, float* v) {
    const u16* p = (const u16*)row + 32 * (i64)c;
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = h2f(p[l]);
}

FORGE_DEV void deq32_bf16(const u8* row, int c, float* v) {
    const u16* p = (const u16*)row + 32 * (i64)c;
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = bf2f(p[l]);
}

// X-macro over every weight type: (suffix, elements per block, bytes per block).
#define FORGE_WEIGHT_TYPES(X) \
    X(f32, 1, 4) X(f16, 1, 2) X(bf16, 1, 2) \
    X(q4_0, QK, BYTES_Q4_0) X(q4_1, QK, BYTES_Q4_1) X(q5_0, QK, BYTES_Q5_0) \
    X(q5_1, QK, BYTES_Q5_1) X(q8_0, QK, BYTES_Q8_0) X(q2_k, QK_K, BYTES_Q2_K) \
    X(q3_k, QK_K, BYTES_Q3_K) X(q4_k, QK_K, BYTES_Q4_K) X(q5_k, QK_K, BYTES_Q5_K) \
    X(q6_k, QK_K, BYTES_Q6_K)

// Single element loaders for the unquantized types (rows of any length).
FORGE_DEV float load_f32(const u8* row, i64 k) { return ((const float*)row)[k]; }
FORGE_DEV float load_f16(const u8* row, i64 k) { return h2f(((const u16*)row)[k]); }
FORGE_DEV float load_bf16(const u8* row, i64 k) { return bf2f(((const u16*)row)[k]); }
