// mmv.h: the decode units of mmv.hip. A unit is one lane's share of one weight row for one step:
// a few bytes of one GGML block, multiplied by activations quantized to int8 (blocks of 32 with a
// float scale and the sum of their int8 values, see mmv.hip's quantizer) with integer dot
// products. Lanes of a row take units u = lane, lane + G, ..., so neighbouring lanes read
// neighbouring bytes. Each unit adds its share of row . x[r] to acc[r] for the R <= RM rows of x.
//
// Units per row (element k of a row sits in exactly one unit):
//   Q4_0 Q4_1 Q5_0 Q5_1: K/16 (2 per block: 8 bytes of quants each)    Q8_0: K/16 (2 per block)
//   Q4_K: K/64 (4 per super-block: 32 bytes of quants each)   Q5_K: K/32 (8 per super-block: 16
//   bytes of quants each)   Q6_K: K/32 (8 per block)
//   Q2_K Q3_K: K/32 (one 32-element chunk, decoded to floats)   MXFP4: K/16 (as Q4_0)
// Plain C++ under FORGE_HOST too, so that tests/test_hip_mmv_host.py checks the units on the CPU.
#pragma once
#include "glu_act.h"
#include "mat_desc.h"
#include "quants.h"

struct alignas(16) V4 { u32 x, y, z, w; };
struct alignas(8) V2 { u32 x, y; };
struct alignas(16) F4 { float x, y, z, w; };
struct alignas(8) F2 { float x, y; };

// ---- descriptors (contract.h's layout), shared by mmv.hip and mmq.hip ----

typedef MatDesc<float> MvMat;  // (x: float32 activations)

FORGE_DEV MvMat mv_mat(const i64* d) { return mat_desc<float>(d); }

// Item w: matrix m (among nmat from `first`) and its row group j; false past the last item.
FORGE_DEV bool mvq_item(const i64* descs, int first, int nmat, int RB, int w, MvMat* m, int* j) {
    for (int c = 0; c < nmat; ++c) {
        *m = mv_mat(descs + (i64)(first + c) * DESC_LEN);
        const int items = (m->N + RB - 1) / RB;
        if (w < items) {
            *j = w;
            return true;
        }
        w -= items;
    }
    return false;
}

#if !defined(FORGE_HOST)
// Start moving `bytes` at p into L2 (the whole block shares the work).
FORGE_DEV void mvq_prefetch(const u8* p, i64 bytes) {
#if defined(FORGE_NV)
    for (i64 o = (i64)threadIdx.x * 128; o < bytes; o += (i64)blockDim.x * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
    }
#else
    (void)p;
    (void)bytes;
#endif
}

// The weight rows of item w (mvq_item's numbering; glu: the up matrix's too) into L2.
FORGE_DEV void mvq_prefetch_item(const i64* descs, int first, int nmat, bool glu, int RB,
                                 int w) {
    MvMat m;
    int j;
    if (!mvq_item(descs, first, nmat, RB, w, &m, &j)) return;
    const int rows = min(RB, m.N - j * RB);
    mvq_prefetch(m.W + (i64)j * RB * m.row_bytes, (i64)rows * m.row_bytes);
    if (glu) {
        const MvMat u = mv_mat(descs + (i64)(first + 1) * DESC_LEN);
        mvq_prefetch(u.W + (i64)j * RB * u.row_bytes, (i64)rows * u.row_bytes);
    }
}
#endif

// Quantized activations: row r of x is q[r * K ...], the {scale, sum of q} of its 32-blocks
// ds[r * K/32 ...].
struct XQ {
    const i8* q;
    const F2* ds;
    int K;
};

#define M4 0x0f0f0f0fu

FORGE_DEV int dp4a(u32 a, u32 b, int c) {  // c + signed byte dot product of a and b
#if defined(FORGE_NV)
    return __dp4a((int)a, (int)b, c);
#elif defined(FORGE_AMD) && (defined(__gfx90a__) || defined(__gfx908__) || defined(__gfx906__) || \
                             defined(__gfx1030__))
    return __builtin_amdgcn_sdot4((int)a, (int)b, c, false);
#else
    for (int s = 0; s < 32; s += 8) c += (int)(i8)(a >> s) * (int)(i8)(b >> s);
    return c;
#endif
}

FORGE_DEV u32 fshr(u32 lo, u32 hi, u32 s) {  // low word of (hi:lo) >> s, s in 0..31
#if defined(FORGE_NV)
    return __funnelshift_r(lo, hi, s);
#else
    return (u32)((((u64)hi << 32) | lo) >> s);
#endif
}

FORGE_DEV u32 ld2(const u8* p) { return *(const u16*)p; }  // 2-aligned

// 4 bytes at a 2-aligned address, from aligned words only (never past the word holding p[3]).
FORGE_DEV u32 ld4_a2(const u8* p) {
    const u64 a = (u64)p;
    const u32* w = (const u32*)(a & ~(u64)3);
    const u32 s = (u32)(a & 2) * 8;
    return fshr(w[0], w[s ? 1 : 0], s);
}

// 8 bytes at a 2-aligned address, from two aligned 8-byte loads (the second is the first again
// when p is 8-aligned, so nothing past p[7] is read).
FORGE_DEV V2 ld8_a2(const u8* p) {
    const u64 a = (u64)p;
    const V2* w = (const V2*)(a & ~(u64)7);
    const V2 lo = w[0], hi = w[(a & 7) ? 1 : 0];
    const u32 s = (u32)(a & 3) * 8;
    const bool up = (a & 4) != 0;
    const u32 w0 = up ? lo.y : lo.x, w1 = up ? hi.x : lo.y, w2 = up ? hi.y : hi.x;
    V2 v;
    v.x = fshr(w0, w1, s);
    v.y = fshr(w1, w2, s);
    return v;
}

FORGE_DEV int dot16(const V4& w, const V4& x) {  // 16 signed bytes . 16 signed bytes
    return dp4a(w.x, x.x, dp4a(w.y, x.y, dp4a(w.z, x.z, dp4a(w.w, x.w, 0))));
}

// Bytewise v - k for bytes v < 128, k <= 128 (no borrow between bytes), as signed bytes.
FORGE_DEV u32 bsub(u32 v, u32 k) { return ((v | 0x80808080u) - k) ^ 0x80808080u; }

// The low 4 bits of v as bit 4 of 4 bytes (bit j -> byte j).
FORGE_DEV u32 bit4_to_bytes(u32 v) { return ((v & 15u) * 0x00204081u & 0x01010101u) << 4; }

// ---- 32-element blocks: Q4_0 Q4_1 Q5_0 Q5_1 (2 units per block) ----
// Unit i of a block holds quants qs[8i .. 8i+7]: elements 8i..8i+7 (low nibbles) and
// 16+8i..16+8i+7 (high nibbles).

// Adds d * d8 * dot + (first unit of the block) m * d8 * sum(q8) for each row of x.
template <int RM>
FORGE_DEV void unit32_add(const XQ& x, int b, int i, u32 w0, u32 w1, u32 w2, u32 w3, float d,
                          float m, int R, float* acc) {
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (RM == 1 || r < R) {  // (R is 1 when RM is)
            const i8* xr = x.q + (i64)r * x.K + 32 * b + 8 * i;
            const V2 xl = *(const V2*)xr, xh = *(const V2*)(xr + 16);
            const int s = dp4a(w0, xl.x, dp4a(w1, xl.y, dp4a(w2, xh.x, dp4a(w3, xh.y, 0))));
            const F2 ds = x.ds[(i64)r * (x.K / 32) + b];
            acc[r] += ds.x * (d * (float)s + (i == 0 ? m * ds.y : 0.0f));
        }
    }
}

// A unit in two halves: ld_T() reads its weight bytes, add_T() does the arithmetic. mmv.hip loads
// every unit of a step before it uses any, so their memory latencies overlap.
struct Ld32 {  // a 32-element-block unit: quants (or their low bits), high bits, scales
    V2 q;
    u32 qh;
    float d, m;
};

FORGE_DEV Ld32 ld_q4_0(const u8* row, int u) {
    const u8* blk = row + (i64)(u >> 1) * BYTES_Q4_0;
    Ld32 w;
    w.q = ld8_a2(blk + 2 + 8 * (u & 1));
    w.qh = 0u;
    w.d = h2f(ld2(blk));
    w.m = 0.0f;
    return w;
}
template <int RM>
FORGE_DEV void add_q4_0(const Ld32& w, int u, const XQ& x, int R, float* acc) {
    const u32 k = 0x08080808u;
    unit32_add<RM>(x, u >> 1, u & 1, bsub(w.q.x & M4, k), bsub(w.q.y & M4, k),
                   bsub((w.q.x >> 4) & M4, k), bsub((w.q.y >> 4) & M4, k), w.d, 0.0f, R, acc);
}

FORGE_DEV Ld32 ld_q4_1(const u8* row, int u) {
    const u8* blk = row + (i64)(u >> 1) * BYTES_Q4_1;
    Ld32 w;
    w.q = ld8_a2(blk + 4 + 8 * (u & 1));
    w.qh = 0u;
    w.d = h2f(ld2(blk));
    w.m = h2f(ld2(blk + 2));
    return w;
}
template <int RM>
FORGE_DEV void add_q4_1(const Ld32& w, int u, const XQ& x, int R, float* acc) {
    unit32_add<RM>(x, u >> 1, u & 1, w.q.x & M4, w.q.y & M4, (w.q.x >> 4) & M4,
                   (w.q.y >> 4) & M4, w.d, w.m, R, acc);
}

FORGE_DEV Ld32 ld_q5_0(const u8* row, int u) {
    const u8* blk = row + (i64)(u >> 1) * BYTES_Q5_0;
    Ld32 w;
    w.qh = ld4_a2(blk + 2);
    w.q = ld8_a2(blk + 6 + 8 * (u & 1));
    w.d = h2f(ld2(blk));
    w.m = 0.0f;
    return w;
}
template <int RM>
FORGE_DEV void add_q5_0(const Ld32& w, int u, const XQ& x, int R, float* acc) {
    const int i = u & 1;
    const u32 hl = w.qh >> (8 * i), hh = w.qh >> (16 + 8 * i), k = 0x10101010u;
    unit32_add<RM>(x, u >> 1, i, bsub((w.q.x & M4) | bit4_to_bytes(hl), k),
                   bsub((w.q.y & M4) | bit4_to_bytes(hl >> 4), k),
                   bsub(((w.q.x >> 4) & M4) | bit4_to_bytes(hh), k),
                   bsub(((w.q.y >> 4) & M4) | bit4_to_bytes(hh >> 4), k), w.d, 0.0f, R, acc);
}

FORGE_DEV Ld32 ld_q5_1(const u8* row, int u) {
    const u8* blk = row + (i64)(u >> 1) * BYTES_Q5_1;
    Ld32 w;
    w.qh = ld4_a2(blk + 4);
    w.q = ld8_a2(blk + 8 + 8 * (u & 1));
    w.d = h2f(ld2(blk));
    w.m = h2f(ld2(blk + 2));
    return w;
}
template <int RM>
FORGE_DEV void add_q5_1(const Ld32& w, int u, const XQ& x, int R, float* acc) {
    const int i = u & 1;
    const u32 hl = w.qh >> (8 * i), hh = w.qh >> (16 + 8 * i);
    unit32_add<RM>(x, u >> 1, i, (w.q.x & M4) | bit4_to_bytes(hl),
                   (w.q.y & M4) | bit4_to_bytes(hl >> 4), ((w.q.x >> 4) & M4) | bit4_to_bytes(hh),
                   ((w.q.y >> 4) & M4) | bit4_to_bytes(hh >> 4), w.d, w.m, R, acc);
}

// MXFP4 (quants.h's deq32_mxfp4 layout, codes 16-byte aligned): unit u = codes 8 (u & 1) .. + 7
// of block u / 2, the Q4_0 element order.

// The 8 E2M1 codes of a word of MXFP4 code bytes (byte j: element j in its low nibble, element
// 16 + j in its high one) as e2m1_twice's int8 values: lo = elements 0..3, hi = 16..19. On NVIDIA
// byte permutes look the codes up: per 16 bits, the magnitudes from a positive and a negative
// table, then per byte the one the code's sign picks, then the bytes sorted by element.
FORGE_DEV void e2m1_word(u32 q, u32& lo, u32& hi) {
#if defined(FORGE_NV)
    u32 v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 c = q >> (16 * h), sel = c & 0x7777u;  // 4 codes' magnitude indices
        const u32 pos = __byte_perm(0x03020100u, 0x0c080604u, sel);
        const u32 neg = __byte_perm(0xfdfeff00u, 0xf4f8fafcu, sel);
        v[h] = __byte_perm(pos, neg, 0x3210u | ((c & 0x8888u) >> 1));
    }
    lo = __byte_perm(v[0], v[1], 0x6420u);
    hi = __byte_perm(v[0], v[1], 0x7531u);
#else
    lo = hi = 0u;
    for (int b = 0; b < 4; ++b) {
        const u32 c = q >> (8 * b);
        lo |= (u32)(e2m1_twice(c & 0xfu) & 255) << (8 * b);
        hi |= (u32)(e2m1_twice((c >> 4) & 0xfu) & 255) << (8 * b);
    }
#endif
}

FORGE_DEV Ld32 ld_mxfp4(const u8* row, int u) {
    Ld32 w;
    w.q = *(const V2*)(row + 16 * (i64)(u >> 1) + 8 * (u & 1));
    w.qh = 0u;
    w.d = e8m0_half(row[-((i64)(u >> 1) + 1)]);
    w.m = 0.0f;
    return w;
}
template <int RM>
FORGE_DEV void add_mxfp4(const Ld32& w, int u, const XQ& x, int R, float* acc) {
    u32 w0, w1, w2, w3;
    e2m1_word(w.q.x, w0, w2);
    e2m1_word(w.q.y, w1, w3);
    unit32_add<RM>(x, u >> 1, u & 1, w0, w1, w2, w3, w.d, 0.0f, R, acc);
}

// Q8_0 (quants.h's deq32_q8_0 layout): unit u = quants 16u .. 16u+15 (half of block u/2), loaded
// as two 8-byte words: ld_q8_0 where rows are 8-aligned (K % 128 == 0), ld_q8_0u (ld8_a2) for
// 2-aligned ones; separate loaders keep the aligned path free of the other's registers.
struct LdQ8 {
    V4 q;
    float d;
};

FORGE_DEV LdQ8 q8_0_unit(V2 a, V2 b, const u8* row, int u) {  // quants a:b, then the scale
    LdQ8 w;
    w.q.x = a.x, w.q.y = a.y, w.q.z = b.x, w.q.w = b.y;
    w.d = h2f(ld2(row - 2 * ((i64)(u >> 1) + 1)));
    return w;
}
FORGE_DEV LdQ8 ld_q8_0(const u8* row, int u) {
    const V2* p = (const V2*)(row + 16 * (i64)u);
    return q8_0_unit(p[0], p[1], row, u);
}
FORGE_DEV LdQ8 ld_q8_0u(const u8* row, int u) {
    return q8_0_unit(ld8_a2(row + 16 * (i64)u), ld8_a2(row + 16 * (i64)u + 8), row, u);
}
template <int RM>
FORGE_DEV void add_q8_0(const LdQ8& w, int u, const XQ& x, int R, float* acc) {
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (RM == 1 || r < R) {
            const V4 xv = *(const V4*)(x.q + (i64)r * x.K + 16 * u);
            acc[r] += w.d * x.ds[(i64)r * (x.K / 32) + (u >> 1)].x * (float)dot16(w.q, xv);
        }
    }
}

// ---- K-quants (super-blocks of 256 = 8 sub-blocks of 32) ----

// 6-bit scale and min of sub-block j of Q4_K/Q5_K from the 12 scale bytes as words s0, s1, s2.
FORGE_DEV void k4_sm(u32 s0, u32 s1, u32 s2, int j, int* sc, int* m) {
    const int t = 8 * (j & 3);
    const u32 b0 = s0 >> t, b1 = s1 >> t, b2 = s2 >> t;
    const bool lo = j < 4;  // selects, not branches: lanes of a warp take both kinds
    *sc = (int)(lo ? b0 & 63 : (b2 & 15) | ((b0 >> 2) & 48));
    *m = (int)(lo ? b1 & 63 : ((b2 >> 4) & 15) | ((b1 >> 2) & 48));
}

// Q5_K unit i (0..7) of a super-block: quants of sub-blocks 2p (wa) and 2p+1 (wb), p = i/2,
// elements l0..l0+15 of each (l0 = 16 (i & 1)); the first unit of a pair adds the two mins.
template <int RM>
FORGE_DEV void unitk_add(const XQ& x, int b, int i, const V4& h, const V4& wa, const V4& wb, int R,
                         float* acc) {
    const int p = i >> 1, l0 = 16 * (i & 1);
    int sca, ma, scb, mb;
    k4_sm(h.y, h.z, h.w, 2 * p, &sca, &ma);
    k4_sm(h.y, h.z, h.w, 2 * p + 1, &scb, &mb);
    const float d = h2f((u16)(h.x & 0xffff)), dmin = h2f((u16)(h.x >> 16));
    const float mins = (i & 1) ? 0.0f : dmin;
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (RM == 1 || r < R) {
            const i8* xr = x.q + (i64)r * x.K + 256 * b + 64 * p + l0;
            const V4 xa = *(const V4*)xr, xb = *(const V4*)(xr + 32);
            const int da = dot16(wa, xa), db = dot16(wb, xb);
            // {scale, sum a, scale, sum b}: one scale per 256 (activations rounded like Q8_K)
            const F4 ds = *(const F4*)(x.ds + (i64)r * (x.K / 32) + 8 * b + 2 * p);
            const float v = d * (float)(sca * da + scb * db) -
                             mins * ((float)ma * ds.y + (float)mb * ds.w);
            acc[r] += ds.x * v;
        }
    }
}

// Q4_K unit p (0..3) of a super-block: its quant bytes 32p .. 32p+31, whose low nibbles are
// sub-block 2p and high nibbles sub-block 2p+1 (all 32 elements of each): one scale decode per
// 64 elements.
struct LdK4 {  // the super-block header (d, dmin, scales) and the unit's 32 quant bytes
    V4 h, q0, q1;
};

FORGE_DEV LdK4 ld_q4_k(const u8* row, int u) {
    const u8* blk = row + (i64)(u >> 2) * BYTES_Q4_K;  // 16-aligned: rows are whole 144-byte blocks
    LdK4 w;
    w.h = *(const V4*)blk;
    w.q0 = *(const V4*)(blk + 16 + 32 * (u & 3));
    w.q1 = *(const V4*)(blk + 32 + 32 * (u & 3));
    return w;
}
template <int RM>
FORGE_DEV void add_q4_k(const LdK4& w, int u, const XQ& x, int R, float* acc) {
    const int b = u >> 2, p = u & 3;
    int sca, ma, scb, mb;
    k4_sm(w.h.y, w.h.z, w.h.w, 2 * p, &sca, &ma);
    k4_sm(w.h.y, w.h.z, w.h.w, 2 * p + 1, &scb, &mb);
    const float d = h2f((u16)(w.h.x & 0xffff)), dmin = h2f((u16)(w.h.x >> 16));
    V4 a0, a1, b0, b1;  // sub-block 2p (low nibbles) and 2p+1 (high), elements 0-15 and 16-31
    a0.x = w.q0.x & M4, a0.y = w.q0.y & M4, a0.z = w.q0.z & M4, a0.w = w.q0.w & M4;
    a1.x = w.q1.x & M4, a1.y = w.q1.y & M4, a1.z = w.q1.z & M4, a1.w = w.q1.w & M4;
    b0.x = (w.q0.x >> 4) & M4, b0.y = (w.q0.y >> 4) & M4, b0.z = (w.q0.z >> 4) & M4;
    b0.w = (w.q0.w >> 4) & M4;
    b1.x = (w.q1.x >> 4) & M4, b1.y = (w.q1.y >> 4) & M4, b1.z = (w.q1.z >> 4) & M4;
    b1.w = (w.q1.w >> 4) & M4;
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (RM == 1 || r < R) {
            const V4* xr = (const V4*)(x.q + (i64)r * x.K + 256 * b + 64 * p);
            const int da = dot16(a0, xr[0]) + dot16(a1, xr[1]);
            const int db = dot16(b0, xr[2]) + dot16(b1, xr[3]);
            // {scale, sum 2p, scale, sum 2p+1}: one scale per 256 (activations rounded like Q8_K)
            const F4 ds = *(const F4*)(x.ds + (i64)r * (x.K / 32) + 8 * b + 2 * p);
            const float v =
                d * (float)(sca * da + scb * db) - dmin * ((float)ma * ds.y + (float)mb * ds.w);
            acc[r] += ds.x * v;
        }
    }
}

template <int RM> FORGE_DEV void unit_q5_k(const u8* row, int u, const XQ& x, int R, float* acc) {
    const int b = u >> 3, i = u & 7, p = i >> 1;
    const u8* blk = row + (i64)b * BYTES_Q5_K;  // 176 bytes: 16-aligned too
    const V4 h = *(const V4*)blk;
    const V4 qh = *(const V4*)(blk + 16 + 16 * (i & 1));
    const V4 q = *(const V4*)(blk + 48 + 16 * i);
    const int sa = 2 * p, sb = 2 * p + 1;
    const u32 o = 0x01010101u;
    V4 wa, wb;
    wa.x = (q.x & M4) | (((qh.x >> sa) & o) << 4), wa.y = (q.y & M4) | (((qh.y >> sa) & o) << 4);
    wa.z = (q.z & M4) | (((qh.z >> sa) & o) << 4), wa.w = (q.w & M4) | (((qh.w >> sa) & o) << 4);
    wb.x = ((q.x >> 4) & M4) | (((qh.x >> sb) & o) << 4);
    wb.y = ((q.y >> 4) & M4) | (((qh.y >> sb) & o) << 4);
    wb.z = ((q.z >> 4) & M4) | (((qh.z >> sb) & o) << 4);
    wb.w = ((q.w >> 4) & M4) | (((qh.w >> sb) & o) << 4);
    unitk_add<RM>(x, b, i, h, wa, wb, R, acc);
}

// Q6_K unit j (0..7) of a block (quants.h's deq32_q6_k layout): elements l0 .. l0+7 (l0 = 8 (j &
// 3)) of the four 32-element chunks of half h = j >> 2, i.e. ql[64h + l0 ..] (chunk 0 low nibbles,
// chunk 2 high), ql[64h + 32 + l0 ..] (chunks 1 and 3) and the two high bits of all four from
// qh[32h + l0 ..]; chunk c's scale is scales[8h + l0/16 + 2c]. ld_q6_k where rows are 8-aligned
// (K % 1024 == 0: three aligned 8-byte quant loads), ld_q6_ku (ld8_a2) for 2-aligned ones.
struct LdK6 {  // the unit's low bits (two 8-byte runs), high bits, its half's 8 scales, and d
    V2 qa, qc, qh, sc;
    float d;
};

FORGE_DEV LdK6 q6_k_unit(V2 qa, V2 qc, V2 qh, const u8* row, int u) {  // quants, then scales, d
    const u8* aux = row - 18 * ((i64)(u >> 3) + 1);
    LdK6 w;
    w.qa = qa, w.qc = qc, w.qh = qh;
    w.sc = ld8_a2(aux + 8 * ((u >> 2) & 1));
    w.d = h2f(ld2(aux + 16));
    return w;
}
// The unit's ql run (chunks 0 and 2); chunks 1 and 3 are 32 bytes on, the high bits at +qh_at().
FORGE_DEV const u8* q6_k_ql(const u8* row, int u) {
    return row + 192 * (i64)(u >> 3) + 64 * ((u >> 2) & 1) + 8 * (u & 3);
}
FORGE_DEV int q6_k_qh_at(int u) { return 128 - 32 * ((u >> 2) & 1); }
FORGE_DEV LdK6 ld_q6_k(const u8* row, int u) {
    const u8* q = q6_k_ql(row, u);
    const V2* p = (const V2*)q;
    return q6_k_unit(p[0], p[4], *(const V2*)(q + q6_k_qh_at(u)), row, u);
}
FORGE_DEV LdK6 ld_q6_ku(const u8* row, int u) {
    const u8* q = q6_k_ql(row, u);
    return q6_k_unit(ld8_a2(q), ld8_a2(q + 32), ld8_a2(q + q6_k_qh_at(u)), row, u);
}
template <int RM>
FORGE_DEV void add_q6_k(const LdK6& w, int u, const XQ& x, int R, float* acc) {
    const int b = u >> 3, h = (u >> 2) & 1, l0 = 8 * (u & 3);
    const u32 o = 0x03030303u, k = 0x20202020u;
    u32 g[4][2];  // chunks 0..3: 8 signed 6-bit values each
    g[0][0] = bsub((w.qa.x & M4) | ((w.qh.x & o) << 4), k);
    g[0][1] = bsub((w.qa.y & M4) | ((w.qh.y & o) << 4), k);
    g[1][0] = bsub((w.qc.x & M4) | (((w.qh.x >> 2) & o) << 4), k);
    g[1][1] = bsub((w.qc.y & M4) | (((w.qh.y >> 2) & o) << 4), k);
    g[2][0] = bsub(((w.qa.x >> 4) & M4) | (((w.qh.x >> 4) & o) << 4), k);
    g[2][1] = bsub(((w.qa.y >> 4) & M4) | (((w.qh.y >> 4) & o) << 4), k);
    g[3][0] = bsub(((w.qc.x >> 4) & M4) | (((w.qh.x >> 6) & o) << 4), k);
    g[3][1] = bsub(((w.qc.y >> 4) & M4) | (((w.qh.y >> 6) & o) << 4), k);
    const u32 sw = (l0 >> 4) ? (w.sc.x >> 8) | (w.sc.y << 24) : w.sc.x;  // scales from l0/16 on
    const u32 sv = (l0 >> 4) ? w.sc.y >> 8 : w.sc.y;
    const int s0 = (int)(i8)(sw & 255), s1 = (int)(i8)((sw >> 16) & 255);
    const int s2 = (int)(i8)(sv & 255), s3 = (int)(i8)((sv >> 16) & 255);
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (RM == 1 || r < R) {
            const i8* xr = x.q + (i64)r * x.K + 256 * b + 128 * h + l0;
            const V2 x0 = *(const V2*)xr, x1 = *(const V2*)(xr + 32);
            const V2 x2 = *(const V2*)(xr + 64), x3 = *(const V2*)(xr + 96);
            const int s = s0 * dp4a(g[0][0], x0.x, dp4a(g[0][1], x0.y, 0)) +
                          s1 * dp4a(g[1][0], x1.x, dp4a(g[1][1], x1.y, 0)) +
                          s2 * dp4a(g[2][0], x2.x, dp4a(g[2][1], x2.y, 0)) +
                          s3 * dp4a(g[3][0], x3.x, dp4a(g[3][1], x3.y, 0));
            acc[r] += x.ds[(i64)r * (x.K / 32) + 8 * b].x * w.d * (float)s;
        }
    }
}

// unit_T: both halves at once (row tails and the host tests call these).
#define MVQ_UNIT(T)                                                                     \
    template <int RM>                                                                   \
    FORGE_DEV void unit_##T(const u8* row, int u, const XQ& x, int R, float* acc) {     \
        add_##T<RM>(ld_##T(row, u), u, x, R, acc);                                      \
    }
MVQ_UNIT(q4_0)
MVQ_UNIT(q4_1)
MVQ_UNIT(q5_0)
MVQ_UNIT(q5_1)
MVQ_UNIT(q8_0)
MVQ_UNIT(q4_k)
MVQ_UNIT(q6_k)
MVQ_UNIT(mxfp4)
// T: type B's units through B's 2-aligned loader ld_T (same arithmetic, add_B).
#define MVQ_UNIT_U(T, B)                                                                \
    template <int RM>                                                                   \
    FORGE_DEV void add_##T(const decltype(ld_##B(nullptr, 0))& w, int u, const XQ& x,   \
                           int R, float* acc) {                                         \
        add_##B<RM>(w, u, x, R, acc);                                                   \
    }                                                                                   \
    MVQ_UNIT(T)
MVQ_UNIT_U(q8_0u, q8_0)
MVQ_UNIT_U(q6_ku, q6_k)

// Any quantized type through its float decoder (quants.h): unit c = elements 32c .. 32c+31.
#define MVQ_UNIT_DEQ(T)                                                                        \
    template <int RM>                                                                          \
    FORGE_DEV void unit_##T(const u8* row, int c, const XQ& x, int R, float* acc) {            \
        float v[32];                                                                           \
        deq32_##T(row, c, v);                                                                  \
        _Pragma("unroll") for (int r = 0; r < RM; ++r) {                                       \
            if (r < R) {                                                                       \
                const V4* xr = (const V4*)(x.q + (i64)r * x.K + 32 * c);                       \
                float s = 0.0f;                                                                \
                _Pragma("unroll") for (int w = 0; w < 8; ++w) {                                \
                    const V4 q4 = xr[w / 4];                                                   \
                    const u32 q = (w & 3) == 0   ? q4.x                                        \
                                  : (w & 3) == 1 ? q4.y                                        \
                                  : (w & 3) == 2 ? q4.z                                        \
                                                 : q4.w;                                       \
                    _Pragma("unroll") for (int e = 0; e < 4; ++e)                              \
                        s += v[4 * w + e] * (float)(i8)(q >> (8 * e));                         \
                }                                                                              \
                acc[r] += x.ds[(i64)r * (x.K / 32) + c].x * s;                                 \
            }                                                                                  \
        }                                                                                      \
    }
MVQ_UNIT_DEQ(q2_k)
MVQ_UNIT_DEQ(q3_k)
