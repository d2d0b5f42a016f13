/* topp_family.h: what the topp family's harness files share (topp_family.c, the record and its tensors;
 * topp_rule.c, the rule's judgement and parameters): the prepared case and the rule parameters. */
#ifndef TOPP_FAMILY_H
#define TOPP_FAMILY_H

#include "../cases/topp_case.h"
#include "../reference/topp_ref.h"
#include "kp_harness.h"

/* The rule parameters a rule or exact check declares. */
typedef struct topp_params {
    kp_tie_policy tie_policy;
    double band;
} topp_params;

typedef struct topp_data {
    kp_topp_case tc;
    float *logits; /* the inputs (the harness holds them): [rows_total, stride] */
    float *top_p;  /* [rows_total] */
    int have_ref;
    bool ref_borrowed; /* ref points into the cache's entry (reference_adopt): not ours to free */
    kp_topp_ref ref;
} topp_data;

extern const kp_rule kp_topp_rule;
extern const char *const kp_topp_param_keys[];
int kp_topp_parse_params(const kp_param_reader *r, void *params, kp_error *err);
void kp_topp_describe_params(const void *params, cJSON *out);
void kp_topp_default_params(void *params);

#endif
