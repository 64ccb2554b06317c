// kv_format.h: how the attention kernels store and read one head of K or V (n values) in a cache
// row, per format (contract.h's KV_*). Row r of a cache (r = slot * n_kv_head + kv head) starts at
// byte r * kv_row_bytes(fmt, n).
//   KV_F32, KV_F16, KV_BF16  n values of 4, 2, 2 bytes.
//   KV_Q8_0  n int8 values, then n / 32 f16 scales (value i = q[i] * scale[i / 32]);
//   KV_Q4_0  n / 2 bytes, value 2j in the low and 2j + 1 in the high half of byte j (q - 8 times
//            the scale), then the scales. The numbers are GGML's Q8_0 / Q4_0 (the same rounding
//            as llama.cpp's conversions into its cache); only the order within a row differs, so
//            that 8 consecutive values load as one or two aligned words.
// Quantized rows are padded to 8 bytes (Q8_0: a piece's 8 values load as one word) or 4 (Q4_0).
#pragma once
#include "forge_hip.h"

// a * b rounded once: a product the compiler may not fuse with the add after it (Q4_0's rounding
// must match GGML's multiply-then-add). On AMD __fmul_rn is a plain product that clang contracts
// with a following add under HIP's default -ffp-contract, hence the pragma.
FORGE_DEV float mul_rn(float a, float b) {
#if defined(FORGE_HOST)
    return a * b;
#elif defined(FORGE_AMD)
#pragma clang fp contract(off)
    return a * b;
#else
    return __fmul_rn(a, b);
#endif
}

FORGE_DEV bool kv_quant(int fmt) { return fmt == KV_Q8_0 || fmt == KV_Q4_0; }

FORGE_DEV int kv_row_bytes(int fmt, int n) {
    if (fmt == KV_F32) return 4 * n;
    if (fmt == KV_F16 || fmt == KV_BF16) return 2 * n;
    const int codes = fmt == KV_Q8_0 ? n : n / 2, pad = fmt == KV_Q8_0 ? 7 : 3;
    return (codes + 2 * (n / KV_BLOCK) + pad) & ~pad;
}

// The scale of value d's block in a quantized row of n values starting at `row`.
FORGE_DEV float kv_scale(const char* row, int fmt, int n, int d) {
    const int codes = fmt == KV_Q8_0 ? n : n / 2;
    return h2f(*(const u16*)(row + codes + 2 * (d / KV_BLOCK)));
}

// The codes of the 8 values from value d (a multiple of 8) of a quantized row: Q8_0's 8 bytes as
// lo and hi, Q4_0's 4 bytes as lo (one aligned load: rows are padded for it).
struct KvCodes {
    u32 lo, hi;
};

template <int FMT> FORGE_DEV KvCodes kv_codes(const char* row, int d) {
    KvCodes c;
    if (FMT == KV_Q8_0) {
        const u64 w = *(const u64*)(row + d);
        c.lo = (u32)w;
        c.hi = (u32)(w >> 32);
    } else {
        c.lo = *(const u32*)(row + d / 2);
        c.hi = 0u;
    }
    return c;
}

// The integer of value k (0..7) of such 8 codes (Q4_0's without its offset of 8), to be
// multiplied by the block's scale.
template <int FMT> FORGE_DEV int kv_code(u32 lo, u32 hi, int k) {
    if (FMT == KV_Q8_0) return (int)(i8)((k < 4 ? lo : hi) >> (8 * (k % 4)));
    return (int)((lo >> (4 * k)) & 15u) - 8;
}

// Value d of cache row `row` (n values a row) of a cache in format FMT.
template <int FMT> FORGE_DEV float kv_elem(const void* cache, i64 row, int n, int d) {
    const char* at = (const char*)cache + row * kv_row_bytes(FMT, n);
    if (FMT == KV_F32) return ((const float*)at)[d];
    if (FMT == KV_F16) return h2f(((const u16*)at)[d]);
    if (FMT == KV_BF16) return bf2f(((const u16*)at)[d]);
    const KvCodes c = kv_codes<FMT>(at, d & ~7);
    return (float)kv_code<FMT>(c.lo, c.hi, d & 7) * kv_scale(at, FMT, n, d);
}
