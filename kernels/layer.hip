// layer.hip: the fused non-matmul, non-attention steps of a transformer layer, over R token rows
// at once (attention, with its Q/K norm, RoPE and KV store, is in attention.hip).
#include "add_norm.h"

// Sum over the block; with a single warp, shuffles only (no barrier).
FORGE_DEV float row_sum(float v, float* scratch) {
    return blockDim.x <= FORGE_WARP ? warp_sum(v) : block_sum(v, scratch);
}

// x[r] += (w_post ? rmsnorm(o[r]) * w_post : o[r])   (when o is given)
// h[r] = rmsnorm(x[r]) * w_next                        (when w_next is given)
// Launch: grid = R, block = a multiple of the warp size, at most 1024, with
// blockDim.x * AN_PER >= n (forge_hip.plan.add_norm_threads: one warp for rows up to 1024, where
// mmv.hip's mvq_*_r1n compute the same bits). Each thread holds elements t, t + blockDim.x, ...
// of the row in registers: one round trip loads the row; the weights are loaded before the wait
// (they are no kernel's output). Arithmetic: add_norm.h.
FORGE_KERNEL void add_norm(float* __restrict__ x, const float* __restrict__ o,
                           const float* __restrict__ w_post, const float* __restrict__ w_next,
                           float* __restrict__ h, int n, float eps) {
    __shared__ float scratch[32];
    const int t = threadIdx.x, T = blockDim.x;
    float xv[AN_PER], ov[AN_PER], wp[AN_PER], wn[AN_PER];
#pragma unroll
    for (int j = 0; j < AN_PER; ++j) {
        const int i = t + j * T;
        wp[j] = w_post && i < n ? w_post[i] : 0.0f;
        wn[j] = w_next && i < n ? w_next[i] : 0.0f;
    }
    FORGE_GRID_WAIT();
    float* xr = x + (i64)blockIdx.x * n;
    const float* orow = o ? o + (i64)blockIdx.x * n : nullptr;
#pragma unroll
    for (int j = 0; j < AN_PER; ++j) {
        const int i = t + j * T;
        xv[j] = i < n ? xr[i] : 0.0f;
        ov[j] = orow && i < n ? orow[i] : 0.0f;
    }
    if (o) {
        float inv = 1.0f;
        if (w_post) {
            float ss = 0.0f;
#pragma unroll
            for (int j = 0; j < AN_PER; ++j) ss = an_sq(ss, ov[j]);
            inv = an_inv(row_sum(ss, scratch), n, eps);
        }
#pragma unroll
        for (int j = 0; j < AN_PER; ++j) {
            const int i = t + j * T;
            xv[j] = an_resid(xv[j], ov[j], inv, wp[j], w_post != nullptr);
            if (i < n) xr[i] = xv[j];
        }
    }
    if (w_next) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < AN_PER; ++j) ss = an_sq(ss, xv[j]);
        const float inv = an_inv(row_sum(ss, scratch), n, eps);
        float* hr = h + (i64)blockIdx.x * n;
#pragma unroll
        for (int j = 0; j < AN_PER; ++j) {
            const int i = t + j * T;
            if (i < n) hr[i] = an_out(xv[j], inv, wn[j]);
        }
    }
}

// dst[i, :] = src[idx[i], :] (rows of n floats). grid = n_rows, block = any.
FORGE_KERNEL void gather_rows(const float* __restrict__ src, const i32* __restrict__ idx,
                              float* __restrict__ dst, int n) {
    FORGE_GRID_WAIT();
    const float* s = src + (i64)idx[blockIdx.x] * n;
    float* d = dst + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
}

// Tensor parallelism's gathered logits back in vocabulary order: rank s computed n_s = min(part,
// n - s * part) columns of each of `rows` rows (row stride n_s), gathered at src + s * rows * part;
// dst[r, s * part + j] = that rank's [r, j]. grid = (rows, ranks), block = any.
FORGE_KERNEL void unshard_rows(const float* __restrict__ src, float* __restrict__ dst, int rows,
                               int n, int part) {
    FORGE_GRID_WAIT();
    const int r = blockIdx.x, s = blockIdx.y;
    const int ns = min(part, n - s * part);
    const float* from = src + ((i64)s * rows * part + (i64)r * ns);
    float* to = dst + (i64)r * n + (i64)s * part;
    for (int j = threadIdx.x; j < ns; j += blockDim.x) to[j] = from[j];
}

// The token ids of a step whose tokens the previous step picked on the device: for each row r
// with feed[r] >= 0, ids[r] = am[feed[r]] (a failed pick, -1, becomes token 0; the step that made
// it reports the failure). grid = 1, block = any.
FORGE_KERNEL void feed_ids(i32* __restrict__ ids, const i32* __restrict__ feed,
                           const i32* __restrict__ am, int rows) {
    FORGE_GRID_WAIT();
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const int f = feed[r];
        if (f >= 0) ids[r] = max(am[f], 0);
    }
}

// y[r, :] += bias[:] over R rows of n. grid = R, block = any (for matmul kernels without bias).
FORGE_KERNEL void add_bias(float* __restrict__ y, const float* __restrict__ bias, int n) {
    FORGE_GRID_WAIT();
    float* yr = y + (i64)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] += bias[i];
}

// y = x rounded the way llama.cpp's CPU matrix products round activations for a weight type
// (mode 1: 8-bit blocks of 32 with an f16 scale, as Q8_0; 2: 8-bit blocks of 256 scaled by the
// signed peak, as Q8_K; 3: f16; 4: bf16). Rows of n. grid = R, block = any.
FORGE_KERNEL void act_round(const float* __restrict__ x, float* __restrict__ y, int n, int mode) {
    FORGE_GRID_WAIT();
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    if (mode >= 3) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            yr[i] = mode == 3 ? h2f(f2h(xr[i])) : bf2f(f2bf(xr[i]));
        }
        return;
    }
    const int len = mode == 1 ? 32 : 256;
    for (int b = threadIdx.x; b < n / len; b += blockDim.x) {
        const float* xb = xr + (i64)b * len;
        float* yb = yr + (i64)b * len;
        float peak = 0.0f, amax = 0.0f;
        for (int i = 0; i < len; ++i) {
            if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); peak = xb[i]; }
        }
        if (mode == 1) {
            const float d = amax / 127.0f, inv = d > 0.0f ? 1.0f / d : 0.0f;
            const float dh = h2f(f2h(d));
            for (int i = 0; i < len; ++i) yb[i] = rintf(xb[i] * inv) * dh;
        } else {
            const float iscale = peak != 0.0f ? -127.0f / peak : 0.0f;
            const float d = iscale != 0.0f ? 1.0f / iscale : 0.0f;
            for (int i = 0; i < len; ++i) yb[i] = fminf(rintf(xb[i] * iscale), 127.0f) * d;
        }
    }
}
