// attention.hip: the attention of a transformer layer over a paged KV cache, R token rows at once.
//
// Per-row metadata lives in device memory (int32, written by one host->device copy per step, so a
// captured graph replays with new values): pos[r] (the row's position), slots[r] (its KV-cache
// slot), btoff[r] (offset of its sequence's block table in the flat table array bt).
// KV caches: kc [n_slots, n_kv_head, D], vc [n_slots, n_kv_head, Dv], rows in the format kv_fmt
// (kv_format.h: float32, float16, bfloat16, Q8_0 or Q4_0; attention reads that format directly);
// position p of a sequence lives in slot bt[p / block_size] * block_size + p % block_size.
//
// Kernels:
//   qk_rope_store  Q/K RMSNorm + RoPE in place, K/V into the cache (prefill and mixed batches)
//   attn_rows      causal attention of each row over its cached positions (after qk_rope_store)
//   attn_decode    one token per sequence: norm + RoPE of its Q/K, the K/V store and attention
//                  in one launch (the row's own K/V come from registers, not from the cache);
//                  its _g4 kernels take 4 query heads of a KV head a block, reading each cached
//                  K/V row once for all of them
// Both attention kernels split the positions over blockIdx.z (flash decoding) into as many splits
// as the length needs (ATT_SPLIT_MIN positions each at least, gridDim.z at most; ATT_SPLIT_FEW when
// fewer than ATT_FEW_BLOCKS (head, row) blocks share a split), decided on the device so a captured
// graph serves every length. One split writes the output directly; with more,
// each block writes its partial (o, max, sum) and the last block of a (row, head) to finish, found
// through an atomic counter (cnt, zero between launches), merges them: no combine launch.
#include "attn_heads.h"

#define ATT_MAX_WARPS 8  // blocks of up to 256 threads (8 warps on NVIDIA, 4 on wave64 AMD)
#define ATT_CHUNK 16  // attn_rows: positions a warp takes at once (slots looked up together)
// Past ATT_SPLIT_MIN positions, launches with fewer (head, row) blocks than ATT_FEW_BLOCKS split
// every ATT_SPLIT_FEW positions instead, so that more blocks share the work. H100, decode of 128
// tokens from positions 128 / 256 / 512 / 895, gemma3 twin (4 heads, 1 row): 1,452-1,454 /
// 1,425-1,428 / 1,446-1,448 / 1,444-1,446 -> 1,512-1,515 / 1,522-1,526 / 1,506-1,514 /
// 1,505-1,510 tok/s. The llama-8B twin (32 heads) lost with shorter splits (at 256: 314.0 ->
// 297.1), so it keeps 128 (its steps are 0.6% slower with this rule's code, same splits).
#define ATT_SPLIT_FEW 32
#define ATT_FEW_BLOCKS 16
#define ATT_NEG (-3.402823466e38f)
// attn_decode: rounds a warp asks L2 for ahead of the one it computes (a bounded window of each
// block's positions in flight: the whole split at once overflowed L2 at depth)
#define ATT_AHEAD 4

// Per head of each row: Q heads get (optional) RMSNorm and RoPE in place; K heads get the same and
// are stored to the cache; V heads are stored. q [R, H, D], k [R, Hkv, D], v [R, Hkv, Dv].
// freqs, mscale: rope_table's (a null table: base^(-2i / n_rot)).
// Launch: grid = (ceil((H + Hkv) / W) + Hkv, R) with W = blockDim.x / FORGE_WARP <= ATT_MAX_WARPS
// (forge_hip.tuning.qk_rope_blocks): the first blocks take W of the row's Q then K heads, one per
// warp, after building the row's RoPE table together; each of the last Hkv blocks stores a V head.
FORGE_KERNEL void qk_rope_store(float* __restrict__ q, float* __restrict__ k,
                                const float* __restrict__ v, const float* __restrict__ qnw,
                                const float* __restrict__ knw, const i32* __restrict__ pos,
                                const i32* __restrict__ slots, void* kc, void* vc, int H, int Hkv,
                                int D, int Dv, int n_rot, int neox, float base, float freq_scale,
                                const float* __restrict__ freqs, float mscale, float eps,
                                int kv_fmt) {
    FORGE_GRID_WAIT();
    __shared__ float xch[ATT_MAX_WARPS * LAYER_MAX_D], rc[LAYER_MAX_D];
    const int r = blockIdx.y, W = blockDim.x / FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int qk_blocks = (H + Hkv + W - 1) / W;
    const i64 slot = slots[r];
    if ((int)blockIdx.x >= qk_blocks) {  // a V head: store only
        const int vh = blockIdx.x - qk_blocks;
        const float* src = v + ((i64)r * Hkv + vh) * Dv;
        const i64 dst = (slot * Hkv + vh) * Dv;
        if (kv_fmt == KV_F16 || kv_fmt == KV_F32) {
            for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
                if (kv_fmt == KV_F16) ((u16*)vc)[dst + d] = f2h(src[d]);
                else ((float*)vc)[dst + d] = src[d];
            }
        } else if (warp == 0) {
#define V_HEAD(L, V) v_head<L, V>(src, vc, slot * Hkv + vh, Dv, kv_fmt)
            ATT_LAYOUT(Dv, Dv, V_HEAD);
#undef V_HEAD
        }
        return;
    }
    rope_table(rc, n_rot, (float)pos[r] * freq_scale, base, freqs, mscale);
    __syncthreads();
    const int j = blockIdx.x * W + warp;  // this warp's head: Q 0..H-1, then K
    if (j >= H + Hkv) return;
    const bool is_q = j < H;
    float* xh = is_q ? q + ((i64)r * H + j) * D : k + ((i64)r * Hkv + (j - H)) * D;
    float* wx = xch + warp * LAYER_MAX_D;
    const i64 krow = slot * Hkv + (j - H);  // (a K head's cache row)
#define QK_HEAD(L, V) \
    qk_head<L, V>(xh, xh, is_q ? qnw : knw, kc, krow, is_q, D, n_rot, neox, rc, eps, kv_fmt, wx)
    ATT_LAYOUT(D, Dv, QK_HEAD);
#undef QK_HEAD
}

FORGE_DEV int shfl_idx(int v, int src) {
#if defined(FORGE_AMD)
    return __shfl(v, src, FORGE_WARP);
#else
    return __shfl_sync(0xffffffffu, v, src, FORGE_WARP);
#endif
}

// Which positions block s of a row attends to: [begin, end) of lo .. n_kv - 1.
struct AttSplit {
    int n_eff, begin, end;
};

// H: the launch's query heads (the few-blocks rule counts (head, row) pairs, however many heads
// a block takes, so that grouped and per-head kernels split alike).
FORGE_DEV AttSplit att_split(int n_kv, int window, int s, int n_grid, int H) {
    const int lo = window > 0 && n_kv > window ? n_kv - window : 0;
    const int len = n_kv - lo;
    const bool few = H * (int)gridDim.y < ATT_FEW_BLOCKS && len > ATT_SPLIT_MIN;
    int n_eff = few ? (len + ATT_SPLIT_FEW - 1) / ATT_SPLIT_FEW  // (constant divisors: shifts)
                    : (len + ATT_SPLIT_MIN - 1) / ATT_SPLIT_MIN;
    n_eff = n_eff < 1 ? 1 : (n_eff > n_grid ? n_grid : n_eff);
    const int per = (len + n_eff - 1) / n_eff;
    AttSplit a;
    a.n_eff = n_eff;
    a.begin = lo + s * per;
    a.end = a.begin + per < n_kv ? a.begin + per : n_kv;
    return a;
}

struct AttArgs {
    const void* kc;
    const void* vc;
    const i32* table;  // the row's block table
    int block_size, Hkv, kvh, D, Dv, begin, end;  // cached positions [begin, end)
};

FORGE_DEV u32 word(const V4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// A lane's slice of a cache row is held as words of 16 bytes: 8 halves or bfloat16s, 4 floats,
// or for the quantized formats one 8-value piece (Q8_0: its values in x and y; Q4_0: in x) with
// the block's scale as a float in z.

// The value of element i of a lane's slice without its scale (the quantized formats' integer).
template <int FMT>
FORGE_DEV float elem_code(const V4* w, int i) {
    if (FMT == KV_F16 || FMT == KV_BF16) {
        const u32 x = word(w[i / 8], (i % 8) / 2);
        const u16 h = (u16)(i % 2 ? x >> 16 : x & 0xffffu);
        return FMT == KV_F16 ? h2f(h) : bf2f(h);
    }
    if (kv_quant(FMT)) return (float)kv_code<FMT>(w[i / 8].x, w[i / 8].y, i % 8);
    return bits_to_float(word(w[i / 4], i % 4));
}

// The scale of the piece holding element i (1 for the formats without one).
template <int FMT> FORGE_DEV float elem_scale(const V4* w, int i) {
    return kv_quant(FMT) ? bits_to_float(w[i / 8].z) : 1.0f;
}

// The word of cache row `row` (n values) holding value d and the values after it that a word
// holds (d a multiple of 8; of 4 for float32).
template <int FMT> FORGE_DEV V4 kv_word(const void* cache, i64 row, int n, int d) {
    const char* at = (const char*)cache + row * kv_row_bytes(FMT, n);
    if (FMT == KV_F32) return *(const V4*)(at + 4 * d);
    if (!kv_quant(FMT)) return *(const V4*)(at + 2 * d);
    const KvCodes c = kv_codes<FMT>(at, d);
    V4 w;
    w.x = c.lo;
    w.y = c.hi;
    w.z = float_to_bits(kv_scale(at, FMT, n, d));
    w.w = 0u;
    return w;
}

// Start moving the cached K and V rows of positions [begin, min(end, a.end)) of KV head a.kvh
// into L2, thread t0 of `stride` threads taking every stride-th line (NVIDIA only, a no-op
// elsewhere). fmt: the cache's format.
FORGE_DEV void att_prefetch(const AttArgs& a, int fmt, int begin, int end, int t0, int stride) {
#if defined(FORGE_NV)
    const int krb = kv_row_bytes(fmt, a.D), vrb = kv_row_bytes(fmt, a.Dv);
    const int kl = (krb + 127) / 128, vl = (vrb + 127) / 128, per = kl + vl;
    end = end < a.end ? end : a.end;
    for (int t = t0; t < (end - begin) * per; t += stride) {
        const int p = begin + t / per, line = t % per;
        const i64 slot = (i64)a.table[p / a.block_size] * a.block_size + p % a.block_size;
        const char* at = line < kl ? (const char*)a.kc + (slot * a.Hkv + a.kvh) * krb + 128 * line
                                   : (const char*)a.vc + (slot * a.Hkv + a.kvh) * vrb
                                          + 128 * (line - kl);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    }
#else
    (void)a;
    (void)fmt;
    (void)begin;
    (void)end;
    (void)t0;
    (void)stride;
#endif
}

// The register tiles of the attention loop: a warp holds G = FORGE_WARP / LPP positions at once
// (one per group of LPP lanes, each lane 8 VPL elements of the K and V rows in the hd() layout,
// as 16-byte words), U such steps per load round: CH = G U positions per round.
template <int LPP, int VPL, int FMT> struct AttShape {
    static constexpr bool WIDE = FMT == KV_F32;  // two words per 8 values
    static constexpr int G = FORGE_WARP / LPP, E = 8 * VPL, NW = WIDE ? 2 * VPL : VPL;
    // steps per round: 8 when a warp holds one position (wide heads) of a 16-bit or smaller cache
    static constexpr int U = VPL == 2 ? 2 : (G == 1 && !WIDE ? 8 : 4);
    static constexpr int CH = G * U;
};

template <class S> struct AttTile {
    V4 k[S::U][S::NW], v[S::U][S::NW];
};

// Cache slot of position c0 + lane for the first n lanes (0 elsewhere and past a.end).
FORGE_DEV int att_slot(const AttArgs& a, int c0, int lane, int n) {
    const int p = c0 + lane;
    return lane < n && p < a.end ? a.table[p / a.block_size] * a.block_size + p % a.block_size
                                 : 0;
}

// Load round positions c0 + t0 + u G + grp (u < U; lane j of `my` holds the slot of c0 + j):
// this lane's K and V pieces, zeros past a.end or past the head.
template <int LPP, int VPL, int FMT>
FORGE_DEV void att_load(const AttArgs& a, AttTile<AttShape<LPP, VPL, FMT>>& t, int my, int c0,
                        int t0, int lane) {
    using S = AttShape<LPP, VPL, FMT>;
    const int e = lane % LPP, grp = lane / LPP;
    constexpr int per_word = S::WIDE ? 4 : 8;  // elements per word
    const V4 z = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int u = 0; u < S::U; ++u) {
        const int j = t0 + u * S::G + grp;
        const bool in = c0 + j < a.end;
        const i64 row = (i64)shfl_idx(my, j % FORGE_WARP) * a.Hkv + a.kvh;
#pragma unroll
        for (int w = 0; w < S::NW; ++w) {
            const int v = w * per_word / 8;  // which 8-element piece
            const int d = hd<LPP>(8 * v, e) + (w * per_word) % 8;
            const bool kon = in && hd<LPP>(8 * v, e) < a.D, von = in && hd<LPP>(8 * v, e) < a.Dv;
            t.k[u][w] = kon ? kv_word<FMT>(a.kc, row, a.D, d) : z;
            t.v[u][w] = von ? kv_word<FMT>(a.vc, row, a.Dv, d) : z;
        }
    }
}

// Online softmax over a loaded round for NQ query heads of one KV head (head j: q + j E, m[j],
// l[j], acc + j E; each head's arithmetic is the same whatever NQ): `left` positions from the
// round's first are real. The quantized formats apply each piece's scale once to its 8 products.
template <int LPP, int VPL, int FMT, int NQ>
FORGE_DEV void att_score(const AttTile<AttShape<LPP, VPL, FMT>>& t, const float* q, int left,
                         int grp, float* m, float* l, float* acc) {
    using S = AttShape<LPP, VPL, FMT>;
    constexpr int E = S::E;
    float sc[NQ][S::U], mx[NQ];
#pragma unroll
    for (int j = 0; j < NQ; ++j) mx[j] = m[j];
#pragma unroll
    for (int u = 0; u < S::U; ++u) {
        float dot[NQ];
#pragma unroll
        for (int j = 0; j < NQ; ++j) dot[j] = 0.0f;
        if (kv_quant(FMT)) {
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                float pd[NQ];
#pragma unroll
                for (int j = 0; j < NQ; ++j) pd[j] = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const float kf = elem_code<FMT>(t.k[u], 8 * v + k);
#pragma unroll
                    for (int j = 0; j < NQ; ++j) pd[j] += q[j * E + 8 * v + k] * kf;
                }
                const float ks = elem_scale<FMT>(t.k[u], 8 * v);
#pragma unroll
                for (int j = 0; j < NQ; ++j) dot[j] += pd[j] * ks;
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) {
                const float kf = elem_code<FMT>(t.k[u], i);
#pragma unroll
                for (int j = 0; j < NQ; ++j) dot[j] += q[j * E + i] * kf;
            }
        }
#pragma unroll
        for (int j = 0; j < NQ; ++j) {
#pragma unroll
            for (int o = LPP / 2; o > 0; o >>= 1) dot[j] += shfl_xor(dot[j], o);
            sc[j][u] = u * S::G + grp < left ? dot[j] : ATT_NEG;
            mx[j] = fmaxf(mx[j], sc[j][u]);
        }
    }
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
        const float f = expf(m[j] - mx[j]);
        l[j] *= f;
#pragma unroll
        for (int i = 0; i < E; ++i) acc[j * E + i] *= f;
    }
#pragma unroll
    for (int u = 0; u < S::U; ++u) {
        float pu[NQ];
#pragma unroll
        for (int j = 0; j < NQ; ++j) {
            pu[j] = u * S::G + grp < left ? expf(sc[j][u] - mx[j]) : 0.0f;
            l[j] += pu[j];
        }
        if (kv_quant(FMT)) {
#pragma unroll
            for (int v = 0; v < VPL; ++v) {
                const float vs = elem_scale<FMT>(t.v[u], 8 * v);
                float ps[NQ];
#pragma unroll
                for (int j = 0; j < NQ; ++j) ps[j] = pu[j] * vs;
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const float vf = elem_code<FMT>(t.v[u], 8 * v + k);
#pragma unroll
                    for (int j = 0; j < NQ; ++j) acc[j * E + 8 * v + k] += ps[j] * vf;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < E; ++i) {
                const float vf = elem_code<FMT>(t.v[u], i);
#pragma unroll
                for (int j = 0; j < NQ; ++j) acc[j * E + i] += pu[j] * vf;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NQ; ++j) m[j] = mx[j];
}

// Each warp's online softmax (att_score's NQ heads) over its chunks of CHK positions of
// [begin, end) (chunk c0 = begin + CHK (warp + nwarps k), rounds of CH within it), continuing
// (m, l, acc). `loaded`: t already holds the first round of the warp's first chunk and `my` its
// slots.
template <int LPP, int VPL, int FMT, int CHK, int NQ, bool PF = false>
FORGE_DEV void attend_run(const AttArgs& a, const float* q, AttTile<AttShape<LPP, VPL, FMT>>& t,
                          bool loaded, int my, float* m, float* l, float* acc) {
    using S = AttShape<LPP, VPL, FMT>;
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nwarps = blockDim.x / FORGE_WARP, first = a.begin + warp * CHK;
    const int step = nwarps * CHK;
    if (!loaded) my = att_slot(a, first, lane, CHK);
    for (int c0 = first; c0 < a.end; c0 += step) {
        if (PF) {  // this warp's chunk ATT_AHEAD chunks on, into L2
            const int ahead = c0 + ATT_AHEAD * step;
            if (ahead < a.end) att_prefetch(a, FMT, ahead, ahead + CHK, lane, FORGE_WARP);
        }
        const int cn = a.end - c0 < CHK ? a.end - c0 : CHK;
        int my_next = 0;
        for (int t0 = 0; t0 < cn; t0 += S::CH) {
            if (!loaded || c0 != first || t0 != 0) att_load<LPP, VPL, FMT>(a, t, my, c0, t0, lane);
            // the next chunk's slots, asked for while this round's rows load (not after)
            if (t0 == 0) my_next = att_slot(a, c0 + step, lane, CHK);
            att_score<LPP, VPL, FMT, NQ>(t, q, cn - t0, lane / LPP, m, l, acc);
        }
        my = my_next;
    }
}

// Merge the groups of a warp; (m, l, acc) into wm[warp], wl[warp], wacc[warp * LAYER_MAX_D + d].
template <int LPP, int VPL>
FORGE_DEV void att_warp_out(float m, float l, float* acc, int Dv, float* wm, float* wl,
                            float* wacc) {
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int e = lane % LPP;
#pragma unroll
    for (int o = LPP; o < FORGE_WARP; o <<= 1) {
        const float mo = shfl_xor(m, o), lo = shfl_xor(l, o);
        const float mm = fmaxf(m, mo), fa = expf(m - mm), fb = expf(mo - mm);
        l = l * fa + lo * fb;
#pragma unroll
        for (int i = 0; i < 8 * VPL; ++i) acc[i] = acc[i] * fa + shfl_xor(acc[i], o) * fb;
        m = mm;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    if (lane < LPP) {
#pragma unroll
        for (int i = 0; i < 8 * VPL; ++i) {
            if (hd<LPP>(i, e) < Dv) wacc[warp * LAYER_MAX_D + hd<LPP>(i, e)] = acc[i];
        }
    }
}

// attn_rows' attention of each warp over its chunks of [begin, end) (16 positions at least per
// slot lookup); qs: the scaled query in shared memory. D and Dv multiples of 8, at most 8 LPP VPL.
template <int LPP, int VPL, int FMT>
FORGE_DEV void attend(const AttArgs& a, const float* qs, float* wm, float* wl, float* wacc) {
    using S = AttShape<LPP, VPL, FMT>;
    const int e = (threadIdx.x % FORGE_WARP) % LPP;
    float q[S::E], acc[S::E], m = ATT_NEG, l = 0.0f;
#pragma unroll
    for (int i = 0; i < S::E; ++i) {
        q[i] = hd<LPP>(i, e) < a.D ? qs[hd<LPP>(i, e)] : 0.0f;
        acc[i] = 0.0f;
    }
    AttTile<S> t;
    constexpr int CHK = S::CH > ATT_CHUNK ? S::CH : ATT_CHUNK;
    attend_run<LPP, VPL, FMT, CHK, 1>(a, q, t, false, 0, &m, &l, acc);
    att_warp_out<LPP, VPL>(m, l, acc, a.Dv, wm, wl, wacc);
}

// Merge the block's entries (its warps, plus the row's own position when given as one more),
// then write the output (one split) or the block's partial; the last block of the (row, head) to
// finish merges the partials. rh = r * H + h.
// sink (gpt-oss's learned sink of the head, or null): one more softmax term e^sink whose value is
// zero, counted once, where the output is normalised.
FORGE_DEV void att_finish(const float* wm, const float* wl, float* wacc, int n_ent, int Dv,
                          int n_eff, int s, int n_grid, i64 rh, float* part_o, float* part_ml,
                          u32* cnt, float* out, int* flag, const float* sink) {
    __syncthreads();  // every entry's wm, wl, wacc
    const bool sunk = sink && n_eff == 1;
    float mx = sunk ? *sink : ATT_NEG;
    for (int w = 0; w < n_ent; ++w) mx = fmaxf(mx, wm[w]);
    float fw[ATT_MAX_WARPS + 1], total = sunk ? expf(*sink - mx) : 0.0f;
#pragma unroll
    for (int w = 0; w < ATT_MAX_WARPS + 1; ++w) {
        fw[w] = w < n_ent ? expf(wm[w] - mx) : 0.0f;
        total += w < n_ent ? wl[w] * fw[w] : 0.0f;
    }
    float* orow = out + rh * Dv;
    const i64 part = rh * n_grid + s;
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_MAX_WARPS + 1; ++w) {
            if (w < n_ent) o += wacc[w * LAYER_MAX_D + d] * fw[w];
        }
        if (n_eff == 1) orow[d] = o / total;
        else part_o[part * Dv + d] = o;
    }
    if (n_eff == 1) return;
    if (threadIdx.x == 0) {
        part_ml[2 * part] = mx;
        part_ml[2 * part + 1] = total;
    }
    __threadfence();  // the partial is visible device-wide before the counter says so
    __syncthreads();
    if (threadIdx.x == 0) *flag = atomicAdd(cnt + rh, 1u) == (u32)(n_eff - 1);
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    // The merge: the partials' maxima, sums and weights found by the whole block at once (a
    // thread looping over every partial's one after another made each split cost a block's
    // latency), the weights into wacc (read by every thread above, so free now; the plan keeps
    // n_eff within the (row, split) pairs of part_o, far fewer than wacc's floats).
    __shared__ float red[ATT_MAX_WARPS];  // (block_max / block_sum: one float a warp)
    const float* po = part_o + rh * n_grid * Dv;
    const float* pm = part_ml + 2 * rh * n_grid;
    float lm = ATT_NEG;
    for (int i = threadIdx.x; i < n_eff; i += blockDim.x) lm = fmaxf(lm, ld_coherent(pm + 2 * i));
    const float gm = fmaxf(block_max(lm, red), sink ? *sink : ATT_NEG);
    float ls = 0.0f;
    for (int i = threadIdx.x; i < n_eff; i += blockDim.x) {
        const float w = expf(ld_coherent(pm + 2 * i) - gm);
        wacc[i] = w;
        ls += ld_coherent(pm + 2 * i + 1) * w;
    }
    const float gl = block_sum(ls, red) + (sink ? expf(*sink - gm) : 0.0f);  // (a barrier too)
    for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll 8
        for (int i = 0; i < n_eff; ++i) o += ld_coherent(po + (i64)i * Dv + d) * wacc[i];
        orow[d] = o / gl;
    }
    if (threadIdx.x == 0) cnt[rh] = 0u;  // every other block of this (row, head) has counted
}

// Causal attention of each row's query (already normed and rotated) over its sequence's cached
// positions 0..pos[r] (the last `window` of them when window > 0). q [R, H, D] -> out [R, H, Dv].
// grid = (H, R, max splits), block = up to ATT_MAX_WARPS warps. part_o [R * H * max splits, Dv],
// part_ml [R * H * max splits, 2], cnt [R * H] (zero). D and Dv: multiples of 8, at most 512.
// sinks [H] (null: none): each head's attention sink, a softmax term with a zero value.
FORGE_KERNEL void __launch_bounds__(ATT_THREADS) attn_rows(const float* __restrict__ q, const void* kc,
    const void* vc, const i32* __restrict__ bt, const i32* __restrict__ btoff,
    const i32* __restrict__ pos, float* part_o, float* part_ml, u32* cnt, float* out, int Hkv,
    int D, int Dv, int block_size, float scale, int window, int kv_fmt,
    const float* __restrict__ sinks) {
    FORGE_GRID_WAIT();
    __shared__ float qs[LAYER_MAX_D];
    __shared__ float wm[ATT_MAX_WARPS + 1], wl[ATT_MAX_WARPS + 1];
    __shared__ float wacc[(ATT_MAX_WARPS + 1) * LAYER_MAX_D];
    __shared__ int flag;
    const int h = blockIdx.x, r = blockIdx.y, s = blockIdx.z, H = gridDim.x;
    const AttSplit sp = att_split(pos[r] + 1, window, s, gridDim.z, H);
    if (s >= sp.n_eff) return;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[((i64)r * H + h) * D + d] * scale;
    __syncthreads();
    AttArgs a;
    a.kc = kc;
    a.vc = vc;
    a.table = bt + btoff[r];
    a.block_size = block_size;
    a.Hkv = Hkv;
    a.kvh = h / (H / Hkv);
    a.D = D;
    a.Dv = Dv;
    a.begin = sp.begin;
    a.end = sp.end;
#define ATTEND_FMT(L, V, F) attend<L, V, F>(a, qs, wm, wl, wacc)
#define ATTEND(L, V) KV_DISPATCH(kv_fmt, ATTEND_FMT, L, V)
    ATT_LAYOUT(a.D, a.Dv, ATTEND);
#undef ATTEND
#undef ATTEND_FMT
    att_finish(wm, wl, wacc, blockDim.x / FORGE_WARP, Dv, sp.n_eff, s, gridDim.z,
               (i64)r * H + h, part_o, part_ml, cnt, out, &flag, sinks ? sinks + h : nullptr);
}

// attn_decode's arguments.
struct DecArgs {
    const float *q, *k, *v, *qnw, *knw;
    const i32 *pos, *slots, *bt, *btoff;
    void *kc, *vc;
    float *part_o, *part_ml;
    u32* cnt;
    float* out;
    int Hkv, D, Dv, n_rot, neox;
    float base, freq_scale;
    const float* freqs;
    float mscale, eps;
    int block_size;
    float scale;
    int window, kv_fmt;
    const float* sinks;
};

// attn_decode in the (LPP, VPL) layout for NQ query heads of one KV head: block x takes heads
// h0 .. h0 + nq - 1 of KV head kvh (the group's H / Hkv heads in ceil(group / NQ) blocks, the last
// one's nq possibly short; its missing heads run as zero queries and write nothing), so that
// each K/V row a block loads serves all of them. Each warp norms and rotates the query heads in
// its registers (no block barrier); warp 0 of the block whose split holds the row's own position
// does the same for the K head, starts its softmax with that position from registers (not from
// the cache) and, in the group's first block, stores K and V. Before the wait each warp loads
// its first round of cached K/V, the RoPE coefficients and the norm weights.
template <int LPP, int VPL, int FMT, int NQ>
FORGE_DEV void attn_decode_head(const DecArgs& g, int H, float* rc, float* wm, float* wl,
                                float* wacc, int* flag) {
    using S = AttShape<LPP, VPL, FMT>;
    constexpr int E = S::E;
    const int r = blockIdx.y, s = blockIdx.z;
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nwarps = blockDim.x / FORGE_WARP, e = lane % LPP, grp = lane / LPP;
    const int group = H / g.Hkv, nb = (group + NQ - 1) / NQ, kvh = blockIdx.x / nb;
    const int first = (blockIdx.x % nb) * NQ, h0 = kvh * group + first;
    const int nq = NQ == 1 || group - first >= NQ ? NQ : group - first;
    const int n_kv = g.pos[r] + 1;
    const AttSplit sp = att_split(n_kv, g.window, s, gridDim.z, H);
    const bool active = s < sp.n_eff;
    const bool self = active && sp.begin < sp.end && sp.end == n_kv && warp == 0;
    AttArgs a;
    a.kc = g.kc;
    a.vc = g.vc;
    a.table = g.bt + g.btoff[r];
    a.block_size = g.block_size;
    a.Hkv = g.Hkv;
    a.kvh = kvh;
    a.D = g.D;
    a.Dv = g.Dv;
    a.begin = sp.begin;
    a.end = sp.end == n_kv ? n_kv - 1 : sp.end;  // cached positions only
    // Before the wait, while the Q/K/V product still runs: only the step's metadata (copied in
    // before the graph), norm weights and K/V rows of earlier positions (final since their steps).
    AttTile<S> t;
    float c[E], sn[E], qw[E], kw[E];
    int my = 0;
    if (active) {
        const int c0 = a.begin + warp * S::CH;
        my = att_slot(a, c0, lane, S::CH);
        if (c0 < a.end) att_load<LPP, VPL, FMT>(a, t, my, c0, 0, lane);
        // the next ATT_AHEAD rounds of every warp into L2 (each round then asks for the one
        // ATT_AHEAD on: L2 holds a bounded window of every block's positions, however long)
        const int r1 = a.begin + nwarps * S::CH;
        att_prefetch(a, FMT, r1, r1 + ATT_AHEAD * nwarps * S::CH, threadIdx.x, blockDim.x);
        rope_table(rc, g.n_rot, (float)g.pos[r] * g.freq_scale, g.base, g.freqs, g.mscale);
        head_weights<LPP, VPL>(g.qnw, g.D, e, qw);
        if (self) head_weights<LPP, VPL>(g.knw, g.D, e, kw);
        __syncthreads();  // uniform: `active` is the same for the whole block
        head_rope_coef<LPP, VPL>(rc, c, sn, e, g.n_rot, g.neox);
    }
    FORGE_GRID_WAIT();
    if (!active) return;
    float q[NQ * E], kx[E], vx[E], acc[NQ * E], m[NQ], l[NQ];
    float* xch = wacc + warp * LAYER_MAX_D;  // the warp's own slice, free until att_warp_out
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
        head_load<LPP, VPL>(g.q + ((i64)r * H + h0 + j) * g.D, j < nq ? g.D : 0, e, q + j * E);
        head_norm_rope<LPP, VPL>(q + j * E, qw, g.qnw != nullptr, c, sn, xch, g.D, g.n_rot,
                                 g.neox, g.eps, g.scale, e, grp == 0);
        m[j] = ATT_NEG;
        l[j] = 0.0f;
    }
    if (self) {
        head_load<LPP, VPL>(g.k + ((i64)r * g.Hkv + kvh) * g.D, g.D, e, kx);
        head_load<LPP, VPL>(g.v + ((i64)r * g.Hkv + kvh) * g.Dv, g.Dv, e, vx);
    }
#pragma unroll
    for (int i = 0; i < NQ * E; ++i) acc[i] = 0.0f;
    if (self) {
        head_norm_rope<LPP, VPL>(kx, kw, g.knw != nullptr, c, sn, xch, g.D, g.n_rot, g.neox,
                                 g.eps, 1.0f, e, grp == 0);
        // K and V as the cache holds them (as read back later); the group's first block stores
        const i64 row = (i64)g.slots[r] * g.Hkv + kvh;
        const bool store = grp == 0 && first == 0;
        head_put<LPP, VPL>(kx, g.kc, row, g.D, e, FMT, store);
        head_put<LPP, VPL>(vx, g.vc, row, g.Dv, e, FMT, store);
#pragma unroll
        for (int j = 0; j < NQ; ++j) {
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < E; ++i) dot += q[j * E + i] * kx[i];
#pragma unroll
            for (int o = LPP / 2; o > 0; o >>= 1) dot += shfl_xor(dot, o);
            if (grp == 0) {  // one group holds the position (the warp's groups are summed)
                m[j] = dot;
                l[j] = 1.0f;
#pragma unroll
                for (int i = 0; i < E; ++i) acc[j * E + i] = vx[i];
            }
        }
    }
    attend_run<LPP, VPL, FMT, S::CH, NQ, true>(a, q, t, true, my, m, l, acc);
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
        if (j < nq) {  // (uniform over the block)
            if (j > 0) __syncthreads();  // the previous head's merge has read wm, wl, wacc
            att_warp_out<LPP, VPL>(m[j], l[j], acc + j * E, g.Dv, wm, wl, wacc);
            const int h = h0 + j;
            att_finish(wm, wl, wacc, nwarps, g.Dv, sp.n_eff, s, gridDim.z, (i64)r * H + h,
                       g.part_o, g.part_ml, g.cnt, g.out, flag, g.sinks ? g.sinks + h : nullptr);
        }
    }
}

// Decode: each row is one new token of its own sequence. q [R, H, D], k [R, Hkv, D], v [R, Hkv, Dv]
// as the QKV product left them (not normed, not rotated); attn_decode_head says who does what.
// freqs, mscale: rope_table's; sinks: attn_rows'.
// grid = (H, R, max splits), block = up to ATT_MAX_WARPS warps. D, Dv as for attn_rows.
// attn_decode_w<W> takes heads of at most W, in the layout of that width (its registers only);
// the plan takes the narrowest that holds its heads. attn_decode_w512 takes every head width.
// attn_decode_w<W>_g4 (W <= 256) takes the query heads of a KV head 4 at a time, reading each
// cached K/V row once for them: grid = (Hkv ceil(H / Hkv / 4), R, max splits), one more
// argument H; its results are attn_decode_w<W>'s to the bit at the same grid z.
#define ATT_DECODE_PARAMS                                                                       \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,      \
        const float *__restrict__ qnw, const float *__restrict__ knw, const i32 *__restrict__ pos, \
        const i32 *__restrict__ slots, const i32 *__restrict__ bt, const i32 *__restrict__ btoff, \
        void *kc, void *vc, float *part_o, float *part_ml, u32 *cnt, float *out, int Hkv, int D, \
        int Dv, int n_rot, int neox, float base, float freq_scale, const float *freqs,         \
        float mscale, float eps, int block_size, float scale, int window, int kv_fmt,          \
        const float *sinks
#define ATT_DECODE_BODY(DISPATCH)                                                               \
    __shared__ float rc[LAYER_MAX_D], wm[ATT_MAX_WARPS + 1], wl[ATT_MAX_WARPS + 1];            \
    __shared__ float wacc[(ATT_MAX_WARPS + 1) * LAYER_MAX_D];                                   \
    __shared__ int flag;                                                                        \
    const DecArgs g = {q, k, v, qnw, knw, pos, slots, bt, btoff, kc, vc, part_o, part_ml, cnt, \
                       out, Hkv, D, Dv, n_rot, neox, base, freq_scale, freqs, mscale, eps,     \
                       block_size, scale, window, kv_fmt, sinks};                              \
    DISPATCH
#define DECODE_FMT(L, V, F) attn_decode_head<L, V, F, 1>(g, gridDim.x, rc, wm, wl, wacc, &flag)
#define DECODE_HEAD(L, V) KV_DISPATCH(kv_fmt, DECODE_FMT, L, V)
#define DECODE_FMT4(L, V, F) attn_decode_head<L, V, F, 4>(g, H, rc, wm, wl, wacc, &flag)
#define DECODE_HEAD4(L, V) KV_DISPATCH(kv_fmt, DECODE_FMT4, L, V)

FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w64(ATT_DECODE_PARAMS) {
    ATT_DECODE_BODY(DECODE_HEAD(8, 1);)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w128(ATT_DECODE_PARAMS) {
    ATT_DECODE_BODY(DECODE_HEAD(16, 1);)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w256(ATT_DECODE_PARAMS) {
    ATT_DECODE_BODY(DECODE_HEAD(32, 1);)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w512(ATT_DECODE_PARAMS) {
    ATT_DECODE_BODY(DECODE_HEAD((FORGE_WARP >= 64 ? 64 : 32), (FORGE_WARP >= 64 ? 1 : 2));)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w64_g4(ATT_DECODE_PARAMS, int H) {
    ATT_DECODE_BODY(DECODE_HEAD4(8, 1);)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w128_g4(ATT_DECODE_PARAMS, int H) {
    ATT_DECODE_BODY(DECODE_HEAD4(16, 1);)
}
FORGE_KERNEL void __launch_bounds__(ATT_THREADS, 1) attn_decode_w256_g4(ATT_DECODE_PARAMS, int H) {
    ATT_DECODE_BODY(DECODE_HEAD4(32, 1);)
}
#undef DECODE_HEAD4
#undef DECODE_FMT4
#undef DECODE_HEAD
#undef DECODE_FMT
