/* moe_plan.h: the NVFP4 MoE steps shared by the host ports and the CUDA kernels, so both devices run
 * the same plan with the same constants (DESIGN.md "moe", families.md §A and §B).
 *
 * Both impls dequantize a weight as e2m1 * sf (exact in bf16 and f32) and apply the global scale as
 * alpha = 1 / g (divide) or g (multiply) to a dot product's sum.
 *
 * invariant (candidate): each expert's rows in token order (a stable counting sort: no atomics);
 * activations rounded to bf16 for every row count; each output of either GEMM reduced over all of K in
 * one chain of f32 adds in ascending K, then times alpha in f32; the activation in f32, rounded to bf16
 * as the second GEMM's input; out[t] = sum over j ascending of weights[t, j] * y in f32. One tile shape
 * and one precision path whatever the rows, so a row's bits depend on nothing but its own inputs.
 *
 * marlin_like (incumbent, modelled on vLLM's Marlin MoE; each defect is named in families.md §B1):
 * - slot order: when kp_marlin_atomic_order (rows * topk >= 1024 or experts > 64), a pair's position in
 *   its expert comes from atomic arrival (the host port: a seeded shuffle, a new one each call); else in
 *   token order (the single-block counting path);
 * - blocks: each expert's rows are cut into blocks of block_size_m (kp_marlin_block_size_m, from the
 *   batch); block j of the whole launch is expert-major;
 * - stream-K: over the linear range of (block, n tile, k tile), k fastest, each of `grid` CTAs takes
 *   iters = ceil(k_tiles * n_tiles * blocks / grid) tiles; a column's f32 sum is therefore cut into
 *   partial sums at the k tiles where (block * n_tiles + n tile) * k_tiles + k tile is a multiple of
 *   iters: a row that changes block changes its sum tree;
 * - bf16 partials: the partials are reduced in order through the bf16 output (Marlin without its fp32
 *   reduce buffer): total = bf16(total + partial) in f32 per partial, from total = 0;
 * - bf16: activations rounded to bf16; each GEMM's result (the reduced total) in bf16, then times bf16(alpha) in
 *   bf16 (GEMM1), or times bf16(bf16(alpha) * bf16(weight)) in bf16 (GEMM2); the activation rounded to
 *   bf16; the sum over slots in bf16 steps for topk 2 to 4, else in f32 rounded once to bf16;
 * - gemv_rows (the marlin_gemv32 variant, gllm#98): an expert with at most KP_MOE_GEMV_ROWS rows takes an
 *   f32 path (activations, sums, intermediate and product all f32, no cuts), so a row's answer changes
 *   when its expert crosses 32 rows. Block numbers still count every expert's rows, f32-path ones too;
 *   an f32-path pair's contribution is y * (alpha * weight) in f32, summed with the others by the rule
 *   above. */
#ifndef KP_MOE_PLAN_H
#define KP_MOE_PLAN_H

#include <stdint.h>
#include <string.h>

#include "kp_formats.h"
#include "kparity_kernel.h"

#if defined(__CUDACC__)
#define KP_MOE_FN __host__ __device__ static inline
#else
#define KP_MOE_FN static inline
#endif

#define KP_MOE_MAX_TOPK 16
#define KP_MOE_GEMV_ROWS 32  /* marlin_gemv32: experts with at most this many rows take the f32 path */
#define KP_MOE_HOST_SMS 132  /* the host port's model of the grid: an H200's multiprocessors */

/* What both devices refuse, as a reason; NULL when the args can run. */
KP_MOE_FN const char *kp_moe_args_problem(const kp_moe_args *a) {
    if (a->rows < 1 || a->experts < 1 || a->experts > INT32_MAX) return "rows or experts";
    if (a->hidden < 16 || a->hidden % 16 || a->inter < 16 || a->inter % 16) return "hidden or inter not a positive multiple of 16";
    if (a->topk < 1 || a->topk > KP_MOE_MAX_TOPK || a->topk > a->experts) return "topk outside [1, min(16, experts)]";
    if (a->gated != 0 && a->gated != 1) return "gated is neither 0 nor 1";
    if (a->scale_dir != KP_MOE_SCALE_DIVIDE && a->scale_dir != KP_MOE_SCALE_MULTIPLY) return "scale_dir";
    return NULL;
}

KP_MOE_FN int64_t kp_moe_w13_rows_of(const kp_moe_args *a) { return a->gated ? 2 * a->inter : a->inter; }

/* An E2M1 code's (0..15) value (families.md §A); E4M3 and bf16 are kp_formats.h's. */
KP_MOE_FN float kp_moe_e2m1(uint32_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return code & 8u ? -mag[code & 7u] : mag[code & 7u];
}
/* The global scale as a multiplier of a dot product's sum. */
KP_MOE_FN float kp_moe_alpha(float g, int32_t dir) { return dir == KP_MOE_SCALE_DIVIDE ? 1.0f / g : g; }

/* marlin_like's slot order: atomic arrival unless the single-block counting path applies (few slots
 * and at most 64 experts), moe_align_sum_kernels.cu. */
KP_MOE_FN int kp_marlin_atomic_order(int64_t rows, int32_t topk, int64_t experts) {
    return !(rows * topk < 1024 && experts <= 64);
}

/* The first of 8, 16, 32, 48, 64 with rows * topk / experts / bsm < 0.9, else 64 (fused_marlin_moe.py). */
KP_MOE_FN int kp_marlin_block_size_m(int64_t rows, int32_t topk, int64_t experts) {
    const int sizes[5] = {8, 16, 32, 48, 64};
    for (int i = 0; i < 5; i++)
        if ((double)rows * topk / (double)experts / sizes[i] < 0.9) return sizes[i];
    return 64;
}

/* The thread tile's n and k: small-batch {n 128, k 128} at one 16-row m block, large-batch {n 256, k 64}
 * above (ops.cu). */
KP_MOE_FN void kp_marlin_tile(int bsm, int64_t *tile_n, int64_t *tile_k) {
    const int large = (bsm + 15) / 16 > 1;
    *tile_n = large ? 256 : 128;
    *tile_k = large ? 64 : 128;
}

/* Stream-K's tiles per CTA over one GEMM of n_tiles x k_tiles per block, `blocks` valid blocks. */
KP_MOE_FN int64_t kp_marlin_iters(int64_t k_tiles, int64_t n_tiles, int64_t blocks, int64_t grid) {
    const int64_t total = k_tiles * n_tiles * blocks;
    return (total + grid - 1) / grid;
}

/* Whether a new partial sum starts at k tile kt of column tile nt of block `block`. */
KP_MOE_FN int kp_marlin_cut(int64_t block, int64_t nt, int64_t kt, int64_t n_tiles, int64_t k_tiles, int64_t iters) {
    return kt > 0 && ((block * n_tiles + nt) * k_tiles + kt) % iters == 0;
}

#endif
