// elementwise.hip: gated activations over n floats (the gated products' unfused path).
// Launch: 1-D, any grid x block covering n (grid-stride loops). In place is allowed.
#include "forge_hip.h"

#define FORGE_FOR_EACH(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

FORGE_DEV float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

FORGE_DEV float silu(float x) { return x / (1.0f + expf(-x)); }

// y = act(gate) * up
FORGE_KERNEL void geglu(const float* gate, const float* up, float* y, i64 n) {
    FORGE_GRID_WAIT();
    FORGE_FOR_EACH(i, n) y[i] = gelu_tanh(gate[i]) * up[i];
}

FORGE_KERNEL void swiglu(const float* gate, const float* up, float* y, i64 n) {
    FORGE_GRID_WAIT();
    FORGE_FOR_EACH(i, n) y[i] = silu(gate[i]) * up[i];
}
