// contract.h: every number the kernels and forge_hip (Python) must agree on. Python reads this
// file (forge_hip.contract parses its #defines) instead of mirroring the values, and reads kernel
// argument signatures from the FORGE_KERNEL declarations; tests/hip/test_contract.py checks both.
// Only plain `#define NAME integer-expression` lines here: the parser evaluates them in order.
#pragma once

// ---- weight type ids of matrix descriptors, in forge's type order ----
#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_Q4_0 3
#define T_Q4_1 4
#define T_Q5_0 5
#define T_Q5_1 6
#define T_Q8_0 7
#define T_Q2_K 8
#define T_Q3_K 9
#define T_Q4_K 10
#define T_Q5_K 11
#define T_Q6_K 12
#define T_MXFP4 13  // expert matrices only (moe.hip)

// ---- matrix descriptors: DESC_LEN int64 per matrix, in device memory ----
#define DESC_LEN 8
#define DESC_W 0          // weight rows' address (as placed: see forge_hip.arena.device_rows)
#define DESC_X 1          // x: float [R, K] (the prefill table: the rounded copy of x)
#define DESC_Y 2          // y: float [R, N]
#define DESC_BIAS 3       // float [N], 0: none
#define DESC_TYPE 4       // T_* above
#define DESC_K 5          // row length
#define DESC_N 6          // rows
#define DESC_ROW_BYTES 7  // bytes per weight row

// ---- KV cache formats (the kv_fmt argument of the attention kernels) ----
#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_Q8_0 3  // rows: the head's int8 values, then one f16 scale per 32 (kv_format.h)
#define KV_Q4_0 4  // rows: the head's 4-bit values, two a byte, then the same scales
#define KV_BLOCK 32        // values per scale of the quantized formats
#define AP_TENSOR_CORES 8  // attn_prefill.hip kv_mode flag: f16/Q8_0/Q4_0 cache on tensor cores

// ---- block sizes launches must use, and sizes the launch plan sizes grids by ----
#define MV_WARPS 4         // linear.hip mv_multi / mv_glu: warps per block
#define MVQ_THREADS 256    // mmv.hip and mmq.hip kernels
#define MMQ_WARPS 8        // mmq.hip: 32-lane warps per block (halves of a wave on wave64 AMD)
#define GB_THREADS 256     // gemm.hip
#define GB_N 128           // gemm.hip: weight rows (outputs) per block
#define ATT_THREADS 256    // attention.hip attn_rows / attn_decode
#define AP_THREADS 256     // attn_prefill.hip: 8 warps (tensor cores: 16 rows each)
#define AP_ROWS 128        // attn_prefill.hip: (token, query head) pairs per block
#define AP_MAX_SPLITS 16   // attn_prefill.hip: most splits of the key range
#define AP_STAGES 2        // attn_prefill.hip: K/V tiles in flight on tensor cores (NVIDIA)
// ... its dynamic shared memory on NVIDIA (bytes): the ring of AP_STAGES float16 K/V tiles (64
// positions of rows of DP + 8 halves; 32 for DP 256, whose V tiles take 128 columns), or for a
// quantized cache (attn_prefill_q<DP>) the ring of 32-position tiles as cached plus the float16
// K/V tile they are converted into
#define AP_SMEM_64 (AP_STAGES * 64 * (72 + 72) * 2)
#define AP_SMEM_128 (AP_STAGES * 64 * (136 + 136) * 2)
#define AP_SMEM_256 (AP_STAGES * 32 * (264 + 136) * 2)
#define AP_SMEM_Q64 (AP_STAGES * 32 * (72 + 72) + 32 * (72 + 72) * 2)
#define AP_SMEM_Q128 (AP_STAGES * 32 * (136 + 136) + 32 * (136 + 136) * 2)
#define AP_SMEM_Q256 (AP_STAGES * 32 * (272 + 136) + 32 * (264 + 136) * 2)
#define SMP_THREADS 1024   // sampling.hip sample_rows

// ---- shared memory and size limits ----
#define MVQ_SMEM_R1 20480  // mmv.hip: shared bytes for quantized x, one-row kernels
#define MVQ_SMEM_RN 40960  // ... kernels of several rows
#define MVQ_NORM_K 1024    // mmv.hip: longest row whose add_norm a one-row product takes over
#define MVQ_SPLIT_RM 8     // mmv.hip: the kernels whose blocks may split x's rows (gridDim.y)
#define ANQ_TASKS 2        // mmv.hip add_norm_quant: 256-element tasks per 32-lane group
#define ANQ_K (ANQ_TASKS * 256 * 16)  // ... longest row it takes (512 threads)
#define AN_PER 32          // layer.hip add_norm: elements of a row each lane holds at most
#define LAYER_MAX_D 512    // attention.hip: largest head dimension
#define ATT_SPLIT_MIN 128  // attention.hip: positions per split at least
#define TCD_THREADS 128   // attn_decode_tc.hip: threads of a block (4 warps)
#define TCD_STAGES 3      // ... key tiles in flight per warp (cp.async ring)
#define TCD_BK 16         // ... keys of a tile
#define TCD_MAX_GROUP 16  // ... most query heads a KV head serves (the rows of an mma tile)
#define TCD_MAX_D 128     // ... largest head (the fused prologue's shared rows)
#define TCD_SPLIT_MIN 256 // ... keys of a split at least
#define TCD_SMEM_64 (TCD_THREADS / 32 * TCD_STAGES * 2 * TCD_BK * (64 + 8) * 2)  // dynamic bytes
#define TCD_SMEM_128 (TCD_THREADS / 32 * TCD_STAGES * 2 * TCD_BK * (128 + 8) * 2)
// ... with a Q8_0 cache: the ring holds rows as cached (72 / 136 bytes), plus a float16 tile a warp
#define TCD_SMEM_Q8_64 (TCD_THREADS / 32 * (TCD_STAGES * 2 * TCD_BK * 72 + TCD_BK * (64 + 8) * 4))
#define TCD_SMEM_Q8_128 (TCD_THREADS / 32 * (TCD_STAGES * 2 * TCD_BK * 136 + TCD_BK * (128 + 8) * 4))
#define MOE_THREADS 1024   // moe.hip moe_route: most threads of its one block (>= E)
#define MOE_MAX_EXPERTS 1024  // moe.hip: most experts of a layer
#define MOE_MAX_PAIRS 8192    // moe.hip: most (token, chosen expert) pairs of one pass
#define MOE_MAX_USED 16       // moe.hip: most experts a token uses
#define MOE_ROUTER_THREADS 256  // moe.hip moe_router: threads of a block (an expert)
#define MOE_ROUTER_VEC 4        // ... float4 of the weight row each thread holds
#define MOE_ROUTER_ROWS 32      // ... most token rows of one launch

// ---- sampling.hip's per-row parameter fields (int32 words, one field array per word) ----
#define F_TEMP 0   // float
#define F_TOPK 1   // int, 0 = off
#define F_TOPP 2   // double (words 2, 3), 1 = off
#define F_LMINP 4  // double (words 4, 5): ln(min_p), -inf = off
#define F_KEY 6    // u64 (words 6, 7)
#define F_CTR 8    // u32: the draw's counter
#define F_WORDS 9  // words per row
