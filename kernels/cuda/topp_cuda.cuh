/* topp_cuda.cuh: what the topp CUDA files share: the plan of a run (where a row's work lives) and the
 * lane and tree helpers whose order the host ports replay; the generic CUDA helpers are kp_cuda.cuh's.
 * The overview of the kernels, and which file holds what: topp_split.cu. */
#ifndef KP_TOPP_CUDA_CUH
#define KP_TOPP_CUDA_CUH

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>

/* kp_registry.h is not included: it pulls in cases/kp_common.h, whose C11 _Noreturn is not C++. */
#include "../kparity_kernel.h"
#include "../topp_split.h"
#include "kp_cuda.cuh"

#define TOPP_THREADS 256 /* the lane count of every in-piece reduction; the host port mirrors it */

enum topp_algo { ALGO_SPLIT_LOGIT = 0, ALGO_SPLIT_PROB = 1 };

/* One piece's statistics: [batch][P]. */
struct topp_stats {
    float max, sum, min;
    int count;
};

/* split_logit: one pivot over one piece, [batch][ROUNDS][P][F]; key: the smallest f32 prob above it. */
struct topp_part {
    float mass, key;
    int count, unused;
};

/* Where a row's work lives; the same numbers for every kernel of one run. */
struct topp_plan {
    const float *logits;
    float *out;
    const float *top_p;
    int64_t row_stride;
    int vocab;
    int slices;            /* S: programs per row */
    int piece_len;         /* L (split_logit) or KP_TOPP_TILE */
    int piece_count;       /* pieces per row actually used */
    int piece_cap;         /* pieces per row in the workspace */
    int pieces_per_program;
    topp_stats *stats;     /* [batch][piece_cap] */
    topp_part *parts;      /* split_logit: [batch][rounds][piece_cap][F] */
    unsigned long long *hist; /* split_prob: [batch][PROB_R][PROB_F + 1] bucket fix-masses */
    kp_topp_search *search;   /* split_prob: [batch][PROB_R + 1] the state entering each round */
    unsigned *counts;         /* split_prob: [batch][CNT_WORDS]: members of the trimmed level the mask appended,
                                 programs finished per kernel (zeroed by the launcher) */
    uint32_t *level_list;     /* split_prob: [batch][3][level_cap] their logit keys, indices, and scratch */
    int level_cap;            /* split_prob: entries per list, min(vocab, LEVEL_CAP) rounded up to 4 */
    uint32_t *cand_list;      /* split_prob: [batch][3 * level_cap] indices of round 1's bracket tokens */
    int sel_cap;              /* split_prob: entries prob_select_kernel caches in shared memory */
};

__device__ __forceinline__ bool finite_logit(float x) { return isfinite(x); }

__device__ __forceinline__ void key_merge(float &key, int &count, float other_key, int other_count) {
    if (other_count == 0) return;
    if (other_key < key) {
        key = other_key;
        count = other_count;
    } else if (other_key == key) {
        count += other_count;
    }
}

/* Lane t's tokens begin + t, begin + t + 256, ... handed to fn(index, value) in that order, with
 * LANE_BATCH loads in flight per thread; the order of every per-lane sum is the plain loop's. 4, not
 * more: with one 256-thread block per row the passes are bound by the per-token expf, division and 8
 * pivot compares, not by memory (measured variants: MEASURED.md). */
#define LANE_BATCH 4
template <typename Load, typename Fn>
__device__ __forceinline__ void lane_tokens_by(Load &&load, int begin, int end, Fn &&fn) {
    int i = begin + (int)threadIdx.x;
    for (; i + (LANE_BATCH - 1) * TOPP_THREADS < end; i += LANE_BATCH * TOPP_THREADS) {
        float v[LANE_BATCH];
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) v[u] = load(i + u * TOPP_THREADS);
#pragma unroll
        for (int u = 0; u < LANE_BATCH; u++) fn(i + u * TOPP_THREADS, v[u]);
    }
    for (; i < end; i += TOPP_THREADS) fn(i, load(i));
}
template <typename Fn>
__device__ __forceinline__ void lane_tokens(const float *x, int begin, int end, Fn &&fn) {
    lane_tokens_by([&](int i) { return x[i]; }, begin, end, fn);
}

/* ---- reductions over the 256 lanes of a block, in the order the host port replays ---- */

static_assert(TOPP_THREADS == 256, "the warp-local trees below are written for 256 lanes");
static_assert(TOPP_THREADS / 32 >= KP_TOPP_FANOUT, "one warp reduces each pivot");

/* The halving tree over buf[0..255] (lane t adds lane t + half, half = 128 .. 1) run by one warp:
 * lane l carries lanes l, l + 32, l + 64, l + 96 through the first three levels, then shuffles down.
 * Bit-identical to the block-wide tree and to the host port's; valid in lane 0. */
__device__ __forceinline__ float warp_tree_sum(const float *buf) {
    const int l = threadIdx.x & 31;
    const float v0 = buf[l] + buf[l + 128], v1 = buf[l + 32] + buf[l + 160];
    const float v2 = buf[l + 64] + buf[l + 192], v3 = buf[l + 96] + buf[l + 224];
    float u = (v0 + v2) + (v1 + v3);
    for (int half = 16; half > 0; half /= 2) u = u + __shfl_down_sync(0xffffffffu, u, half);
    return u;
}

/* Smallest key and how many share it over 256 lanes, by one warp (order-free); valid in lane 0. */
__device__ __forceinline__ void warp_key_merge(const float *keys, const int *counts, float &key, int &count) {
    const int l = threadIdx.x & 31;
    key = INFINITY;
    count = 0;
    for (int j = 0; j < TOPP_THREADS / 32; j++) key_merge(key, count, keys[l + 32 * j], counts[l + 32 * j]);
    for (int half = 16; half > 0; half /= 2) {
        float other_key = __shfl_down_sync(0xffffffffu, key, half);
        int other_count = __shfl_down_sync(0xffffffffu, count, half);
        key_merge(key, count, other_key, other_count);
    }
}

/* topp_split_logit.cu: the incumbent's launches of one call (plan filled in by topp_cuda_run). */
int topp_logit_launch(topp_plan plan, const kp_topp_args *a, int sm_count, cudaStream_t stream, char *message,
                      size_t message_len);

#endif
