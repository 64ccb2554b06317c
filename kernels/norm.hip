// norm.hip: RMSNorm over rows. y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:].
// Launch: grid = n_rows, block = any multiple of the warp size up to 1024. In place is allowed.
// Per-head norms (q/k norm) are the same kernel over rows of head_dim.
#include "forge_hip.h"

FORGE_KERNEL void rms_norm(const float* x, const float* __restrict__ w, float* y, int n,
                           float eps) {
    FORGE_GRID_WAIT();
    __shared__ float scratch[32];
    const float* xr = x + (i64)blockIdx.x * n;
    float* yr = y + (i64)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
}
