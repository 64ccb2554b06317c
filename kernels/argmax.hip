// argmax.hip: index of the largest of n floats (first one on ties, NaN never wins), per row.
// Launch: grid = n_rows, block = a multiple of the warp size up to 1024. out: int32 [n_rows].
#include "forge_hip.h"

FORGE_DEV void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

FORGE_KERNEL void argmax(const float* __restrict__ x, int n, i32* __restrict__ out) {
    FORGE_GRID_WAIT();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* xr = x + (i64)blockIdx.x * n;
    float v = -3.402823466e38f;
    int idx = 0x7fffffff;
    for (int k = threadIdx.x; k < n; k += blockDim.x) better(v, idx, xr[k], k);
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) better(v, idx, shfl_xor(v, m), shfl_xor_int(idx, m));
    int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    if (lane == 0) { sv[warp] = v; si[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        int nwarps = (blockDim.x + FORGE_WARP - 1) / FORGE_WARP;
        v = lane < nwarps ? sv[lane] : -3.402823466e38f;
        idx = lane < nwarps ? si[lane] : 0x7fffffff;
        for (int m = FORGE_WARP / 2; m > 0; m >>= 1) better(v, idx, shfl_xor(v, m), shfl_xor_int(idx, m));
        if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0 : idx;
    }
}
