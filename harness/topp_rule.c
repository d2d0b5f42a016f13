/* topp_rule.c: the topp family's rule stage for the harness (kp_rule): its judgement of an output
 * (reference/topp_ref.c's judge: strict, tie and band mismatches per row), what it says of a row, the reference's
 * view of a row, the totals, and the rule parameters. harness/rule.c writes the findings and summary from these. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "topp_family.h"

const char *const kp_topp_param_keys[] = {"tie_policy", "band", NULL};

int kp_topp_parse_params(const kp_param_reader *r, void *params, kp_error *err) {
    static const char *const policies[] = {"minimal_index", "inclusive", NULL};
    topp_params *p = params;
    const char *policy;
    if (kp_param_string(r, "tie_policy", policies, &policy, err) || kp_tie_policy_parse(policy, &p->tie_policy) ||
        kp_param_number(r, "band", 0.0, 0.5, false, &p->band, err))
        return err->code ? err->code : KP_EXIT_USAGE;
    return 0;
}

void kp_topp_describe_params(const void *params, cJSON *out) {
    const topp_params *p = params;
    cJSON_AddStringToObject(out, "tie_policy", kp_tie_policy_name(p->tie_policy));
    kp_json_add_double(out, "band", p->band);
}

/* What an exact check explains its differences with when the config declares no rule parameters: the
 * design's band for f32 kernels summing ~10^5 terms (DESIGN.md "topp"), written into the receipt. */
void kp_topp_default_params(void *params) { /* field by field: the padding stays as zeroed, params compare by bytes */
    topp_params *p = params;
    p->tie_policy = KP_TIE_MINIMAL_INDEX, p->band = 1e-6;
}

/* --- the rule: the family judges (reference/topp_ref.c), the harness reports (harness/rule.c) --- */

static void *topp_judge(void *data, const void *params, const kp_output *o, kp_error *err) {
    topp_data *d = data;
    const topp_params *p = params;
    KP_ASSERT(d->have_ref); /* the harness computes the reference before any judging */
    kp_topp_judgement *j = kp_calloc(1, sizeof *j, "a judgement", err);
    if (j && kp_topp_judge(&d->ref, d->logits, o->t[0].data, o->t[0].row_stride, p->tie_policy, p->band, j, err))
        return free(j), NULL;
    return j;
}

static void free_judgement(void *j) {
    kp_topp_judgement_free(j);
    free(j);
}

static bool row_ok(const void *j, int64_t r) { return ((const kp_topp_judgement *)j)->rows[r].rule_ok; }

static void row_figures(const void *judgement, int64_t r, cJSON *row) {
    const kp_topp_row_judgement *rj = &((const kp_topp_judgement *)judgement)->rows[r];
    kp_json_add_int(row, "kept", rj->kept_count);
    kp_json_add_double(row, "kept_mass", rj->kept_mass);
    kp_json_add_int(row, "group_kept", rj->group_kept);
    cJSON_AddBoolToObject(row, "group_lowest_first", rj->group_lowest_first);
    cJSON_AddBoolToObject(row, "all_neginf", rj->all_neginf);
    kp_json_add_int(row, "altered", rj->altered_count);
    kp_json_add_int(row, "nan_out", rj->nan_out_count);
    cJSON *flags = cJSON_AddObjectToObject(row, "conformance");
    cJSON_AddBoolToObject(flags, "mass", rj->mass_ok);
    cJSON_AddBoolToObject(flags, "minimal", rj->minimal_ok);
    cJSON_AddBoolToObject(flags, "monotone", rj->monotone_ok);
    cJSON_AddBoolToObject(flags, "no_nan", rj->no_nan_ok);
    cJSON_AddBoolToObject(flags, "nonempty", rj->nonempty_ok);
}

/* Tokens kept past the rule's prefix (strict), the boundary tie group taken otherwise than the policy says (tie), and
 * differences within the band of the boundary's mass (band). */
static const char *const lists[] = {"strict", "tie", "band", NULL};

static kp_index_list row_list(const void *judgement, int list, int64_t r) {
    const kp_topp_judgement *j = judgement;
    const int64_t *idx = list == 0 ? j->strict_idx : list == 1 ? j->tie_idx : j->band_idx;
    const int64_t *off = list == 0 ? j->strict_off : list == 1 ? j->tie_off : j->band_off;
    return kp_index_list_row(idx, off, r);
}

static void add_bits(cJSON *obj, const char *key, float v) {
    char text[64];
    uint32_t bits;
    memcpy(&bits, &v, 4);
    snprintf(text, sizeof text, "%.9g (0x%08x)", (double)v, bits);
    cJSON_AddStringToObject(obj, key, text);
}

static void reference_row(const void *data, const void *params, int64_t r, cJSON *row) {
    (void)params;
    const kp_topp_ref_row *rr = &((const topp_data *)data)->ref.rows[r];
    kp_json_add_float(row, "top_p", (float)rr->top_p);
    kp_json_add_int(row, "finite", rr->finite_count);
    if (rr->nan_count) kp_json_add_int(row, "nan_inputs", rr->nan_count);
    kp_json_add_int(row, "kept", rr->kept_count);
    kp_json_add_double(row, "kept_mass", rr->kept_mass);
    kp_json_add_int(row, "boundary_token", rr->boundary_token);
    if (rr->boundary_token >= 0) add_bits(row, "boundary_logit", rr->boundary_logit);
    kp_json_add_int(row, "tie_group_size", rr->tie_group_size);
    kp_json_add_int(row, "tie_needed", rr->tie_needed);
    kp_json_add_int(row, "band_tokens", rr->band_count);
}

static void totals(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *f, char *summary,
                   size_t len) {
    (void)data, (void)params;
    const kp_topp_judgement *j = judgement;
    int64_t strict = 0, tie = 0, band = 0, neginf_rows = 0;
    for (int64_t r = 0; r < rows; r++) {
        strict += j->rows[r].strict_count, tie += j->rows[r].tie_count, band += j->rows[r].band_count;
        neginf_rows += j->rows[r].all_neginf;
    }
    kp_json_add_int(f, "strict", strict);
    kp_json_add_int(f, "tie", tie);
    kp_json_add_int(f, "band", band);
    kp_json_add_int(f, "all_neginf_rows", neginf_rows);
    int n = snprintf(summary, len, "%lld strict, %lld tie, %lld band", (long long)strict, (long long)tie, (long long)band);
    if (neginf_rows && n >= 0 && (size_t)n < len)
        snprintf(summary + n, len - (size_t)n, "; ALL -inf rows present (%lld)", (long long)neginf_rows);
}

const kp_rule kp_topp_rule = {
    .judge = topp_judge,
    .free_judgement = free_judgement,
    .row_ok = row_ok,
    .row_figures = row_figures,
    .lists = lists,
    .row_list = row_list,
    .reference_row = reference_row,
    .totals = totals,
};

