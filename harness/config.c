/* config.c: the gate config (JSON): impl roles, check sets, cases and grids of cases, defaults,
 * memory budget, timeout. Everything is validated before anything runs; errors name the field. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cases/kp_sha256.h"
#include "kp_device.h"
#include "kp_harness.h"
#include "kp_launch.h"

static char *read_text(const char *path, size_t *len, kp_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        kp_fail(err, KP_EXIT_USAGE, "config %s: cannot be read", path);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n < cap) continue;
        char *grown = realloc(buf, (cap *= 2) + 1);
        if (!grown) free(buf);
        buf = grown;
    }
    fclose(f);
    if (!buf) {
        kp_fail(err, KP_EXIT_ENV, "out of memory reading %s", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* An impl named in the config: a role ("candidate") or a registered name; "@auto" picks @cuda when
 * a GPU and the CUDA impl exist, @host otherwise. */
static int resolve_impl(const char *declared, const char *where, const kp_impl **out, kp_error *err) {
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
    return resolve_impl(text, where, impl, err);
}

static const cJSON *member(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

static int want_string(const cJSON *v, const char *where, const char **out, kp_error *err) {
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return kp_fail(err, KP_EXIT_USAGE, "%s: expected a non-empty string", where);
    *out = v->valuestring;
    return 0;
}

static int want_number(const cJSON *v, const char *where, double *out, kp_error *err) {
    if (!cJSON_IsNumber(v)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected a number", where);
    *out = v->valuedouble;
    return 0;
}

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
    static const char *const tolerance_keys[] = {"atol", "rtol", "nmse", "cosine", "ulp", "tensors", NULL};
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
    if (want_number(v, at, out, err)) return err->code;
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
                strcmp(m->string, "cosine") && strcmp(m->string, "ulp"))
                return kp_fail(err, KP_EXIT_USAGE, "%s.%s.%s: unknown field (atol, rtol, nmse, cosine, ulp)", at, t->string,
                               m->string);
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
    if (want_string(member(check, "check"), at, &text, err)) return err->code;
    int kind = kp_check_parse(text);
    if (kind < 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (exact, rule, tolerance, repeat, batch, expect)", at, text);
    s->kind = (kp_check_kind)kind;
    kp_check_kind inner = s->kind;
    if (s->kind == KP_CHECK_EXPECT) {
        snprintf(at, sizeof at, "%.300s.of", where);
        if (want_string(member(check, "of"), at, &text, err)) return err->code;
        int of = kp_check_parse(text);
        if (of != KP_CHECK_RULE && of != KP_CHECK_TOLERANCE && of != KP_CHECK_REPEAT && of != KP_CHECK_BATCH)
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' must be rule, tolerance, repeat or batch", at, text);
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
    if (s->kind == KP_CHECK_EXACT) {
        const cJSON *impls = member(check, "impls");
        snprintf(at, sizeof at, "%.300s.impls", where);
        if (!cJSON_IsArray(impls) || cJSON_GetArraySize(impls) != 2)
            return kp_fail(err, KP_EXIT_USAGE, "%s: expected an array of two impls or roles", at);
        for (int i = 0; i < 2; i++) {
            snprintf(at, sizeof at, "%.300s.impls[%d]", where, i);
            if (want_string(cJSON_GetArrayItem(impls, i), at, &text, err) ||
                impl_ref(cfg, fam, text, at, &s->impl[i], s->role[i], err))
                return err->code;
        }
        s->nimpl = 2;
        if (s->impl[0] == s->impl[1])
            return kp_fail(err, KP_EXIT_USAGE, "%s.impls: both name %s; exact compares two different impls", where,
                           s->impl[0]->name);
    } else {
        snprintf(at, sizeof at, "%.300s.impl", where);
        if (want_string(member(check, "impl"), at, &text, err) || impl_ref(cfg, fam, text, at, &s->impl[0], s->role[0], err))
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
        if (want_string(member(check, "result"), at, &text, err)) return err->code;
        if (strcmp(text, "INCORRECT"))
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': a known-defect control expects INCORRECT", at, text);
        s->expect_result = KP_INCORRECT;
        const cJSON *defect = member(check, "defect");
        if (defect) {
            char known[256];
            join_list(fam->defects, known, sizeof known);
            snprintf(at, sizeof at, "%.300s.defect", where);
            if (want_string(defect, at, &text, err)) return err->code;
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

static int parse_checks(const kp_config *cfg, const cJSON *checks, const char *where, kp_case_spec *cs, kp_error *err) {
    const cJSON *defaults = member(cfg->doc, "defaults");
    char at[640];
    if (cJSON_IsString(checks)) { /* a named check set */
        const cJSON *sets = member(cfg->doc, "check_sets");
        const cJSON *set = sets ? member(sets, checks->valuestring) : NULL;
        if (!set) return kp_fail(err, KP_EXIT_USAGE, "%s: check set '%s' is not defined in \"check_sets\"", where, checks->valuestring);
        snprintf(at, sizeof at, "check_sets.%s", checks->valuestring);
        return parse_checks(cfg, set, at, cs, err);
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

/* The distinct impls the cases name, so the launch cache is sized once, at load. */
static void count_impls(kp_config *cfg) {
    const kp_impl **seen = NULL;
    int n = 0, cap = 0;
    for (int c = 0; c < cfg->ncases; c++)
        for (int k = 0; k < cfg->cases[c].nchecks; k++)
            for (int i = 0; i < cfg->cases[c].checks[k].nimpl; i++) {
                const kp_impl *impl = cfg->cases[c].checks[k].impl[i];
                int found = 0;
                for (int j = 0; j < n && !found; j++) found = seen[j] == impl;
                if (found) continue;
                if (n == cap) {
                    const kp_impl **grown = realloc(seen, sizeof *seen * (size_t)(cap = cap ? 2 * cap : 8));
                    if (!grown) kp_abort(__FILE__, __LINE__, "out of host memory counting impls");
                    seen = grown;
                }
                seen[n++] = impl;
            }
    free(seen);
    cfg->nimpls = n;
}

static int add_case(kp_config *cfg, kp_case *c, const cJSON *checks, const char *where, kp_error *err) {
    if (kp_case_normalize(c, err)) {
        kp_error_prefix(err, "%s: ", where);
        return err->code;
    }
    const kp_family *fam = kp_family_find(c->family);
    if (!fam) {
        char known[256];
        kp_family_names(known, sizeof known);
        return kp_fail(err, KP_EXIT_USAGE, "%s: family '%s' has cases but no harness family (known: %s)", where, c->family, known);
    }
    kp_case_spec *grown = realloc(cfg->cases, sizeof *cfg->cases * (size_t)(cfg->ncases + 1));
    if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of memory reading the config");
    cfg->cases = grown;
    kp_case_spec *cs = &cfg->cases[cfg->ncases++];
    memset(cs, 0, sizeof *cs);
    cs->c = *c;
    cs->fam = fam;
    if (kp_case_format(c, cs->name, sizeof cs->name) < 0) return kp_fail(err, KP_EXIT_USAGE, "%s: case name too long", where);
    for (int i = 0; i + 1 < cfg->ncases; i++)
        if (!strcmp(cfg->cases[i].name, cs->name))
            return kp_fail(err, KP_EXIT_USAGE, "%s: case %s is listed twice", where, cs->name);
    char at[640];
    snprintf(at, sizeof at, "%.300s.checks", where);
    if (!checks) return kp_fail(err, KP_EXIT_USAGE, "%s: required", at);
    if (parse_checks(cfg, checks, at, cs, err)) return err->code;
    int nimpl = 0;
    for (int i = 0; i < cs->nchecks; i++) nimpl += cs->checks[i].nimpl;
    cs->host_bytes = fam->estimate_bytes(c, nimpl, err);
    if (cs->host_bytes == 0) return kp_fail(err, KP_EXIT_USAGE, "%s: case %s: its buffers overflow the address space", where, cs->name);
    for (int k = 0; k < cs->nchecks; k++)
        for (int i = 0; i < cs->checks[k].nimpl; i++) {
            const kp_impl *impl = cs->checks[k].impl[i];
            if (impl->memory != KP_MEMORY_CUDA || kp_device_count() <= 0) continue;
            size_t need = fam->estimate_device_bytes(c, impl, err);
            if (need == 0) return kp_fail(err, KP_EXIT_USAGE, "%s: case %s: device buffers overflow", where, cs->name);
            if (need > cfg->device_budget)
                return kp_fail(err, KP_EXIT_USAGE, "%s: case %s needs about %.3g GiB of device memory for %s, over the "
                               "budget of %.3g GiB (budget.device_bytes); nothing was allocated", where, cs->name,
                               (double)need / 1073741824.0, impl->name, (double)cfg->device_budget / 1073741824.0);
        }
    if (cs->host_bytes > cfg->host_budget)
        return kp_fail(err, KP_EXIT_USAGE, "%s: case %s needs about %.3g GiB of host memory, over the budget of %.3g GiB "
                       "(budget.host_bytes); nothing was allocated", where, cs->name, (double)cs->host_bytes / 1073741824.0,
                       (double)cfg->host_budget / 1073741824.0);
    return 0;
}

/* One value of a case field from JSON: strings as they are, numbers in canonical text. */
static int field_text(const cJSON *v, const char *where, char *out, size_t len, kp_error *err) {
    if (cJSON_IsString(v)) return snprintf(out, len, "%s", v->valuestring), 0;
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) > 9007199254740992.0)
            return kp_fail(err, KP_EXIT_USAGE, "%s: integers above 2^53 lose bits in JSON; give it as a string", where);
        if (v->valuedouble == floor(v->valuedouble) && fabs(v->valuedouble) < 1e15)
            snprintf(out, len, "%.0f", v->valuedouble);
        else
            kp_format_number(v->valuedouble, out, len);
        return 0;
    }
    return kp_fail(err, KP_EXIT_USAGE, "%s: expected a string or a number", where);
}

static int expand_grid(kp_config *cfg, kp_case *base, const cJSON *grid, const cJSON *axis, const cJSON *checks,
                       const char *where, kp_error *err) {
    if (!axis) return add_case(cfg, base, checks, where, err);
    char at[640];
    snprintf(at, sizeof at, "%.300s.grid.%s", where, axis->string);
    if (!cJSON_IsArray(axis) || cJSON_GetArraySize(axis) == 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: expected a non-empty array", at);
    for (const cJSON *v = axis->child; v; v = v->next) {
        char text[64];
        kp_case c = *base;
        if (field_text(v, at, text, sizeof text, err)) return err->code;
        if (kp_case_set(&c, axis->string, text, err)) {
            kp_error_prefix(err, "%s: ", at);
            return err->code;
        }
        if (expand_grid(cfg, &c, grid, axis->next, checks, where, err)) return err->code;
    }
    return 0;
}

static int parse_case_entry(kp_config *cfg, const cJSON *entry, int index, kp_error *err) {
    char where[64], at[640];
    snprintf(where, sizeof where, "cases[%d]", index);
    if (!cJSON_IsObject(entry)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected an object", where);
    const cJSON *name = member(entry, "case"), *family = member(entry, "family"), *checks = member(entry, "checks");
    kp_case c;
    if (name) {
        const char *text = NULL;
        snprintf(at, sizeof at, "%.300s.case", where);
        if (want_string(name, at, &text, err)) return err->code;
        if (kp_case_parse(text, &c, err)) {
            kp_error_prefix(err, "%s: ", at);
            return err->code;
        }
        if (!kp_family_find(c.family)) {
            char known[256];
            kp_family_names(known, sizeof known);
            return kp_fail(err, KP_EXIT_USAGE, "%s: family '%s' is unknown (known: %s)", at, c.family, known);
        }
        return add_case(cfg, &c, checks, where, err);
    }
    const char *fam = NULL;
    snprintf(at, sizeof at, "%.300s.family", where);
    if (!family) return kp_fail(err, KP_EXIT_USAGE, "%s: give \"case\" (a case name) or \"family\" with \"params\"", where);
    if (want_string(family, at, &fam, err)) return err->code;
    if (!kp_family_find(fam)) {
        char known[256];
        kp_family_names(known, sizeof known);
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (known: %s)", at, fam, known);
    }
    memset(&c, 0, sizeof c);
    snprintf(c.family, sizeof c.family, "%s", fam);
    const cJSON *params = member(entry, "params"), *grid = member(entry, "grid");
    if (params && !cJSON_IsObject(params)) return kp_fail(err, KP_EXIT_USAGE, "%s.params: expected an object", where);
    for (const cJSON *p = params ? params->child : NULL; p; p = p->next) {
        char text[64];
        snprintf(at, sizeof at, "%.300s.params.%s", where, p->string);
        if (field_text(p, at, text, sizeof text, err)) return err->code; /* its message names the field */
        if (kp_case_set(&c, p->string, text, err)) {
            kp_error_prefix(err, "%s: ", at);
            return err->code;
        }
    }
    if (grid && !cJSON_IsObject(grid)) return kp_fail(err, KP_EXIT_USAGE, "%s.grid: expected an object of arrays", where);
    return expand_grid(cfg, &c, grid, grid ? grid->child : NULL, checks, where, err);
}

int kp_config_load(const char *path, kp_config *cfg, kp_error *err) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
    size_t len;
    char *text = read_text(path, &len, err);
    if (!text) return err->code;
    kp_sha256_hex(text, len, cfg->sha256);
    cfg->doc = cJSON_ParseWithLength(text, len);
    if (!cfg->doc) {
        const char *at = cJSON_GetErrorPtr();
        long offset = at && at >= text && at <= text + len ? (long)(at - text) : -1;
        int line = 1;
        for (long i = 0; i < offset; i++) line += text[i] == '\n';
        free(text);
        return kp_fail(err, KP_EXIT_USAGE, "config %s: malformed JSON near line %d (byte %ld)", path, line, offset);
    }
    free(text);
    const cJSON *doc = cfg->doc, *v;
    if (!cJSON_IsObject(doc)) return kp_fail(err, KP_EXIT_USAGE, "config %s: the top level must be an object", path);
    for (const cJSON *m = doc->child; m; m = m->next) {
        static const char *const allowed[] = {"schema", "name", "description", "impls", "defaults", "check_sets",
                                              "cases", "budget", "timeout_s", "plugins"};
        int ok = 0;
        for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++) ok |= !strcmp(m->string, allowed[i]);
        if (!ok) return kp_fail(err, KP_EXIT_USAGE, "config %s: field '%s' is unknown", path, m->string);
    }
    const char *s = NULL;
    if (want_string(member(doc, "schema"), "schema", &s, err)) return err->code;
    if (strcmp(s, "kparity.gate/v1")) return kp_fail(err, KP_EXIT_USAGE, "schema: '%s' is not kparity.gate/v1", s);
    if (want_string(member(doc, "name"), "name", &s, err)) return err->code;
    snprintf(cfg->name, sizeof cfg->name, "%s", s);
    /* plugins first, so roles may name their impls */
    const cJSON *plugins = member(doc, "plugins");
    for (int i = 0; plugins && i < cJSON_GetArraySize(plugins); i++) {
        char at[64];
        const cJSON *pl = cJSON_GetArrayItem(plugins, i);
        const char *ppath = NULL, *want = NULL;
        snprintf(at, sizeof at, "plugins[%d].path", i);
        if (want_string(member(pl, "path"), at, &ppath, err)) return err->code;
        const cJSON *sha = member(pl, "sha256");
        if (sha) {
            char got[KP_SHA256_HEX_LEN];
            snprintf(at, sizeof at, "plugins[%d].sha256", i);
            if (want_string(sha, at, &want, err) || kp_sha256_file_hex(ppath, got, err)) return err->code;
            if (strcmp(got, want))
                return kp_fail(err, KP_EXIT_USAGE, "%s: %s has SHA-256 %s, the config pins %s", at, ppath, got, want);
        }
        if (kp_plugin_load(ppath, err)) return err->code;
    }
    const cJSON *impls = member(doc, "impls");
    if (!cJSON_IsObject(impls)) return kp_fail(err, KP_EXIT_USAGE, "impls: expected an object of role: impl name");
    cfg->roles = kp_calloc((size_t)cJSON_GetArraySize(impls), sizeof *cfg->roles, "roles", err);
    if (!cfg->roles) return err->code;
    for (const cJSON *r = impls->child; r; r = r->next) {
        char at[160];
        snprintf(at, sizeof at, "impls.%.100s", r->string);
        kp_role *role = &cfg->roles[cfg->nroles];
        if (strlen(r->string) >= sizeof role->role) return kp_fail(err, KP_EXIT_USAGE, "%s: the role's name is too long", at);
        if (want_string(r, at, &s, err)) return err->code;
        snprintf(role->role, sizeof role->role, "%s", r->string);
        snprintf(role->declared, sizeof role->declared, "%s", s);
        if (resolve_impl(s, at, &role->impl, err)) return err->code;
        /* "<family>.<role>": one family's role, so one config can hold impls of several families */
        const char *dot = strchr(r->string, '.');
        if (dot) {
            char fam[32];
            snprintf(fam, sizeof fam, "%.*s", (int)(dot - r->string < 31 ? dot - r->string : 31), r->string);
            if (!kp_family_find(fam) || !dot[1])
                return kp_fail(err, KP_EXIT_USAGE, "%s: a role with a '.' is '<family>.<role>', and '%s' is no family", at, fam);
            if (strcmp(role->impl->family, fam))
                return kp_fail(err, KP_EXIT_USAGE, "%s: impl %s is of family %s, not %s", at, role->impl->name,
                               role->impl->family, fam);
        }
        cfg->nroles++;
    }
    const cJSON *budget = member(doc, "budget");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cfg->host_budget = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : (uint64_t)8 << 30;
    if (budget) {
        double b = 0;
        v = member(budget, "host_bytes");
        if (!cJSON_IsObject(budget)) return kp_fail(err, KP_EXIT_USAGE, "budget: expected an object");
        for (const cJSON *m = budget->child; m; m = m->next)
            if (strcmp(m->string, "host_bytes") && strcmp(m->string, "device_bytes"))
                return kp_fail(err, KP_EXIT_USAGE, "budget.%s: unknown field (host_bytes, device_bytes)", m->string);
        if (v) {
            if (want_number(v, "budget.host_bytes", &b, err)) return err->code;
            if (!(b >= 1 << 20)) return kp_fail(err, KP_EXIT_USAGE, "budget.host_bytes: %g is below 1 MiB", b);
            cfg->host_budget = (uint64_t)b;
        }
    }
    /* device budget: declared, else the device's memory less 1 GiB for the context and the L2 flush buffer */
    cfg->device_budget = kp_device_count() > 0 ? kp_device_memory_bytes() : 0;
    if (cfg->device_budget > ((uint64_t)1 << 30)) cfg->device_budget -= (uint64_t)1 << 30;
    if (budget && (v = member(budget, "device_bytes"))) {
        double b = 0;
        if (want_number(v, "budget.device_bytes", &b, err)) return err->code;
        if (!(b >= 1 << 20)) return kp_fail(err, KP_EXIT_USAGE, "budget.device_bytes: %g is below 1 MiB", b);
        cfg->device_budget = (uint64_t)b;
    }
    cfg->timeout_s = 0;
    if ((v = member(doc, "timeout_s"))) {
        if (want_number(v, "timeout_s", &cfg->timeout_s, err)) return err->code;
        if (!(cfg->timeout_s > 0)) return kp_fail(err, KP_EXIT_USAGE, "timeout_s: %g must be positive", cfg->timeout_s);
    }
    const cJSON *cases = member(doc, "cases");
    if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) == 0)
        return kp_fail(err, KP_EXIT_USAGE, "cases: expected a non-empty array");
    int index = 0;
    for (const cJSON *e = cases->child; e; e = e->next, index++)
        if (parse_case_entry(cfg, e, index, err)) return err->code;
    count_impls(cfg);
    kp_launch_reserve(cfg->nimpls);
    return 0;
}

void kp_config_free(kp_config *cfg) {
    for (int i = 0; i < cfg->ncases; i++) free(cfg->cases[i].checks);
    free(cfg->cases);
    free(cfg->roles);
    cJSON_Delete(cfg->doc);
    memset(cfg, 0, sizeof *cfg);
}
