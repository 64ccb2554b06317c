// add_norm.h: the arithmetic of one row's add_norm (residual add with optional post-norm, then the
// next RMSNorm), shared by layer.hip's add_norm kernel and mmv.hip's one-row products that fold it
// in (mvq_*_r1n), so that both paths round identically. The lanes of a group each take elements
// lane + G * j in increasing j; their squares are summed per lane in that order, then over the
// group (an_group_sum).
#pragma once
#include "forge_hip.h"


FORGE_DEV float an_sq(float ss, float v) { return fmaf(v, v, ss); }

FORGE_DEV float an_inv(float ss, int n, float eps) { return rsqrtf(ss / (float)n + eps); }

// the residual after adding o: x + rmsnorm(o) * w_post (post), else x + o
FORGE_DEV float an_resid(float x, float o, float inv_o, float wp, bool post) {
    return post ? fmaf(o * inv_o, wp, x) : x + o;
}

FORGE_DEV float an_out(float x, float inv, float wn) { return x * inv * wn; }
