/* config_checks.c: the checks of a gate config: the impls and roles they name, which fields each kind
 * of check takes, the family's rule parameters, tolerance thresholds and runs, and the checks' labels. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_config.h"
#include "kp_device.h"

/* An impl named in the config: a role ("candidate") or a registered name; "@auto" picks @cuda when
 * a GPU and the CUDA impl exist, @host otherwise. */
int kp_resolve_impl(const char *declared, const char *where, const kp_impl **out, kp_error *err) {
    const char *at = strrchr(declared, '@');
    if (at && !strcmp(at, "@auto")) {
        char name[128];
        int n = (int)(at - declared);
        snprintf(name, sizeof name, "%.*s@cuda", n, declared);
        if (kp_device_count() > 0 && (*out = kp_impl_find(name))) return 0;
        snprintf(name, sizeof name, "%.*s@host", n, declared);
        if ((*out = kp_impl_find(name))) return 0;
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': neither %.*s@cuda nor %.*s@host is registered", where, declared, n,
                       declared, n, declared);
    }
    if ((*out = kp_impl_find(declared))) return 0;
    char known[1024] = "";
    for (int i = 0; i < kp_impl_count(); i++) {
        size_t l = strlen(known);
        snprintf(known + l, sizeof known - l, "%s%s", i ? ", " : "", kp_impl_at(i)->name);
    }
    return kp_fail(err, KP_EXIT_USAGE, "%s: impl '%s' is unknown (registered: %s)", where, declared, known);
}

/* An impl a check names: a role of the case's family ("<family>.candidate"), a role ("candidate"),
 * or an impl's name. */
static int impl_ref(const kp_config *cfg, const kp_family *fam, const char *text, const char *where, const kp_impl **impl,
                    char role[64], kp_error *err) {
    char qualified[160];
    snprintf(qualified, sizeof qualified, "%s.%s", fam->name, text);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < cfg->nroles; i++)
            if (!strcmp(cfg->roles[i].role, pass ? text : qualified)) {
                *impl = cfg->roles[i].impl;
                snprintf(role, 64, "%s", cfg->roles[i].role);
                return 0;
            }
    role[0] = '\0';
    return kp_resolve_impl(text, where, impl, err);
}

static const cJSON *member(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

static bool listed(const char *const *list, const char *s) {
    for (int i = 0; list && list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

static void join_list(const char *const *list, char *buf, size_t len) {
    buf[0] = '\0';
    for (int i = 0; list && list[i]; i++) {
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, "%s%s", i ? ", " : "", list[i]);
    }
}

/* The fields a check of this kind takes (an expect check: its own and those of the check it expects). */
static bool field_allowed(const kp_family *fam, kp_check_kind kind, kp_check_kind of, const char *key) {
    static const char *const tolerance_keys[] = {"atol", "rtol", "nmse", "cosine", "ulp", "element_rule", "round_reference", "tensors", NULL};
    if (!strcmp(key, "check")) return true;
    if (kind == KP_CHECK_EXPECT) {
        if (!strcmp(key, "of") || !strcmp(key, "result") || !strcmp(key, "defect")) return true;
        kind = of;
    }
    switch (kind) {
    case KP_CHECK_EXACT: return !strcmp(key, "impls") || listed(fam->param_keys, key);
    case KP_CHECK_RULE: return !strcmp(key, "impl") || listed(fam->param_keys, key);
    case KP_CHECK_TOLERANCE: return !strcmp(key, "impl") || listed(tolerance_keys, key);
    case KP_CHECK_REPEAT: return !strcmp(key, "impl") || !strcmp(key, "runs");
    case KP_CHECK_BATCH: return !strcmp(key, "impl");
    case KP_CHECK_EXPECT:
    case KP_CHECK_KIND_COUNT: break;
    }
    return false;
}

/* A tolerance field for one output tensor: from "tensors".<tensor>, else the check, else "defaults". */
static const cJSON *tolerance_field(const cJSON *per_tensor, const kp_param_reader *r, const char *key, const char *tensor,
                                    char *at, size_t len) {
    const cJSON *v = per_tensor ? member(per_tensor, key) : NULL;
    if (v) snprintf(at, len, "%.300s.tensors.%.40s.%s", r->where, tensor, key);
    else snprintf(at, len, "%.300s.%s", r->where, key);
    return v ? v : kp_param_get(r, key);
}

static int tolerance_number(const cJSON *v, const char *at, bool *has, double *out, kp_error *err) {
    if (!v) return 0;
    if (kp_want_number(v, at, out, err)) return err->code;
    if (!(*out >= 0 && *out < 1e300)) return kp_fail(err, KP_EXIT_USAGE, "%s: %g must be a finite number >= 0", at, *out);
    if (has) *has = true;
    return 0;
}

static int parse_tolerance(const kp_family *fam, const kp_param_reader *r, kp_check_spec *s, kp_error *err) {
    char at[480];
    const cJSON *tensors = kp_param_get(r, "tensors");
    snprintf(at, sizeof at, "%.300s.tensors", r->where);
    if (tensors && !cJSON_IsObject(tensors))
        return kp_fail(err, KP_EXIT_USAGE, "%s: expected an object of output tensor: thresholds", at);
    for (const cJSON *t = tensors ? tensors->child : NULL; t; t = t->next) {
        char known[256];
        join_list(fam->tolerance_outputs, known, sizeof known);
        if (!listed(fam->tolerance_outputs, t->string))
            return kp_fail(err, KP_EXIT_USAGE, "%s.%s: not an output the %s reference gives (%s)", at, t->string, fam->name, known);
        if (!cJSON_IsObject(t)) return kp_fail(err, KP_EXIT_USAGE, "%s.%s: expected an object of thresholds", at, t->string);
        for (const cJSON *m = t->child; m; m = m->next)
            if (strcmp(m->string, "atol") && strcmp(m->string, "rtol") && strcmp(m->string, "nmse") &&
                strcmp(m->string, "cosine") && strcmp(m->string, "ulp") && strcmp(m->string, "element_rule") &&
                strcmp(m->string, "round_reference"))
                return kp_fail(err, KP_EXIT_USAGE, "%s.%s.%s: unknown field (atol, rtol, nmse, cosine, ulp, element_rule, "
                               "round_reference)", at, t->string, m->string);
    }
    for (int k = 0; fam->tolerance_outputs[k]; k++) {
        KP_ASSERT(k < KP_MAX_TENSORS);
        const char *name = fam->tolerance_outputs[k];
        const cJSON *mine = tensors ? member(tensors, name) : NULL;
        kp_tolerance *tol = &s->tolerance[k];
        const cJSON *v;
        bool has;
        for (int req = 0; req < 2; req++) { /* atol and rtol: required */
            const char *key = req ? "rtol" : "atol";
            v = tolerance_field(mine, r, key, name, at, sizeof at);
            if (!v) return kp_fail(err, KP_EXIT_USAGE, "%s: required (in the check, \"tensors\".%s or \"defaults\")", at, name);
            if (tolerance_number(v, at, NULL, req ? &tol->rtol : &tol->atol, err)) return err->code;
        }
        v = tolerance_field(mine, r, "nmse", name, at, sizeof at);
        if (tolerance_number(v, at, &tol->has_nmse, &tol->nmse, err)) return err->code;
        v = tolerance_field(mine, r, "cosine", name, at, sizeof at);
        if (tolerance_number(v, at, &tol->has_cosine, &tol->cosine, err)) return err->code;
        v = tolerance_field(mine, r, "ulp", name, at, sizeof at);
        double ulp = 0;
        has = false;
        if (tolerance_number(v, at, &has, &ulp, err)) return err->code;
        if (has && (ulp != floor(ulp) || ulp > 65535))
            return kp_fail(err, KP_EXIT_USAGE, "%s: %g must be an integer in [0, 65535]", at, ulp);
        tol->has_ulp = has, tol->ulp = (int64_t)ulp;
        v = tolerance_field(mine, r, "element_rule", name, at, sizeof at);
        const char *rule = "sum";
        if (v && kp_want_string(v, at, &rule, err)) return err->code;
        if (strcmp(rule, "sum") && strcmp(rule, "both"))
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is not an element rule (sum: |x - r| <= atol + rtol |r|; both: an "
                           "element fails only past both atol and rtol |r|)", at, rule);
        tol->both = !strcmp(rule, "both");
        v = tolerance_field(mine, r, "round_reference", name, at, sizeof at);
        if (v && !cJSON_IsBool(v)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected true or false", at);
        tol->round_reference = v && cJSON_IsTrue(v);
    }
    return 0;
}

/* The family's rule parameters: required for rule (and expect of rule); for exact, read when the
 * config declares any of them, else the family's defaults, recorded as such. */
static int family_params(const kp_family *fam, const kp_param_reader *r, kp_check_kind kind, kp_check_spec *s,
                         kp_error *err) {
    if (!fam->parse_params) return 0;
    bool declared = false;
    for (int i = 0; fam->param_keys && fam->param_keys[i]; i++) declared |= kp_param_get(r, fam->param_keys[i]) != NULL;
    if (kind == KP_CHECK_EXACT && !declared) {
        if (!fam->default_params) return 0;
        fam->default_params(s->params);
        s->has_params = s->params_defaulted = true;
        return 0;
    }
    if (fam->parse_params(r, s->params, err)) return err->code;
    s->has_params = true;
    return 0;
}

static int parse_check(const kp_config *cfg, const kp_family *fam, const cJSON *check, const cJSON *defaults,
                       const char *where, kp_check_spec *s, kp_error *err) {
    memset(s, 0, sizeof *s);
    char at[640];
    const char *text = NULL;
    if (!cJSON_IsObject(check)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected an object", where);
    snprintf(at, sizeof at, "%.300s.check", where);
    if (kp_want_string(member(check, "check"), at, &text, err)) return err->code;
    int kind = kp_check_parse(text);
    if (kind < 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (exact, rule, tolerance, repeat, batch, expect)", at, text);
    s->kind = (kp_check_kind)kind;
    kp_check_kind inner = s->kind;
    if (s->kind == KP_CHECK_EXPECT) {
        snprintf(at, sizeof at, "%.300s.of", where);
        if (kp_want_string(member(check, "of"), at, &text, err)) return err->code;
        int of = kp_check_parse(text);
        if (of != KP_CHECK_EXACT && of != KP_CHECK_RULE && of != KP_CHECK_TOLERANCE && of != KP_CHECK_REPEAT &&
            of != KP_CHECK_BATCH)
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' must be exact, rule, tolerance, repeat or batch", at, text);
        inner = s->of = (kp_check_kind)of;
    }
    for (const cJSON *m = check->child; m; m = m->next)
        if (!field_allowed(fam, s->kind, s->of, m->string))
            return kp_fail(err, KP_EXIT_USAGE, "%s.%s: unknown field for a%s %s check of family %s", where, m->string,
                           s->kind == KP_CHECK_EXACT || s->kind == KP_CHECK_EXPECT ? "n" : "", kp_check_name(s->kind),
                           fam->name);
    snprintf(at, sizeof at, "%.300s.check", where);
    if (inner == KP_CHECK_RULE && !fam->rule)
        return kp_fail(err, KP_EXIT_USAGE, "%s: family %s has no rule check", at, fam->name);
    if (inner == KP_CHECK_TOLERANCE && !fam->tolerance_outputs)
        return kp_fail(err, KP_EXIT_USAGE, "%s: family %s's reference gives no continuous output to hold a tolerance to",
                       at, fam->name);
    if (inner == KP_CHECK_EXACT) {
        const cJSON *impls = member(check, "impls");
        snprintf(at, sizeof at, "%.300s.impls", where);
        if (!cJSON_IsArray(impls) || cJSON_GetArraySize(impls) != 2)
            return kp_fail(err, KP_EXIT_USAGE, "%s: expected an array of two impls or roles", at);
        for (int i = 0; i < 2; i++) {
            snprintf(at, sizeof at, "%.300s.impls[%d]", where, i);
            if (kp_want_string(cJSON_GetArrayItem(impls, i), at, &text, err) ||
                impl_ref(cfg, fam, text, at, &s->impl[i], s->role[i], err))
                return err->code;
        }
        s->nimpl = 2;
        if (s->impl[0] == s->impl[1])
            return kp_fail(err, KP_EXIT_USAGE, "%s.impls: both name %s; exact compares two different impls", where,
                           s->impl[0]->name);
    } else {
        snprintf(at, sizeof at, "%.300s.impl", where);
        if (kp_want_string(member(check, "impl"), at, &text, err) || impl_ref(cfg, fam, text, at, &s->impl[0], s->role[0], err))
            return err->code;
        s->nimpl = 1;
    }
    for (int i = 0; i < s->nimpl; i++)
        if (strcmp(s->impl[i]->family, fam->name))
            return kp_fail(err, KP_EXIT_USAGE, "%s.%s: impl %s is of family %s, the case is %s%s%s%s", where,
                           s->nimpl == 2 ? (i ? "impls[1]" : "impls[0]") : "impl", s->impl[i]->name, s->impl[i]->family,
                           fam->name, s->role[i][0] ? " (declare a role \"" : "", s->role[i][0] ? fam->name : "",
                           s->role[i][0] ? ".<role>\" for it)" : "");
    const kp_param_reader r = {.check = check, .defaults = defaults, .where = where};
    if ((inner == KP_CHECK_EXACT || inner == KP_CHECK_RULE) && family_params(fam, &r, inner, s, err)) return err->code;
    if (inner == KP_CHECK_TOLERANCE && parse_tolerance(fam, &r, s, err)) return err->code;
    if (inner == KP_CHECK_REPEAT) {
        int64_t runs;
        if (kp_param_int(&r, "runs", 2, 1000, &runs, err)) return err->code;
        s->runs = (int)runs;
    }
    if (s->kind == KP_CHECK_EXPECT) {
        snprintf(at, sizeof at, "%.300s.result", where);
        if (kp_want_string(member(check, "result"), at, &text, err)) return err->code;
        if (strcmp(text, "INCORRECT"))
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': a known-defect control expects INCORRECT", at, text);
        s->expect_result = KP_INCORRECT;
        const cJSON *defect = member(check, "defect");
        if (defect) {
            char known[256];
            join_list(fam->defects, known, sizeof known);
            snprintf(at, sizeof at, "%.300s.defect", where);
            if (kp_want_string(defect, at, &text, err)) return err->code;
            if (!listed(fam->defects, text) || !fam->has_defect)
                return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is not a defect family %s knows (%s)", at, text, fam->name,
                               known[0] ? known : "it names none");
            snprintf(s->defect, sizeof s->defect, "%s", text);
        }
    }
    /* the label names the check, its impls and the parameters that change its meaning */
    int n = snprintf(s->label, sizeof s->label, "%s", kp_check_name(s->kind));
    if (s->kind == KP_CHECK_EXPECT) n += snprintf(s->label + n, sizeof s->label - (size_t)n, " %s=INCORRECT", kp_check_name(s->of));
    for (int i = 0; i < s->nimpl; i++)
        n += snprintf(s->label + n, sizeof s->label - (size_t)n, "%s%s", i ? " vs " : " ", s->impl[i]->name);
    return 0;
}

int kp_parse_checks(const kp_config *cfg, const cJSON *checks, const char *where, kp_case_spec *cs, kp_error *err) {
    const cJSON *defaults = member(cfg->doc, "defaults");
    char at[640];
    if (cJSON_IsString(checks)) { /* a named check set */
        const cJSON *sets = member(cfg->doc, "check_sets");
        const cJSON *set = sets ? member(sets, checks->valuestring) : NULL;
        if (!set) return kp_fail(err, KP_EXIT_USAGE, "%s: check set '%s' is not defined in \"check_sets\"", where, checks->valuestring);
        snprintf(at, sizeof at, "check_sets.%s", checks->valuestring);
        return kp_parse_checks(cfg, set, at, cs, err);
    }
    if (!cJSON_IsArray(checks) || cJSON_GetArraySize(checks) == 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: expected a non-empty array of checks or the name of a check set", where);
    cs->nchecks = cJSON_GetArraySize(checks);
    cs->checks = kp_calloc((size_t)cs->nchecks, sizeof *cs->checks, "checks", err);
    if (!cs->checks) return err->code;
    for (int i = 0; i < cs->nchecks; i++) {
        snprintf(at, sizeof at, "%.300s[%d]", where, i);
        if (parse_check(cfg, cs->fam, cJSON_GetArrayItem(checks, i), defaults, at, &cs->checks[i], err)) return err->code;
    }
    return 0;
}
