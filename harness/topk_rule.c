/* topk_rule.c: the topk family's rule stage for the harness (kp_rule): its judgement of an output
 * (reference/topk_ref.c's judge: strict and tie differences, dropped candidates, order), what it says of a row, the
 * reference's view of a row, the totals and the rows failing with NaN in their window, and the rule parameters.
 * harness/rule.c writes the findings and summary from these. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "topk_family.h"

/* The answer with NaN ranked as `nan` says. */
const kp_topk_ref *kp_topk_answer(topk_data *d, kp_topk_nan nan, kp_error *err) {
    if (!d->have_ref[nan]) {
        if (kp_topk_reference(d->scores, d->tc.rows, d->tc.width, d->tc.stride, d->starts, d->ends, d->tc.k,
                              d->tc.index_base, d->tc.fill, nan, &d->ref[nan], err))
            return NULL;
        d->have_ref[nan] = 1;
    }
    return &d->ref[nan];
}

const char *const kp_topk_param_keys[] = {"ties", "order", "nan", NULL};

int kp_topk_parse_params(const kp_param_reader *r, void *params, kp_error *err) {
    static const char *const ties[] = {"lowest_index", "any", NULL}, *const orders[] = {"index", "value", "any", NULL};
    static const char *const nans[] = {"below", "above", NULL};
    topk_params *p = params;
    const char *t, *o, *n = "below"; /* nan is optional: a check without it ranks NaN below, as it always has */
    if (kp_param_string(r, "ties", ties, &t, err) || kp_param_string(r, "order", orders, &o, err) ||
        (kp_param_get(r, "nan") && kp_param_string(r, "nan", nans, &n, err)))
        return err->code;
    p->ties = !strcmp(t, "any") ? KP_TOPK_TIES_ANY : KP_TOPK_TIES_LOWEST_INDEX;
    p->order = !strcmp(o, "index") ? KP_TOPK_ORDER_INDEX : !strcmp(o, "value") ? KP_TOPK_ORDER_VALUE : KP_TOPK_ORDER_ANY;
    p->nan = !strcmp(n, "above") ? KP_TOPK_NAN_ABOVE : KP_TOPK_NAN_BELOW;
    return 0;
}

void kp_topk_describe_params(const void *params, cJSON *out) {
    const topk_params *p = params;
    cJSON_AddStringToObject(out, "ties", kp_topk_ties_name(p->ties));
    cJSON_AddStringToObject(out, "order", kp_topk_order_name(p->order));
    cJSON_AddStringToObject(out, "nan", kp_topk_nan_name(p->nan));
}

/* What an exact check explains its differences with when the config declares no rule parameters: the
 * strictest tie policy, and no order (exact compares sets). */
void kp_topk_default_params(void *params) {
    topk_params *p = params;
    p->ties = KP_TOPK_TIES_LOWEST_INDEX, p->order = KP_TOPK_ORDER_ANY, p->nan = KP_TOPK_NAN_BELOW;
}

/* --- the rule: the family judges (reference/topk_ref.c), the harness reports (harness/rule.c) --- */

static void *topk_judge(void *data, const void *params, const kp_output *o, kp_error *err) {
    topk_data *d = data;
    const topk_params *p = params;
    KP_ASSERT(d->have_ref[KP_TOPK_NAN_BELOW]); /* the harness computes the reference before any judging */
    const kp_topk_ref *ref = kp_topk_answer(d, p->nan, err);
    kp_topk_judgement *j = ref ? kp_calloc(1, sizeof *j, "a judgement", err) : NULL;
    if (j && kp_topk_judge(ref, d->scores, d->tc.stride, o->t[0].data, o->t[1].data, p->ties, p->order, j, err))
        return free(j), NULL;
    return j;
}

static void free_judgement(void *j) {
    kp_topk_judgement_free(j);
    free(j);
}

static bool row_ok(const void *j, int64_t r) { return ((const kp_topk_judgement *)j)->row[r].rule_ok; }

static void row_figures(const void *judgement, int64_t r, cJSON *row) {
    const kp_topk_row_judgement *rj = &((const kp_topk_judgement *)judgement)->row[r];
    kp_json_add_int(row, "valid", rj->valid);
    kp_json_add_int(row, "dropped", rj->dropped);
    kp_json_add_int(row, "out_of_window", rj->out_of_window);
    kp_json_add_int(row, "duplicates", rj->duplicates);
    kp_json_add_int(row, "value_mismatch", rj->value_mismatch);
    kp_json_add_int(row, "fill_misplaced", rj->fill_misplaced + rj->fill_value_bad);
    cJSON_AddBoolToObject(row, "order_ok", rj->order_ok);
    cJSON_AddStringToObject(row, "set_sha256", rj->set_sha256);
}

/* Indices held past the answer's boundary (strict) or from its tie group against the policy (tie), and the answer's
 * indices the output misses. */
static const char *const lists[] = {"strict", "tie", "missing", NULL};

static kp_index_list row_list(const void *judgement, int list, int64_t r) {
    const kp_topk_judgement *j = judgement;
    const int64_t *idx = list == 0 ? j->strict_idx : list == 1 ? j->tie_idx : j->missing_idx;
    const int64_t *off = list == 0 ? j->strict_off : list == 1 ? j->tie_off : j->missing_off;
    return kp_index_list_row(idx, off, r);
}

static void reference_row(const void *data, const void *params, int64_t r, cJSON *row) {
    const kp_topk_ref_row *rr = &((const topk_data *)data)->ref[((const topk_params *)params)->nan].row[r];
    kp_json_add_int(row, "window_start", rr->start);
    kp_json_add_int(row, "window_len", rr->len);
    kp_json_add_int(row, "count", rr->count);
    if (rr->count > 0) kp_json_add_f32_bits(row, "boundary_value", rr->boundary_value);
    kp_json_add_int(row, "tie_group_size", rr->group_size);
    kp_json_add_int(row, "tie_group_needed", rr->group_needed);
    if (rr->nan_count) kp_json_add_int(row, "nan_in_window", rr->nan_count); /* where the NaN rank decides */
}

static void totals(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *f, char *summary,
                   size_t len) {
    (void)data, (void)params;
    const kp_topk_judgement *j = judgement;
    int64_t strict = 0, tie = 0, dropped = 0, dropped_rows = 0, bad_order = 0, malformed = 0;
    for (int64_t r = 0; r < rows; r++) {
        const kp_topk_row_judgement *rj = &j->row[r];
        strict += rj->strict_count, tie += rj->tie_count, dropped += rj->dropped, dropped_rows += rj->dropped > 0;
        bad_order += !rj->order_ok;
        malformed += rj->out_of_window + rj->duplicates + rj->value_mismatch + rj->fill_misplaced + rj->fill_value_bad;
    }
    kp_json_add_int(f, "strict", strict);
    kp_json_add_int(f, "tie", tie);
    kp_json_add_int(f, "dropped", dropped);
    kp_json_add_int(f, "rows_with_dropped", dropped_rows);
    kp_json_add_int(f, "rows_out_of_order", bad_order);
    kp_json_add_int(f, "malformed_entries", malformed);
    snprintf(summary, len, "%lld strict, %lld tie; %lld dropped in %lld rows; %lld out of order; %lld malformed",
             (long long)strict, (long long)tie, (long long)dropped, (long long)dropped_rows, (long long)bad_order,
             (long long)malformed);
}

/* Rows that fail with NaN in their window, named: where a NaN rank convention (nan: below or above) may be why. */
static void notes(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *f, char *summary,
                  size_t len) {
    const topk_data *d = data;
    const topk_params *p = params;
    const kp_topk_judgement *j = judgement;
    cJSON *nan_rows = NULL;
    size_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (j->row[r].rule_ok || !d->ref[p->nan].row[r].nan_count) continue;
        if (!nan_rows) {
            nan_rows = cJSON_AddArrayToObject(f, "rows_failing_with_nan");
            n += (size_t)snprintf(summary, len, "; rows failing with NaN in their window (NaN ranked %s every number):",
                                  kp_topk_nan_name(p->nan));
        }
        cJSON_AddItemToArray(nan_rows, kp_json_int(r));
        if (n < len) n += (size_t)snprintf(summary + n, len - n, " %lld", (long long)r);
    }
}

const kp_rule kp_topk_rule = {
    .judge = topk_judge,
    .free_judgement = free_judgement,
    .row_ok = row_ok,
    .row_figures = row_figures,
    .lists = lists,
    .row_list = row_list,
    .reference_row = reference_row,
    .totals = totals,
    .notes = notes,
};

