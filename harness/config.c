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

static const char *const result_names[] = {"PASSED", "NOT_SUPPORTED", "NOT_RUN", "INCORRECT", "FAILED"};
static const char *const check_names[] = {"exact", "rule", "repeat", "batch", "expect"};

const char *kp_result_name(kp_result r) { return result_names[r]; }
const char *kp_check_name(kp_check_kind k) { return check_names[k]; }

static int parse_check_kind(const char *s, kp_check_kind *out) {
    for (int k = 0; k < 5; k++)
        if (!strcmp(s, check_names[k])) return *out = (kp_check_kind)k, 0;
    return -1;
}

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
        if (n == cap) buf = realloc(buf, (cap *= 2) + 1);
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

static int impl_ref(kp_config *cfg, const char *text, const char *where, const kp_impl **impl, char role[32],
                    kp_error *err) {
    for (int i = 0; i < cfg->nroles; i++)
        if (!strcmp(cfg->roles[i].role, text)) {
            *impl = cfg->roles[i].impl;
            snprintf(role, 32, "%s", text);
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

/* Reads a check's parameter from the check, else from the config's "defaults"; never from code. */
static const cJSON *param(const cJSON *check, const cJSON *defaults, const char *key) {
    const cJSON *v = member(check, key);
    return v ? v : (defaults ? member(defaults, key) : NULL);
}

static int rule_params(const cJSON *check, const cJSON *defaults, const char *where, kp_check_spec *s, kp_error *err) {
    char at[640];
    const cJSON *tp = param(check, defaults, "tie_policy"), *band = param(check, defaults, "band");
    const char *text = NULL;
    snprintf(at, sizeof at, "%.300s.tie_policy", where);
    if (!tp) return kp_fail(err, KP_EXIT_USAGE, "%s: required (in the check or in \"defaults\")", at);
    if (want_string(tp, at, &text, err)) return err->code;
    if (kp_tie_policy_parse(text, &s->tie_policy))
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (minimal_index, inclusive)", at, text);
    snprintf(at, sizeof at, "%.300s.band", where);
    if (!band) return kp_fail(err, KP_EXIT_USAGE, "%s: required (in the check or in \"defaults\")", at);
    if (want_number(band, at, &s->band, err)) return err->code;
    if (!(s->band >= 0.0 && s->band < 0.5)) return kp_fail(err, KP_EXIT_USAGE, "%s: %g is outside [0, 0.5)", at, s->band);
    return 0;
}

static int parse_check(kp_config *cfg, const cJSON *check, const cJSON *defaults, const char *where, kp_check_spec *s,
                       kp_error *err) {
    memset(s, 0, sizeof *s);
    char at[640];
    const char *kind = NULL;
    if (!cJSON_IsObject(check)) return kp_fail(err, KP_EXIT_USAGE, "%s: expected an object", where);
    snprintf(at, sizeof at, "%.300s.check", where);
    if (want_string(member(check, "check"), at, &kind, err)) return err->code;
    if (parse_check_kind(kind, &s->kind))
        return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (exact, rule, repeat, batch, expect)", at, kind);
    for (const cJSON *m = check->child; m; m = m->next) {
        static const char *const allowed[] = {"check", "impl", "impls", "tie_policy", "band", "runs", "of", "result", "defect"};
        int ok = 0;
        for (size_t i = 0; i < sizeof allowed / sizeof *allowed; i++) ok |= !strcmp(m->string, allowed[i]);
        if (!ok) return kp_fail(err, KP_EXIT_USAGE, "%s.%s: unknown field", where, m->string);
    }
    if (s->kind == KP_CHECK_EXACT) {
        const cJSON *impls = member(check, "impls");
        snprintf(at, sizeof at, "%.300s.impls", where);
        if (!cJSON_IsArray(impls) || cJSON_GetArraySize(impls) != 2)
            return kp_fail(err, KP_EXIT_USAGE, "%s: expected an array of two impls or roles", at);
        for (int i = 0; i < 2; i++) {
            const char *text = NULL;
            snprintf(at, sizeof at, "%.300s.impls[%d]", where, i);
            if (want_string(cJSON_GetArrayItem(impls, i), at, &text, err) ||
                impl_ref(cfg, text, at, &s->impl[i], s->role[i], err))
                return err->code;
        }
        s->nimpl = 2;
        if (s->impl[0] == s->impl[1])
            return kp_fail(err, KP_EXIT_USAGE, "%s.impls: both name %s; exact compares two different impls", where,
                           s->impl[0]->name);
        if (rule_params(check, defaults, where, s, err)) return err->code;
    } else {
        const char *text = NULL;
        snprintf(at, sizeof at, "%.300s.impl", where);
        if (want_string(member(check, "impl"), at, &text, err) || impl_ref(cfg, text, at, &s->impl[0], s->role[0], err))
            return err->code;
        s->nimpl = 1;
    }
    if (s->kind == KP_CHECK_RULE && rule_params(check, defaults, where, s, err)) return err->code;
    if (s->kind == KP_CHECK_REPEAT) {
        double runs = 0;
        const cJSON *r = param(check, defaults, "runs");
        snprintf(at, sizeof at, "%.300s.runs", where);
        if (!r) return kp_fail(err, KP_EXIT_USAGE, "%s: required (in the check or in \"defaults\")", at);
        if (want_number(r, at, &runs, err)) return err->code;
        if (runs != floor(runs) || runs < 2 || runs > 1000)
            return kp_fail(err, KP_EXIT_USAGE, "%s: %g must be an integer in [2, 1000]", at, runs);
        s->runs = (int)runs;
    }
    if (s->kind == KP_CHECK_EXPECT) {
        const char *text = NULL;
        snprintf(at, sizeof at, "%.300s.of", where);
        if (want_string(member(check, "of"), at, &text, err)) return err->code;
        if (parse_check_kind(text, &s->of) || s->of == KP_CHECK_EXPECT || s->of == KP_CHECK_EXACT)
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' must be rule, repeat or batch", at, text);
        snprintf(at, sizeof at, "%.300s.result", where);
        if (want_string(member(check, "result"), at, &text, err)) return err->code;
        if (strcmp(text, "INCORRECT"))
            return kp_fail(err, KP_EXIT_USAGE, "%s: '%s': a known-defect control expects INCORRECT", at, text);
        s->expect_result = KP_INCORRECT;
        const cJSON *defect = member(check, "defect");
        if (defect) {
            snprintf(at, sizeof at, "%.300s.defect", where);
            if (want_string(defect, at, &text, err)) return err->code;
            if (strcmp(text, "all_neginf"))
                return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (all_neginf)", at, text);
            snprintf(s->defect, sizeof s->defect, "%s", text);
        }
        if (s->of == KP_CHECK_RULE && rule_params(check, defaults, where, s, err)) return err->code;
        if (s->of == KP_CHECK_REPEAT) {
            const cJSON *r = param(check, defaults, "runs");
            s->runs = cJSON_IsNumber(r) ? (int)r->valuedouble : 0;
            if (s->runs < 2 || s->runs > 1000)
                return kp_fail(err, KP_EXIT_USAGE, "%s.runs: required, an integer in [2, 1000]", where);
        }
    }
    /* the label names the check, its impls and the parameters that change its meaning */
    int n = snprintf(s->label, sizeof s->label, "%s", kp_check_name(s->kind));
    if (s->kind == KP_CHECK_EXPECT) n += snprintf(s->label + n, sizeof s->label - (size_t)n, " %s=INCORRECT", kp_check_name(s->of));
    for (int i = 0; i < s->nimpl; i++)
        n += snprintf(s->label + n, sizeof s->label - (size_t)n, "%s%s", i ? " vs " : " ", s->impl[i]->name);
    return 0;
}

static int parse_checks(kp_config *cfg, const cJSON *checks, const char *where, kp_case_spec *cs, kp_error *err) {
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
        if (parse_check(cfg, cJSON_GetArrayItem(checks, i), defaults, at, &cs->checks[i], err)) return err->code;
        if (strcmp(cs->checks[i].impl[0]->family, cs->c.family))
            return kp_fail(err, KP_EXIT_USAGE, "%s: impl %s is of family %s, the case is %s", at, cs->checks[i].impl[0]->name,
                           cs->checks[i].impl[0]->family, cs->c.family);
    }
    return 0;
}

static int add_case(kp_config *cfg, kp_case *c, const cJSON *checks, const char *where, kp_error *err) {
    if (kp_case_normalize(c, err)) {
        kp_error_prefix(err, "%s: ", where);
        return err->code;
    }
    kp_case_spec *grown = realloc(cfg->cases, sizeof *cfg->cases * (size_t)(cfg->ncases + 1));
    if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of memory reading the config");
    cfg->cases = grown;
    kp_case_spec *cs = &cfg->cases[cfg->ncases++];
    memset(cs, 0, sizeof *cs);
    cs->c = *c;
    if (kp_case_format(c, cs->name, sizeof cs->name) < 0) return kp_fail(err, KP_EXIT_USAGE, "%s: case name too long", where);
    for (int i = 0; i + 1 < cfg->ncases; i++)
        if (!strcmp(cfg->cases[i].name, cs->name))
            return kp_fail(err, KP_EXIT_USAGE, "%s: case %s is listed twice", where, cs->name);
    char at[640];
    snprintf(at, sizeof at, "%.300s.checks", where);
    if (!checks) return kp_fail(err, KP_EXIT_USAGE, "%s: required", at);
    if (parse_checks(cfg, checks, at, cs, err)) return err->code;
    const kp_family *fam = kp_family_find(c->family);
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
        if (field_text(v, at, text, sizeof text, err) || kp_case_set(&c, axis->string, text, err)) return err->code;
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
        if (!kp_family_find(c.family))
            return kp_fail(err, KP_EXIT_USAGE, "%s: family '%s' is unknown (known: topp)", at, c.family);
        return add_case(cfg, &c, checks, where, err);
    }
    const char *fam = NULL;
    snprintf(at, sizeof at, "%.300s.family", where);
    if (!family) return kp_fail(err, KP_EXIT_USAGE, "%s: give \"case\" (a case name) or \"family\" with \"params\"", where);
    if (want_string(family, at, &fam, err)) return err->code;
    if (!kp_family_find(fam)) return kp_fail(err, KP_EXIT_USAGE, "%s: '%s' is unknown (known: topp)", at, fam);
    memset(&c, 0, sizeof c);
    snprintf(c.family, sizeof c.family, "%s", fam);
    const cJSON *params = member(entry, "params"), *grid = member(entry, "grid");
    if (params && !cJSON_IsObject(params)) return kp_fail(err, KP_EXIT_USAGE, "%s.params: expected an object", where);
    for (const cJSON *p = params ? params->child : NULL; p; p = p->next) {
        char text[64];
        snprintf(at, sizeof at, "%.300s.params.%s", where, p->string);
        if (field_text(p, at, text, sizeof text, err) || kp_case_set(&c, p->string, text, err)) {
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
    for (const cJSON *r = impls->child; r; r = r->next) {
        char at[64];
        snprintf(at, sizeof at, "impls.%s", r->string);
        if (cfg->nroles == 8) return kp_fail(err, KP_EXIT_USAGE, "impls: at most 8 roles");
        if (want_string(r, at, &s, err)) return err->code;
        snprintf(cfg->roles[cfg->nroles].role, sizeof cfg->roles[0].role, "%s", r->string);
        snprintf(cfg->roles[cfg->nroles].declared, sizeof cfg->roles[0].declared, "%s", s);
        if (resolve_impl(s, at, &cfg->roles[cfg->nroles].impl, err)) return err->code;
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
    return 0;
}

void kp_config_free(kp_config *cfg) {
    for (int i = 0; i < cfg->ncases; i++) free(cfg->cases[i].checks);
    free(cfg->cases);
    cJSON_Delete(cfg->doc);
    memset(cfg, 0, sizeof *cfg);
}
