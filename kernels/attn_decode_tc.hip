// attn_decode_tc.hip: decode attention on tensor cores (NVIDIA) over a float16 or Q8_0 paged
// cache (Q8_0 rows are copied as cached and turned into float16 tiles in shared memory, each value
// rounded once, before the same products).
//
// Each row r is one new token of its own sequence. Fused (k given): the kernel norms and rotates
// the row's Q heads itself (each block its group's, into shared memory) and, in the block of the
// last split, the warp whose tiles hold the row's own position stores the row's K/V into the
// cache before it copies the tile holding them, with attn_heads.h's functions, so the bits are
// qk_rope_store's; this saves that launch and its wait in every decode layer. Before the grid
// wait a block reads only what no kernel of the step writes: the row's position and block
// table, the RoPE frequencies, the cached K/V of earlier positions (its first stages).
// Unfused (k null): Q is already normed and rotated and K/V already cached (qk_rope_store).
// A block takes one KV head of one row over one split of the row's positions: the G = H / Hkv
// query heads of that KV head are the rows of m16n8k16 tiles (zero rows past G), so each cached
// K/V row is read once for all of them and both products run on tensor cores. attention.hip's
// attn_decode keeps those heads in registers and spends a warp's arithmetic per position: at
// depth it held a block to ~1 TB/s, with its loads made asynchronous or not
// (benchmarks/gpu_notes.md).
// Each warp streams its own tiles of TCD_BK keys (tile w, w + warps, ...) into a ring of
// TCD_STAGES stages by cp.async, rows padded to D + 8 halves (ldmatrix without bank conflicts);
// S = Q K^T, an online softmax in float32 with exp2, O += P V, Q and P rounded to float16 as
// attn_prefill's tensor-core path and llama.cpp's f16 flash attention round them. The block's
// warps merge in shared memory; with several splits each block writes its partial and the last
// of a (row, KV head) to finish, found through an atomic counter (zero between launches), merges.
//
// Kernels attn_decode_tc64 / attn_decode_tc128 (D = Dv = 64 / 128; _q8: a Q8_0 cache): q [R, H,
// D] -> out [R, H, D]; grid = (Hkv, R, max splits), block = TCD_THREADS, dynamic shared memory
// TCD_SMEM_64 / TCD_SMEM_128 (TCD_SMEM_Q8_64 / TCD_SMEM_Q8_128). part_o [R H max splits, D],
// part_ml [.., 2], cnt [R H]; sinks [H] or null (gpt-oss: one more softmax term of value zero);
// window > 0: the last `window` positions only; cache blocks of block_size >= TCD_BK positions.
// Fused: k [R, Hkv, D], v [R, Hkv, D], the norm weights (or null), slots [R] and the RoPE
// arguments as qk_rope_store takes them (q is read, not written). D <= TCD_MAX_D.
// On AMD the kernels are empty: the plan takes them on NVIDIA only.
#include "attn_heads.h"

#define TCD_NEG (-1.0e30f)
#define TCD_LOG2E 1.4426950408889634f
#define TCD_WARPS (TCD_THREADS / 32)

struct TcdArgs {
    const float* q;
    void *kc, *vc;  // float16 rows, or Q8_0 rows of TcdQ8<D>::RB bytes (the fused form writes)
    const i32 *bt, *btoff, *pos;
    float *part_o, *part_ml;
    u32* cnt;
    float* out;
    int H, Hkv, block_size;
    float scale;
    int window;
    const float* sinks;
    // the fused form's (k null: unfused)
    const float *k, *v, *qnw, *knw;
    const i32* slots;
    int n_rot, neox;
    float base, freq_scale;
    const float* freqs;
    float mscale, eps;
};

// Shared memory of the fused form's prologue (static, beside the dynamic ring, so the ring's first
// copies are in flight while the queries are rotated).
struct TcdPrologue {
    float q[TCD_MAX_GROUP * TCD_MAX_D];  // the group's normed, rotated query heads
    float rc[TCD_MAX_D];  // rope_table's cos/sin pairs
    float xch[TCD_WARPS * TCD_MAX_D];  // each warp's exchange row (head_norm_rope)
};

#if defined(FORGE_NV)
// The cache slots of a tile of positions [key0, key0 + TCD_BK) (those before `end`). Cache blocks
// hold TCD_BK positions or more (the plan's condition), so a tile spans at most two: their table
// entries are found once a tile, not with a division and a table read for every row a lane
// copies (as many instructions as the tile's products).
struct TcdTile {
    int bs, r0;
    i64 base0, base1;

    FORGE_DEV TcdTile(const TcdArgs& g, const i32* table, int key0, int end) {
        bs = g.block_size;
        const int b0 = key0 / bs;
        r0 = key0 - b0 * bs;
        base0 = key0 < end ? (i64)table[b0] * bs : 0;
        base1 = b0 * bs + bs < end ? (i64)table[b0 + 1] * bs - bs : 0;
    }
    // The cache slot of the tile's row `row` (a valid one: before the split's end).
    FORGE_DEV i64 slot(int row) const { return (r0 + row < bs ? base0 : base1) + r0 + row; }
};

// Copy tile positions [key0, key0 + TCD_BK) of KV head kvh (zeros past end) into a stage: K rows
// then V rows, LD halves apart; each lane D / 16 pieces of 16 bytes of each.
template <int D, int LD>
FORGE_DEV void tcd_issue(const TcdArgs& g, const i32* table, int kvh, int key0, int end, u16* stage,
                         int lane) {
    u16* vs = stage + TCD_BK * LD;
    const TcdTile tile(g, table, key0, end);
#pragma unroll
    for (int i = 0; i < TCD_BK * D / 8 / 32; ++i) {
        const int idx = i * 32 + lane, row = idx / (D / 8), col = (idx % (D / 8)) * 8;
        const bool ok = key0 + row < end;
        const i64 slot = ok ? tile.slot(row) : 0;
        const i64 off = (slot * g.Hkv + kvh) * D + col;
        cp_async16(stage + row * LD + col, (const u16*)g.kc + off, ok);
        cp_async16(vs + row * LD + col, (const u16*)g.vc + off, ok);
    }
}

// Bytes of a Q8_0 cache row of D values (kv_format.h: the codes, the f16 scales, padded to 8).
template <int D> struct TcdQ8 {
    static constexpr int RB = (D + 2 * (D / 32) + 7) & ~7;
};

// The Q8_0 form of tcd_issue: the tile's K then V rows as they are cached (RB bytes each, 8-byte
// aligned: copied in pieces of 8 bytes), for tcd_dequant to turn into float16 tiles.
template <int D>
FORGE_DEV void tcd_issue_q8(const TcdArgs& g, const i32* table, int kvh, int key0, int end,
                            char* stage, int lane) {
    constexpr int RB = TcdQ8<D>::RB, CH = RB / 8, N = 2 * TCD_BK * CH;
    static_assert(N % 32 == 0, "a tile's 8-byte pieces split evenly over a warp");
    const TcdTile tile(g, table, key0, end);
#pragma unroll
    for (int j = 0; j < N / 32; ++j) {
        const int idx = j * 32 + lane, m = idx / (TCD_BK * CH), rem = idx - m * TCD_BK * CH;
        const int row = rem / CH, c = rem - row * CH;
        const bool ok = key0 + row < end;
        const i64 slot = ok ? tile.slot(row) : 0;
        const char* src = (const char*)(m ? g.vc : g.kc) + (slot * g.Hkv + kvh) * RB + 8 * c;
        cp_async8(stage + (m * TCD_BK + row) * RB + 8 * c, src, ok);
    }
}

// Four Q8_0 codes (bytes sel's two of `codes`) times the scale pair d2, as float16 pairs: each
// code biased into the mantissa of 1024 (0x64XX = 1152 + code), 1152 taken off exactly, then
// one rounded product, as rounding code * scale to float16.
FORGE_DEV u32 tcd_q8_pair(u32 codes, u32 sel, u32 d2) {
    const u32 h = __byte_perm(codes ^ 0x80808080u, 0x64646464u, sel);
    u32 r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x64806480u));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(r), "r"(d2));
    return r;
}

// A warp's staged Q8_0 tile (K rows then V rows) as float16 rows LD halves apart, the layout
// tcd_issue gives a float16 cache.
template <int D, int LD> FORGE_DEV void tcd_dequant(const char* raw, u16* tile, int lane) {
    constexpr int RB = TcdQ8<D>::RB, W = 2 * TCD_BK * (D / 8);
#pragma unroll
    for (int j = 0; j < W / 32; ++j) {
        const int w = j * 32 + lane, row = w / (D / 8), c8 = w % (D / 8);
        const char* src = raw + row * RB;
        const uint2 codes = *(const uint2*)(src + 8 * c8);
        const u32 d = *(const u16*)(src + D + 2 * (c8 / 4)), d2 = d | (d << 16);
        uint4 out;
        out.x = tcd_q8_pair(codes.x, 0x5150u, d2);
        out.y = tcd_q8_pair(codes.x, 0x5352u, d2);
        out.z = tcd_q8_pair(codes.y, 0x5150u, d2);
        out.w = tcd_q8_pair(codes.y, 0x5352u, d2);
        *(uint4*)(tile + row * LD + 8 * c8) = out;
    }
}

// The last block of a (row, KV head) merges the G heads' n_eff partials. The block first reads
// every partial's (max, sum) at once and turns them into weights in shared memory (w), then each
// thread sums float4 columns of the partials with eight loads in flight: one thread looping
// over the partials one after another made each split cost an L2 round trip (the merge took
// ~15 us of a 56 us launch at 32 splits on an H200).
template <int D>
FORGE_DEV void tcd_merge(const TcdArgs& g, i64 rh0, int h0, int G, int n_eff, int n_grid,
                         float* w) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float* pm = g.part_ml + 2 * rh0 * n_grid;  // [G][n_grid][2]
    for (int t = threadIdx.x; t < G * n_eff; t += blockDim.x) {
        const int row = t / n_eff, i = t % n_eff;
        w[t] = __ldcg(pm + 2 * (row * n_grid + i));
        w[G * n_eff + t] = __ldcg(pm + 2 * (row * n_grid + i) + 1);
    }
    __syncthreads();
    for (int row = warp; row < G; row += TCD_WARPS) {  // a warp a head: its weights
        const float sink = g.sinks ? g.sinks[h0 + row] * TCD_LOG2E : TCD_NEG;
        float gm = sink;
        for (int i = lane; i < n_eff; i += 32) gm = fmaxf(gm, w[row * n_eff + i]);
        for (int o = 16; o > 0; o /= 2) gm = fmaxf(gm, shfl_xor(gm, o));
        float l = 0.0f;
        for (int i = lane; i < n_eff; i += 32)
            l += w[G * n_eff + row * n_eff + i] * exp2f(w[row * n_eff + i] - gm);
        for (int o = 16; o > 0; o /= 2) l += shfl_xor(l, o);
        l += g.sinks ? exp2f(sink - gm) : 0.0f;
        __syncwarp();  // every lane has read the row's maxima before they become weights
        for (int i = lane; i < n_eff; i += 32)
            w[row * n_eff + i] = exp2f(w[row * n_eff + i] - gm) / l;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D / 4; t += blockDim.x) {
        const int row = t / (D / 4), d = 4 * (t % (D / 4));
        const float4* po = (const float4*)(g.part_o + ((rh0 + row) * n_grid) * D + d);
        const float* wr = w + row * n_eff;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int i = 0; i < n_eff; ++i) {
            const float4 v = __ldcg(po + i * (D / 4));
            acc.x += v.x * wr[i];
            acc.y += v.y * wr[i];
            acc.z += v.z * wr[i];
            acc.w += v.w * wr[i];
        }
        *(float4*)(g.out + (rh0 + row) * D + d) = acc;
    }
}

template <int D, int LD, bool Q8>
FORGE_DEV void tcd_stage(const TcdArgs& g, const i32* table, int kvh, int key0, int end, u16* stage,
                         int lane) {
    if (Q8) tcd_issue_q8<D>(g, table, kvh, key0, end, (char*)stage, lane);
    else tcd_issue<D, LD>(g, table, kvh, key0, end, stage, lane);
}

// The (LPP, VPL) layout attn_heads.h's functions take for heads of D (ATT_LAYOUT's, D <= 128).
template <int D> struct TcdHead {
    static constexpr int LPP = D <= 64 ? 8 : 16;
};

// Fused form: the row's K head (normed, rotated) and V head of KV head kvh into the cache, as
// qk_rope_store stores them, by one warp (the one whose tiles hold the row's own position: its
// copy of that tile comes after these stores in its own order, so no other warp waits for them;
// only tiles of earlier positions were copied before).
template <int D, bool Q8>
FORGE_DEV void tcd_store_kv(const TcdArgs& g, TcdPrologue& sp, int r, int kvh) {
    constexpr int LPP = TcdHead<D>::LPP, FMT = Q8 ? KV_Q8_0 : KV_F16;
    const int warp = threadIdx.x / 32;
    const i64 row = (i64)g.slots[r] * g.Hkv + kvh, at = ((i64)r * g.Hkv + kvh) * D;
    qk_head<LPP, 1>(g.k + at, nullptr, g.knw, g.kc, row, false, D, g.n_rot, g.neox, sp.rc, g.eps,
                    FMT, sp.xch + warp * TCD_MAX_D);
    v_head<LPP, 1>(g.v + at, g.vc, row, D, FMT);
    __syncwarp();  // the stores are seen by the warp's later copies
}

// Fused form: the G query heads of KV head kvh, normed and rotated into sp.q (a warp a head).
template <int D> FORGE_DEV void tcd_rope_q(const TcdArgs& g, TcdPrologue& sp, int r, int kvh,
                                           int G) {
    constexpr int LPP = TcdHead<D>::LPP;
    const int warp = threadIdx.x / 32;
    for (int j = warp; j < G; j += TCD_WARPS)
        qk_head<LPP, 1>(g.q + ((i64)r * g.H + kvh * G + j) * D, sp.q + j * D, g.qnw, nullptr, 0,
                        true, D, g.n_rot, g.neox, sp.rc, g.eps, KV_F16, sp.xch + warp * TCD_MAX_D);
}

template <int D, bool Q8>
FORGE_DEV void tcd_body(const TcdArgs& g, u16* ring_all, int* flag, TcdPrologue& sp) {
    // a warp's ring of TCD_STAGES stages (float16 tiles, or Q8_0 rows as cached, in halves),
    // then with Q8_0 the float16 tile they are turned into
    constexpr int LD = D + 8, TILE = 2 * TCD_BK * LD;
    constexpr int STAGE = Q8 ? TCD_BK * TcdQ8<D>::RB : TILE;
    constexpr int WARP_HALVES = TCD_STAGES * STAGE + (Q8 ? TILE : 0);
    const int kvh = blockIdx.x, r = blockIdx.y, s = blockIdx.z, n_grid = gridDim.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, G = g.H / g.Hkv;
    // The split rule of attention.hip's att_split (without its short splits for few blocks:
    // this kernel's blocks are few only at lengths where one split is enough).
    const int n_kv = g.pos[r] + 1;
    const int lo = g.window > 0 && n_kv > g.window ? n_kv - g.window : 0, len = n_kv - lo;
    int n_eff = (len + TCD_SPLIT_MIN - 1) / TCD_SPLIT_MIN;
    n_eff = n_eff < 1 ? 1 : (n_eff > n_grid ? n_grid : n_eff);
    if (s >= n_eff) return;  // (before the wait: this block reads and writes nothing)
    const int per = (len + n_eff - 1) / n_eff, begin = lo + s * per;
    const int end = begin + per < n_kv ? begin + per : n_kv;
    const i32* table = g.bt + g.btoff[r];
    u16* ring = ring_all + warp * WARP_HALVES;
    const int tiles = (end - begin + TCD_BK - 1) / TCD_BK;
    const bool fused = g.k != nullptr;
    const int mine = warp < tiles ? (tiles - warp + TCD_WARPS - 1) / TCD_WARPS : 0;
    // Before the wait, the first stages whose keys all precede the row's own position (cached by
    // earlier steps; the step's metadata came before the graph) are copied, and the RoPE table
    // built: the kernel before may still run. The row's own K/V are stored after the wait.
    int early = 0;
    while (early < TCD_STAGES - 1 && early < mine &&
           begin + (warp + early * TCD_WARPS + 1) * TCD_BK <= n_kv - 1) {
        tcd_stage<D, LD, Q8>(g, table, kvh, begin + (warp + early * TCD_WARPS) * TCD_BK, end,
                             ring + early * STAGE, lane);
        cp_async_commit();
        ++early;
    }
    if (fused) {
        rope_table(sp.rc, g.n_rot, (float)g.pos[r] * g.freq_scale, g.base, g.freqs, g.mscale);
        __syncthreads();
    }
    FORGE_GRID_WAIT();
    // the split holding the row's own position; the warp whose tiles hold it
    if (fused && s == n_eff - 1 && warp == (tiles - 1) % TCD_WARPS)
        tcd_store_kv<D, Q8>(g, sp, r, kvh);
    for (int i = early; i < TCD_STAGES - 1; ++i) {
        if (i < mine)
            tcd_stage<D, LD, Q8>(g, table, kvh, begin + (warp + i * TCD_WARPS) * TCD_BK, end,
                                 ring + i * STAGE, lane);
        cp_async_commit();
    }
    if (fused) {  // (while the first tiles are on their way)
        tcd_rope_q<D>(g, sp, r, kvh, G);
        __syncthreads();
    }
    // Q fragments, scaled by scale * log2(e): rows r0 = lane / 4 and r1 = r0 + 8 (heads of the
    // group; zero past G), columns c, c + 1 (and + 8) of each 16-wide step.
    const int r0 = lane / 4, r1 = r0 + 8, c = (lane % 4) * 2;
    const float qs = g.scale * TCD_LOG2E;
    const float* qg = fused ? sp.q : g.q + ((i64)r * g.H + kvh * G) * D;
    const float *q0 = qg + r0 * D, *q1 = qg + r1 * D;
    u32 qa[D / 16][4];
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const int d = 16 * k + c;
        qa[k][0] = r0 < G ? pack_h2(q0[d] * qs, q0[d + 1] * qs) : 0u;
        qa[k][1] = r1 < G ? pack_h2(q1[d] * qs, q1[d + 1] * qs) : 0u;
        qa[k][2] = r0 < G ? pack_h2(q0[d + 8] * qs, q0[d + 9] * qs) : 0u;
        qa[k][3] = r1 < G ? pack_h2(q1[d + 8] * qs, q1[d + 9] * qs) : 0u;
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m0 = TCD_NEG, m1 = TCD_NEG, l0 = 0.0f, l1 = 0.0f;
    const int mat = lane / 8, mr = lane % 8;  // the ldmatrix tile and row this lane addresses
    for (int i = 0; i < mine; ++i) {
        const int ahead = i + TCD_STAGES - 1;
        if (ahead < mine)
            tcd_stage<D, LD, Q8>(g, table, kvh, begin + (warp + ahead * TCD_WARPS) * TCD_BK, end,
                                 ring + (ahead % TCD_STAGES) * STAGE, lane);
        cp_async_commit();
        cp_async_wait<TCD_STAGES - 1>();
        __syncwarp();
        const u16* ks = ring + (i % TCD_STAGES) * STAGE;
        if (Q8) {
            tcd_dequant<D, LD>((const char*)ks, ring + TCD_STAGES * STAGE, lane);
            __syncwarp();
            ks = ring + TCD_STAGES * STAGE;
        }
        const u16* vs = ks + TCD_BK * LD;
        // S (16 heads x 16 keys): tiles of keys 0-7 and 8-15, each from two 8 x 8 ldmatrix tiles
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            u32 b[4];
            ldsm_x4(ks + ((mat / 2) * 8 + mr) * LD + 16 * k + (mat % 2) * 8, b);
            mma_f16(sc[0], qa[k], b[0], b[1]);
            mma_f16(sc[1], qa[k], b[2], b[3]);
        }
        const int key0 = begin + (warp + i * TCD_WARPS) * TCD_BK;
        if (key0 + TCD_BK > end) {  // (the split's last tile only)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if (key0 + nt * 8 + c + (e & 1) >= end) sc[nt][e] = TCD_NEG;
                }
            }
        }
        float x0 = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
        float x1 = fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3]));
        x0 = fmaxf(x0, shfl_xor(x0, 1));
        x0 = fmaxf(x0, shfl_xor(x0, 2));
        x1 = fmaxf(x1, shfl_xor(x1, 1));
        x1 = fmaxf(x1, shfl_xor(x1, 2));
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        // Rescale only when a maximum of the warp grew (factors of exactly 1 otherwise: the
        // same values): past the first tiles of a long split it seldom does.
        if (__any_sync(0xffffffffu, n0 > m0 || n1 > m1)) {
            const float f0 = exp2f(m0 - n0), f1 = exp2f(m1 - n1);
            l0 *= f0;
            l1 *= f1;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                o[j][0] *= f0;
                o[j][1] *= f0;
                o[j][2] *= f1;
                o[j][3] *= f1;
            }
            m0 = n0;
            m1 = n1;
        }
        float p[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            p[nt][0] = exp2f(sc[nt][0] - m0);
            p[nt][1] = exp2f(sc[nt][1] - m0);
            p[nt][2] = exp2f(sc[nt][2] - m1);
            p[nt][3] = exp2f(sc[nt][3] - m1);
        }
        l0 = l0 + p[0][0] + p[0][1] + p[1][0] + p[1][1];
        l1 = l1 + p[0][2] + p[0][3] + p[1][2] + p[1][3];
        // P as the A tile of O += P V (the S fragments' layout is the A fragments')
        const u32 pa[4] = {pack_h2(p[0][0], p[0][1]), pack_h2(p[0][2], p[0][3]),
                           pack_h2(p[1][0], p[1][1]), pack_h2(p[1][2], p[1][3])};
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {
            u32 b[4];
            ldsm_x4_t(vs + ((mat % 2) * 8 + mr) * LD + 16 * j + (mat / 2) * 8, b);
            mma_f16(o[2 * j], pa, b[0], b[1]);
            mma_f16(o[2 * j + 1], pa, b[2], b[3]);
        }
        __syncwarp();  // the stage is read before a later round's copies reuse it
    }
    cp_async_wait<0>();
    l0 += shfl_xor(l0, 1);
    l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1);
    l1 += shfl_xor(l1, 2);
    __syncthreads();  // every warp is done with its ring: the shared memory now holds the merge
    float* wo = (float*)ring_all;  // [warps][16][D]
    float* wml = wo + TCD_WARPS * 16 * D;  // [warps][16][2]
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        const int d = 8 * j + c;
        wo[(warp * 16 + r0) * D + d] = o[j][0];
        wo[(warp * 16 + r0) * D + d + 1] = o[j][1];
        wo[(warp * 16 + r1) * D + d] = o[j][2];
        wo[(warp * 16 + r1) * D + d + 1] = o[j][3];
    }
    if (lane % 4 == 0) {
        wml[2 * (warp * 16 + r0)] = m0;
        wml[2 * (warp * 16 + r0) + 1] = l0;
        wml[2 * (warp * 16 + r1)] = m1;
        wml[2 * (warp * 16 + r1) + 1] = l1;
    }
    __syncthreads();
    const i64 rh0 = (i64)r * g.H + kvh * G;  // (row, first head of the group)
    for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
        const int row = t / D, d = t % D;
        float mx = TCD_NEG;
#pragma unroll
        for (int w = 0; w < TCD_WARPS; ++w) mx = fmaxf(mx, wml[2 * (w * 16 + row)]);
        float acc = 0.0f, l = 0.0f;
#pragma unroll
        for (int w = 0; w < TCD_WARPS; ++w) {
            const float f = exp2f(wml[2 * (w * 16 + row)] - mx);
            acc += wo[(w * 16 + row) * D + d] * f;
            l += wml[2 * (w * 16 + row) + 1] * f;
        }
        const i64 rh = rh0 + row;
        if (n_eff == 1) {
            const float sink = g.sinks ? g.sinks[kvh * G + row] * TCD_LOG2E : TCD_NEG;
            const float gm = fmaxf(mx, sink), f = exp2f(mx - gm);
            g.out[rh * D + d] = acc * f / (l * f + (g.sinks ? exp2f(sink - gm) : 0.0f));
        } else {  // (maxima in log2 units: only this kernel merges its partials)
            const i64 part = rh * n_grid + s;
            g.part_o[part * D + d] = acc;
            if (d == 0) {
                g.part_ml[2 * part] = mx;
                g.part_ml[2 * part + 1] = l;
            }
        }
    }
    if (n_eff == 1) return;
    __threadfence();  // the partial is visible device-wide before the counter says so
    __syncthreads();
    if (threadIdx.x == 0) *flag = atomicAdd(g.cnt + rh0, 1u) == (u32)(n_eff - 1);
    __syncthreads();
    if (!*flag) return;
    __threadfence();
    tcd_merge<D>(g, rh0, kvh * G, G, n_eff, n_grid, (float*)ring_all);
    if (threadIdx.x == 0) g.cnt[rh0] = 0u;  // every block of this (row, KV head) has counted
}
#endif

#define TCD_PARAMS                                                                              \
    const float *__restrict__ q, void *kc, void *vc, const i32 *__restrict__ bt,                \
        const i32 *__restrict__ btoff, const i32 *__restrict__ pos, float *part_o,             \
        float *part_ml, u32 *cnt, float *out, int H, int Hkv, int block_size, float scale,     \
        int window, const float *sinks, const float *k, const float *v, const float *qnw,          \
        const float *knw, const i32 *slots, int n_rot, int neox, float base, float freq_scale, \
        const float *freqs, float mscale, float eps
#if defined(FORGE_NV)
#define TCD_KERNEL_BODY(D, Q8)                                                                  \
    extern __shared__ __align__(16) u16 tcd_ring[];                                             \
    __shared__ int flag;                                                                        \
    __shared__ TcdPrologue pro;                                                                 \
    const TcdArgs g = {q,     kc,    vc,    bt,   btoff, pos,   part_o, part_ml, cnt,   out,   \
                       H,     Hkv,   block_size, scale, window, sinks, k,   v,     qnw,   knw,  \
                       slots, n_rot, neox,  base, freq_scale, freqs, mscale, eps};              \
    tcd_body<D, Q8>(g, tcd_ring, &flag, pro);
#else
#define TCD_KERNEL_BODY(D, Q8)                                                                  \
    (void)q, (void)kc, (void)vc, (void)bt, (void)btoff, (void)pos, (void)part_o, (void)part_ml; \
    (void)cnt, (void)out, (void)H, (void)Hkv, (void)block_size, (void)scale, (void)window;      \
    (void)sinks, (void)k, (void)v, (void)qnw, (void)knw, (void)slots, (void)n_rot, (void)neox;   \
    (void)base, (void)freq_scale, (void)freqs, (void)mscale, (void)eps;                       \
    FORGE_GRID_WAIT();
#endif

FORGE_KERNEL void __launch_bounds__(TCD_THREADS, 2) attn_decode_tc64(TCD_PARAMS) {
    TCD_KERNEL_BODY(64, false)
}
FORGE_KERNEL void __launch_bounds__(TCD_THREADS, 2) attn_decode_tc128(TCD_PARAMS) {
    TCD_KERNEL_BODY(128, false)
}
FORGE_KERNEL void __launch_bounds__(TCD_THREADS, 2) attn_decode_tc64_q8(TCD_PARAMS) {
    TCD_KERNEL_BODY(64, true)
}
FORGE_KERNEL void __launch_bounds__(TCD_THREADS, 2) attn_decode_tc128_q8(TCD_PARAMS) {
    TCD_KERNEL_BODY(128, true)
}
#undef TCD_KERNEL_BODY
#undef TCD_PARAMS
