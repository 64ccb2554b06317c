// probe.hip: small kernels for the runtime tests (graph replay against direct launches, the
// order of overlapped launches): each starts with FORGE_GRID_WAIT() as forge's own kernels do.
// Launch: 1-D, any grid x block covering n (grid-stride loops); in place is allowed.
#include "forge_hip.h"

#define PROBE_FOR_EACH(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

FORGE_KERNEL void probe_add(const float* a, const float* b, float* y, i64 n) {
    FORGE_GRID_WAIT();
    PROBE_FOR_EACH(i, n) y[i] = a[i] + b[i];
}

FORGE_KERNEL void probe_scale(const float* x, float* y, float s, i64 n) {
    FORGE_GRID_WAIT();
    PROBE_FOR_EACH(i, n) y[i] = x[i] * s;
}
