// glu_act.h: the activations of gated FFN products, y = act(gate) * up (mmv.h's and mmq.hip's
// dense products, moe.hip's and moe_gemm.hip's expert products).
#pragma once
#include "forge_hip.h"

#if !defined(FORGE_HOST)
// The gated products' activation: 0 SiLU, 1 GELU-tanh.
FORGE_DEV float mvq_act(float a, int act) {
    return act == 1 ? 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)))
                    : a / (1.0f + expf(-a));
}

// An expert's gate g and up u combined: act 0 / 1 as mvq_act; 2 gpt-oss's clamped SwiGLU
// (g clamped above at `limit`, u to [-limit, limit], g sigmoid(alpha g) (u + 1)).
FORGE_DEV float moe_act(float g, float u, int act, float alpha, float limit) {
    if (act == 2) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
    return mvq_act(g, act) * u;
}
#endif
