// attn_prefill.hip: causal attention of many query rows at once (prefill), flash-attention style,
// over the paged KV cache that qk_rope_store (attention.hip) has just filled.
//
// Inputs as attention.hip's attn_rows takes them: q [R, H, D] (normed, rotated, float32),
// kc [n_slots, Hkv, D] / vc [n_slots, Hkv, Dv] (rows in the cache's format, kv_format.h), per row r
// pos[r] and btoff[r] (its sequence's block table bt + btoff[r]; position p lives in slot
// table[p / block_size] * block_size + p % block_size). Row r attends to positions lo .. pos[r]
// of its own sequence, lo = pos[r] + 1 - window when window > 0 and that is > 0, else 0.
// out [R, H, Dv] float32. sinks [H] (null: none): each head's attention sink (gpt-oss), one more
// softmax term e^sink whose value is zero.
//
// A block takes AP_ROWS query rows of one KV head: the pairs (token r, head g of the group)
// numbered i = r * G + g (G = H / Hkv query heads per KV head), i in [i0, i0 + AP_ROWS), so the
// heads sharing a K/V tile read it once. The rows' tokens may belong to several sequences (a
// mixed batch): the block walks its runs of equal btoff (segments) one after the other, each
// over its own key range, the rows of the other segments masked. blockIdx.z picks AP_DVC(DP)
// columns of the output (Dv wider than that takes several blocks, each recomputing the scores)
// and one of `splits` parts of the key range: blockIdx.z = split * ceil(Dv / AP_DVC(DP)) + column
// block. Blocks with the most keys (the last rows) start first.
//
// Splits (flash-decoding for prompts at depth: a 256-row piece of Llama-3-8B heads is 64 blocks
// of AP_ROWS pairs, fewer than an H200's SMs, each walking every cached key): a block's longest
// segment key range is cut into parts of `chunk` keys (a multiple of AP_SPLIT_ALIGN, at least
// AP_SPLIT_MIN), part `split` of every segment going to the block of that split; splits past
// the parts a block needs return at once. One part: the block writes its output as without
// splits (the same bits). Several: each writes its rows' unnormalised partial (o, m, l) into
// part_o [R * H * splits, Dv] / part_ml [R * H * splits, 2] (pair (token, head) * splits +
// split), counts itself in cnt[tile] (zero; left zero), and the last block of the tile (every
// split and column block of its AP_ROWS pairs and KV head) merges the partials into out.
//
// kv_mode: the cache's format (KV_*), plus AP_TENSOR_CORES for a float16, Q8_0 or Q4_0 cache whose
// products may round their operands. Without the flag, the SIMT path in float32 (everywhere; what
// a prefill that must match the decode kernels uses; bfloat16 caches always), its tiles
// dequantized as they load.
// NVIDIA, with AP_TENSOR_CORES: AP_THREADS / 32 warps of 16 rows (AP_ROWS in all share each K/V
// tile read from the cache); Q fragments in registers (float16), K/V tiles
// of BK positions in a ring of AP_STAGES stages in dynamic shared memory (AP_SMEM_<DP> /
// AP_SMEM_Q<DP> bytes), copied by cp.async: the loads of tile j + AP_STAGES - 1 start when tile j
// has landed, one barrier a tile (a quantized cache's tiles, of AP_BKQ positions, arrive as stored
// and are converted into one float16 tile there, a second barrier), S = Q K^T and O += P V by
// mma.sync m16n8k16 (float16 operands, float32 accumulators), online softmax in float32 with
// exp2 (no mask compares in a tile every row of the warp sees whole). Rounding: Q and P are
// rounded to float16 (as llama.cpp's f16 K/V products round them).
// Elsewhere (AMD, and the other modes): a SIMT path in float32, 4 threads per row, tiles of
// AP_SIMT_BK positions in shared memory as float32, AP_THREADS / 4 rows at a time (two passes
// per block).
//
// Kernels attn_prefill_64 / _128 / _256 (float caches) and attn_prefill_q64 / _q128 / _q256 (Q8_0
// and Q4_0 caches): D padded to DP = 64 / 128 / 256 (zeros past D). Tensor cores
// need D and Dv multiples of 8 (16-byte rows). grid = (ceil(R * G / AP_ROWS), Hkv,
// ceil(Dv / AP_DVC(DP)) * splits), block = AP_THREADS.
#include "kv_format.h"

#define AP_SIMT_BK 16
static_assert(AP_ROWS == 16 * (AP_THREADS / 32), "tensor cores: 16 rows a 32-lane warp");
static_assert(AP_ROWS % (AP_THREADS / 4) == 0, "SIMT: whole passes of 4 threads a row");
#define AP_DVC(DP) ((DP) < 128 ? (DP) : 128)
#define AP_BK(DP) ((DP) > 128 ? 32 : 64)
#define AP_NEG (-3.0e38f)   // score of a masked position
#define AP_LIVE (-1.0e38f)  // scores above this are not masked
#define AP_LOG2E 1.4426950408889634f
#define AP_SPLIT_ALIGN 64  // split boundaries: whole tiles of either path
#define AP_SPLIT_MIN 512   // keys of a split at least (fewer do not repay the partials' round trip)

#define AP_BKQ 32  // tensor-core tile positions of a quantized cache (room for its raw tiles)
// Bytes of a staged quantized piece of w values: the Q8_0 codes (Q4_0's take half) and scales in
// whole 4-byte words, padded to 8 bytes (a bound for both formats).
#define AP_RBQ(w) (((w) + (((w) / 16 + 3) & ~3) + 7) & ~7)

// Shared memory of one block (16-bit words): the tensor-core path's ring of AP_STAGES K/V tiles
// (STAGE words each; a quantized cache's as stored, then the float16 K/V TILE they are converted
// into), or the SIMT path's float32 tiles; at least the split merge's scratch.
template <int DP, bool QUANT = false> struct ApSmem {
    static constexpr int LDK = DP + 8, LDV = AP_DVC(DP) + 8;  // padded rows: ldmatrix without conflicts
    static constexpr int BK = QUANT ? AP_BKQ : AP_BK(DP);
    static constexpr int TILE = BK * (LDK + LDV);
    static constexpr int STAGE = QUANT ? BK * (AP_RBQ(DP) + AP_RBQ(AP_DVC(DP))) / 2 : TILE;
#if defined(FORGE_NV)
    static constexpr int MMA = AP_STAGES * STAGE + (QUANT ? TILE : 0);
#else
    static constexpr int MMA = 0;  // (the tensor-core path is NVIDIA's)
#endif
    static constexpr int SIMT = 2 * AP_SIMT_BK * (DP + AP_DVC(DP));
    static constexpr int MERGE = 2 * AP_ROWS * (AP_MAX_SPLITS + 1);  // ap_merge's float scratch
    static constexpr int MOST = MMA > SIMT ? MMA : SIMT;
    static constexpr int WORDS = MOST > MERGE ? MOST : MERGE;
};

struct ApArgs {
    const float* q;
    const void* kc;
    const void* vc;
    const i32* bt;
    float* out;
    int R, H, Hkv, D, Dv, bs, window;
    float sl;  // scale * log2(e)
    int G, kvh, i0, col0, t_first, n_tok;
    int split, splits, n_used, chunk;  // this block's split, the grid's, those used, keys a split
    int ncol;                          // column blocks of Dv
    const float* sinks;
    float* part_o;
    float* part_ml;
    u32* cnt;
    const i32* s_pos;  // shared: pos and btoff of the block's tokens t_first ..
    const i32* s_off;
    i32* s_slot;  // shared: cache slots of the ring's K/V tiles (tensor-core path)
};

// The segment starting at block token a: its last token, its first key and its key end.
struct ApSeg {
    int last, kbeg, kend;
};

// 2^x where results below 2^-126 may be flushed to zero (NVIDIA: the one MUFU instruction;
// exp2f adds a range reduction for subnormal results): softmax weights that small are lost in a
// sum that holds the row's largest, 2^0.
FORGE_DEV float ap_exp2(float x) {
#if defined(FORGE_NV)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);
#endif
}

FORGE_DEV int ap_lo(int p, int window) { return window > 0 && p + 1 > window ? p + 1 - window : 0; }

FORGE_DEV ApSeg ap_segment(const ApArgs& a, int t) {
    ApSeg s;
    s.last = t;
    s.kbeg = ap_lo(a.s_pos[t], a.window);
    s.kend = a.s_pos[t] + 1;
    while (s.last + 1 < a.n_tok && a.s_off[s.last + 1] == a.s_off[t]) {
        ++s.last;
        const int p = a.s_pos[s.last], lo = ap_lo(p, a.window);
        s.kbeg = lo < s.kbeg ? lo : s.kbeg;
        s.kend = p + 1 > s.kend ? p + 1 : s.kend;
    }
    return s;
}

// Row `row` of the block: its query (null when past the last pair), output row, and (for the
// segment of block tokens [sa, sb]) its key range [lo, hi] (hi = -1: no keys in this segment).
struct ApRow {
    const float* q;
    float* o;
    int tok;  // block token index
    int h;    // query head
};

FORGE_DEV ApRow ap_row(const ApArgs& a, int row) {
    ApRow r;
    const int i = a.i0 + row;
    r.q = 0;
    r.o = 0;
    r.tok = -1;
    r.h = 0;
    if (i < a.R * a.G) {
        const int t = i / a.G, h = a.kvh * a.G + i % a.G;
        r.h = h;
        r.q = a.q + ((i64)t * a.H + h) * a.D;
        r.o = a.out + ((i64)t * a.H + h) * a.Dv;
        r.tok = t - a.t_first;
    }
    return r;
}

// The factor turning a row's accumulated P V into its output: 1 / l, or with a sink s (log2
// units, as m) the softmax's own normaliser once e^s joins: e^(m - m') / (l e^(m - m') + e^(s - m'))
// with m' = max(m, s).
FORGE_DEV float ap_norm(const ApArgs& a, int h, float m, float l) {
    if (!a.sinks) return l > 0.0f ? 1.0f / l : 0.0f;
    const float s = a.sinks[h] * AP_LOG2E, mm = fmaxf(m, s), f = exp2f(m - mm);
    return f / (l * f + exp2f(s - mm));
}

FORGE_DEV void ap_range(const ApArgs& a, int tok, int sa, int sb, int& lo, int& hi) {
    if (tok >= sa && tok <= sb) {
        hi = a.s_pos[tok];
        lo = ap_lo(hi, a.window);
    } else {
        hi = -1;
        lo = 0x7fffffff;
    }
}

// This block's keys [kb, ke) of a segment (empty: kb >= ke), and a row's range clipped to them.
FORGE_DEV void ap_keys(const ApArgs& a, const ApSeg& seg, int& kb, int& ke) {
    kb = seg.kbeg + a.split * a.chunk;
    ke = seg.kend < kb + a.chunk ? seg.kend : kb + a.chunk;
}

FORGE_DEV void ap_clip(int kb, int ke, int& lo, int& hi) {
    lo = lo > kb ? lo : kb;
    hi = hi < ke - 1 ? hi : ke - 1;
}

// Where row r's partial of this split goes in part_o / part_ml (pair index).
FORGE_DEV i64 ap_part(const ApArgs& a, const ApRow& r) {
    return ((i64)(a.t_first + r.tok) * a.H + r.h) * a.splits + a.split;
}

// ---- portable SIMT path (float32) ------------------------------------------------------------

// Positions k0 .. k0 + AP_SIMT_BK - 1 of one head into dst [AP_SIMT_BK][W] (zeros past kend or
// past `width` columns).
template <int W, int FMT>
FORGE_DEV void ap_simt_tile(float* dst, const void* cache, const i32* table, int bs, int Hkv,
                            int kvh, int width, int col0, int k0, int kend) {
    for (int e = threadIdx.x; e < AP_SIMT_BK * W; e += AP_THREADS) {
        const int key = e / W, d = e % W, p = k0 + key;
        float v = 0.0f;
        if (p < kend && col0 + d < width) {
            const i64 slot = (i64)table[p / bs] * bs + p % bs;
            v = kv_elem<FMT>(cache, slot * Hkv + kvh, width, col0 + d);
        }
        dst[e] = v;
    }
}

template <int DP, int FMT> FORGE_DEV void ap_simt(const ApArgs& a, float* smem) {
    constexpr int DVC = AP_DVC(DP), NQ = DP / 4, NO = DVC / 4;
    float* Ks = smem;
    float* Vs = smem + AP_SIMT_BK * DP;
    const int sub = threadIdx.x & 3;
    for (int half = 0; half < AP_ROWS / (AP_THREADS / 4); ++half) {
        const ApRow r = ap_row(a, half * (AP_THREADS / 4) + (threadIdx.x >> 2));
        float qv[NQ], acc[NO];
#pragma unroll
        for (int i = 0; i < NQ; ++i) {
            const int d = sub + 4 * i;
            qv[i] = r.q && d < a.D ? r.q[d] * a.sl : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NO; ++i) acc[i] = 0.0f;
        float m = AP_NEG, l = 0.0f;
        for (int sa = 0; sa < a.n_tok;) {
            const ApSeg seg = ap_segment(a, sa);
            const i32* table = a.bt + a.s_off[sa];
            int lo, hi, kb, ke;
            ap_range(a, r.tok, sa, seg.last, lo, hi);
            ap_keys(a, seg, kb, ke);
            ap_clip(kb, ke, lo, hi);
            for (int k0 = kb; k0 < ke; k0 += AP_SIMT_BK) {
                __syncthreads();  // the previous tile is consumed
                ap_simt_tile<DP, FMT>(Ks, a.kc, table, a.bs, a.Hkv, a.kvh, a.D, 0, k0, ke);
                ap_simt_tile<DVC, FMT>(Vs, a.vc, table, a.bs, a.Hkv, a.kvh, a.Dv, a.col0, k0, ke);
                __syncthreads();
                float s[AP_SIMT_BK], mx = m;
#pragma unroll
                for (int j = 0; j < AP_SIMT_BK; ++j) {
                    float dot = 0.0f;
#pragma unroll
                    for (int i = 0; i < NQ; ++i) dot += qv[i] * Ks[j * DP + sub + 4 * i];
                    dot += shfl_xor(dot, 1);
                    dot += shfl_xor(dot, 2);
                    const int p = k0 + j;
                    s[j] = p >= lo && p <= hi ? dot : AP_NEG;
                    mx = fmaxf(mx, s[j]);
                }
                const float alpha = exp2f(m - mx);
                l *= alpha;
#pragma unroll
                for (int i = 0; i < NO; ++i) acc[i] *= alpha;
#pragma unroll
                for (int j = 0; j < AP_SIMT_BK; ++j) {
                    const float p = s[j] > AP_LIVE ? exp2f(s[j] - mx) : 0.0f;
                    l += p;
#pragma unroll
                    for (int i = 0; i < NO; ++i) acc[i] += p * Vs[j * DVC + sub + 4 * i];
                }
                m = mx;
            }
            sa = seg.last + 1;
        }
        if (r.o) {
            const bool whole = a.n_used == 1;
            const float inv = whole ? ap_norm(a, r.h, m, l) : 1.0f;
            const i64 p = whole ? 0 : ap_part(a, r);
            float* dst = whole ? r.o : a.part_o + p * a.Dv;
#pragma unroll
            for (int i = 0; i < NO; ++i) {
                const int d = a.col0 + sub + 4 * i;
                if (sub + 4 * i < DVC && d < a.Dv) dst[d] = whole ? acc[i] * inv : acc[i];
            }
            if (!whole && sub == 0 && a.col0 == 0) {
                a.part_ml[2 * p] = m;
                a.part_ml[2 * p + 1] = l;
            }
        }
    }
}

// ---- NVIDIA tensor-core path (float16 cache) -------------------------------------------------

#if defined(FORGE_NV)
// Cache slot of position p of the segment (-1 past kend).
FORGE_DEV int ap_slot(const i32* table, int bs, int p, int kend) {
    return p < kend ? table[p / bs] * bs + p % bs : -1;
}

// Values d .. d + 7 of a quantized cache row (`width` values) as 8 halves: the value rounded to
// float16, as llama.cpp's flash attention converts a quantized cache for its matrix products.
template <int FMT> FORGE_DEV uint4 ap_quant8(const char* row, int width, int d) {
    const float s = kv_scale(row, FMT, width, d);
    const KvCodes c = kv_codes<FMT>(row, d);
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = (float)kv_code<FMT>(c.lo, c.hi, k) * s;
    return make_uint4(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
}

// Row stride of a staged quantized piece of w values (codes, then scales; see AP_RBQ).
template <int FMT> FORGE_DEV int ap_stride(int w) {
    return ((FMT == KV_Q8_0 ? w : w / 2) + ((2 * (w / KV_BLOCK) + 3) & ~3) + 7) & ~7;
}

// The BK positions whose cache slots are in `slots` (-1: none), one head (W columns from col0,
// `width` per cache row): a float16 cache into dst [BK][ld] by cp.async (zeros for no slot or
// past width); a quantized one's values col0 .. col0 + w - 1 (w = min(W, width - col0)) into
// `raw` by cp.async as they are stored, a piece of w values with its own scales after its codes
// (ap_stride apart; zeros for no slot), which ap_convert turns into dst once they have arrived.
// (Reading the scales in whole words may read 2 bytes past them: the row's padding.)
template <int W, int BK, int FMT>
FORGE_DEV void ap_mma_tile(u16* dst, int ld, char* raw, const void* cache, const i32* slots,
                           int Hkv, int kvh, int width, int col0) {
    constexpr int CPR = W / 8;  // 16-byte pieces per row
    static_assert(BK * CPR % AP_THREADS == 0, "whole tile rounds");
    const int rb = kv_row_bytes(FMT, width);
    if (FMT == KV_F16) {
#pragma unroll
        for (int it = 0; it < BK * CPR / AP_THREADS; ++it) {
            const int c = threadIdx.x + it * AP_THREADS;
            const int key = c / CPR, col = (c % CPR) * 8, slot = slots[key];
            const bool ok = slot >= 0 && col0 + col < width;
            const char* row = (const char*)cache + ((i64)slot * Hkv + kvh) * rb;
            cp_async16(dst + key * ld + col, ok ? row + 2 * (col0 + col) : cache, ok);
        }
    } else {
        const int w = width - col0 < W ? width - col0 : W;
        const int cb = FMT == KV_Q8_0 ? w : w / 2, sb = (2 * (w / KV_BLOCK) + 3) & ~3;
        const int code0 = FMT == KV_Q8_0 ? col0 : col0 / 2;
        const int scale0 = (FMT == KV_Q8_0 ? width : width / 2) + 2 * (col0 / KV_BLOCK);
        const int words = (cb + sb) / 4, stride = ap_stride<FMT>(w);
        for (int c = threadIdx.x; c < BK * words; c += AP_THREADS) {
            const int key = c / words, b = 4 * (c % words), slot = slots[key];
            const char* row = (const char*)cache + ((i64)slot * Hkv + kvh) * rb;
            const char* src = b < cb ? row + code0 + b : row + scale0 + (b - cb);
            cp_async4(raw + key * stride + b, slot >= 0 ? src : cache, slot >= 0);
        }
    }
}

// A quantized tile's raw pieces (ap_mma_tile) into dst [BK][ld] as float16 (zeros past w).
template <int W, int BK, int FMT>
FORGE_DEV void ap_convert(u16* dst, int ld, const char* raw, int width, int col0) {
    constexpr int CPR = W / 8;
    const int w = width - col0 < W ? width - col0 : W, stride = ap_stride<FMT>(w);
    // (one piece at a time: the loop runs while the outputs hold most registers)
#pragma unroll 1
    for (int c = threadIdx.x; c < BK * CPR; c += AP_THREADS) {
        const int key = c / CPR, col = (c % CPR) * 8;
        *(uint4*)(dst + key * ld + col) = col < w ? ap_quant8<FMT>(raw + key * stride, w, col)
                                                  : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Starts the copies of the tile whose cache slots are in `slots` into ring stage `stage` (a float16
// K tile then V tile; a quantized cache's raw K then V pieces) as one cp.async group.
template <int DP, int FMT> FORGE_DEV void ap_issue(const ApArgs& a, u16* stage, const i32* slots) {
    using Sm = ApSmem<DP, FMT != KV_F16>;
    constexpr int DVC = AP_DVC(DP), BK = Sm::BK;
    char* raw = (char*)stage;
    ap_mma_tile<DP, BK, FMT>(stage, Sm::LDK, raw, a.kc, slots, a.Hkv, a.kvh, a.D, 0);
    ap_mma_tile<DVC, BK, FMT>(stage + BK * Sm::LDK, Sm::LDV, raw + BK * AP_RBQ(DP), a.vc, slots,
                              a.Hkv, a.kvh, a.Dv, a.col0);
    cp_async_commit();
}

// S = Q K^T of a warp's 16 rows and the BK keys of the tile Ks (rows LDK halves apart).
template <int DP, int BK, int LDK>
FORGE_DEV void ap_scores(float (&s)[BK / 8][4], const u32 (&qf)[DP / 16][4], const u16* Ks,
                         int lane) {
#pragma unroll
    for (int n = 0; n < BK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < DP / 16; ++ks) {
#pragma unroll
        for (int jj = 0; jj < BK / 16; ++jj) {
            u32 b[4];
            ldsm_x4(Ks + (16 * jj + (lane & 7) + ((lane >> 4) << 3)) * LDK + 16 * ks +
                        ((lane >> 3) & 1) * 8,
                    b);
            mma_f16(s[2 * jj], qf[ks], b[0], b[1]);
            mma_f16(s[2 * jj + 1], qf[ks], b[2], b[3]);
        }
    }
}

// Online softmax of a warp's rows ra (x = 0: s[n][0..1]) and rb (x = 1: s[n][2..3]) over the
// tile's keys k0 ..: keys outside [lo[x], hi[x]] masked (WHOLE: the warp's rows see every key of
// the tile, no compares), the scale sl applied inside the exponent (max(s sl) = max(s) sl for sl >
// 0), o rescaled only when a row's maximum grew, the probabilities left in pf as the A fragments
// of P V (the accumulator layout of two 8-key tiles is that of a 16-k A).
template <bool WHOLE, int BK, int DVC>
FORGE_DEV void ap_softmax(float (&s)[BK / 8][4], u32 (&pf)[BK / 16][4], float (&o)[DVC / 8][4],
                          float (&m)[2], float (&l)[2], const int (&lo)[2], const int (&hi)[2],
                          int k0, float sl, int lane) {
    float alpha[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        float mx = AP_NEG;
#pragma unroll
        for (int n = 0; n < BK / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int p = k0 + 8 * n + 2 * (lane & 3) + e;
                if (!WHOLE && (p < lo[x] || p > hi[x])) s[n][2 * x + e] = AP_NEG;
                mx = fmaxf(mx, s[n][2 * x + e]);
            }
        }
        mx = fmaxf(mx, shfl_xor(mx, 1));
        mx = fmaxf(mx, shfl_xor(mx, 2));
        mx = fmaxf(m[x], mx * sl);  // (a masked row's AP_NEG sl stays far below any score)
        alpha[x] = ap_exp2(m[x] - mx);
        m[x] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < BK / 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float v = s[n][2 * x + e];
                const float p = WHOLE || v > AP_LIVE ? ap_exp2(fmaf(v, sl, -mx)) : 0.0f;
                s[n][2 * x + e] = p;
                sum += p;
            }
        }
        l[x] = l[x] * alpha[x] + sum;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < DVC / 8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
    }
#pragma unroll
    for (int t = 0; t < BK / 16; ++t) {
        pf[t][0] = pack_h2(s[2 * t][0], s[2 * t][1]);
        pf[t][1] = pack_h2(s[2 * t][2], s[2 * t][3]);
        pf[t][2] = pack_h2(s[2 * t + 1][0], s[2 * t + 1][1]);
        pf[t][3] = pack_h2(s[2 * t + 1][2], s[2 * t + 1][3]);
    }
}

// O += P V of a warp's 16 rows and the tile's V rows Vs (LDV halves apart).
template <int BK, int DVC, int LDV>
FORGE_DEV void ap_pv(float (&o)[DVC / 8][4], const u32 (&pf)[BK / 16][4], const u16* Vs, int lane) {
#pragma unroll
    for (int t = 0; t < BK / 16; ++t) {
#pragma unroll
        for (int nn = 0; nn < DVC / 16; ++nn) {
            u32 b[4];
            ldsm_x4_t(Vs + (16 * t + (lane & 15)) * LDV + 16 * nn + (lane >> 4) * 8, b);
            mma_f16(o[2 * nn], pf[t], b[0], b[1]);
            mma_f16(o[2 * nn + 1], pf[t], b[2], b[3]);
        }
    }
}

// One tile of BK keys for a warp's 16 rows, in two halves whose products overlap the other
// half's softmax: the second half's scores are issued before the first half's softmax, the first
// half's P V before the second half's softmax.
template <bool WHOLE, int DP, int BK, int DVC, int LDK, int LDV>
FORGE_DEV void ap_tile(const u32 (&qf)[DP / 16][4], const u16* Ks, const u16* Vs,
                       float (&o)[DVC / 8][4], float (&m)[2], float (&l)[2], const int (&lo)[2],
                       const int (&hi)[2], int k0, float sl, int lane) {
    constexpr int HB = BK / 2;
    float s0[HB / 8][4], s1[HB / 8][4];
    u32 p0[HB / 16][4], p1[HB / 16][4];
    ap_scores<DP, HB, LDK>(s0, qf, Ks, lane);
    ap_scores<DP, HB, LDK>(s1, qf, Ks + HB * LDK, lane);
    ap_softmax<WHOLE, HB, DVC>(s0, p0, o, m, l, lo, hi, k0, sl, lane);
    ap_pv<HB, DVC, LDV>(o, p0, Vs, lane);
    ap_softmax<WHOLE, HB, DVC>(s1, p1, o, m, l, lo, hi, k0 + HB, sl, lane);
    ap_pv<HB, DVC, LDV>(o, p1, Vs + HB * LDV, lane);
}

template <int DP, int FMT> FORGE_DEV void ap_tc(const ApArgs& a, u16* smem) {
    constexpr bool QUANT = FMT != KV_F16;
    using Sm = ApSmem<DP, QUANT>;
    constexpr int DVC = AP_DVC(DP), BK = Sm::BK, LDK = Sm::LDK, LDV = Sm::LDV, S = AP_STAGES;
    static_assert(S >= 2 && BK <= 64, "a tile in flight while one is read; s_slot's room");
    u16* tile = smem + S * Sm::STAGE;  // (a quantized cache's stage converted to float16)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const ApRow ra = ap_row(a, warp * 16 + (lane >> 2)), rb = ap_row(a, warp * 16 + (lane >> 2) + 8);

    // Q fragments (A operand, rows ra / rb, columns 16 ks + 2 (lane & 3) + {0, 1, 8, 9})
    u32 qf[DP / 16][4];
#pragma unroll
    for (int ks = 0; ks < DP / 16; ++ks) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const float* qr = x & 1 ? rb.q : ra.q;
            const int c = 16 * ks + 2 * (lane & 3) + 8 * (x >> 1);
            float2 v = make_float2(0.0f, 0.0f);
            if (qr && c < a.D) v = *(const float2*)(qr + c);
            qf[ks][x] = pack_h2(v.x, v.y);
        }
    }
    float o[DVC / 8][4];
#pragma unroll
    for (int n = 0; n < DVC / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {AP_NEG, AP_NEG}, l[2] = {0.0f, 0.0f};

    for (int sa = 0; sa < a.n_tok;) {
        const ApSeg seg = ap_segment(a, sa);
        const i32* table = a.bt + a.s_off[sa];
        int lo[2], hi[2], kb, ke;
        ap_keys(a, seg, kb, ke);
        if (kb >= ke) {  // (the same for the whole block)
            sa = seg.last + 1;
            continue;
        }
        ap_range(a, ra.tok, sa, seg.last, lo[0], hi[0]);
        ap_range(a, rb.tok, sa, seg.last, lo[1], hi[1]);
        ap_clip(kb, ke, lo[0], hi[0]);
        ap_clip(kb, ke, lo[1], hi[1]);
        const int nt = (ke - kb + BK - 1) / BK;
        // Tile j lives in stage j % S, its cache slots in s_slot[(j % S) * BK ..]: written at
        // least one barrier before the tile's copies start (the first S here, tile j + S while
        // tile j is read: its copies started S - 1 tiles ago).
        __syncthreads();  // the previous segment's tiles are consumed
        for (int e = threadIdx.x; e < S * BK; e += AP_THREADS) {
            a.s_slot[e] = ap_slot(table, a.bs, kb + e, ke);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < S - 1; ++j) {
            if (j < nt) ap_issue<DP, FMT>(a, smem + j * Sm::STAGE, a.s_slot + j * BK);
            else cp_async_commit();
        }
        for (int j = 0; j < nt; ++j) {
            const int k0 = kb + j * BK, st = j % S;
            cp_async_wait<S - 2>();  // this thread's copies of tile j
            __syncthreads();  // everyone's; and tile j - 1 is consumed, its stage free
            const int jn = j + S - 1;
            if (jn < nt) ap_issue<DP, FMT>(a, smem + jn % S * Sm::STAGE, a.s_slot + jn % S * BK);
            else cp_async_commit();
            if (threadIdx.x < BK && j + S < nt) {
                a.s_slot[st * BK + threadIdx.x] = ap_slot(table, a.bs, k0 + S * BK + threadIdx.x, ke);
            }
            const u16* Ks = smem + st * Sm::STAGE;
            const u16* Vs = Ks + BK * LDK;
            if (QUANT) {
                const char* raw = (const char*)Ks;
                ap_convert<DP, BK, FMT>(tile, LDK, raw, a.D, 0);
                ap_convert<DVC, BK, FMT>(tile + BK * LDK, LDV, raw + BK * AP_RBQ(DP), a.Dv, a.col0);
                __syncthreads();
                Ks = tile;
                Vs = tile + BK * LDK;
            }
            const bool sees = (hi[0] >= k0 && lo[0] < k0 + BK) || (hi[1] >= k0 && lo[1] < k0 + BK);
            if (!__any_sync(0xffffffffu, sees)) continue;  // no live score in the warp's rows
            const bool whole = lo[0] <= k0 && hi[0] >= k0 + BK - 1 && lo[1] <= k0 && hi[1] >= k0 + BK - 1;
            if (__all_sync(0xffffffffu, whole)) {
                ap_tile<true, DP, BK, DVC, LDK, LDV>(qf, Ks, Vs, o, m, l, lo, hi, k0, a.sl, lane);
            } else {
                ap_tile<false, DP, BK, DVC, LDK, LDV>(qf, Ks, Vs, o, m, l, lo, hi, k0, a.sl, lane);
            }
        }
        cp_async_wait<0>();  // (groups past the last tile are empty)
        sa = seg.last + 1;
    }
    // the quad's partial sums, then O / l
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        l[x] += shfl_xor(l[x], 1);
        l[x] += shfl_xor(l[x], 2);
    }
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const ApRow& r = x ? rb : ra;
        if (!r.o) continue;
        const bool whole = a.n_used == 1;  // else this split's unnormalised partial
        const float inv = whole ? ap_norm(a, r.h, m[x], l[x]) : 1.0f;
        const i64 p = whole ? 0 : ap_part(a, r);
        float* dst = whole ? r.o : a.part_o + p * a.Dv;
#pragma unroll
        for (int n = 0; n < DVC / 8; ++n) {
            const int d = a.col0 + 8 * n + 2 * (lane & 3);
            if (d < a.Dv) *(float2*)(dst + d) = make_float2(o[n][2 * x] * inv, o[n][2 * x + 1] * inv);
        }
        if (!whole && (lane & 3) == 0 && a.col0 == 0) {
            a.part_ml[2 * p] = m[x];
            a.part_ml[2 * p + 1] = l[x];
        }
    }
}
#endif

// ---- splits: the last block of a tile merges its partials ---------------------------------------

// After this block's partials: count it; the last of the tile's n_used * ncol blocks merges every
// split of its rows into out, all Dv columns (`scratch`: the tile's shared memory, free now).
FORGE_DEV void ap_merge(const ApArgs& a, float* scratch) {
    __shared__ int last;
    __threadfence();  // the partials are visible device-wide before the counter says so
    __syncthreads();
    u32* cnt = a.cnt + blockIdx.x + (i64)gridDim.x * a.kvh;
    if (threadIdx.x == 0) last = atomicAdd(cnt, 1u) == (u32)(a.n_used * a.ncol - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    constexpr int W = AP_MAX_SPLITS + 1;  // per row: the splits' weights, then 1 / the sum
    for (int row = threadIdx.x; row < AP_ROWS; row += AP_THREADS) {
        ApRow r = ap_row(a, row);
        if (!r.o) continue;
        const i64 p0 = ap_part(a, r) - a.split;
        float mx = AP_NEG, sum = 0.0f;
        for (int s = 0; s < a.n_used; ++s) mx = fmaxf(mx, ld_coherent(a.part_ml + 2 * (p0 + s)));
        for (int s = 0; s < a.n_used; ++s) {
            const float w = exp2f(ld_coherent(a.part_ml + 2 * (p0 + s)) - mx);
            scratch[row * W + s] = w;
            sum += ld_coherent(a.part_ml + 2 * (p0 + s) + 1) * w;
        }
        scratch[row * W + AP_MAX_SPLITS] = ap_norm(a, r.h, mx, sum);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < AP_ROWS * a.Dv; e += AP_THREADS) {
        const int row = e / a.Dv, d = e % a.Dv;
        const ApRow r = ap_row(a, row);
        if (!r.o) continue;
        const float* po = a.part_o + (ap_part(a, r) - a.split) * a.Dv + d;
        float o = 0.0f;
        for (int s = 0; s < a.n_used; ++s) {
            o += ld_coherent(po + (i64)s * a.Dv) * scratch[row * W + s];
        }
        r.o[d] = o * scratch[row * W + AP_MAX_SPLITS];
    }
    if (threadIdx.x == 0) *cnt = 0u;  // every block of the tile has counted
}

// ---- the kernels -------------------------------------------------------------------------------

// The block's attention on the path its cache format and mode take.
template <int DP, bool QUANT> FORGE_DEV void ap_run(const ApArgs& a, int kv_mode, u16* smem) {
    const int fmt = kv_mode & ~AP_TENSOR_CORES;
#if defined(FORGE_NV)
    if ((kv_mode & AP_TENSOR_CORES) && (QUANT || fmt == KV_F16)) {  // (others: SIMT)
        if (!QUANT) ap_tc<DP, KV_F16>(a, smem);
        else if (fmt == KV_Q4_0) ap_tc<DP, KV_Q4_0>(a, smem);
        else ap_tc<DP, KV_Q8_0>(a, smem);
        return;
    }
#endif
    if (QUANT) {
        if (fmt == KV_Q4_0) ap_simt<DP, KV_Q4_0>(a, (float*)smem);
        else ap_simt<DP, KV_Q8_0>(a, (float*)smem);
    } else if (fmt == KV_F16) {
        ap_simt<DP, KV_F16>(a, (float*)smem);
    } else if (fmt == KV_BF16) {
        ap_simt<DP, KV_BF16>(a, (float*)smem);
    } else {
        ap_simt<DP, KV_F32>(a, (float*)smem);
    }
}

// QUANT: the kernels for Q8_0 and Q4_0 caches (attn_prefill_q<DP>); the others take float caches
// (kernels of their own, so that neither set's registers are allocated for the other's loops).
template <int DP, bool QUANT>
FORGE_DEV void ap_main(const float* q, const void* kc, const void* vc, const i32* bt,
                       const i32* btoff, const i32* pos, float* out, int R, int H, int Hkv, int D,
                       int Dv, int block_size, float scale, int window, int kv_mode,
                       const float* sinks, float* part_o, float* part_ml, u32* cnt, int splits,
                       u16* smem, i32* s_pos, i32* s_off, i32* s_slot) {
    static_assert(ApSmem<DP, QUANT>::WORDS * 2 >= AP_ROWS * (AP_MAX_SPLITS + 1) * 4,
                  "merge scratch");
    ApArgs a;
    a.q = q;
    a.kc = kc;
    a.vc = vc;
    a.bt = bt;
    a.out = out;
    a.R = R;
    a.H = H;
    a.Hkv = Hkv;
    a.D = D;
    a.Dv = Dv;
    a.bs = block_size;
    a.window = window;
    a.sinks = sinks;
    a.sl = scale * AP_LOG2E;
    a.G = H / Hkv;
    a.kvh = blockIdx.y;
    a.i0 = (gridDim.x - 1 - blockIdx.x) * AP_ROWS;  // the last rows (most keys) first
    a.ncol = (Dv + AP_DVC(DP) - 1) / AP_DVC(DP);
    a.col0 = blockIdx.z % a.ncol * AP_DVC(DP);
    a.split = blockIdx.z / a.ncol;
    a.splits = splits < AP_MAX_SPLITS ? splits : AP_MAX_SPLITS;  // (what the merge holds)
    a.part_o = part_o;
    a.part_ml = part_ml;
    a.cnt = cnt;
    const int n_pairs = R * a.G;
    if (a.i0 >= n_pairs) return;
    const int last = (a.i0 + AP_ROWS < n_pairs ? a.i0 + AP_ROWS : n_pairs) - 1;
    a.t_first = a.i0 / a.G;
    a.n_tok = last / a.G - a.t_first + 1;
    for (int t = threadIdx.x; t < a.n_tok; t += AP_THREADS) {
        s_pos[t] = pos[a.t_first + t];
        s_off[t] = btoff[a.t_first + t];
    }
    a.s_pos = s_pos;
    a.s_off = s_off;
    a.s_slot = s_slot;
    __syncthreads();
    int longest = 0;  // the block's longest segment key range, cut into the splits' chunks
    for (int sa = 0; sa < a.n_tok;) {
        const ApSeg seg = ap_segment(a, sa);
        longest = seg.kend - seg.kbeg > longest ? seg.kend - seg.kbeg : longest;
        sa = seg.last + 1;
    }
    const int each = (longest + a.splits - 1) / a.splits;
    a.chunk = (each + AP_SPLIT_ALIGN - 1) / AP_SPLIT_ALIGN * AP_SPLIT_ALIGN;
    a.chunk = a.chunk > AP_SPLIT_MIN ? a.chunk : AP_SPLIT_MIN;
    a.n_used = (longest + a.chunk - 1) / a.chunk;
    if (a.split >= a.n_used) return;
    ap_run<DP, QUANT>(a, kv_mode, smem);
    if (a.n_used > 1) ap_merge(a, (float*)smem);
}

// A kernel's shared memory: on NVIDIA the dynamic bytes the host reserves (contract.h's AP_SMEM_*,
// the tensor-core ring), elsewhere static.
#if defined(FORGE_NV)
#define AP_SHARED(DP, QUANT, BYTES)                                                  \
    static_assert(ApSmem<DP, QUANT>::WORDS * 2 == (BYTES), "contract.h's AP_SMEM"); \
    extern __shared__ __attribute__((aligned(16))) u16 smem[]
#else
#define AP_SHARED(DP, QUANT, BYTES) __shared__ __attribute__((aligned(16))) u16 smem[ApSmem<DP, QUANT>::WORDS]
#endif

// Written out (not by a macro) so that each kernel's name appears in the text: attn_prefill_<DP>
// for float32, float16 and bfloat16 caches, attn_prefill_q<DP> for Q8_0 and Q4_0 ones.
FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_64(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(64, false, AP_SMEM_64);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<64, false>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale, window,
                       kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                       s_slot);
}

FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_128(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(128, false, AP_SMEM_128);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<128, false>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale,
                        window, kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                        s_slot);
}

FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_256(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(256, false, AP_SMEM_256);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<256, false>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale,
                        window, kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                        s_slot);
}

FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_q64(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(64, true, AP_SMEM_Q64);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<64, true>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale, window,
                       kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                       s_slot);
}

FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_q128(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(128, true, AP_SMEM_Q128);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<128, true>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale,
                        window, kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                        s_slot);
}

FORGE_KERNEL void __launch_bounds__(AP_THREADS, 1) attn_prefill_q256(const float* __restrict__ q,
    const void* kc, const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* __restrict__ out, int R, int H, int Hkv, int D, int Dv,
    int block_size, float scale, int window, int kv_mode, const float* __restrict__ sinks,
    float* part_o, float* part_ml, u32* cnt, int splits) {
    FORGE_GRID_WAIT();
    AP_SHARED(256, true, AP_SMEM_Q256);
    __shared__ i32 s_pos[AP_ROWS + 1], s_off[AP_ROWS + 1], s_slot[AP_STAGES * 64];
    ap_main<256, true>(q, kc, vc, bt, btoff, pos, out, R, H, Hkv, D, Dv, block_size, scale,
                        window, kv_mode, sinks, part_o, part_ml, cnt, splits, smem, s_pos, s_off,
                        s_slot);
}
