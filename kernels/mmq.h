// mmq.h: the int8 tensor-core pieces of mmq.hip (fragments, per-type weight expansion,
// mmq_rows: 16 weight rows of one matrix against every x row of a block's m tiles), shared by
// mmq.hip's dense products and moe.hip's grouped expert products. See mmq.hip for the method.
#pragma once
#include "mmv.h"

#ifndef MMQ_MASK  // (experiments) bit T keeps type T's path: one type's registers under -Xptxas -v
#define MMQ_MASK 0xffff
#endif

FORGE_DEV u32 shfl32(u32 v, int src) {  // v of lane src of this 32-lane warp
#if defined(FORGE_AMD)
    return (u32)__shfl((int)v, src, 32);
#else
    return __shfl_sync(0xffffffffu, v, src, 32);
#endif
}
FORGE_DEV float shfl32f(float v, int src) { return bits_to_float(shfl32(float_to_bits(v), src)); }

// c (int32: rows g, cols 2t, 2t+1; rows g + 8, the same cols) += A B over 16 k, lane (g, t) =
// (lane / 4, lane % 4) holding A's rows g (a0) and g + 8 (a1) at k 4t .. 4t+3 and B's column g at
// the same k (b): PTX's m16n8k16 int8 fragments.
FORGE_DEV void mmq_mma(int* c, u32 a0, u32 a1, u32 b) {
#if defined(FORGE_NV) && !defined(MMQ_EMULATE)
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
#else
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const u32 xa = shfl32(a0, 4 * g + q), xb = shfl32(a1, 4 * g + q);
        const u32 w0 = shfl32(b, 8 * t + q), w1 = shfl32(b, 8 * t + 4 + q);
        c[0] = dp4a(xa, w0, c[0]);
        c[1] = dp4a(xa, w1, c[1]);
        c[2] = dp4a(xb, w0, c[2]);
        c[3] = dp4a(xb, w1, c[3]);
    }
#endif
}

// A weight block's share of one quad lane for both n tiles: the int8 words of mma 0 (lo) and
// mma 1 (hi); per output column 2t + c of tile j the float scale wd, the factor wm of x's block
// sum (types with mins), and for Q6_K the integer scales of the two 16-element halves.
struct MmqW {
    u32 lo[2], hi[2];
    float wd[2][2], wm[2][2];
    int sl[2][2], sh[2][2];
};

// Adds block s of x times the weights in w to acc[i][j][e] (m tile i, n tile j, mma C element e).
// xo[2i], xo[2i + 1]: offsets of the block's x rows 16i + g and 16i + g + 8 (past its rows: its
// last row again).
template <int MT, bool CONTIG, bool MINS, bool HALVES>
FORGE_DEV void mmq_block(const XQ& x, const int* xo, int s, const MmqW& w, float (*acc)[2][4]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const i8* pa = x.q + xo[2 * i] + 32 * s;
        const i8* pb = x.q + xo[2 * i + 1] + 32 * s;
        u32 al, ah, bl, bh;  // rows g (a) and g + 8 (b): words of mma 0 (l) and mma 1 (h)
        if (CONTIG) {
            const V2 va = *(const V2*)(pa + 8 * t), vb = *(const V2*)(pb + 8 * t);
            al = va.x, ah = va.y, bl = vb.x, bh = vb.y;
        } else {
            al = *(const u32*)(pa + 4 * t), ah = *(const u32*)(pa + 16 + 4 * t);
            bl = *(const u32*)(pb + 4 * t), bh = *(const u32*)(pb + 16 + 4 * t);
        }
        const F2 fa = x.ds[(xo[2 * i] >> 5) + s], fb = x.ds[(xo[2 * i + 1] >> 5) + s];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            int c[4] = {0, 0, 0, 0};
            if (HALVES) {
                int d[4] = {0, 0, 0, 0};
                mmq_mma(c, al, bl, w.lo[j]);
                mmq_mma(d, ah, bh, w.hi[j]);
#pragma unroll
                for (int e = 0; e < 4; ++e) c[e] = w.sl[j][e & 1] * c[e] + w.sh[j][e & 1] * d[e];
            } else {
                mmq_mma(c, al, bl, w.lo[j]);
                mmq_mma(c, ah, bh, w.hi[j]);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const F2 f = e < 2 ? fa : fb;
                const float v = w.wd[j][e & 1] * (float)c[e];
                acc[i][j][e] += f.x * (MINS ? v + w.wm[j][e & 1] * f.y : v);
            }
        }
    }
}

// This lane's weight rows n0 + 8j + g of the two n tiles (clamped to the matrix). The scales of its
// output columns 2t, 2t + 1 come from the lanes holding those rows (mmq_col_scales).
struct MmqRows {
    const u8* r[2];
};

// The float scale of column c of tile j, from the lane whose row it is (lane 8t + 4c).
FORGE_DEV void mmq_col_scales(const float* own, float (*out)[2]) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        out[j][0] = shfl32f(own[j], 8 * t);
        out[j][1] = shfl32f(own[j], 8 * t + 4);
    }
}

// ---- 32-element blocks (chunk = one block): raw bytes first, expanded just before the mmas ----
// Q8_0 (quants.h's deq32_q8_0 layout): elements 8t..8t+7 are quants 8t..8t+7 (a: 8t..8t+3, b: the
// rest). Q4_0 Q4_1 Q5_0 Q5_1: quant byte 4t + i holds element 4t + i (low nibble) and 16 + 4t + i
// (high); a: those 4 bytes, b: Q5's 32 fifth bits (element e: bit e). dm: f16 d, and m above it.
// MXFP4 (quants.h's deq32_mxfp4 layout): code bytes as Q4_0's quants; dm: the E8M0 exponent.
struct MmqRaw32 {
    u32 a[2], b[2], dm[2];
};

template <int T> struct Mmq32 {
    enum {
        bytes = T == T_Q4_0 ? BYTES_Q4_0 : T == T_Q4_1 ? BYTES_Q4_1 : T == T_Q5_0 ? BYTES_Q5_0
                : BYTES_Q5_1,
        qs = T == T_Q4_0 ? 2 : T == T_Q4_1 ? 4 : T == T_Q5_0 ? 6 : 8,  // quants' offset
        mins = T == T_Q4_1 || T == T_Q5_1,
        q5 = T == T_Q5_0 || T == T_Q5_1,
        mxfp4 = T == T_MXFP4,
    };
};

// AL: Q8_0 rows 8-aligned.
template <int T, bool AL> FORGE_DEV MmqRaw32 mmq_raw32(const MmqRows& p, int s) {
    const int t = threadIdx.x & 3;
    MmqRaw32 r;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (T == T_Q8_0) {
            const u8* q = p.r[j] + 32 * (i64)s + 8 * t;
            const V2 v = AL ? *(const V2*)q : ld8_a2(q);
            r.a[j] = v.x, r.b[j] = v.y;
            r.dm[j] = ld2(p.r[j] - 2 * ((i64)s + 1));
        } else if (Mmq32<T>::mxfp4) {
            r.a[j] = *(const u32*)(p.r[j] + 16 * (i64)s + 4 * t);
            r.b[j] = 0u;
            r.dm[j] = p.r[j][-((i64)s + 1)];
        } else {
            const u8* blk = p.r[j] + (i64)s * Mmq32<T>::bytes;
            r.a[j] = ld4_a2(blk + Mmq32<T>::qs + 4 * t);
            r.b[j] = Mmq32<T>::q5 ? ld4_a2(blk + (T == T_Q5_0 ? 2 : 4)) : 0u;
            r.dm[j] = Mmq32<T>::mins ? *(const u32*)blk : ld2(blk);  // (Q4_1/Q5_1 blocks: 4-aligned)
        }
    }
    return r;
}

template <int T> FORGE_DEV MmqW mmq_expand32(const MmqRaw32& r) {
    const int t = threadIdx.x & 3;
    MmqW w;
    float d[2], m[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (T == T_Q8_0) {
            w.lo[j] = r.a[j], w.hi[j] = r.b[j];
        } else if (Mmq32<T>::mxfp4) {
            e2m1_word(r.a[j], w.lo[j], w.hi[j]);
        } else {
            u32 lo = r.a[j] & M4, hi = (r.a[j] >> 4) & M4;
            if (Mmq32<T>::q5) {
                lo |= bit4_to_bytes(r.b[j] >> (4 * t));
                hi |= bit4_to_bytes(r.b[j] >> (16 + 4 * t));
            }
            if (T == T_Q4_0) lo = bsub(lo, 0x08080808u), hi = bsub(hi, 0x08080808u);
            if (T == T_Q5_0) lo = bsub(lo, 0x10101010u), hi = bsub(hi, 0x10101010u);
            w.lo[j] = lo, w.hi[j] = hi;
        }
        d[j] = Mmq32<T>::mxfp4 ? e8m0_half(r.dm[j]) : h2f((u16)(r.dm[j] & 0xffff));
        m[j] = h2f((u16)(r.dm[j] >> 16));
    }
    mmq_col_scales(d, w.wd);
    if (T != T_Q8_0 && Mmq32<T>::mins) mmq_col_scales(m, w.wm);
    return w;
}

// ---- K-quants: raw loads first, each sub-block's fragments expanded just before its mmas ----
// Q4_K / Q5_K chunk u = sub-blocks 2q, 2q + 1 of super-block b (q = u & 3): quant bytes 32q + 8t
// .. + 7 hold elements 8t..8t+7 of sub-block 2q (low nibbles) and 2q + 1 (high); Q5_K's fifth
// bits are bits 2q / 2q + 1 of qh bytes 8t..8t+7. Scales from each column's super-block header.
struct MmqK45 {
    V2 q[2], qh[2];
    V4 h[2];  // this lane's rows' super-block headers
};

template <int T> FORGE_DEV MmqK45 mmq_k45_load(const MmqRows& p, int u) {
    const int t = threadIdx.x & 3, q = u & 3;
    const i64 at = (i64)(u >> 2) * (T == T_Q4_K ? BYTES_Q4_K : BYTES_Q5_K);
    MmqK45 r;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const u8* blk = p.r[j] + at;
        r.q[j] = *(const V2*)(blk + (T == T_Q4_K ? 16 : 48) + 32 * q + 8 * t);
        r.qh[j] = T == T_Q5_K ? *(const V2*)(blk + 16 + 8 * t) : r.q[j];
        r.h[j] = *(const V4*)blk;
    }
    return r;
}

// Sub-block 2q + k of the chunk loaded in r.
template <int T> FORGE_DEV MmqW mmq_k45_sub(const MmqK45& r, int u, int k) {
    const int sb = 2 * (u & 3) + k;
    MmqW w;
    float d[2], m[2];  // this lane's rows' scale and min factor
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        w.lo[j] = (r.q[j].x >> (4 * k)) & M4, w.hi[j] = (r.q[j].y >> (4 * k)) & M4;
        if (T == T_Q5_K) {
            const u32 o = 0x01010101u;
            w.lo[j] |= ((r.qh[j].x >> sb) & o) << 4, w.hi[j] |= ((r.qh[j].y >> sb) & o) << 4;
        }
        const V4 h = r.h[j];
        int sc, mi;
        k4_sm(h.y, h.z, h.w, sb, &sc, &mi);
        d[j] = h2f((u16)(h.x & 0xffff)) * (float)sc;
        m[j] = -h2f((u16)(h.x >> 16)) * (float)mi;
    }
    mmq_col_scales(d, w.wd);
    mmq_col_scales(m, w.wm);
    return w;
}

// Q6_K chunk u = half h = u & 1 of block b = u >> 1 (quants.h's deq32_q6_k layout): its four
// 32-element runs c (sub-blocks 8b + 4h + c), element l of run c from ql[64h + 32 (c & 1) + l]
// (low nibble for c < 2, else high) and bits 2c, 2c + 1 of qh[32h + l]; lane t takes l = 4t.. (mma
// 0, scale 8h + 2c) and 16 + 4t.. (mma 1, scale 8h + 2c + 1).
struct MmqQ6 {
    u32 a0[2], a1[2], c0[2], c1[2], h0[2], h1[2];
    V2 sc[2];  // the half's 8 scales of this lane's rows
    float d[2];
};

FORGE_DEV MmqQ6 mmq_q6_k_load(const MmqRows& p, int u) {
    const int t = threadIdx.x & 3, b = u >> 1, h = u & 1;
    MmqQ6 r;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const u8* ql = p.r[j] + 192 * (i64)b + 64 * h + 4 * t;
        const u8* qh = p.r[j] + 192 * (i64)b + 128 + 32 * h + 4 * t;
        r.a0[j] = ld4_a2(ql), r.a1[j] = ld4_a2(ql + 16);
        r.c0[j] = ld4_a2(ql + 32), r.c1[j] = ld4_a2(ql + 48);
        r.h0[j] = ld4_a2(qh), r.h1[j] = ld4_a2(qh + 16);
        const u8* aux = p.r[j] - 18 * ((i64)b + 1);
        r.sc[j] = ld8_a2(aux + 8 * h);
        r.d[j] = h2f(ld2(aux + 16));
    }
    return r;
}

FORGE_DEV MmqW mmq_q6_k_run(const MmqQ6& r, int c) {
    const u32 o = 0x03030303u, k = 0x20202020u;
    MmqW w;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const u32 l0 = (c & 1) ? r.c0[j] : r.a0[j], l1 = (c & 1) ? r.c1[j] : r.a1[j];
        const int sh = 4 * (c >> 1);
        w.lo[j] = bsub(((l0 >> sh) & M4) | (((r.h0[j] >> (2 * c)) & o) << 4), k);
        w.hi[j] = bsub(((l1 >> sh) & M4) | (((r.h1[j] >> (2 * c)) & o) << 4), k);
        const u32 word = (c < 2 ? r.sc[j].x : r.sc[j].y) >> (16 * (c & 1));
        const int t = threadIdx.x & 3;  // the scales of columns 2t, 2t + 1: lanes 8t, 8t + 4
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const u32 sw = shfl32(word, 8 * t + 4 * e);
            w.sl[j][e] = (int)(i8)(sw & 255);
            w.sh[j][e] = (int)(i8)((sw >> 8) & 255);
        }
    }
    mmq_col_scales(r.d, w.wd);
    return w;
}

// This warp's chunks kw, kw + ks, ... of the 16 rows in p, added to acc (x: the copy the type
// reads). The raw bytes of MMQ_AHEAD32 (K-quants: MMQ_AHEAD) chunks are loaded before any is
// multiplied, so their loads overlap (one chunk's 8 or 16 bytes per lane leave the memory system
// idle: the output head ran at 1.25 TB/s).
#ifndef MMQ_AHEAD32
#define MMQ_AHEAD32 2
#endif
#ifndef MMQ_AHEAD
#define MMQ_AHEAD 1
#endif
template <int MT, int T, bool AL = false>
FORGE_DEV void mmq_loop32(const MmqRows& p, int units, int kw, int ks, const XQ& x,
                          const int* xo, float (*acc)[2][4]) {
    constexpr bool contig = T == T_Q8_0, mins = T != T_Q8_0 && Mmq32<T>::mins;
    constexpr int S = MMQ_AHEAD32;
    if (!((MMQ_MASK >> T) & 1)) return;
    int s = kw;
    for (; s + (S - 1) * ks < units; s += S * ks) {
        MmqRaw32 r[S];
#pragma unroll
        for (int i = 0; i < S; ++i) r[i] = mmq_raw32<T, AL>(p, s + i * ks);
#pragma unroll
        for (int i = 0; i < S; ++i)
            mmq_block<MT, contig, mins, false>(x, xo, s + i * ks, mmq_expand32<T>(r[i]), acc);
    }
    for (; s < units; s += ks)
        mmq_block<MT, contig, mins, false>(x, xo, s, mmq_expand32<T>(mmq_raw32<T, AL>(p, s)), acc);
}

template <int MT, int T>
FORGE_DEV void mmq_loop_k45(const MmqRows& p, int units, int kw, int ks, const XQ& x,
                            const int* xo, float (*acc)[2][4]) {
    constexpr int S = MMQ_AHEAD;
    if (!((MMQ_MASK >> T) & 1)) return;
    int u = kw;
    for (; u + (S - 1) * ks < units; u += S * ks) {
        MmqK45 r[S];
#pragma unroll
        for (int i = 0; i < S; ++i) r[i] = mmq_k45_load<T>(p, u + i * ks);
#pragma unroll
        for (int i = 0; i < S; ++i) {
            const int v = u + i * ks;
            mmq_block<MT, true, true, false>(x, xo, 2 * v, mmq_k45_sub<T>(r[i], v, 0), acc);
            mmq_block<MT, true, true, false>(x, xo, 2 * v + 1, mmq_k45_sub<T>(r[i], v, 1), acc);
        }
    }
    for (; u < units; u += ks) {
        const MmqK45 r = mmq_k45_load<T>(p, u);
        mmq_block<MT, true, true, false>(x, xo, 2 * u, mmq_k45_sub<T>(r, u, 0), acc);
        mmq_block<MT, true, true, false>(x, xo, 2 * u + 1, mmq_k45_sub<T>(r, u, 1), acc);
    }
}

template <int MT>
FORGE_DEV void mmq_loop_q6_k(const MmqRows& p, int units, int kw, int ks, const XQ& x,
                             const int* xo, float (*acc)[2][4]) {
    constexpr int S = MMQ_AHEAD;
    if (!((MMQ_MASK >> T_Q6_K) & 1)) return;
    int u = kw;
    for (; u + (S - 1) * ks < units; u += S * ks) {
        MmqQ6 r[S];
#pragma unroll
        for (int i = 0; i < S; ++i) r[i] = mmq_q6_k_load(p, u + i * ks);
#pragma unroll
        for (int i = 0; i < S; ++i) {
#pragma unroll
            for (int c = 0; c < 4; ++c)
                mmq_block<MT, false, false, true>(x, xo, 4 * (u + i * ks) + c, mmq_q6_k_run(r[i], c),
                                                  acc);
        }
    }
    for (; u < units; u += ks) {
        const MmqQ6 r = mmq_q6_k_load(p, u);
#pragma unroll
        for (int c = 0; c < 4; ++c)
            mmq_block<MT, false, false, true>(x, xo, 4 * u + c, mmq_q6_k_run(r, c), acc);
    }
}

// Rows n0 .. n0 + 15 of m times every x row, over this warp's chunks, added to acc.
template <int MT>
FORGE_DEV void mmq_rows(const MvMat& m, int n0, int kw, int ks, const XQ& x1, const XQ& x2,
                        const int* xo, float (*acc)[2][4]) {
    const int g = (threadIdx.x & 31) >> 2, K = m.K;
    MmqRows p;
#pragma unroll
    for (int j = 0; j < 2; ++j) p.r[j] = m.W + (i64)min(n0 + 8 * j + g, m.N - 1) * m.row_bytes;
    switch (m.type) {
        case T_Q4_0: mmq_loop32<MT, T_Q4_0>(p, K / 32, kw, ks, x1, xo, acc); break;
        case T_Q4_1: mmq_loop32<MT, T_Q4_1>(p, K / 32, kw, ks, x1, xo, acc); break;
        case T_Q5_0: mmq_loop32<MT, T_Q5_0>(p, K / 32, kw, ks, x1, xo, acc); break;
        case T_Q5_1: mmq_loop32<MT, T_Q5_1>(p, K / 32, kw, ks, x1, xo, acc); break;
#if defined(FORGE_MXFP4)  // (moe.hip only: no dense product reads MXFP4)
        case T_MXFP4: mmq_loop32<MT, T_MXFP4>(p, K / 32, kw, ks, x1, xo, acc); break;
#endif
        case T_Q8_0:
            if (((u64)m.W | (u64)m.row_bytes) % 8 == 0) {
                mmq_loop32<MT, T_Q8_0, true>(p, K / 32, kw, ks, x1, xo, acc);
            } else {
                mmq_loop32<MT, T_Q8_0, false>(p, K / 32, kw, ks, x1, xo, acc);
            }
            break;
        case T_Q4_K: mmq_loop_k45<MT, T_Q4_K>(p, K / 64, kw, ks, x2, xo, acc); break;
        case T_Q5_K: mmq_loop_k45<MT, T_Q5_K>(p, K / 64, kw, ks, x2, xo, acc); break;
        case T_Q6_K: mmq_loop_q6_k<MT>(p, K / 128, kw, ks, x2, xo, acc); break;
        default:  // not an mmq type (forge_hip.plan.MMQ_TYPES): a visible NaN, never a silent 0
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][j][e] = bits_to_float(0x7fc00000u);
            break;
    }
}
