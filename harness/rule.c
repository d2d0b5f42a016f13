/* rule.c: a rule check, judged by the family and reported here (kp_rule in kp_harness.h): the judgements of a case's
 * outputs kept one per (output, parameters), the findings and summary of a rule check, and the explanation of an exact
 * check's differences. The family answers what a judgement says of a row; what a receipt holds is written here. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_launch.h"

static void *memo_find(const kp_judgements *js, const kp_output *out, const void *params) {
    for (int i = 0; i < js->n; i++)
        if (js->e[i].out == out && !memcmp(js->e[i].params, params, js->fam->params_bytes)) return js->e[i].value;
    return NULL;
}

static void *memo_add(kp_judgements *js, const kp_output *out, const void *params, void *value) {
    if (js->n == KP_MEMO_MAX) { /* evict the oldest */
        js->fam->rule->free_judgement(js->e[0].value);
        memmove(&js->e[0], &js->e[1], sizeof js->e[0] * (KP_MEMO_MAX - 1));
        js->n--;
    }
    js->e[js->n].out = out;
    memset(js->e[js->n].params, 0, sizeof js->e[js->n].params);
    memcpy(js->e[js->n].params, params, js->fam->params_bytes);
    js->e[js->n].value = value;
    return js->e[js->n++].value;
}

void kp_judgements_clear(kp_judgements *js) {
    for (int i = 0; i < js->n; i++) js->fam->rule->free_judgement(js->e[i].value);
    js->n = 0;
}

const void *kp_judgement(kp_judgements *js, const void *params, const kp_output *out, kp_error *err) {
    void *j = memo_find(js, out, params);
    if (j) return j;
    const double t0 = kp_now();
    j = js->fam->rule->judge(js->data, params, out, err);
    kp_stage_add(KP_STAGE_JUDGING, kp_now() - t0);
    return j ? memo_add(js, out, params, j) : NULL;
}

/* One row of a judgement: the family's figures, whether it meets the rule, its index lists as evidence (named
 * "<tag>.row<r>.<list>" when stored as artifacts). */
static int row_record(const kp_rule *rule, const void *j, int64_t r, cJSON *row, kp_evidence *ev, const char *tag,
                      kp_error *err) {
    rule->row_figures(j, r, row);
    cJSON_AddBoolToObject(row, "meets_rule", rule->row_ok(j, r));
    for (int l = 0; rule->lists[l]; l++) {
        char name[200];
        snprintf(name, sizeof name, "%s.row%lld.%s", tag, (long long)r, rule->lists[l]);
        const kp_index_list list = rule->row_list(j, l, r);
        if (kp_evidence_list(ev, row, rule->lists[l], name, list.idx, list.n, err)) return err->code;
    }
    return 0;
}

kp_result kp_rule_check(kp_judgements *js, const void *params, const kp_output *out, const kp_impl *impl, cJSON *check,
                        kp_evidence *ev, kp_error *err) {
    const kp_rule *rule = js->fam->rule;
    const void *j = kp_judgement(js, params, out, err);
    if (!j) return KP_FAILED;
    const int64_t rows = out->nrows;
    int64_t ok = 0;
    for (int64_t r = 0; r < rows; r++) ok += rule->row_ok(j, r);
    cJSON *f = cJSON_AddObjectToObject(check, "findings");
    kp_json_add_int(f, "rows", rows);
    kp_json_add_int(f, "rows_meeting_rule", ok);
    char summary[600];
    const int n = snprintf(summary, sizeof summary, "%lld/%lld rows meet the rule; ", (long long)ok, (long long)rows);
    rule->totals(js->data, params, j, rows, f, summary + n, sizeof summary - (size_t)n);
    cJSON *per_row = cJSON_AddArrayToObject(f, "per_row");
    for (int64_t r = 0; r < rows; r++) {
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToArray(per_row, row);
        kp_json_add_int(row, "row", r);
        rule->reference_row(js->data, params, r, cJSON_AddObjectToObject(row, "reference"));
        if (row_record(rule, j, r, cJSON_AddObjectToObject(row, "impl"), ev, impl->name, err)) return KP_FAILED;
    }
    if (rule->notes) {
        const size_t used = strlen(summary);
        rule->notes(js->data, params, j, rows, f, summary + used, sizeof summary - used);
    }
    cJSON_AddStringToObject(check, "summary", summary);
    return ok == rows ? KP_PASSED : KP_INCORRECT;
}

int kp_rule_explain_exact(kp_judgements *js, const void *params, const kp_impl *const impls[2],
                          const kp_output *const outs[2], const int64_t *rows, int64_t nrows, cJSON *rows_json,
                          kp_evidence *ev, kp_error *err) {
    const kp_rule *rule = js->fam->rule;
    const void *ja = kp_judgement(js, params, outs[0], err);
    const void *jb = ja ? kp_judgement(js, params, outs[1], err) : NULL;
    if (!ja || !jb) return err->code;
    for (int64_t q = 0; q < nrows; q++) {
        const int64_t r = rows[q];
        cJSON *row = cJSON_GetArrayItem(rows_json, (int)q);
        rule->reference_row(js->data, params, r, cJSON_AddObjectToObject(row, "reference"));
        if (row_record(rule, ja, r, cJSON_AddObjectToObject(row, impls[0]->name), ev, impls[0]->name, err) ||
            row_record(rule, jb, r, cJSON_AddObjectToObject(row, impls[1]->name), ev, impls[1]->name, err))
            return err->code;
        const bool a = rule->row_ok(ja, r), b = rule->row_ok(jb, r);
        cJSON_AddStringToObject(row, "meets_rule", a && b ? "both" : a ? impls[0]->name : b ? impls[1]->name : "neither");
    }
    return 0;
}
