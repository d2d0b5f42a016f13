/* moe_common.cuh: what the NVFP4 MoE steps of moe_cuda.cuh share: the tiling constants, struct moe_run
 * (one call as the kernels read it) and the helpers routing, the GEMMs, the f32 path and the combine use. */
#ifndef KP_MOE_COMMON_CUH
#define KP_MOE_COMMON_CUH

#include <cuda_bf16.h>

#include <math.h>

#include "../moe_plan.h"
#include "kp_cuda.cuh"

enum { MOE_INVARIANT = 0, MOE_MARLIN = 1, MOE_MARLIN_GEMV = 2 };

#define MOE_TM 64          /* rows (expert positions) per CTA tile */
#define MOE_TK 64          /* k per pipeline stage */
#ifndef MOE_STAGES /* these three may be overridden to build tiling variants for timing */
#define MOE_STAGES 4
#endif
#ifndef MOE_CTAS_PER_SM
#define MOE_CTAS_PER_SM 3 /* invariant (168 registers); marlin's cut state takes 255, 2 CTAs */
#endif
#ifndef MOE_WARPS
#define MOE_WARPS 4        /* each owns 32 weight rows of the tile, for all its rows */
#endif
#define MOE_THREADS (32 * MOE_WARPS)
#define MOE_TN (32 * MOE_WARPS) /* weight rows per CTA tile */
#define MOE_A_ROWS_PER_PASS (MOE_THREADS / 8) /* A rows one cp.async pass covers (8 threads a row) */
#define MOE_A_PASSES (MOE_TM / MOE_A_ROWS_PER_PASS)
#define MOE_A_BYTES (MOE_TM * MOE_TK * 2)  /* bf16, rows of 128 bytes, 16-byte units XOR row % 8 */
#define MOE_B_BYTES (MOE_TN * MOE_TK / 2)  /* codes, rows of 32 bytes, 16-byte halves swizzled by row bit 2 */
#define MOE_S_BYTES (MOE_TN * MOE_TK / 16) /* E4M3 scales, 4 a row */
#define MOE_STAGE_BYTES (MOE_A_BYTES + MOE_B_BYTES + MOE_S_BYTES)
#define MOE_SMEM_BYTES (MOE_STAGES * MOE_STAGE_BYTES)
#define MOE_CHUNK 256      /* pairs per routing block */
#define MOE_SCAN_THREADS 1024
#define MOE_F32_THREADS 256 /* gemv32's f32 path: 8 warps x 8 weight rows, a lane per row */
#define MOE_F32_KC 128      /* its k per step */
#define MOE_F32_SMEM ((64 * MOE_F32_KC + KP_MOE_GEMV_ROWS * (MOE_F32_KC + 1)) * 4)
#define MOE_MAX_PAIRS (1ll << 28)

enum { MOE_INFO_TILES = 0, MOE_INFO_BLOCKS = 1, MOE_INFO_ITERS1 = 2, MOE_INFO_ITERS2 = 3 };

/* One call as the kernels read it: the args, the plan, the workspace's pieces. */
struct moe_run {
    const float *x;        /* [rows, hidden] */
    const int32_t *ids;    /* [rows, topk] */
    const float *weights;  /* [rows, topk] */
    const uint8_t *w13, *s13, *w2, *s2;
    const float *g13, *g2; /* [experts] */
    float *out;            /* [rows, hidden] */
    int32_t *slots;        /* [rows, topk] */
    int64_t rows, hidden, inter, experts, w13_rows, pairs;
    int64_t kp1, kp2;      /* xb's and act's row strides: hidden and inter rounded up to MOE_TK (zeros past) */
    int32_t topk, gated, scale_dir;
    int32_t atomic;        /* slot order from atomic arrival */
    int64_t chunks;        /* routing blocks; hist has `chunks` rows (1 when atomic) */
    int64_t tile_cap;
    int32_t n_tiles1, n_tiles2, f32_tiles1, f32_tiles2; /* CTA column tiles of each GEMM */
    int32_t bsm;           /* marlin's block_size_m */
    int64_t mtile_n, mtile_k, m_ntiles1, m_ktiles1, m_ntiles2, m_ktiles2, grid;
    int32_t *hist, *first, *block0, *order;
    int4 *tiles;           /* m tile: expert, m0, position of its row 0, the expert's rows */
    int64_t *info;
    uint16_t *xb, *act;
    float *actf, *y;
};

/* ---- small device helpers ---- */

__device__ __forceinline__ uint16_t bf16_bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float bf16r(float v) { return kp_bf16_round(v); }
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

#endif
