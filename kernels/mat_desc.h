// mat_desc.h: a product's matrix descriptor (contract.h's DESC_* layout: W, x, y, bias, type id,
// K, N, row bytes) as the kernels read it; X is the activations' element type.
#pragma once
#include "forge_hip.h"

template <class X> struct MatDesc {
    const u8* W;
    const X* x;
    float* y;
    const float* bias;
    int type, K, N;
    i64 row_bytes;
};

template <class X> FORGE_DEV MatDesc<X> mat_desc(const i64* d) {
    MatDesc<X> m;
    m.W = (const u8*)d[DESC_W];
    m.x = (const X*)d[DESC_X];
    m.y = (float*)d[DESC_Y];
    m.bias = (const float*)d[DESC_BIAS];
    m.type = (int)d[DESC_TYPE];
    m.K = (int)d[DESC_K];
    m.N = (int)d[DESC_N];
    m.row_bytes = d[DESC_ROW_BYTES];
    return m;
}
