/* topk_cuda.cuh: what the topk CUDA files share: the run's args as the kernels read them, a row's
 * window and output, and the launchers' checks (the host port's, with the same messages). */
#ifndef KP_TOPK_CUDA_CUH
#define KP_TOPK_CUDA_CUH

#include <math.h>

#include "kp_cuda.cuh"
#include "../topk_radix.h"

/* What every kernel reads: the run's args, with the row count deciding radix_buffer's path. */
struct topk_params {
    const float *scores;   /* [rows, row_stride], f32 */
    const int32_t *starts; /* [rows] */
    const int32_t *ends;   /* [rows] */
    int32_t *indices;      /* [rows, k], int32 */
    float *values;         /* [rows, k], f32 */
    int64_t rows, row_stride;
    int32_t k, index_base, fill;
};

/* One row's window and output. */
struct topk_row {
    const float *x; /* the row's scores */
    int32_t start;
    int64_t len;
    int32_t *idx;
    float *val;
    uint32_t count; /* min(k, len) */
};

__device__ __forceinline__ topk_row row_at(const topk_params &p, int64_t r) {
    topk_row w;
    w.x = p.scores + r * p.row_stride;
    w.start = p.starts[r];
    w.len = (int64_t)p.ends[r] - w.start;
    w.idx = p.indices + r * p.k;
    w.val = p.values + r * p.k;
    w.count = (uint32_t)(w.len < p.k ? w.len : p.k);
    return w;
}

/* The host port's checks (kp_topk_args_problem), with the same messages. */
static inline int topk_check(const char *name, const void *args, char *message, size_t message_len) {
    const char *why = kp_topk_args_problem(static_cast<const kp_topk_args *>(args));
    if (!why) return KP_RUN_OK;
    return kp_cuda_fail_msg(message, message_len, KP_RUN_NOT_SUPPORTED, "%s: %s", name, why);
}

static inline size_t topk_workspace_bytes(const void *args) {
    (void)args;
    return 0;
}

static inline topk_params topk_params_of(const kp_topk_args *a) {
    return topk_params{a->scores, a->starts, a->ends, a->indices, a->values, a->rows, a->row_stride,
                       a->k, a->index_base, a->fill};
}

#endif
