/* moe_family.h: what the moe family's harness files share (moe_family.c, the record and its tensors; moe_batch.c,
 * its batch thresholds and when a probe moved a row; moe_export.c, what an export says): the prepared case. */
#ifndef MOE_FAMILY_H
#define MOE_FAMILY_H

#include "../cases/moe_case.h"
#include "kp_harness.h"

typedef struct moe_data {
    kp_moe_case mc;
    /* the inputs (the harness holds them) */
    float *x, *weights, *scales; /* scales: [2, experts], W13's then W2's */
    int32_t *ids;
    uint8_t *w13, *s13, *w2, *s2;
    double *ref;      /* [m, hidden]: on x as given */
    double *ref_bf16; /* [m, hidden]: on x rounded to bf16, as every W4A16 kernel reads its activations */
    bool ref_borrowed; /* ref and ref_bf16 point into the cache's entry (reference_adopt): not ours to free */
    const char *ref_computed_on; /* where ref and ref_bf16 were computed (kp_moe_ref_in's computed_on); NULL if read back */
} moe_data;

/* moe_batch.c (kp_family.case_thresholds, kp_family.row_moved) */
int kp_moe_case_thresholds(const kp_case *c, kp_threshold *t);
bool kp_moe_row_moved(const void *data, const kp_output *full, int64_t full_row, const kp_output *probe,
                      int64_t probe_row);
/* moe_export.c */
extern const kp_array_doc kp_moe_array_docs[];

#endif
