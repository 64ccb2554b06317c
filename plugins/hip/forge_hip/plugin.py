"""The hip plugin's hook implementations (registered by forge like any third-party plugin).

The kernel vocabulary of backend "hip" (what `forge_register_kernels` takes for it; a plugin
registering a kernel with a higher priority replaces the built-in one):

- impl: a `forge_hip.library.HipKernel` (source file, function, optional directory for a
  plugin's own sources, which may include forge's forge_hip.h, contract.h and quants.h; the
  argument signature is read from the function's `FORGE_KERNEL` declaration).
- "matmul", per weight type: y[r, n] = x[r] . W[n] (+ bias, added by a separate launch) for
  x float32 [rows, K]; signature (W, x, y, K, N) "pppii", block = 4 warps, grid = (ceil(N / 4),
  rows). W is the weight as placed (`forge_hip.arena.device_rows`): GGML blocks as stored,
  except Q8_0, Q6_K and MXFP4 rows, whose scales move before each row's quants
  (kernels/quants.h deq32_q8_0 / deq32_q6_k / deq32_mxfp4 read them). Replacing it takes the
  matrices of that type off the fused descriptor paths (one launch per matrix).
- "embed", per weight type: out[t] = scale * W[ids[t]] as float32; (W, ids, out, K, scale).
- The weightless ops, each with its built-in kernel's arguments and launch (`forge_hip.plan`,
  `forge_hip.attention_part`; the RoPE ops take a frequency table and a cos/sin magnitude after
  freq_scale, and the attention ops the heads' sinks last, each 0 / 1.0 / 0 when absent):
  "add_norm" (residual add and RMSNorm, layer.hip), "qk_rope_store" and "attn_rows"
  (attention.hip), "attn_decode" (attention.hip's attn_decode_w512: every head width, one block
  per query head; when the built-in one wins the plan takes the narrowest layout for the heads,
  and its grouped form, 4 query heads of a KV head a block, one more argument H, when KV heads
  are shared), "gather_rows", "add_bias",
  "act_round" (layer.hip), "sample_rows" (sampling.hip), "geglu" and "swiglu"
  (elementwise.hip). Attention kernels read the KV cache in its format (contract.h's KV_*).
"""

from __future__ import annotations

from forge.hookspecs import hookimpl
from forge_hip.backend import HipBackend

FORGE_HOOK_API = 1


@hookimpl
def forge_register_backends(register) -> None:
    register(HipBackend)


@hookimpl
def forge_register_kernels(register) -> None:
    from forge_hip.library import register_builtin

    register_builtin(register)
