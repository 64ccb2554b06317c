// linear.hip: y = x W^T + bias for several weight matrices in one launch, each of its own GGML type,
// weights read as stored. Matrices are described in device memory by descriptors of DESC_LEN int64:
//   contract.h's DESC_* fields: W, x (float [R, K]), y (float [R, N]), bias (0: none), type id
//   (T_*), K, N, bytes per weight row.
// blockIdx.z picks descriptor `first + z`, so Q/K/V (or gate/up) run as one launch even when their
// types differ. Quantized types need K % 32 == 0 (GGUF rows are whole blocks); float types any K.
//
// mv_multi: decode. block = MV_WARPS warps, grid = (ceil(max N / MV_WARPS), R, n_mats);
//   one warp per output row.
// mv_glu: y_gate = act(x W_gate^T) * (x W_up^T), descriptors first (gate) and first + 1 (up);
//   launch like mv_multi with n_mats = 1. act 0: SiLU, 1: GELU-tanh.
// mm_tiled: prefill. block = 256 threads, grid = (ceil(max N / 64), ceil(R / 64), n_mats);
//   a 64x64 output tile per block, weights decoded once per tile into shared memory.
#include "quants.h"

struct Mat {
    const u8* W;
    const float* x;
    float* y;
    const float* bias;
    int type, K, N;
    i64 row_bytes;
};

FORGE_DEV Mat mat_at(const i64* d) {
    Mat m;
    m.W = (const u8*)d[DESC_W];
    m.x = (const float*)d[DESC_X];
    m.y = (float*)d[DESC_Y];
    m.bias = (const float*)d[DESC_BIAS];
    m.type = (int)d[DESC_TYPE];
    m.K = (int)d[DESC_K];
    m.N = (int)d[DESC_N];
    m.row_bytes = d[DESC_ROW_BYTES];
    return m;
}

template <int T> FORGE_DEV void deq(const u8* row, int c, float* v);
#define FORGE_DEQ_SPEC(ID, T) \
    template <> FORGE_DEV void deq<ID>(const u8* row, int c, float* v) { deq32_##T(row, c, v); }
FORGE_DEQ_SPEC(T_Q4_0, q4_0)
FORGE_DEQ_SPEC(T_Q4_1, q4_1)
FORGE_DEQ_SPEC(T_Q5_0, q5_0)
FORGE_DEQ_SPEC(T_Q5_1, q5_1)
FORGE_DEQ_SPEC(T_Q8_0, q8_0)
FORGE_DEQ_SPEC(T_Q2_K, q2_k)
FORGE_DEQ_SPEC(T_Q3_K, q3_k)
FORGE_DEQ_SPEC(T_Q4_K, q4_k)
FORGE_DEQ_SPEC(T_Q5_K, q5_k)
FORGE_DEQ_SPEC(T_Q6_K, q6_k)

FORGE_DEV float load_elem(int t, const u8* row, i64 k) {
    return t == T_F32 ? load_f32(row, k) : t == T_F16 ? load_f16(row, k) : load_bf16(row, k);
}

// One lane's share of row . x for a quantized type: lanes take 32-element chunks in turn.
template <int T> FORGE_DEV float dot_q(const u8* row, const float* x, int K, int lane) {
    float acc = 0.0f, v[32];
    for (int c = lane; c < K / 32; c += FORGE_WARP) {
        deq<T>(row, c, v);
        const float4* xc = (const float4*)(x + 32 * c);
#pragma unroll
        for (int l = 0; l < 8; ++l) {
            float4 xv = xc[l];
            acc += v[4 * l] * xv.x + v[4 * l + 1] * xv.y + v[4 * l + 2] * xv.z + v[4 * l + 3] * xv.w;
        }
    }
    return acc;
}

template <int T> FORGE_DEV float dot_f(const u8* row, const float* x, int K, int lane) {
    float acc = 0.0f;
    for (int k = lane; k < K; k += FORGE_WARP) acc += load_elem(T, row, k) * x[k];
    return acc;
}

// The warp's full dot product of weight row n with x (every lane gets it).
FORGE_DEV float row_dot(const Mat& m, int n, const float* x, int lane) {
    const u8* row = m.W + (i64)n * m.row_bytes;
    float acc;
    switch (m.type) {
        case T_F32: acc = dot_f<T_F32>(row, x, m.K, lane); break;
        case T_F16: acc = dot_f<T_F16>(row, x, m.K, lane); break;
        case T_BF16: acc = dot_f<T_BF16>(row, x, m.K, lane); break;
        case T_Q4_0: acc = dot_q<T_Q4_0>(row, x, m.K, lane); break;
        case T_Q4_1: acc = dot_q<T_Q4_1>(row, x, m.K, lane); break;
        case T_Q5_0: acc = dot_q<T_Q5_0>(row, x, m.K, lane); break;
        case T_Q5_1: acc = dot_q<T_Q5_1>(row, x, m.K, lane); break;
        case T_Q8_0: acc = dot_q<T_Q8_0>(row, x, m.K, lane); break;
        case T_Q2_K: acc = dot_q<T_Q2_K>(row, x, m.K, lane); break;
        case T_Q3_K: acc = dot_q<T_Q3_K>(row, x, m.K, lane); break;
        case T_Q4_K: acc = dot_q<T_Q4_K>(row, x, m.K, lane); break;
        case T_Q5_K: acc = dot_q<T_Q5_K>(row, x, m.K, lane); break;
        default: acc = dot_q<T_Q6_K>(row, x, m.K, lane); break;
    }
    return warp_sum(acc);
}

FORGE_KERNEL void mv_multi(const i64* __restrict__ descs, int first) {
    FORGE_GRID_WAIT();
    const Mat m = mat_at(descs + (i64)(first + blockIdx.z) * DESC_LEN);
    const int lane = threadIdx.x % FORGE_WARP;
    const int n = blockIdx.x * (blockDim.x / FORGE_WARP) + threadIdx.x / FORGE_WARP;
    if (n >= m.N) return;
    const int b = blockIdx.y;
    float acc = row_dot(m, n, m.x + (i64)b * m.K, lane);
    if (lane == 0) m.y[(i64)b * m.N + n] = acc + (m.bias ? m.bias[n] : 0.0f);
}

FORGE_DEV float gelu_tanh_f(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

FORGE_KERNEL void mv_glu(const i64* __restrict__ descs, int first, int act) {
    FORGE_GRID_WAIT();
    const Mat g = mat_at(descs + (i64)first * DESC_LEN);
    const Mat u = mat_at(descs + (i64)(first + 1) * DESC_LEN);
    const int lane = threadIdx.x % FORGE_WARP;
    const int n = blockIdx.x * (blockDim.x / FORGE_WARP) + threadIdx.x / FORGE_WARP;
    if (n >= g.N) return;
    const int b = blockIdx.y;
    const float* x = g.x + (i64)b * g.K;
    float a = row_dot(g, n, x, lane) + (g.bias ? g.bias[n] : 0.0f);
    float c = row_dot(u, n, x, lane) + (u.bias ? u.bias[n] : 0.0f);
    a = act == 1 ? gelu_tanh_f(a) : a / (1.0f + expf(-a));
    if (lane == 0) g.y[(i64)b * g.N + n] = a * c;
}

#define TILE 64
#define TK 32

// Decode the 64 x 32 weight tile (rows n0.., chunk kc) into ws[k][n]; quantized: one row per thread.
template <int T> FORGE_DEV void load_tile_q(const Mat& m, int n0, int kc, float (*ws)[TILE + 1]) {
    const int t = threadIdx.x;
    if (t < TILE) {
        float v[32];
        if (n0 + t < m.N) {
            deq<T>(m.W + (i64)(n0 + t) * m.row_bytes, kc, v);
        } else {
#pragma unroll
            for (int l = 0; l < 32; ++l) v[l] = 0.0f;
        }
#pragma unroll
        for (int l = 0; l < 32; ++l) ws[l][t] = v[l];
    }
}

FORGE_DEV void load_tile_f(const Mat& m, int n0, int k0, float (*ws)[TILE + 1]) {
    for (int i = threadIdx.x; i < TILE * TK; i += blockDim.x) {
        const int r = i / TK, l = i % TK, n = n0 + r, k = k0 + l;
        ws[l][r] = (n < m.N && k < m.K) ? load_elem(m.type, m.W + (i64)n * m.row_bytes, k) : 0.0f;
    }
}

FORGE_KERNEL void mm_tiled(const i64* __restrict__ descs, int first, int R) {
    FORGE_GRID_WAIT();
    __shared__ float ws[TK][TILE + 1];
    __shared__ float xs[TK][TILE + 1];
    const Mat m = mat_at(descs + (i64)(first + blockIdx.z) * DESC_LEN);
    const int n0 = blockIdx.x * TILE, b0 = blockIdx.y * TILE;
    if (n0 >= m.N) return;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < m.K; k0 += TK) {
        switch (m.type) {
            case T_F32: case T_F16: case T_BF16: load_tile_f(m, n0, k0, ws); break;
            case T_Q4_0: load_tile_q<T_Q4_0>(m, n0, k0 / TK, ws); break;
            case T_Q4_1: load_tile_q<T_Q4_1>(m, n0, k0 / TK, ws); break;
            case T_Q5_0: load_tile_q<T_Q5_0>(m, n0, k0 / TK, ws); break;
            case T_Q5_1: load_tile_q<T_Q5_1>(m, n0, k0 / TK, ws); break;
            case T_Q8_0: load_tile_q<T_Q8_0>(m, n0, k0 / TK, ws); break;
            case T_Q2_K: load_tile_q<T_Q2_K>(m, n0, k0 / TK, ws); break;
            case T_Q3_K: load_tile_q<T_Q3_K>(m, n0, k0 / TK, ws); break;
            case T_Q4_K: load_tile_q<T_Q4_K>(m, n0, k0 / TK, ws); break;
            case T_Q5_K: load_tile_q<T_Q5_K>(m, n0, k0 / TK, ws); break;
            default: load_tile_q<T_Q6_K>(m, n0, k0 / TK, ws); break;
        }
        for (int i = threadIdx.x; i < TILE * TK; i += blockDim.x) {
            const int r = i / TK, l = i % TK, b = b0 + r, k = k0 + l;
            xs[l][r] = (b < R && k < m.K) ? m.x[(i64)b * m.K + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int l = 0; l < TK; ++l) {
            float xv[4], wv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) xv[i] = xs[l][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) wv[j] = ws[l][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += xv[i] * wv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int b = b0 + ty + 16 * i;
        if (b >= R) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n < m.N) m.y[(i64)b * m.N + n] = acc[i][j] + (m.bias ? m.bias[n] : 0.0f);
        }
    }
}
