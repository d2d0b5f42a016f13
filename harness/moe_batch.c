/* moe_batch.c: the moe family's batch stage: the rows at which the modelled impls change what they run for a case's
 * experts and top-k (its batch probes straddle each), and whether a probe moved a row (its pairs took other slots). */
#include <string.h>

#include "../kernels/moe_plan.h"
#include "moe_family.h"

/* Rows at which the modelled impls change what they run, for this case's experts and top-k. */
int kp_moe_case_thresholds(const kp_case *c, kp_threshold *t) {
    static const char *const why_bsm[] = {
        "marlin_like's block_size_m steps from 8 to 16 rows above here (rows * topk / experts / 8 reaches 0.9)",
        "marlin_like's block_size_m steps from 16 to 32 rows above here",
        "marlin_like's block_size_m steps from 32 to 48 rows above here (and its tile from {n 128, k 128} to {n 256, k 64})",
        "marlin_like's block_size_m steps from 48 to 64 rows above here",
    };
    const kp_moe_case mc = *kp_moe_case_of(c);
    int n = 0;
    t[n++] = (kp_threshold){KP_MOE_GEMV_ROWS, "marlin_gemv32 runs an expert with at most 32 rows in f32 and one with more "
                                              "in bf16: a hot or straddle expert crosses 32 rows here"};
    static const int sizes[] = {8, 16, 32, 48};
    for (int i = 0; i < 4; i++) {
        int64_t T = (int64_t)(0.9 * sizes[i] * (double)mc.experts / (double)mc.topk) + 1;
        while (T > 1 && kp_marlin_block_size_m(T, (int32_t)mc.topk, mc.experts) > sizes[i]) T--;
        if (T > KP_MOE_GEMV_ROWS) t[n++] = (kp_threshold){T, why_bsm[i]};
    }
    if (mc.experts <= 64)
        t[n++] = (kp_threshold){(1023 / mc.topk), "marlin_like's token order turns atomic at 1024 routed slots (with "
                                                  "at most 64 experts): one row more than this"};
    return n;
}

/* A row moved when its pairs took other slots of their experts: what marlin's order, and so its sums, depend on. */
bool kp_moe_row_moved(const void *data, const kp_output *full, int64_t full_row, const kp_output *probe,
                      int64_t probe_row) {
    const moe_data *d = data;
    const int32_t *a = (const int32_t *)full->t[1].data + full_row * d->mc.topk;
    const int32_t *b = (const int32_t *)probe->t[1].data + probe_row * d->mc.topk;
    return memcmp(a, b, sizeof *a * (size_t)d->mc.topk) != 0;
}

