// forge_hip.h: the portability layer every kernel includes. It compiles under hipcc and hiprtc
// (clang, AMD: wavefront 64 on CDNA/GCN, 32 on RDNA), under nvcc and NVRTC (NVIDIA: warp 32),
// and as plain host C++ when FORGE_HOST is defined (the CPU test harness of the decoders).
// No system headers: NVRTC has none, so fixed-width types are our own.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#if defined(FORGE_HOST)
#define FORGE_DEV inline
#define FORGE_WARP 32
#elif defined(__HIP__)
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>  // hipcc needs it; hiprtc provides these declarations itself
#endif
#define FORGE_AMD 1
#define FORGE_DEV __device__ __forceinline__
#define FORGE_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define FORGE_NV 1
#define FORGE_DEV __device__ __forceinline__
#define FORGE_WARP 32
#endif

#include "contract.h"

#define FORGE_KERNEL extern "C" __global__

// The first statement of every kernel. On NVIDIA sm_90+ a launch may be made with programmatic
// stream serialization (forge_hip.executor, inside captured graphs): the kernel's blocks then
// start while the previous kernel is finishing and wait here until it has completed and its
// writes are visible, which hides the launch gap between dependent kernels. Once past the wait,
// the kernel lets the next one be scheduled early in turn. Elsewhere (AMD, older NVIDIA, plain
// launches) the wait is a no-op and the kernel starts after its predecessor as usual.
#if defined(FORGE_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FORGE_GRID_WAIT()                                                \
    do {                                                                 \
        asm volatile("griddepcontrol.wait;" ::: "memory");               \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  \
    } while (0)
#else
#define FORGE_GRID_WAIT() \
    do {                  \
    } while (0)
#endif

#if !defined(FORGE_HOST)
// RoPE: the angle of rotation pair i of n_rot at position p (every RoPE path without a frequency
// table uses this one form, so prefill, decode and the standalone kernels rotate by the same
// bits; attention.hip's rope_table reads a table instead for YaRN and Llama 3.1 scaling).
FORGE_DEV float rope_theta(int i, int n_rot, float p, float base) {
    return p * powf(base, -2.0f * (float)i / (float)n_rot);
}
#endif

// ---- half and bfloat16 (stored as raw 16-bit words) ----
FORGE_DEV float bits_to_float(u32 b) {
#if defined(FORGE_HOST)
    union { u32 u; float f; } c; c.u = b; return c.f;
#else
    return __uint_as_float(b);
#endif
}

FORGE_DEV u32 float_to_bits(float f) {
#if defined(FORGE_HOST)
    union { u32 u; float f; } c; c.f = f; return c.u;
#else
    return __float_as_uint(f);
#endif
}

FORGE_DEV float h2f(u16 h) {
#if defined(FORGE_AMD)
    union { u16 u; __fp16 h; } c; c.u = h; return (float)c.h;
#elif defined(FORGE_NV)
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
    u32 s = (u32)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return bits_to_float(s | 0x7f800000u | (m << 13));
    if (e == 0) {  // zero or subnormal: m * 2^-24
        float v = (float)m * 5.9604644775390625e-8f;
        return s ? -v : v;
    }
    return bits_to_float(s | ((e + 112) << 23) | (m << 13));
#endif
}

FORGE_DEV u16 f2h(float f) {
#if defined(FORGE_AMD)
    union { u16 u; __fp16 h; } c; c.h = (__fp16)f; return c.u;
#elif defined(FORGE_NV)
    u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
#else
    (void)f; return 0;  // the host harness only decodes
#endif
}

FORGE_DEV float bf2f(u16 b) { return bits_to_float((u32)b << 16); }

FORGE_DEV u16 f2bf(float f) {  // round to nearest even; NaN stays NaN
    u32 u = float_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    return (u16)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

FORGE_DEV u16 load_u16(const u8* p) { return (u16)(p[0] | (p[1] << 8)); }
FORGE_DEV u32 load_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

#if !defined(FORGE_HOST)
// ---- warp-level reductions ----
FORGE_DEV float shfl_xor(float v, int mask) {
#if defined(FORGE_AMD)
    return __shfl_xor(v, mask, FORGE_WARP);
#else
    return __shfl_xor_sync(0xffffffffu, v, mask, FORGE_WARP);
#endif
}

FORGE_DEV int shfl_xor_int(int v, int mask) {
#if defined(FORGE_AMD)
    return __shfl_xor(v, mask, FORGE_WARP);
#else
    return __shfl_xor_sync(0xffffffffu, v, mask, FORGE_WARP);
#endif
}

FORGE_DEV float warp_sum(float v) {
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}

FORGE_DEV float warp_max(float v) {
    for (int m = FORGE_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
    return v;
}

// A load of data another block wrote before a __threadfence and an atomic this block saw (past
// any incoherent cache level).
FORGE_DEV float ld_coherent(const float* p) {
#if defined(FORGE_NV)
    return __ldcg(p);
#else
    return *(const volatile float*)p;
#endif
}

// Two floats as a packed pair of float16 (lo in the low half), rounded to nearest.
FORGE_DEV u32 pack_h2(float lo, float hi) {
#if defined(FORGE_NV)
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
#endif
}

#if defined(FORGE_NV)
// cp.async (sm_80+): copies from global into shared memory that skip the registers, committed in
// groups a thread later waits for (cp_async_wait<N>: all but its N most recent groups arrived).
// An invalid copy fills its destination with zeros.
FORGE_DEV u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

FORGE_DEV void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

FORGE_DEV void cp_async8(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 8 : 0));
}

FORGE_DEV void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

FORGE_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> FORGE_DEV void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ldmatrix: four 8x8 tiles of 16-bit values from shared memory (lane i gives row i % 8 of tile
// i / 8), as mma fragments; _t transposed.
FORGE_DEV void ldsm_x4(const u16* p, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

FORGE_DEV void ldsm_x4_t(const u16* p, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c (16 x 8, float) += a (16 x 16, float16, row-major fragments) * b (16 x 8, column-major).
FORGE_DEV void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Sum over the whole block; `scratch` holds one float per warp. Every thread gets the result.
FORGE_DEV float block_sum(float v, float* scratch) {
    int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    int nwarps = (blockDim.x + FORGE_WARP - 1) / FORGE_WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

FORGE_DEV float block_max(float v, float* scratch) {
    int lane = threadIdx.x % FORGE_WARP, warp = threadIdx.x / FORGE_WARP;
    int nwarps = (blockDim.x + FORGE_WARP - 1) / FORGE_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -3.402823466e38f;
    return warp_max(v);
}
#endif
