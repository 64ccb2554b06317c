// sampling.hip: one token per logits row, picked on the device, so only token ids go to the host.
//
// sample_rows follows the host chain of forge.sampling for the built-in stages, in their default
// order: top_k (keep the k highest logits and ties with the k-th) -> top_p (the smallest most
// probable set with softmax mass >= p, and ties) -> min_p (logit >= max + ln min_p) ->
// temperature -> a draw: the first kept token, in token-id order, whose running sum of
// exp((logit - max) / T) exceeds u times the total, u uniform in [0, 1) from Philox4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) keyed by the sequence's
// 64-bit key at counter = the sequence's token index: the same key and counter give the same u.
// Temperature 0 is the argmax (lowest id among ties). A row holding NaN or +inf, or only -inf,
// gets -1 (the host raises).
//
// Per row r (blocks (r, 0 .. P - 1) of SMP_THREADS threads: grid = (rows, P)), parameter row
// pr = rowidx ? rowidx[r] : r, and field f of it at prm[f * stride + pr] (int32 words; doubles as
// two words, low word first). The P blocks of a row find the max of one slice each (the whole
// of a greedy pick, which is one pass over the row: P blocks read it P times faster); the last
// of them to finish, found through cnt[r] (zero between launches), merges their results from
// part [rows, P, 3] and goes on alone with what the row's sampling needs.
//
// How: a histogram of distances below the max (bins of 1/SMP_SCALE) bounds the set the stages
// can keep; when that set has at most SMP_CAP tokens (the usual case: top_k, min_p or a peaked
// distribution), they are gathered into shared memory, ranked, and cut exactly there. Otherwise
// (no truncation, or a very wide one) each threshold is found by bisection over the float order
// with one pass over the row per step, and the draw scans the row in id order.
#include "forge_hip.h"

#define SMP_BINS 2048
#define SMP_SCALE 128.0f
#define SMP_CAP 2048  // = 2 * SMP_THREADS: each thread owns two candidates in the scans
#define SMP_NEG (-3.402823466e38f)
#define SMP_NONE 0x7fffffff
#define SMP_BATCH 8  // loads in flight per thread in a pass over the row


// ---- Philox4x32-10 -------------------------------------------------------------------------
FORGE_DEV double philox_uniform(u32 k0, u32 k1, u32 c0, u32 c1) {
    u32 x0 = c0, x1 = c1, x2 = 0u, x3 = 0u;
    for (int i = 0; i < 10; ++i) {
        const u64 p0 = (u64)0xD2511F53u * x0, p1 = (u64)0xCD9E8D57u * x2;
        const u32 y0 = (u32)(p1 >> 32) ^ x1 ^ k0, y2 = (u32)(p0 >> 32) ^ x3 ^ k1;
        x1 = (u32)p1;
        x3 = (u32)p0;
        x0 = y0;
        x2 = y2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    // 53 random bits: [0, 1) in steps of 2^-53
    return ((double)(x0 >> 5) * 67108864.0 + (double)(x1 >> 6)) * (1.0 / 9007199254740992.0);
}

// ---- block helpers (deterministic: every order of summation is fixed) ------------------------
FORGE_DEV double shfl_xor_d(double v, int m) {
#if defined(FORGE_AMD)
    return __shfl_xor(v, m, FORGE_WARP);
#else
    return __shfl_xor_sync(0xffffffffu, v, m, FORGE_WARP);
#endif
}

FORGE_DEV double shfl_up_d(double v, int d) {
#if defined(FORGE_AMD)
    return __shfl_up(v, (unsigned)d, FORGE_WARP);
#else
    return __shfl_up_sync(0xffffffffu, v, (unsigned)d, FORGE_WARP);
#endif
}

FORGE_DEV double block_sum_d(double v, double* ws) {
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nw = blockDim.x / FORGE_WARP;
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) v += shfl_xor_d(v, m);
    __syncthreads();
    if (lane == 0) ws[warp] = v;
    __syncthreads();
    double t = 0.0;
    for (int w = 0; w < nw; ++w) t += ws[w];
    return t;
}

FORGE_DEV int block_sum_i(int v, int* ws) {
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nw = blockDim.x / FORGE_WARP;
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) v += shfl_xor_int(v, m);
    __syncthreads();
    if (lane == 0) ws[warp] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < nw; ++w) t += ws[w];
    return t;
}

// Exclusive prefix sum in thread order; *total gets the sum over the block.
FORGE_DEV double block_scan_d(double v, double* ws, double* total) {
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nw = blockDim.x / FORGE_WARP;
    double inc = v;
    for (int o = 1; o < FORGE_WARP; o <<= 1) {
        const double y = shfl_up_d(inc, o);
        if (lane >= o) inc += y;
    }
    double exc = shfl_up_d(inc, 1);
    if (lane == 0) exc = 0.0;
    __syncthreads();
    if (lane == FORGE_WARP - 1) ws[warp] = inc;
    __syncthreads();
    double before = 0.0, all = 0.0;
    for (int w = 0; w < nw; ++w) {
        if (w < warp) before += ws[w];
        all += ws[w];
    }
    *total = all;
    return before + exc;
}

FORGE_DEV void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// Largest value (lowest index among equals) over the block; every thread gets both.
FORGE_DEV void block_best(float& v, int& i, float* fs, int* is) {
    const int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    const int nw = blockDim.x / FORGE_WARP;
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) better(v, i, shfl_xor(v, m), shfl_xor_int(i, m));
    __syncthreads();
    if (lane == 0) {
        fs[warp] = v;
        is[warp] = i;
    }
    __syncthreads();
    v = SMP_NEG;
    i = SMP_NONE;
    for (int w = 0; w < nw; ++w) better(v, i, fs[w], is[w]);
}

// slot = the smallest c any thread offers (c = SMP_NONE offers nothing); slot preset to SMP_NONE.
FORGE_DEV void claim_min(int c, int* slot) {
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) {
        const int o = shfl_xor_int(c, m);
        c = o < c ? o : c;
    }
    if (threadIdx.x % FORGE_WARP == 0 && c != SMP_NONE) atomicMin(slot, c);
}

FORGE_DEV void claim_max(int c, int* slot) {  // the same for the largest; c = -1 offers nothing
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) {
        const int o = shfl_xor_int(c, m);
        c = o > c ? o : c;
    }
    if (threadIdx.x % FORGE_WARP == 0 && c >= 0) atomicMax(slot, c);
}

// Float order as unsigned order (no NaN here).
FORGE_DEV u32 okey(float f) {
    const u32 b = float_to_bits(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

FORGE_DEV float okey_inv(u32 k) {
    return bits_to_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

FORGE_DEV int smp_bin(float mx, float v) {  // non-increasing in v
    const float d = (mx - v) * SMP_SCALE;
    return d < (float)(SMP_BINS - 1) ? (int)d : SMP_BINS - 1;
}

FORGE_DEV bool alive(float v) { return v >= SMP_NEG; }  // not -inf

// f(v, i) for every logit v = x[i] of the row, thread tid taking i = tid, tid + blockDim.x, ...
// (in that order), SMP_BATCH loads in flight at once: one block reads a whole row, so memory
// parallelism, not arithmetic, sets the speed of each pass.
template <class F>
FORGE_DEV void for_row(const float* x, int n, F f) {
    for (int i0 = threadIdx.x; i0 < n; i0 += SMP_BATCH * blockDim.x) {
        float v[SMP_BATCH];
#pragma unroll
        for (int j = 0; j < SMP_BATCH; ++j) {
            const int i = i0 + j * blockDim.x;
            v[j] = i < n ? x[i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < SMP_BATCH; ++j) {
            const int i = i0 + j * blockDim.x;
            if (i < n) f(v[j], i);
        }
    }
}

// The same over ids [i0, i1) of one thread, in order.
template <class F>
FORGE_DEV void for_span(const float* x, int i0, int i1, F f) {
    for (int b = i0; b < i1; b += SMP_BATCH) {
        float v[SMP_BATCH];
#pragma unroll
        for (int j = 0; j < SMP_BATCH; ++j) v[j] = b + j < i1 ? x[b + j] : 0.0f;
#pragma unroll
        for (int j = 0; j < SMP_BATCH; ++j) {
            if (b + j < i1) f(v[j], b + j);
        }
    }
}

// Tokens of the row with logit >= t (count) or their exp(logit - mx) (mass), over the block.
FORGE_DEV int count_ge(const float* x, int n, float t, int* is) {
    int c = 0;
    for_row(x, n, [&](float v, int) { c += v >= t && alive(v); });
    return block_sum_i(c, is);
}

FORGE_DEV double mass_ge(const float* x, int n, float t, float mx, double* ds) {
    double s = 0.0;
    for_row(x, n, [&](float v, int) {
        if (v >= t && alive(v)) s += (double)expf(v - mx);
    });
    return block_sum_d(s, ds);
}

// Largest key t in [lo, hi) with pred(t) (pred(lo) holds, pred(hi) does not, pred monotone).
// by_mass: pred(t) = mass_ge(t) >= need; else count_ge(t) >= k.
FORGE_DEV float bisect(const float* x, int n, u32 lo, u32 hi, bool by_mass, int k, double need,
                       float mx, int* is, double* ds) {
    while (hi - lo > 1u) {
        const u32 mid = lo + (hi - lo) / 2u;
        const float t = okey_inv(mid);
        const bool ok = by_mass ? mass_ge(x, n, t, mx, ds) >= need : count_ge(x, n, t, is) >= k;
        if (ok) lo = mid;
        else hi = mid;
    }
    return okey_inv(lo);
}

// The number of leading entries >= t of the first K of sv (sorted descending).
FORGE_DEV int prefix_ge(const float* sv, int K, float t, int* slot) {
    __syncthreads();
    if (threadIdx.x == 0) *slot = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        if (sv[c] >= t && (c + 1 == K || !(sv[c + 1] >= t))) *slot = c + 1;
    }
    __syncthreads();
    return *slot;
}

FORGE_DEV double param_d(const i32* prm, int stride, int pr, int f) {
    const u64 lo = (u32)prm[f * stride + pr], hi = (u32)prm[(f + 1) * stride + pr];
    return __longlong_as_double((long long)((hi << 32) | lo));
}

FORGE_KERNEL void __launch_bounds__(SMP_THREADS) sample_rows(const float* __restrict__ logits,
    int n, const i32* __restrict__ prm, int stride, const i32* __restrict__ rowidx,
    i32* __restrict__ out, i32* __restrict__ part, u32* __restrict__ cnt) {
    FORGE_GRID_WAIT();
    __shared__ int hist[SMP_BINS];
    __shared__ float cv[SMP_CAP], sv[SMP_CAP];
    __shared__ int ci[SMP_CAP], si[SMP_CAP];
    __shared__ double ds[32];
    __shared__ float fs[32];
    __shared__ int is[32];
    __shared__ int sh[4];
    const int tid = threadIdx.x, bd = blockDim.x;
    const float* x = logits + (i64)blockIdx.x * n;
    const int pr = rowidx ? rowidx[blockIdx.x] : (int)blockIdx.x;
    const float temp = bits_to_float((u32)prm[F_TEMP * stride + pr]);

    // 1. the max (lowest id among equals); NaN or +inf anywhere is an error. Block y of the row
    // scans slice y; the last block of the row to finish merges the slices' results.
    const int parts = gridDim.y, chunk = (n + parts - 1) / parts;
    const int lo = min(n, (int)blockIdx.y * chunk), hi = min(n, lo + chunk);
    float mv = SMP_NEG;
    int mi = SMP_NONE, bad = 0;
    for_row(x + lo, hi - lo, [&](float v, int i) {
        bad |= (v != v) || v > 3.402823466e38f;
        better(mv, mi, v, lo + i);
    });
    bad = block_sum_i(bad, is);
    block_best(mv, mi, fs, is);
    if (parts > 1) {
        i32* mine = part + ((i64)blockIdx.x * parts + blockIdx.y) * 3;
        if (tid == 0) {
            mine[0] = (i32)float_to_bits(mv);
            mine[1] = mi;
            mine[2] = bad;
        }
        __threadfence();  // the slice's result is visible device-wide before the counter says so
        __syncthreads();
        if (tid == 0) sh[0] = atomicAdd(cnt + blockIdx.x, 1u) == (u32)(parts - 1);
        __syncthreads();
        if (!sh[0]) return;
        __threadfence();
        const volatile i32* all = part + (i64)blockIdx.x * parts * 3;
        mv = SMP_NEG, mi = SMP_NONE, bad = 0;
        for (int y = 0; y < parts; ++y) {
            better(mv, mi, bits_to_float((u32)all[3 * y]), all[3 * y + 1]);
            bad |= all[3 * y + 2];
        }
        __syncthreads();  // sh[0] read by every thread before later steps reuse it
        if (tid == 0) cnt[blockIdx.x] = 0u;  // every block of this row has counted
    }
    const float mx = mv;
    if (bad || mi == SMP_NONE || !(temp > 0.0f)) {
        if (tid == 0) out[blockIdx.x] = bad || mi == SMP_NONE ? -1 : mi;
        return;
    }
    const int top_k = prm[F_TOPK * stride + pr];
    const double top_p = param_d(prm, stride, pr, F_TOPP);
    const double lmp = param_d(prm, stride, pr, F_LMINP);
    const bool use_p = top_p < 1.0, use_m = lmp > -1.0e308;
    const float t_m = use_m ? (float)((double)mx + lmp) : SMP_NEG;
    const double u = philox_uniform((u32)prm[F_KEY * stride + pr],
                                    (u32)prm[(F_KEY + 1) * stride + pr],
                                    (u32)prm[F_CTR * stride + pr], 0u);
    const float neg_inf = bits_to_float(0xff800000u);
    float thr = neg_inf;  // the big path's cut: tokens with logit >= thr are kept
    bool k_on = false;
    int token = -1;

    // 2. histogram of distances below the max: bounds on what each stage keeps
    int bc = SMP_BINS - 1, nc = 0, bk = SMP_BINS - 1, bp = SMP_BINS - 1, bq = 0;
    double total = 0.0;
    if (top_k > 0 || use_p || use_m) {
        for (int b = tid; b < SMP_BINS; b += bd) hist[b] = 0;
        __syncthreads();
        int n_alive = 0, tail = 0;
        double mass = 0.0;
        for_row(x, n, [&](float v, int) {
            if (!alive(v)) return;
            ++n_alive;
            if (use_p) mass += (double)expf(v - mx);
            const int b = smp_bin(mx, v);
            if (b == SMP_BINS - 1) ++tail;
            else atomicAdd(hist + b, 1);
        });
        n_alive = block_sum_i(n_alive, is);
        tail = block_sum_i(tail, is);
        if (use_p) total = block_sum_d(mass, ds);
        if (tid == 0) hist[SMP_BINS - 1] += tail;
        __syncthreads();
        k_on = top_k > 0 && top_k < n_alive;
        // cumulative counts (and mass bounds) over bins; thread tid owns bins 2 tid, 2 tid + 1
        const int b0 = 2 * tid, b1 = b0 + 1;
        const int h0 = b0 < SMP_BINS ? hist[b0] : 0, h1 = b1 < SMP_BINS ? hist[b1] : 0;
        double all;
        const double c_ex = block_scan_d((double)(h0 + h1), ds, &all);
        if (tid < 3) sh[tid] = SMP_NONE;
        __syncthreads();
        if (k_on) {  // the bin of the k-th highest
            claim_min(c_ex + h0 >= top_k ? b0 : (c_ex + h0 + h1 >= top_k ? b1 : SMP_NONE), sh);
        }
        if (use_p && !k_on) {
            // lower / upper bounds of each bin's mass: its tokens lie (b + 1) / S resp. b / S
            // below the max at most / least (a 1% margin covers the float rounding of the bins)
            const double inv = 1.0 / (double)SMP_SCALE;
            const double lo0 = b0 < SMP_BINS - 1 ? h0 * exp(-(b0 + 1.01) * inv) : 0.0;
            const double lo1 = b1 < SMP_BINS - 1 ? h1 * exp(-(b1 + 1.01) * inv) : 0.0;
            const double up0 = h0 * exp(-(b0 > 0 ? b0 - 0.01 : 0.0) * inv);
            const double up1 = h1 * exp(-(b1 - 0.01) * inv);
            double lo_all, up_all;
            const double l_ex = block_scan_d(lo0 + lo1, ds, &lo_all);
            const double u_ex = block_scan_d(up0 + up1, ds, &up_all);
            const double need = top_p * total;
            claim_min(l_ex + lo0 >= need ? b0 : (l_ex + lo0 + lo1 >= need ? b1 : SMP_NONE), sh + 1);
            // bq: first bin where the upper bound reaches need (the nucleus ends at or after it)
            claim_min(u_ex + up0 >= need ? b0 : (u_ex + up0 + up1 >= need ? b1 : SMP_NONE), sh + 2);
        }
        __syncthreads();
        if (k_on) bk = sh[0] == SMP_NONE ? SMP_BINS - 1 : sh[0];
        if (use_p && !k_on) {
            bp = sh[1] == SMP_NONE ? SMP_BINS - 1 : sh[1];
            bq = sh[2] == SMP_NONE ? 0 : sh[2];
        }
        const int bm = use_m ? smp_bin(mx, t_m) : SMP_BINS - 1;
        if (k_on) bc = use_p ? bk : (bk < bm ? bk : bm);  // top_p needs the whole top-k set
        else bc = use_p ? (bp < bm ? bp : bm) : bm;
        // candidates: tokens in bins <= bc (an upper set, since the bin falls as the logit rises)
        __syncthreads();
        if (b0 <= bc && bc <= b1) sh[3] = (int)(c_ex + h0 + (bc == b1 ? h1 : 0));
        __syncthreads();
        nc = sh[3];
        __syncthreads();
    } else {
        nc = SMP_CAP + 1;  // nothing to cut: straight to the draw over the row
    }

    if (nc <= SMP_CAP) {
        // 3. the small path: gather, rank (logit descending, id ascending), cut exactly
        if (tid == 0) sh[0] = 0;
        __syncthreads();
        for_row(x, n, [&](float v, int i) {
            if (alive(v) && smp_bin(mx, v) <= bc) {
                const int c = atomicAdd(sh, 1);
                if (c < SMP_CAP) {
                    cv[c] = v;
                    ci[c] = i;
                }
            }
        });
        __syncthreads();
        nc = sh[0] < SMP_CAP ? sh[0] : SMP_CAP;
        for (int c = tid; c < nc; c += bd) {
            const float v = cv[c];
            const int id = ci[c];
            int rank = 0;
            for (int j = 0; j < nc; ++j) rank += cv[j] > v || (cv[j] == v && ci[j] < id);
            sv[rank] = v;
            si[rank] = id;
        }
        __syncthreads();
        int K = nc;
        if (k_on && top_k <= nc) K = prefix_ge(sv, K, sv[top_k - 1], sh);  // else all survive
        const int c0 = 2 * tid, c1 = c0 + 1;
        if (use_p && K > 1) {
            __syncthreads();
            const double w0 = c0 < K ? (double)expf(sv[c0] - mx) : 0.0;
            const double w1 = c1 < K ? (double)expf(sv[c1] - mx) : 0.0;
            double sum;
            const double ex = block_scan_d(w0 + w1, ds, &sum);
            const double need = top_p * (k_on ? sum : total);
            if (tid == 0) sh[1] = SMP_NONE;
            __syncthreads();
            const bool at0 = c0 < K && ex + w0 >= need, at1 = c1 < K && ex + w0 + w1 >= need;
            claim_min(at0 ? c0 : (at1 ? c1 : SMP_NONE), sh + 1);
            __syncthreads();
            const int cut = sh[1];
            if (cut != SMP_NONE) K = prefix_ge(sv, K, sv[cut], sh);
        }
        if (use_m && K > 1) {
            const int km = prefix_ge(sv, K, t_m, sh);
            K = km < K ? km : K;
        }
        __syncthreads();
        if (K <= 1) {
            token = si[0];
        } else {
            // 4. the draw over the kept tokens in id order
            for (int c = tid; c < K; c += bd) {
                const int id = si[c];
                int rank = 0;
                for (int j = 0; j < K; ++j) rank += si[j] < id;
                cv[rank] = sv[c];
                ci[rank] = id;
            }
            __syncthreads();
            const float top = mx / temp;
            const double w0 = c0 < K ? (double)expf(cv[c0] / temp - top) : 0.0;
            const double w1 = c1 < K ? (double)expf(cv[c1] / temp - top) : 0.0;
            double sum;
            const double ex = block_scan_d(w0 + w1, ds, &sum);
            const double target = u * sum;
            if (tid == 0) sh[1] = SMP_NONE;
            __syncthreads();
            const bool at0 = c0 < K && ex + w0 > target, at1 = c1 < K && ex + w0 + w1 > target;
            claim_min(at0 ? c0 : (at1 ? c1 : SMP_NONE), sh + 1);
            __syncthreads();
            if (tid == 0) {
                int c = sh[1];
                if (c == SMP_NONE) {  // rounding put the target past the end: the last weighted
                    c = K - 1;
                    while (c > 0 && !(expf(cv[c] / temp - top) > 0.0f)) --c;
                }
                sh[2] = ci[c];
            }
            __syncthreads();
            token = sh[2];
        }
    } else {
        // 3'. the big path: exact cuts by bisection, one pass over the row per step
        if (k_on) {
            u32 lo = okey(SMP_NEG), hi = okey(mx) + 1u;
            if (bk < SMP_BINS - 1) {  // the k-th highest lies in bin bk
                const u32 l2 = okey(mx - (float)(bk + 2) / SMP_SCALE);
                const u32 h2 = okey(mx - (float)(bk - 1) / SMP_SCALE) + 1u;
                if (l2 > lo && count_ge(x, n, okey_inv(l2), is) >= top_k) lo = l2;
                if (bk >= 1 && h2 < hi && count_ge(x, n, okey_inv(h2), is) < top_k) hi = h2;
            }
            thr = bisect(x, n, lo, hi, false, top_k, 0.0, mx, is, ds);
        }
        if (use_p) {
            const double sum = k_on ? mass_ge(x, n, thr, mx, ds) : total;
            const double need = top_p * sum;
            u32 lo = k_on ? okey(thr) : okey(SMP_NEG), hi = okey(mx) + 1u;
            if (!k_on) {  // the nucleus ends between bins bq and bp
                const u32 l2 = okey(mx - (float)(bp + 2) / SMP_SCALE);
                const u32 h2 = okey(mx - (float)(bq - 1) / SMP_SCALE) + 1u;
                if (bp < SMP_BINS - 1 && l2 > lo && mass_ge(x, n, okey_inv(l2), mx, ds) >= need) {
                    lo = l2;
                }
                if (bq >= 1 && h2 < hi && mass_ge(x, n, okey_inv(h2), mx, ds) < need) hi = h2;
            }
            if (mass_ge(x, n, okey_inv(lo), mx, ds) >= need) {  // else rounding: keep them all
                const float t_p = bisect(x, n, lo, hi, true, 0, need, mx, is, ds);
                thr = t_p > thr ? t_p : thr;
            }
        }
        thr = t_m > thr ? t_m : thr;
        // 4'. the draw: thread tid owns ids [tid * cs, (tid + 1) * cs)
        const int cs = (n + bd - 1) / bd;
        const int i0 = tid * cs < n ? tid * cs : n, i1 = i0 + cs < n ? i0 + cs : n;
        const float top = mx / temp;
        double s = 0.0;
        for_span(x, i0, i1, [&](float v, int) {
            if (v >= thr && alive(v)) s += (double)expf(v / temp - top);
        });
        double sum;
        const double ex = block_scan_d(s, ds, &sum);
        const double target = u * sum;
        if (tid == 0) {
            sh[0] = SMP_NONE;
            sh[1] = -1;
        }
        __syncthreads();
        claim_min(s > 0.0 && ex + s > target ? tid : SMP_NONE, sh);
        claim_max(s > 0.0 ? tid : -1, sh + 1);
        __syncthreads();
        const bool past = sh[0] == SMP_NONE;  // rounding: the last weighted token
        if (tid == (past ? sh[1] : sh[0])) {
            double cum = ex;
            int pick = -1;
            bool done = false;
            for_span(x, i0, i1, [&](float v, int i) {
                if (done || !(v >= thr && alive(v))) return;
                const float w = expf(v / temp - top);
                if (w > 0.0f) pick = i;
                cum += (double)w;
                done = !past && cum > target && w > 0.0f;
            });
            sh[2] = pick;
        }
        __syncthreads();
        token = sh[2];
    }
    if (tid == 0) out[blockIdx.x] = token;
}

// Structured output: tokens whose bit is clear in their row's mask (ceil(n / 32) u32 words per
// logits row, token i at bit i % 32 of word i / 32; forge.backend.pack_token_mask) get -inf, in
// place, before sample_rows reads the row (a row left with only -inf picks -1: the host raises).
// grid = (rows, any), block any: blocks of a row take its words in turn.
FORGE_KERNEL void mask_logits(float* __restrict__ logits, int n, const u32* __restrict__ mask) {
    FORGE_GRID_WAIT();
    const int words = (n + 31) / 32;
    float* x = logits + (i64)blockIdx.x * n;
    const u32* m = mask + (i64)blockIdx.x * words;
    const float neg_inf = bits_to_float(0xff800000u);
    for (int w = blockIdx.y * blockDim.x + threadIdx.x; w < words; w += gridDim.y * blockDim.x) {
        const u32 bits = m[w];
        if (bits == 0xffffffffu) continue;
        for (int b = 0; b < 32; ++b) {
            const int i = 32 * w + b;
            if (i < n && !((bits >> b) & 1u)) x[i] = neg_inf;
        }
    }
}
