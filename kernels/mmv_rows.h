// mmv_rows.h: the pieces of a decode product shared by mmv.hip and moe.hip: rounding x to the
// int8 blocks the units read (mvq_quantize), one lane's share of a weight row . x[r] (row_dot,
// mmv.h's units per type) and the sums over a row's lanes (group_sum_rows).
#pragma once
#include "mmv.h"

// Quantize 8 values (dst 8-aligned) as rint(v * inv), clamped to 127 when `clamp`; returns their
// sum.
FORGE_DEV int mvq_store8(i8* dst, const float* v, float inv, bool clamp, bool store) {
    u32 w[2] = {0u, 0u};
    int s = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        float f = rintf(v[e] * inv);
        if (clamp) f = fminf(f, 127.0f);
        const int q = (int)f;
        s += q;
        w[e >> 2] |= (u32)(q & 255) << (8 * (e & 3));
    }
    if (store) {
        V2 p;
        p.x = w[0];
        p.y = w[1];
        *(V2*)dst = p;
    }
    return s;
}

// Round one lane's 8 values of x row r, elements k .. k + 7 (`in`: inside the row; lanes
// outside still take part in the shuffles), into base + off1 (need bit 0) and base + off2 (need
// bit 1) for R rows of K.
FORGE_DEV void mvq_quant8(float* v, int r, int k, bool in, int K, int R, int need, u8* base,
                          int off1, int off2) {
    const int lane = threadIdx.x & 31;
    // the first element of largest magnitude (llama.cpp's Q8_K peak), and the amax
    float am = 0.0f, pk = 0.0f;
    int idx = k;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (fabsf(v[e]) > am) {
            am = fabsf(v[e]);
            pk = v[e];
            idx = k + e;
        }
    }
    const i64 at = (i64)r * K + k, blk = (i64)r * (K / 32) + k / 32;
    if (need & 1) {  // Q8_0 rounding: d = amax / 127 stored as f16
        float bm = fmaxf(am, shfl_xor(am, 1));
        bm = fmaxf(bm, shfl_xor(bm, 2));
        const float d = bm / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
        int s = mvq_store8((i8*)(base + off1) + at, v, inv, false, in);
        s += shfl_xor_int(s, 1);
        s += shfl_xor_int(s, 2);
        if (in && (lane & 3) == 0) {
            F2 ds;
            ds.x = h2f(f2h(d));
            ds.y = (float)s;
            ((F2*)(base + off1 + R * K))[blk] = ds;
        }
    }
    if (need & 2) {  // Q8_K rounding: scale -peak / 127 over 256 elements (K % 256 == 0)
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            const float am2 = shfl_xor(am, m), pk2 = shfl_xor(pk, m);
            const int idx2 = shfl_xor_int(idx, m);
            if (am2 > am || (am2 == am && idx2 < idx)) {
                am = am2;
                pk = pk2;
                idx = idx2;
            }
        }
        const float is = pk != 0.0f ? -127.0f / pk : 0.0f, d = is != 0.0f ? 1.0f / is : 0.0f;
        int s = mvq_store8((i8*)(base + off2) + at, v, is, true, in);
        s += shfl_xor_int(s, 1);
        s += shfl_xor_int(s, 2);
        if (in && (lane & 3) == 0) {
            F2 ds;
            ds.x = d;
            ds.y = (float)s;
            ((F2*)(base + off2 + R * K))[blk] = ds;
        }
    }
}

FORGE_DEV void mvq_load8(const float* p, float* v) {
    const F4 a = *(const F4*)p, b = *(const F4*)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

FORGE_DEV void mvq_store8f(float* p, const float* v) {
    F4 a, b;
    a.x = v[0], a.y = v[1], a.z = v[2], a.w = v[3], b.x = v[4], b.y = v[5], b.z = v[6], b.w = v[7];
    *(F4*)p = a;
    *(F4*)(p + 4) = b;
}

// Quantize rows of x [R, K] into base + off1 (need bit 0) and base + off2 (need bit 1). Tasks of
// 256 elements, one per 32-lane group (8 consecutive elements per lane): task0 + group, in steps.
FORGE_DEV void mvq_quantize(const float* x, int K, int R, int need, u8* base, int off1, int off2,
                            int task0, int tstep) {
    const int lane = threadIdx.x & 31, T = (K + 255) >> 8;
    for (int task = task0 + (int)(threadIdx.x >> 5); task < R * T; task += tstep) {
        const int r = task / T, k = 256 * (task % T) + 8 * lane;
        const bool in = k < K;  // K % 32 == 0: a 32-block is wholly in or out
        float v[8];
        if (in) {
            mvq_load8(x + (i64)r * K + k, v);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.0f;
        }
        mvq_quant8(v, r, k, in, K, R, need, base, off1, off2);
    }
}

// F32/F16/BF16 rows: element by element, x rounded as that weight type's prefill rounds it.
template <int RM>
FORGE_DEV void row_dot_f(int t, const u8* row, const float* x, int K, int lane, int G, int R,
                         float* acc) {
    for (int k = lane; k < K; k += G) {
        const float w = t == T_F32   ? ((const float*)row)[k]
                        : t == T_F16 ? h2f(((const u16*)row)[k])
                                      : bf2f(((const u16*)row)[k]);
#pragma unroll
        for (int r = 0; r < RM; ++r) {
            if (r < R) {
                float v = x[(i64)r * K + k];
                if (t == T_F16) v = h2f(f2h(v));
                if (t == T_BF16) v = bf2f(f2bf(v));
                acc[r] += w * v;
            }
        }
    }
}

// This lane's share of row n . x[r] for r < R, added to acc: MVQ_STEP(RM) units per step, all
// of a step's weight bytes loaded before any unit is computed (one unit at a time for Q5_K and
// the float-decoded types). GEN: with Q2_K/Q3_K (their float decoders need many registers, so
// the kernels for the other types leave them out and skip their rows).
#ifndef MVQ_STEP
#define MVQ_STEP(RM) ((RM) == 1 ? 4 : 2)
#endif
#define MVQ_ROW(T, U, X)                                                                \
    {                                                                                   \
        constexpr int S = MVQ_STEP(RM);                                                 \
        const int units = (U);                                                          \
        int u = lane;                                                                   \
        for (; u + (S - 1) * G < units; u += S * G) {                                   \
            decltype(ld_##T(row, 0)) w[S];                                              \
            _Pragma("unroll") for (int s = 0; s < S; ++s) w[s] = ld_##T(row, u + s * G); \
            _Pragma("unroll") for (int s = 0; s < S; ++s)                               \
                add_##T<RM>(w[s], u + s * G, X, R, acc);                                \
        }                                                                               \
        for (; u < units; u += G) unit_##T<RM>(row, u, X, R, acc);                      \
        break;                                                                          \
    }
#define MVQ_ROW1(F, U, X)                                                               \
    {                                                                                   \
        for (int u = lane; u < (U); u += G) F<RM>(row, u, X, R, acc);                   \
        break;                                                                          \
    }
#define MVQ_ROW_GEN(F, U, X)                                                            \
    {                                                                                   \
        if (GEN) {                                                                      \
            for (int u = lane; u < (U); u += G) F<RM>(row, u, X, R, acc);               \
        }                                                                               \
        break;                                                                          \
    }

// AL: one-row products take the aligned Q6_K loader where rows allow (the gated kernels pass
// false: that path made ptxas spill in mvq_glu_r1's paired loop). TT >= 0: the rows are of type
// TT, known when compiling (only its unit's registers; -1: any type, read from m).
template <int RM, bool GEN, bool AL = false, int TT = -1>
FORGE_DEV void row_dot(const MvMat& m, int n, int lane, int G, const XQ& x1, const XQ& x2, int R,
                       float* acc) {
    const u8* row = m.W + (i64)n * m.row_bytes;
    const int K = m.K;
    switch (TT >= 0 ? TT : m.type) {
        case T_Q4_0: MVQ_ROW(q4_0, K / 16, x1)
        case T_Q4_1: MVQ_ROW(q4_1, K / 16, x1)
        case T_Q5_0: MVQ_ROW(q5_0, K / 16, x1)
        case T_Q5_1: MVQ_ROW(q5_1, K / 16, x1)
        case T_Q8_0:  // (multi-row kernels: the 2-aligned loader only, fewer registers)
            if (RM == 1 && ((u64)m.W | (u64)m.row_bytes) % 8 == 0) MVQ_ROW(q8_0, K / 16, x1)
            MVQ_ROW(q8_0u, K / 16, x1)
        case T_Q2_K: MVQ_ROW_GEN(unit_q2_k, K / 32, x2)
        case T_Q3_K: MVQ_ROW_GEN(unit_q3_k, K / 32, x2)
        case T_Q4_K: MVQ_ROW(q4_k, K / 64, x2)
        case T_Q5_K: MVQ_ROW1(unit_q5_k, K / 32, x2)
#if defined(FORGE_MXFP4)  // (moe.hip only: no dense product reads MXFP4)
        case T_MXFP4: MVQ_ROW(mxfp4, K / 16, x1)
#endif
        case T_Q6_K:  // (as Q8_0)
            if (AL && RM == 1 && ((u64)m.W | (u64)m.row_bytes) % 8 == 0) MVQ_ROW(q6_k, K / 32, x2)
            MVQ_ROW(q6_ku, K / 32, x2)
        default: row_dot_f<RM>(m.type, row, m.x, K, lane, G, R, acc); break;
    }
}

// Sums v[0 .. RM) over the G lanes of a group at once: halving exchanges (each lane keeps one half
// of what it holds and adds its partner's copy of that half: RM/2 + RM/4 + ... shuffles instead of
// RM log2(G)), then plain xor sums once one value is left (G > RM). The lane ends with the sums of
// rows *row0 + i in v[i] for i < max(RM / G, 1); returns whether it is the one lane that writes
// them (several lanes hold the same sums when G > RM).
template <int H> FORGE_DEV void group_halve(float* v, int lane, int& s, int& base) {
    if (s >= 1) {
        const bool hi = (lane & s) != 0;
#pragma unroll
        for (int i = 0; i < H; ++i) {
            const float keep = hi ? v[i + H] : v[i], give = hi ? v[i] : v[i + H];
            v[i] = keep + shfl_xor(give, s);
        }
        if (hi) base += H;
        s >>= 1;
        group_halve<H / 2>(v, lane, s, base);
    }
}
template <> FORGE_DEV void group_halve<0>(float*, int, int&, int&) {}

template <int RM> FORGE_DEV bool group_sum_rows(float* v, int lane, int G, int* row0) {
    int s = G >> 1, base = 0;
    group_halve<RM / 2>(v, lane, s, base);
    for (; s >= 1; s >>= 1) v[0] += shfl_xor(v[0], s);
    *row0 = base;
    return (lane & (G > RM ? G / RM - 1 : 0)) == 0;
}
