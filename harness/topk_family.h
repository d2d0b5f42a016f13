/* topk_family.h: what the topk family's harness files share (topk_family.c, the record and its tensors;
 * topk_rule.c, the rule's judgement and parameters): the prepared case, the rule parameters and the answer per
 * NaN rank. */
#ifndef TOPK_FAMILY_H
#define TOPK_FAMILY_H

#include "../cases/topk_case.h"
#include "../reference/topk_ref.h"
#include "kp_harness.h"

/* The rule parameters: which members of the boundary tie group an output may take, its order, and where NaN ranks
 * (below every number by default; torch.topk ranks it above). */
typedef struct topk_params {
    kp_topk_ties ties;
    kp_topk_order order;
    kp_topk_nan nan;
} topk_params;

typedef struct topk_data {
    kp_topk_case tc;
    float *scores; /* the inputs (the harness holds them): [rows_total, stride] */
    int32_t *starts, *ends;
    int have_ref[2];
    bool ref_borrowed[2]; /* ref[n] points into the cache's entry (reference_adopt): not ours to free */
    kp_topk_ref ref[2]; /* the answer per NaN rank (kp_topk_nan), each computed when first asked for */
} topk_data;

/* The answer with NaN ranked as `nan` says, computed when first asked for; NULL with err set. */
const kp_topk_ref *kp_topk_answer(topk_data *d, kp_topk_nan nan, kp_error *err);
extern const kp_rule kp_topk_rule;
extern const char *const kp_topk_param_keys[];
int kp_topk_parse_params(const kp_param_reader *r, void *params, kp_error *err);
void kp_topk_describe_params(const void *params, cJSON *out);
void kp_topk_default_params(void *params);

#endif
