/* families.c: the family table, the one place the harness lists its families. Adding a family: one
 * row below (and its case family's row in cases/case_families.c); kp_harness.h says what else. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "kp_harness.h"

extern const kp_family kp_topp_family; /* harness/topp_family.c */
extern const kp_family kp_topk_family; /* harness/topk_family.c */
extern const kp_family kp_moe_family;  /* harness/moe_family.c */
extern const kp_family kp_mla_family;  /* harness/mla_family.c */

static const void *const builtin[] = {
    &kp_topp_family,
    &kp_topk_family,
    &kp_moe_family,
    &kp_mla_family,
};
_Static_assert(offsetof(kp_family, name) == 0, "a table row begins with its name (kp_table)");
kp_table kp_families = {builtin, (int)(sizeof builtin / sizeof builtin[0]), {0}, 0};

int kp_family_thresholds(const kp_family *fam, const kp_case *c, kp_threshold t[KP_THRESHOLDS_MAX]) {
    if (fam->case_thresholds) return fam->case_thresholds(c, t);
    const int n = fam->nthresholds < KP_THRESHOLDS_MAX ? fam->nthresholds : KP_THRESHOLDS_MAX;
    for (int i = 0; i < n; i++) t[i] = fam->thresholds[i];
    return n;
}

int kp_family_output_index(const kp_family *fam, const char *name) {
    for (int k = 0; name && fam->output_names && fam->output_names[k]; k++)
        if (!strcmp(fam->output_names[k], name)) return k;
    return -1;
}

void kp_family_output_list(const kp_family *fam, char *buf, size_t len) {
    if (len) buf[0] = '\0';
    for (int k = 0; fam->output_names && fam->output_names[k]; k++) {
        const size_t used = strlen(buf);
        if (used + 1 < len) snprintf(buf + used, len - used, "%s%s", k ? ", " : "", fam->output_names[k]);
    }
}

const kp_array_doc *kp_family_array_doc(const kp_family *fam, kp_array_kind kind, const char *name) {
    for (const kp_array_doc *d = fam->array_docs; d && d->name; d++)
        if (d->kind == kind && !strcmp(d->name, name)) return d;
    return NULL;
}

int kp_family_declare_absent(const kp_impl *impl, const char *name, kp_error *err) {
    const kp_family *fam = impl && impl->family ? kp_family_find(impl->family) : NULL;
    if (!fam)
        return kp_fail(err, KP_EXIT_USAGE, "%s: no family to declare an absent output of",
                       impl && impl->name ? impl->name : "(no impl)");
    if (kp_family_output_index(fam, name) < 0) {
        char names[256];
        kp_family_output_list(fam, names, sizeof names);
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is not an output of %s (its outputs: %s); it cannot be declared absent",
                       impl->name, name ? name : "(null)", fam->name, names);
    }
    return kp_impl_declare_absent(impl, name, err);
}

int kp_family_check(const kp_family *fam, kp_error *err) {
    if (!fam->name || !fam->cases || strcmp(fam->name, fam->cases->name))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: its case family must carry the same name", fam->name ? fam->name : "(null)");
    if (!fam->prepare || !fam->release || !fam->shapes || !fam->outputs ||
        !fam->fill_args || !fam->reference || !fam->reference_provider || !fam->output_names || !fam->output_names[0])
        return kp_fail(err, KP_EXIT_USAGE, "family %s: a required hook is missing (kp_harness.h lists them)", fam->name);
    if (fam->args_bytes == 0 || fam->args_bytes > KP_ARGS_MAX || fam->params_bytes > KP_PARAMS_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "family %s: args_bytes must be in [1, %d] and params_bytes at most %d",
                       fam->name, KP_ARGS_MAX, KP_PARAMS_MAX);
    if (fam->parse_params && (!fam->describe_params || !fam->param_keys || !fam->params_bytes))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: parse_params needs describe_params, param_keys and params_bytes",
                       fam->name);
    int ntol = 0;
    while (fam->tolerance_outputs && fam->tolerance_outputs[ntol]) ntol++;
    if (ntol > KP_MAX_TENSORS || fam->nthresholds < 0 || fam->nthresholds > KP_THRESHOLDS_MAX ||
        (fam->nthresholds && !fam->thresholds))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: at most %d tolerance outputs, and thresholds with their count",
                       fam->name, KP_MAX_TENSORS);
    for (int t = 0; t < fam->nthresholds; t++)
        if (fam->thresholds[t].rows < 1 || !fam->thresholds[t].why)
            return kp_fail(err, KP_EXIT_USAGE, "family %s: threshold %d needs rows >= 1 and a reason", fam->name, t);
    const kp_rule *rule = fam->rule;
    if (rule && (!rule->judge || !rule->free_judgement || !rule->row_ok || !rule->row_figures || !rule->lists ||
                 !rule->row_list || !rule->reference_row || !rule->totals || !fam->parse_params))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: a rule needs every hook of kp_rule but notes, and parse_params",
                       fam->name);
    if ((fam->defects != NULL) != (fam->has_defect != NULL))
        return kp_fail(err, KP_EXIT_USAGE, "family %s: defects and has_defect come together", fam->name);
    return 0;
}

int kp_family_register(const kp_family *fam, kp_error *err) {
    int rc = kp_family_check(fam, err);
    if (!rc && !kp_case_family_find(fam->name)) rc = kp_case_family_register(fam->cases, err);
    return rc ? rc : kp_table_add(&kp_families, fam, "family", err);
}
