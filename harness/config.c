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
#include "kp_config.h"
#include "kp_exec.h"
#include "kp_checks.h"
#include "kp_launch.h"

static const cJSON *member(const cJSON *obj, const char *key) { return cJSON_GetObjectItemCaseSensitive(obj, key); }

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

/* The distinct impls the cases name, so the launch cache is sized once, at load. */
static int count_impls(kp_config *cfg, kp_error *err) {
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
                    if (!grown) return free(seen), kp_fail(err, KP_EXIT_ENV, "out of host memory counting impls");
                    seen = grown;
                }
                seen[n++] = impl;
            }
    free(seen);
    cfg->nimpls = n;
    return 0;
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
    if (kp_parse_checks(cfg, checks, at, cs, err)) return err->code;
    kp_case_bytes est;
    if (kp_launch_estimate(cs, kp_case_extra_rows(cs), &est, err)) {
        kp_error_prefix(err, "%s: case %s: ", where, cs->name);
        return err->code;
    }
    cs->host_bytes = (size_t)est.host, cs->device_bytes = (size_t)est.device;
    if (est.ncuda > 0 && kp_device_count() > 0 && cs->device_bytes > cfg->device_budget)
        return kp_fail(err, KP_EXIT_USAGE, "%s: case %s needs about %.3g GiB of device memory (its inputs and the buffers "
                       "of its %d CUDA impl%s), over the budget of %.3g GiB (budget.device_bytes); nothing was allocated; "
                       "its largest tensor, which the case's fields size: %s", where, cs->name,
                       (double)cs->device_bytes / 1073741824.0, est.ncuda, est.ncuda > 1 ? "s" : "",
                       (double)cfg->device_budget / 1073741824.0, est.largest);
    if (cs->host_bytes > cfg->host_budget)
        return kp_fail(err, KP_EXIT_USAGE, "%s: case %s needs about %.3g GiB of host memory, over the budget of %.3g GiB "
                       "(budget.host_bytes); nothing was allocated; its largest tensor, which the case's fields size: %s",
                       where, cs->name, (double)cs->host_bytes / 1073741824.0, (double)cfg->host_budget / 1073741824.0,
                       est.largest);
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
        if (kp_want_string(name, at, &text, err)) return err->code;
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
    if (kp_want_string(family, at, &fam, err)) return err->code;
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
    if (kp_want_string(member(doc, "schema"), "schema", &s, err)) return err->code;
    if (strcmp(s, "kparity.gate/v1")) return kp_fail(err, KP_EXIT_USAGE, "schema: '%s' is not kparity.gate/v1", s);
    if (kp_want_string(member(doc, "name"), "name", &s, err)) return err->code;
    snprintf(cfg->name, sizeof cfg->name, "%s", s);
    /* plugins first, so roles may name their impls */
    const cJSON *plugins = member(doc, "plugins");
    for (int i = 0; plugins && i < cJSON_GetArraySize(plugins); i++) {
        char at[64];
        const cJSON *pl = cJSON_GetArrayItem(plugins, i);
        const char *ppath = NULL, *want = NULL;
        snprintf(at, sizeof at, "plugins[%d].path", i);
        if (kp_want_string(member(pl, "path"), at, &ppath, err)) return err->code;
        const cJSON *sha = member(pl, "sha256");
        snprintf(at, sizeof at, "plugins[%d].sha256", i);
        if (sha && kp_want_string(sha, at, &want, err)) return err->code;
        /* the pin is checked on the file before it is loaded (kp_plugin_load_pinned) */
        if (kp_plugin_load_pinned(ppath, want, err)) {
            if (want) kp_error_prefix(err, "%s: ", at);
            return err->code;
        }
    }
    const cJSON *impls = member(doc, "impls");
    if (!cJSON_IsObject(impls))
        return kp_fail(err, KP_EXIT_USAGE, "impls: expected an object of role: impl name (or an outside program: {\"exec\": [...], \"impl\": NAME})");
    cfg->roles = kp_calloc((size_t)cJSON_GetArraySize(impls), sizeof *cfg->roles, "roles", err);
    if (!cfg->roles) return err->code;
    for (const cJSON *r = impls->child; r; r = r->next) {
        char at[160];
        snprintf(at, sizeof at, "impls.%.100s", r->string);
        kp_role *role = &cfg->roles[cfg->nroles];
        if (strlen(r->string) >= sizeof role->role) return kp_fail(err, KP_EXIT_USAGE, "%s: the role's name is too long", at);
        snprintf(role->role, sizeof role->role, "%s", r->string);
        if (cJSON_IsObject(r)) { /* an outside program (harness/exec.c) */
            kp_exec_decl decl;
            if (kp_exec_parse(r, r->string, at, &decl, err)) return err->code;
            const int rc = kp_exec_register(&decl, at, &role->impl, err);
            kp_exec_decl_free(&decl);
            if (rc) return rc;
            snprintf(role->declared, sizeof role->declared, "%s", role->impl->name);
        } else {
            if (kp_want_string(r, at, &s, err)) return err->code;
            snprintf(role->declared, sizeof role->declared, "%s", s);
            if (kp_resolve_impl(s, at, &role->impl, err)) return err->code;
        }
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
            if (kp_want_number(v, "budget.host_bytes", &b, err)) return err->code;
            if (!(b >= 1 << 20)) return kp_fail(err, KP_EXIT_USAGE, "budget.host_bytes: %g is below 1 MiB", b);
            /* converting a double past 2^64 to an integer is undefined (fuzz_config found 8.6e101) */
            if (!(b < 0x1p64)) return kp_fail(err, KP_EXIT_USAGE, "budget.host_bytes: %g is past 2^64 bytes", b);
            cfg->host_budget = (uint64_t)b;
        }
    }
    /* device budget: declared, else the device's memory less 1 GiB for the context and the L2 flush buffer */
    cfg->device_budget = kp_device_count() > 0 ? kp_device_memory_bytes() : 0;
    if (cfg->device_budget > ((uint64_t)1 << 30)) cfg->device_budget -= (uint64_t)1 << 30;
    if (budget && (v = member(budget, "device_bytes"))) {
        double b = 0;
        if (kp_want_number(v, "budget.device_bytes", &b, err)) return err->code;
        if (!(b >= 1 << 20)) return kp_fail(err, KP_EXIT_USAGE, "budget.device_bytes: %g is below 1 MiB", b);
        if (!(b < 0x1p64)) return kp_fail(err, KP_EXIT_USAGE, "budget.device_bytes: %g is past 2^64 bytes", b);
        cfg->device_budget = (uint64_t)b;
    }
    cfg->timeout_s = 0;
    if ((v = member(doc, "timeout_s"))) {
        if (kp_want_number(v, "timeout_s", &cfg->timeout_s, err)) return err->code;
        if (!(cfg->timeout_s > 0)) return kp_fail(err, KP_EXIT_USAGE, "timeout_s: %g must be positive", cfg->timeout_s);
    }
    const cJSON *cases = member(doc, "cases");
    if (!cJSON_IsArray(cases) || cJSON_GetArraySize(cases) == 0)
        return kp_fail(err, KP_EXIT_USAGE, "cases: expected a non-empty array");
    int index = 0;
    for (const cJSON *e = cases->child; e; e = e->next, index++)
        if (parse_case_entry(cfg, e, index, err)) return err->code;
    if (count_impls(cfg, err) || kp_launch_reserve(cfg->nimpls, err)) return err->code;
    return 0;
}

double kp_config_timeout_peek(const char *path) {
    kp_error ignored = {0};
    size_t len;
    char *text = read_text(path, &len, &ignored);
    cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    const cJSON *v = member(doc, "timeout_s");
    const double timeout = cJSON_IsNumber(v) && v->valuedouble > 0 ? v->valuedouble : 0;
    cJSON_Delete(doc);
    return timeout;
}

void kp_config_free(kp_config *cfg) {
    for (int i = 0; i < cfg->ncases; i++) free(cfg->cases[i].checks);
    free(cfg->cases);
    free(cfg->roles);
    cJSON_Delete(cfg->doc);
    memset(cfg, 0, sizeof *cfg);
}
