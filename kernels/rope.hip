// rope.hip: rotary position embedding, in place, on x[t, h, d] (n_tokens x n_heads x head_dim).
// Pair i (0 <= i < n_rot/2) of token t rotates by angle pos[t] * freq_scale * base^(-2i/n_rot);
// normal mode pairs (2i, 2i+1), NeoX mode pairs (i, i + n_rot/2). Dims >= n_rot stay.
// Positions are read from device memory so that a captured graph replays with new ones.
// Launch: grid = (n_heads, n_tokens), block = any (threads loop over pairs).
#include "forge_hip.h"

FORGE_DEV void rope_pair(float* x, int a, int b, float theta) {
    float c = cosf(theta), s = sinf(theta);
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}

FORGE_KERNEL void rope_norm(float* x, const i32* __restrict__ pos, int n_heads, int head_dim,
                            int n_rot, float base, float freq_scale) {
    FORGE_GRID_WAIT();
    float* xh = x + ((i64)blockIdx.y * n_heads + blockIdx.x) * head_dim;
    float p = (float)pos[blockIdx.y] * freq_scale;
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        rope_pair(xh, 2 * i, 2 * i + 1, rope_theta(i, n_rot, p, base));
    }
}

FORGE_KERNEL void rope_neox(float* x, const i32* __restrict__ pos, int n_heads, int head_dim,
                            int n_rot, float base, float freq_scale) {
    FORGE_GRID_WAIT();
    float* xh = x + ((i64)blockIdx.y * n_heads + blockIdx.x) * head_dim;
    float p = (float)pos[blockIdx.y] * freq_scale;
    int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        rope_pair(xh, i, i + half, rope_theta(i, n_rot, p, base));
    }
}
