// attn_decode_tc_standalone.cu: the tiles of kernels/attn_decode_tc.hip as a standalone CUDA
// program (float16 paged cache [slot][KV head][128], Llama-3-8B heads: 32 query heads on 8 KV
// heads, one token; the split merge in a second kernel), timed with CUDA events (mean of 50
// launch pairs after 5) and checked against a float64 host reference. It measured the shapes
// in benchmarks/gpu_notes.md before the kernel joined forge; `python
// benchmarks/attn_decode_probe.py --tc` times forge's own kernel.
//
//   nvcc -O3 -arch=sm_90 [-DWARPS=4 -DSTAGES=3 -DMINB=2] -o tcdec benchmarks/attn_decode_tc_standalone.cu
//   ./tcdec POSITIONS SPLITS      (default 32768 32; prints one JSON line)
#include <cuda_fp16.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstdint>

#define D 128
#define BK 16
#ifndef WARPS
#define WARPS 4
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef MINB
#define MINB 2
#endif
#define LDS (D + 8)  // halves per smem row (272 bytes: no ldmatrix bank conflicts)
#define STAGE_HALVES (2 * BK * LDS)

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void ldsm(const __half* p, uint32_t* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(saddr(p)));
}
__device__ __forceinline__ void ldsm_t(const __half* p, uint32_t* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(saddr(p)));
}
__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t h2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t*)&v;
}

// grid (KVH, 1, splits), block 32*WARPS. q [H][D] f32, out partials part_o [KVH*16*splits][D],
// part_ml [..][2]. n: cached positions. G: query heads per KV head (<= 16).
__global__ void __launch_bounds__(32 * WARPS, MINB)
tcdec(const float* q, const __half* kc, const __half* vc, const int* table, int bs, int n, int KVH,
      int G, float scale, float* part_o, float* part_ml) {
    extern __shared__ __align__(16) __half sm[];
    const int kvh = blockIdx.x, split = blockIdx.z, splits = gridDim.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int per = (n + splits - 1) / splits;
    const int begin = split * per, end = min(n, begin + per);
    __half* ring = sm + warp * STAGES * STAGE_HALVES;
    // Q fragments (scaled by scale * log2 e), rows = heads kvh*G + row (< G)
    const float qs = scale * 1.4426950408889634f;
    uint32_t qa[D / 16][4];
    const int r0 = lane / 4, r1 = r0 + 8, c = (lane % 4) * 2;
    const float* q0 = q + (size_t)(kvh * G + r0) * D;
    const float* q1 = q + (size_t)(kvh * G + r1) * D;
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
        const int d = 16 * k + c;
        qa[k][0] = r0 < G ? h2(q0[d] * qs, q0[d + 1] * qs) : 0u;
        qa[k][1] = r1 < G ? h2(q1[d] * qs, q1[d + 1] * qs) : 0u;
        qa[k][2] = r0 < G ? h2(q0[d + 8] * qs, q0[d + 9] * qs) : 0u;
        qa[k][3] = r1 < G ? h2(q1[d + 8] * qs, q1[d + 9] * qs) : 0u;
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m0 = -1e30f, m1 = -1e30f, l0 = 0.f, l1 = 0.f;
    const int ntiles = (end - begin + BK - 1) / BK;
    // tiles of this warp: warp, warp + WARPS, ...
    auto issue = [&](int t, int stage) {
        __half* ks = ring + stage * STAGE_HALVES;
        __half* vs = ks + BK * LDS;
        const int key0 = begin + t * BK;
#pragma unroll
        for (int i = 0; i < BK * D / 8 / 32; ++i) {  // 8 chunks of 16 B a lane, K then V
            const int idx = i * 32 + lane, row = idx / (D / 8), col = (idx % (D / 8)) * 8;
            const int p = key0 + row;
            const bool ok = p < end;
            const size_t slot = ok ? (size_t)table[p / bs] * bs + p % bs : 0;
            const size_t off = (slot * KVH + kvh) * D + col;
            cp16(ks + row * LDS + col, kc + off, ok);
            cp16(vs + row * LDS + col, vc + off, ok);
        }
    };
    int mine = 0;
    for (int t = warp; t < ntiles; t += WARPS) ++mine;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < mine) issue(warp + s * WARPS, s);
        commit();
    }
    for (int i = 0; i < mine; ++i) {
        const int t = warp + i * WARPS;
        if (i + STAGES - 1 < mine) issue(warp + (i + STAGES - 1) * WARPS, (i + STAGES - 1) % STAGES);
        commit();
        waitg<STAGES - 1>();
        __syncwarp();
        const __half* ks = ring + (i % STAGES) * STAGE_HALVES;
        const __half* vs = ks + BK * LDS;
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            uint32_t b[4];
            const int mat = lane / 8, rr = lane % 8;
            // m0: keys 0-7 dims k0..+7, m1: keys 0-7 dims +8, m2: keys 8-15 dims k0, m3: keys 8-15 dims +8
            ldsm(ks + ((mat / 2) * 8 + rr) * LDS + 16 * k + (mat % 2) * 8, b);
            mma(s[0], qa[k], b[0], b[1]);
            mma(s[1], qa[k], b[2], b[3]);
        }
        const int key0 = begin + t * BK;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + nt * 8 + c + (e & 1);
                if (key >= end) s[nt][e] = -1e30f;
            }
        }
        float x0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
        float x1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
        x0 = fmaxf(x0, __shfl_xor_sync(~0u, x0, 1));
        x0 = fmaxf(x0, __shfl_xor_sync(~0u, x0, 2));
        x1 = fmaxf(x1, __shfl_xor_sync(~0u, x1, 1));
        x1 = fmaxf(x1, __shfl_xor_sync(~0u, x1, 2));
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);
        const float f0 = exp2f(m0 - n0), f1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        float p[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            p[nt][0] = exp2f(s[nt][0] - n0);
            p[nt][1] = exp2f(s[nt][1] - n0);
            p[nt][2] = exp2f(s[nt][2] - n1);
            p[nt][3] = exp2f(s[nt][3] - n1);
        }
        l0 = l0 * f0 + p[0][0] + p[0][1] + p[1][0] + p[1][1];
        l1 = l1 * f1 + p[0][2] + p[0][3] + p[1][2] + p[1][3];
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[j][0] *= f0;
            o[j][1] *= f0;
            o[j][2] *= f1;
            o[j][3] *= f1;
        }
        uint32_t pa[4] = {h2(p[0][0], p[0][1]), h2(p[0][2], p[0][3]), h2(p[1][0], p[1][1]),
                          h2(p[1][2], p[1][3])};
#pragma unroll
        for (int j = 0; j < D / 16; ++j) {
            uint32_t b[4];
            const int mat = lane / 8, rr = lane % 8;
            // m0: keys 0-7 dims d0, m1: keys 8-15 dims d0, m2: keys 0-7 dims d0+8, m3: keys 8-15 dims d0+8
            ldsm_t(vs + ((mat % 2) * 8 + rr) * LDS + 16 * j + (mat / 2) * 8, b);
            mma(o[2 * j], pa, b[0], b[1]);
            mma(o[2 * j + 1], pa, b[2], b[3]);
        }
        __syncwarp();
    }
    waitg<0>();
    // row sums over the 4 lanes of a row
    l0 += __shfl_xor_sync(~0u, l0, 1);
    l0 += __shfl_xor_sync(~0u, l0, 2);
    l1 += __shfl_xor_sync(~0u, l1, 1);
    l1 += __shfl_xor_sync(~0u, l1, 2);
    __syncthreads();  // rings free: reuse as float [WARPS][16][D] + ml
    float* wo = (float*)sm;
    float* wml = wo + WARPS * 16 * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        const int d = 8 * j + c;
        wo[(warp * 16 + r0) * D + d] = o[j][0];
        wo[(warp * 16 + r0) * D + d + 1] = o[j][1];
        wo[(warp * 16 + r1) * D + d] = o[j][2];
        wo[(warp * 16 + r1) * D + d + 1] = o[j][3];
    }
    if (lane % 4 == 0) {
        wml[(warp * 16 + r0) * 2] = m0;
        wml[(warp * 16 + r0) * 2 + 1] = l0;
        wml[(warp * 16 + r1) * 2] = m1;
        wml[(warp * 16 + r1) * 2 + 1] = l1;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int row = idx / D, d = idx % D;
        float mx = -1e30f;
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, wml[(w * 16 + row) * 2]);
        float acc = 0.f, l = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float f = exp2f(wml[(w * 16 + row) * 2] - mx);
            acc += wo[(w * 16 + row) * D + d] * f;
            l += wml[(w * 16 + row) * 2 + 1] * f;
        }
        const size_t part = ((size_t)(kvh * 16 + row)) * splits + split;
        part_o[part * D + d] = acc;
        if (d == 0) {
            part_ml[2 * part] = mx;
            part_ml[2 * part + 1] = l;
        }
    }
}

// out [H][D]: merge the splits. grid (KVH * G), block D.
__global__ void combine(const float* part_o, const float* part_ml, int G, int splits, float* out) {
    const int hg = blockIdx.x, kvh = hg / G, row = hg % G, d = threadIdx.x;
    const size_t base = ((size_t)(kvh * 16 + row)) * splits;
    float mx = -1e30f;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_ml[2 * (base + s)]);
    float acc = 0.f, l = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float f = exp2f(part_ml[2 * (base + s)] - mx);
        acc += part_o[(base + s) * D + d] * f;
        l += part_ml[2 * (base + s) + 1] * f;
    }
    out[(size_t)hg * D + d] = acc / l;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

int main(int argc, char** argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 32768, splits = argc > 2 ? atoi(argv[2]) : 32;
    const int H = 32, KVH = 8, G = H / KVH, bs = 16;
    const int nb = (n + bs - 1) / bs;
    std::vector<int> table(nb);
    for (int i = 0; i < nb; ++i) table[i] = (i * 7919) % nb;  // a permutation (nb not a multiple of 7919)
    std::vector<__half> kh((size_t)nb * bs * KVH * D), vh(kh.size());
    std::vector<float> q((size_t)H * D);
    srand(1);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
    for (auto& x : kh) x = __float2half(rnd());
    for (auto& x : vh) x = __float2half(rnd());
    for (auto& x : q) x = rnd() * 2.f;
    __half *dk, *dv;
    float *dq, *po, *pml, *dout;
    int* dt;
    CK(cudaMalloc(&dk, kh.size() * 2));
    CK(cudaMalloc(&dv, vh.size() * 2));
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMalloc(&dt, nb * 4));
    CK(cudaMalloc(&po, (size_t)KVH * 16 * splits * D * 4));
    CK(cudaMalloc(&pml, (size_t)KVH * 16 * splits * 2 * 4));
    CK(cudaMalloc(&dout, (size_t)H * D * 4));
    CK(cudaMemcpy(dk, kh.data(), kh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, vh.data(), vh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt, table.data(), nb * 4, cudaMemcpyHostToDevice));
    const int smem = WARPS * STAGES * STAGE_HALVES * 2;
    CK(cudaFuncSetAttribute(tcdec, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float scale = 1.f / sqrtf((float)D);
    auto run = [&] {
        tcdec<<<dim3(KVH, 1, splits), 32 * WARPS, smem>>>(dq, dk, dv, dt, bs, n, KVH, G, scale, po, pml);
        combine<<<KVH * G, D>>>(po, pml, G, splits, dout);
    };
    run();
    CK(cudaDeviceSynchronize());
    std::vector<float> out((size_t)H * D);
    CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
    // float64 reference
    double worst = 0.0;
    for (int h = 0; h < H; ++h) {
        const int kv = h / G;
        std::vector<double> sc(n);
        double mx = -1e300;
        for (int p = 0; p < n; ++p) {
            const size_t slot = (size_t)table[p / bs] * bs + p % bs;
            double s = 0;
            for (int d = 0; d < D; ++d) s += (double)q[h * D + d] * __half2float(kh[(slot * KVH + kv) * D + d]);
            sc[p] = s * scale;
            mx = std::max(mx, sc[p]);
        }
        double l = 0;
        std::vector<double> o(D, 0.0);
        for (int p = 0; p < n; ++p) {
            const double w = exp(sc[p] - mx);
            l += w;
            const size_t slot = (size_t)table[p / bs] * bs + p % bs;
            for (int d = 0; d < D; ++d) o[d] += w * __half2float(vh[(slot * KVH + kv) * D + d]);
        }
        double num = 0, den = 0;
        for (int d = 0; d < D; ++d) {
            const double ref = o[d] / l;
            num = std::max(num, fabs(out[h * D + d] - ref));
            den = std::max(den, fabs(ref));
        }
        worst = std::max(worst, num / den);
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 5; ++i) run();
    cudaEventRecord(a);
    const int reps = 50;
    for (int i = 0; i < reps; ++i) run();
    cudaEventRecord(b);
    CK(cudaEventSynchronize(b));
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    const double us = ms * 1e3 / reps, bytes = 2.0 * n * KVH * D * 2;
    printf("{\"positions\": %d, \"splits\": %d, \"us\": %.2f, \"GB/s\": %.1f, \"max_rel_err\": %.3e}\n", n,
           splits, us, bytes / us / 1e3, worst);
    return 0;
}
