/* test_shipped_gates.c: every shipped config (every .json under ci/gates and ci/matrix) can fail. Each of its tolerance, rule,
 * exact, repeat and batch checks, exactly as the config declares it (the check's fields and the config's defaults), is
 * run by `kparity judge` on outputs planted just outside it, and must say INCORRECT; the same check on the clean
 * outputs the plants were made from must say PASSED, so the plant, not something else, is what it caught.
 *
 * The plants (issue 26): a continuous output 0.9 x the clean one (each tensor of a tolerance check on its own); one
 * extra boundary token outside the band and the tie group (top-p), one selected index swapped for an unselected one
 * of strictly lower score (top-k); one bit of one element (a bit-exact output: exact, repeat, batch). The clean
 * outputs are a host impl's that meets every such check (the family's candidate). Configs written for the GPU's full
 * shapes are judged on the same case with its sizes cut to what the host runs in a second or two (shrink below); their
 * checks are the config's own. A case is exported once and judged in one call for all its checks (roles below). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../kernels/kp_formats.h"
#include "../receipts/kp_npy.h"
#include "kp_test_util.h"

TestSuite(shipped_gates, .init = kpt_dir_setup, .fini = kpt_dir_teardown, .timeout = 1200);

/* What the test knows of each family: the host impl whose outputs are clean, its outputs in the family's order (order
 * outputs, which judge lets an outside impl leave out, are left out), which of them tolerance compares, and the case
 * fields to cut for the host with their largest value (a field absent from the name counts as larger: its default is
 * the full shape). The plants do not depend on a case's size, so the cuts are what keeps each export and judge call
 * short: MLA's cache (every filler request's s_kv tokens, drawn and written whatever the batch), MoE's weights (every
 * expert's hidden x inter). Fields whose values are the point stay: MLA's topk (its split count, 1088 in two splits),
 * MoE's m and model (routed slots, rows an expert), top-k's widths up to 65536 (16384/16385 straddle the overflow). */
typedef struct {
    const char *field, *host_value;
    long long most;
} shrink;
typedef struct {
    const char *family, *clean;
    const char *outputs[4];
    int tolerance[4];
    shrink cut[4];
    /* A batch check's probes can be given only for fewer rows than the case has: a one-row case's batch check is
     * judged on the case with two rows (and a one-row profile replaced). */
    const char *rows_field, *one_row_profile, *two_row_profile;
    /* Whether batch checks get a judge call of their own: where a row is a whole vocabulary (top-p, top-k), the batch
     * probes' rows, held for every role a call binds, are most of its memory, and the case costs little to prepare
     * again; MoE and MLA cases cost their weights or cache to prepare, which one call shares. */
    int batch_apart;
} family_plan;

static const family_plan plans[] = {
    {"topp", "topp.split_prob@host", {"", NULL}, {0}, {{NULL, NULL, 0}}, "batch", NULL, NULL, 1},
    {"topk", "topk.radix_exact@host", {"indices", "values", NULL}, {0, 0},
     {{"rows", "64", 64}, {"width", "65536", 65536}, {NULL, NULL, 0}}, "rows", NULL, NULL, 1},
    {"moe", "moe.invariant@host", {"out", NULL}, {1}, {{"hidden", "128", 128}, {"inter", "64", 64}, {NULL, NULL, 0}}, "m",
     "single", "uniform", 0},
    {"mla", "mla.split_size@host", {"out", "lse", "max_logits", NULL}, {1, 1, 1},
     {{"topk", "640", 1088}, {"s_kv", "256", 256}, {"batch", "8", 8}, {NULL, NULL, 0}}, "batch", NULL, NULL, 0},
};

static const family_plan *plan_of(const char *family) {
    for (size_t i = 0; i < sizeof plans / sizeof *plans; i++)
        if (!strcmp(plans[i].family, family)) return &plans[i];
    cr_assert_fail("a shipped config has a case of family %s, which this test does not know", family);
    return NULL;
}

static char *path_in(const char *dir, const char *name) {
    char *p;
    cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
    return kpt_scratch(p);
}

/* ---- .npy arrays ---- */

typedef struct {
    kp_npy_info info;
    char *buf;
    size_t len;
} array;

static array load(const char *path) {
    array a = {0};
    a.buf = kpt_read(path, &a.len);
    cr_assert(a.buf, "cannot read %s", path);
    kp_error err = {0};
    cr_assert_eq(kp_npy_decode((const unsigned char *)a.buf, a.len, &a.info, &err), 0, "%s: %s", path, err.msg);
    return a;
}

static void *data(const array *a) { return a->buf + a->info.data_offset; }
static int64_t rows_of(const array *a) { return a->info.shape[0]; }
static int64_t row_elems(const array *a) {
    int64_t n = 1;
    for (int d = 1; d < a->info.ndim; d++) n *= a->info.shape[d];
    return n;
}

/* Write a (or its first `rows` rows) to path. */
static void save(const array *a, const char *path, int64_t rows) {
    int64_t shape[KP_NPY_MAX_DIMS];
    memcpy(shape, a->info.shape, sizeof shape);
    shape[0] = rows;
    kp_error err = {0};
    cr_assert_eq(kp_npy_write(path, a->info.descr, a->info.ndim, shape, data(a), (size_t)(rows * row_elems(a)) * a->info.itemsize,
                              &err),
                 0, "%s", err.msg);
}

static array copy(const array *a) {
    array c = *a;
    c.buf = malloc(a->len + 1);
    cr_assert(c.buf);
    memcpy(c.buf, a->buf, a->len);
    return c;
}

/* One element times 0.9, at its own dtype (bf16 rounded to nearest even). */
static void scale_all(array *a) {
    const int64_t n = rows_of(a) * row_elems(a);
    if (!strcmp(a->info.descr, "<f4")) {
        float *x = data(a);
        for (int64_t i = 0; i < n; i++) x[i] *= 0.9f;
    } else if (!strcmp(a->info.descr, "<u2")) {
        uint16_t *x = data(a);
        for (int64_t i = 0; i < n; i++) x[i] = kp_bf16_bits(kp_bf16_value(x[i]) * 0.9f);
    } else {
        cr_assert_fail("0.9 x an output of dtype %s", a->info.descr);
    }
}

/* ---- the case, its name cut to host sizes ---- */

typedef struct {
    char family[16];
    char keys[24][32], values[24][64];
    int n;
} case_name;

static void parse_case(const char *name, case_name *c) {
    memset(c, 0, sizeof *c);
    const char *open = strchr(name, '(');
    cr_assert(open && open - name < 16, "case %s", name);
    memcpy(c->family, name, (size_t)(open - name));
    for (const char *p = open + 1; *p && *p != ')';) {
        const char *eq = strchr(p, '='), *end = p + strcspn(p, ",)");
        cr_assert(eq && eq < end && c->n < 24, "case %s", name);
        snprintf(c->keys[c->n], sizeof c->keys[0], "%.*s", (int)(eq - p), p);
        snprintf(c->values[c->n], sizeof c->values[0], "%.*s", (int)(end - eq - 1), eq + 1);
        c->n++;
        p = *end == ',' ? end + 1 : end;
    }
}

static void set_field(case_name *c, const char *key, const char *value) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->keys[i], key)) {
            snprintf(c->values[i], sizeof c->values[0], "%s", value);
            return;
        }
    cr_assert(c->n < 24);
    snprintf(c->keys[c->n], sizeof c->keys[0], "%s", key);
    snprintf(c->values[c->n++], sizeof c->values[0], "%s", value);
}

static const char *field(const case_name *c, const char *key) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->keys[i], key)) return c->values[i];
    return NULL;
}

static char *format_case(const case_name *c) {
    char *s = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&s, &len);
    fprintf(f, "%s(", c->family);
    for (int i = 0; i < c->n; i++) fprintf(f, "%s%s=%s", i ? "," : "", c->keys[i], c->values[i]);
    fputc(')', f);
    fclose(f);
    return kpt_scratch(s);
}

static void cut_to_host(case_name *c, const family_plan *fp) {
    for (const shrink *s = fp->cut; s->field; s++) {
        const char *v = field(c, s->field);
        if (!v || atoll(v) > s->most) set_field(c, s->field, s->host_value);
    }
}

/* The first case of a config's case entry: its "case", or its family, params and each grid's first value. */
static char *entry_case(const cJSON *entry) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(entry, "case");
    if (cJSON_IsString(name)) return kpt_scratch(strdup(name->valuestring));
    case_name c = {0};
    snprintf(c.family, sizeof c.family, "%s", cJSON_GetObjectItemCaseSensitive(entry, "family")->valuestring);
    const char *parts[] = {"params", "grid"};
    for (int k = 0; k < 2; k++) {
        const cJSON *obj = cJSON_GetObjectItemCaseSensitive(entry, parts[k]);
        for (const cJSON *f = obj ? obj->child : NULL; f; f = f->next) {
            const cJSON *v = k ? f->child : f;
            char text[64];
            if (cJSON_IsString(v)) snprintf(text, sizeof text, "%s", v->valuestring);
            else snprintf(text, sizeof text, "%.17g", v->valuedouble);
            set_field(&c, f->string, text);
        }
    }
    return format_case(&c);
}

/* ---- the plants ---- */

/* Top-p: on the first row where one exists, keep the dropped finite token of the largest logit (lowest index among
 * equals) below the smallest kept logit (so outside the boundary tie group) when the kept mass is past top_p by more
 * than 2 bands (so outside the band; the float64 sums here are good to about 1e-13): the rule drops it, a strict violation. Returns the row, or -1. */
static int64_t plant_extra_token(array *out, const char *export_dir, double band) {
    array logits = load(path_in(export_dir, "logits.npy")), top_p = load(path_in(export_dir, "top_p.npy"));
    const int64_t rows = rows_of(out), vocab = row_elems(out), stride = row_elems(&logits);
    const float *tp = data(&top_p);
    int64_t planted = -1;
    for (int64_t r = 0; r < rows && planted < 0; r++) {
        const float *x = (const float *)data(&logits) + r * stride;
        float *y = (float *)data(out) + r * vocab;
        double most = -INFINITY, z = 0, kept = 0;
        float least_kept = INFINITY;
        for (int64_t j = 0; j < vocab; j++)
            if (isfinite(x[j]) && x[j] > most) most = x[j];
        if (!isfinite(most)) continue;
        for (int64_t j = 0; j < vocab; j++)
            if (isfinite(x[j])) z += exp(x[j] - most);
        int64_t best = -1;
        for (int64_t j = 0; j < vocab; j++) {
            if (!isfinite(x[j])) continue;
            if (isfinite(y[j])) kept += exp(x[j] - most) / z, least_kept = fminf(least_kept, x[j]);
        }
        for (int64_t j = 0; j < vocab; j++)
            if (isfinite(x[j]) && !isfinite(y[j]) && x[j] < least_kept && (best < 0 || x[j] > x[best])) best = j;
        if (best >= 0 && kept - (double)tp[r % rows_of(&top_p)] > 2 * band) y[best] = x[best], planted = r;
    }
    free(logits.buf), free(top_p.buf);
    return planted;
}

static int by_index(const void *a, const void *b) {
    const int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* Top-k: on the first row where one exists, the selected entry of the lowest score (the highest index among equals)
 * is replaced by the unselected entry of the highest score strictly below it (NaN never), indices kept in the row's
 * order when it was index order. Returns the row, or -1. */
static int64_t plant_swapped_index(array *idx, array *val, const char *export_dir, const case_name *c) {
    array scores = load(path_in(export_dir, "scores.npy")), starts = load(path_in(export_dir, "starts.npy")),
          ends = load(path_in(export_dir, "ends.npy"));
    const int64_t rows = rows_of(idx), k = row_elems(idx), width = row_elems(&scores);
    const int window_base = field(c, "base") && !strcmp(field(c, "base"), "window");
    int64_t planted = -1;
    for (int64_t r = 0; r < rows && planted < 0; r++) {
        const float *s = (const float *)data(&scores) + r * width;
        const int64_t ks = ((const int32_t *)data(&starts))[r], ke = ((const int32_t *)data(&ends))[r];
        int32_t *ix = (int32_t *)data(idx) + r * k;
        float *vx = (float *)data(val) + r * k;
        const int64_t origin = window_base ? ks : 0;
        uint8_t *chosen = calloc((size_t)width, 1);
        cr_assert(chosen);
        int64_t n = 0, worst = -1;
        int sorted = 1;
        for (int64_t i = 0; i < k; i++) {
            const int64_t j = (int64_t)ix[i] + origin;
            if (j < ks || j >= ke) continue; /* the fill of a short window */
            chosen[j] = 1, n++;
            if (i && ix[i] < ix[i - 1]) sorted = 0;
            if (worst < 0 || s[j] < s[ix[worst] + origin] || (s[j] == s[ix[worst] + origin] && j > ix[worst] + origin)) worst = i;
        }
        int64_t best = -1;
        if (worst >= 0) {
            const float bound = s[ix[worst] + origin];
            for (int64_t j = ks; j < ke; j++)
                if (!chosen[j] && s[j] < bound && (best < 0 || s[j] > s[best])) best = j;
        }
        if (best >= 0) {
            ix[worst] = (int32_t)(best - origin), vx[worst] = s[best], planted = r;
            if (sorted) { /* keep index order: sort the row's n selected (index, value) pairs again */
                int64_t (*pairs)[2] = malloc(sizeof *pairs * (size_t)n);
                cr_assert(pairs);
                int64_t m = 0;
                for (int64_t i = 0; i < k; i++)
                    if ((int64_t)ix[i] + origin >= ks && (int64_t)ix[i] + origin < ke) {
                        pairs[m][0] = ix[i];
                        memcpy(&pairs[m][1], &vx[i], sizeof vx[i]);
                        m++;
                    }
                qsort(pairs, (size_t)m, sizeof *pairs, by_index);
                for (int64_t i = 0; i < m; i++) ix[i] = (int32_t)pairs[i][0], memcpy(&vx[i], &pairs[i][1], sizeof vx[i]);
                free(pairs);
            }
        }
        free(chosen);
    }
    free(scores.buf), free(starts.buf), free(ends.buf);
    return planted;
}

/* One bit of one element of row 0: the lowest bit of the first finite value (top-p: a kept logit), or, for top-k,
 * the swapped index (a row compares as a set there, so a bit of an index could name one already in it). */
static void flip_one_bit(array *a) {
    const int64_t n = row_elems(a);
    if (!strcmp(a->info.descr, "<f4")) {
        uint32_t *x = data(a);
        for (int64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, &x[i], sizeof v);
            if (isfinite(v)) {
                x[i] ^= 1u;
                return;
            }
        }
        cr_assert_fail("row 0 has no finite element to flip a bit of");
    } else if (!strcmp(a->info.descr, "<u2")) {
        ((uint16_t *)data(a))[0] ^= 1u;
    } else {
        cr_assert_fail("a bit flip of dtype %s", a->info.descr);
    }
}

/* ---- one config ---- */

typedef struct {
    char role[24];
    const char *want; /* PASSED, INCORRECT or NOT_RUN */
    char what[96];
    const char *differing_probe; /* a batch check's probe that must have differing rows (the INCORRECT's source), or NULL */
} expectation;

/* One judge call on one case: the roles it binds (each a set of files, written once and read by every check that
 * names it), the checks it judges and the result each must get. */
#define MAX_ROLES 8 /* kparity judge binds at most 8 roles a call (MAX_JUDGED, harness/judge.c) */
typedef struct {
    char *argv[96];
    int argc;
    char roles[MAX_ROLES][24];
    int nroles;
    cJSON *derived; /* the checks, each on the roles it names */
    expectation want[128];
    int nwant;
} judge_call;

static void bind(judge_call *j, const char *role, char *const *files, int nfiles) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    fprintf(f, "%s=", role);
    for (int i = 0; i < nfiles; i++) fprintf(f, "%s%s", i ? "," : "", files[i]);
    fclose(f);
    cr_assert(j->argc + 2 < 90);
    j->argv[j->argc++] = "--impl";
    j->argv[j->argc++] = kpt_scratch(text);
}

/* The files of one run of a role: `arrays` (one per output) written under dir as ROLE.K.npy, or their first row. */
static void write_role(judge_call *j, const char *dir, const char *role, array *arrays, int n, int first_row_only) {
    static int runs; /* a role bound twice (repeat's runs) gets two sets of files */
    char *files[4];
    runs++;
    for (int k = 0; k < n; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s%s.%d.%d.npy", role, first_row_only ? "@1" : "", runs, k);
        files[k] = path_in(dir, name);
        save(&arrays[k], files[k], first_row_only ? 1 : rows_of(&arrays[k]));
    }
    char bound[40];
    snprintf(bound, sizeof bound, "%s%s", role, first_row_only ? "@1" : "");
    bind(j, bound, files, n);
}

static void expect_result(judge_call *j, const char *role, const char *want, const char *what) {
    cr_assert(j->nwant < (int)(sizeof j->want / sizeof *j->want));
    expectation *e = &j->want[j->nwant++];
    snprintf(e->role, sizeof e->role, "%s", role);
    e->want = want;
    snprintf(e->what, sizeof e->what, "%s", what);
}

static cJSON *derived_check(const cJSON *check, const char *role, const char *role2) {
    cJSON *d = cJSON_Duplicate(check, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(d, "impl");
    cJSON_DeleteItemFromObjectCaseSensitive(d, "impls");
    if (role2) {
        cJSON *pair = cJSON_AddArrayToObject(d, "impls");
        cJSON_AddItemToArray(pair, cJSON_CreateString(role));
        cJSON_AddItemToArray(pair, cJSON_CreateString(role2));
    } else {
        cJSON_AddStringToObject(d, "impl", role);
    }
    return d;
}

/* Run one judge call on case `name`: its checks as the checks of a config with `defaults`; each check's result must
 * be the one its role expects. The call is emptied for the next. */
static void run_judge(const char *config_name, const cJSON *defaults, const char *name, const char *dir, judge_call *j,
                      const char *family, int *judged) {
    static int serial;
    char file[32];
    snprintf(file, sizeof file, "j%d", serial++);
    char *cfg_path, *bundle;
    cr_assert(asprintf(&cfg_path, "%s/%s.json", dir, file) > 0 && asprintf(&bundle, "%s/%s.bundle", dir, file) > 0);
    kpt_scratch(cfg_path), kpt_scratch(bundle);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "schema", "kparity.gate/v1");
    cJSON_AddStringToObject(cfg, "name", "planted");
    cJSON_AddItemToObject(cfg, "impls", cJSON_CreateObject());
    if (defaults) cJSON_AddItemToObject(cfg, "defaults", cJSON_Duplicate(defaults, 1));
    cJSON *cases = cJSON_AddArrayToObject(cfg, "cases"), *entry = cJSON_CreateObject();
    cJSON_AddStringToObject(entry, "case", name);
    cJSON_AddItemToObject(entry, "checks", j->derived);
    cJSON_AddItemToArray(cases, entry);
    char *text = cJSON_Print(cfg);
    cr_assert_eq(kpt_write(cfg_path, text, strlen(text)), 0);
    free(text);
    cJSON_Delete(cfg);
    char *argv[sizeof j->argv / sizeof *j->argv + 16];
    int argc = 0;
    argv[argc++] = kpt_binary(), argv[argc++] = "judge", argv[argc++] = (char *)name;
    for (int i = 0; i < j->argc; i++) argv[argc++] = j->argv[i];
    argv[argc++] = "--config", argv[argc++] = cfg_path, argv[argc++] = "--out", argv[argc++] = bundle;
    argv[argc++] = "--quiet", argv[argc] = NULL;
    char *o, *e;
    const int code = kpt_run(argv, &o, &e);
    cr_assert(code == 0 || code == 1, "%s: judge %s: exit %d: %s", config_name, name, code, e);
    free(o), free(e);
    cJSON *rec = kpt_receipt(bundle, 1);
    const cJSON *got = cJSON_GetObjectItemCaseSensitive(rec, "checks");
    cr_assert_eq(cJSON_GetArraySize(got), j->nwant, "%s: %s: %d checks judged, %d expected", config_name, name,
                 cJSON_GetArraySize(got), j->nwant);
    int i = 0;
    for (const cJSON *g = got->child; g; g = g->next, i++) {
        const expectation *w = &j->want[i];
        char impl[64];
        snprintf(impl, sizeof impl, "%s.judged_%s@file", family, w->role);
        const char *result = cJSON_GetObjectItemCaseSensitive(g, "result")->valuestring;
        const cJSON *summary = cJSON_GetObjectItemCaseSensitive(g, "summary");
        cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(g, "impl")->valuestring, impl, "%s: check %d", config_name, i);
        cr_assert_str_eq(result, w->want, "%s on %s: %s is %s, not %s: %s", config_name, name, w->what, result, w->want,
                         cJSON_IsString(summary) ? summary->valuestring : "");
        if (w->differing_probe) { /* the verdict comes from a probe that was compared, not from the ones not given */
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(g, "findings"), "probes");
            for (p = p ? p->child : NULL; p; p = p->next)
                if (!strcmp(cJSON_GetObjectItemCaseSensitive(p, "probe")->valuestring, w->differing_probe)) break;
            cr_assert(p, "%s on %s: %s: no probe %s", config_name, name, w->what, w->differing_probe);
            cr_assert_gt(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(p, "rows_differ")), 0,
                         "%s on %s: %s: probe %s has no differing rows", config_name, name, w->what, w->differing_probe);
        }
        (*judged)++;
    }
    cJSON_Delete(rec);
    j->argc = j->nroles = j->nwant = 0;
    j->derived = NULL;
}

/* A check of a family without its impl fields, printed: two checks of a config that differ only in whose outputs
 * they judge, or in which case, declare the same bounds and are judged once. */
static char *params_key(const char *family, const cJSON *check) {
    cJSON *d = cJSON_Duplicate(check, 1);
    cJSON_DeleteItemFromObjectCaseSensitive(d, "impl");
    cJSON_DeleteItemFromObjectCaseSensitive(d, "impls");
    char *printed = cJSON_PrintUnformatted(d), *key;
    cr_assert(asprintf(&key, "%s %s", family, printed) > 0);
    cJSON_Delete(d), free(printed);
    return kpt_scratch(key);
}

/* The checks a config has had judged so far (params_key), and how many results were asserted. */
typedef struct {
    char **seen;
    int nseen, judged;
} progress;

/* ---- the roles: each a set of outputs, planted or clean ----
 *   clean, cleanb      the clean outputs (cleanb: a second impl with the same outputs, exact's clean twin)
 *   scaled_OUT         the clean outputs with OUT at 0.9x (tolerance)
 *   rule               the rule plant (top-p, top-k)
 *   bits               one bit off in row 0 (exact, against clean)
 *   rbits, rclean      two runs: the clean outputs, then the bit plant or the clean outputs again (repeat)
 *   bbits, bclean      the clean outputs, then row 0 alone one bit off or clean (batch's alone.row0 probe)
 * A role is bound once a judge call and read by every check that names it; the checks of one case share one call,
 * up to the roles one call binds. */
typedef struct {
    const family_plan *fp;
    array *clean, *rule_out, *bit_out;
    int nout;
} case_outputs;

/* The roles a check of `kind` reads, into names (at most 6); their count. */
static int roles_of(const char *kind, const case_outputs *co, char names[6][24]) {
    int n = 0;
    if (!strcmp(kind, "tolerance")) {
        for (int k = 0; k < co->nout; k++)
            if (co->fp->tolerance[k]) snprintf(names[n++], sizeof names[0], "scaled_%s", co->fp->outputs[k]);
        snprintf(names[n++], sizeof names[0], "clean");
    } else if (!strcmp(kind, "rule")) {
        snprintf(names[n++], sizeof names[0], "rule"), snprintf(names[n++], sizeof names[0], "clean");
    } else if (!strcmp(kind, "exact")) {
        snprintf(names[n++], sizeof names[0], "bits"), snprintf(names[n++], sizeof names[0], "clean");
        snprintf(names[n++], sizeof names[0], "cleanb");
    } else if (!strcmp(kind, "repeat")) {
        snprintf(names[n++], sizeof names[0], "rbits"), snprintf(names[n++], sizeof names[0], "rclean");
    } else if (!strcmp(kind, "batch")) {
        snprintf(names[n++], sizeof names[0], "bbits"), snprintf(names[n++], sizeof names[0], "bclean");
    }
    return n;
}

static int is_bound(const judge_call *j, const char *role) {
    for (int i = 0; i < j->nroles; i++)
        if (!strcmp(j->roles[i], role)) return 1;
    return 0;
}

/* Bind `role` to its outputs (written under dir) unless this call has. */
static void need_role(judge_call *j, const char *dir, const char *role, const case_outputs *co) {
    if (is_bound(j, role)) return;
    cr_assert(j->nroles < MAX_ROLES);
    snprintf(j->roles[j->nroles++], sizeof j->roles[0], "%.23s", role);
    if (!strncmp(role, "scaled_", 7)) {
        array scaled[4];
        int k = 0;
        while (k < co->nout && strcmp(co->fp->outputs[k], role + 7)) k++;
        cr_assert(k < co->nout);
        for (int m = 0; m < co->nout; m++) scaled[m] = m == k ? copy(&co->clean[m]) : co->clean[m];
        scale_all(&scaled[k]);
        write_role(j, dir, role, scaled, co->nout, 0);
        free(scaled[k].buf);
        return;
    }
    const int two_runs = role[0] == 'r' && strcmp(role, "rule"), alone = role[0] == 'b' && strcmp(role, "bits");
    const int planted = !strcmp(role, "rule") || !strcmp(role, "bits") || !strcmp(role, "rbits") || !strcmp(role, "bbits");
    array *last = !strcmp(role, "rule") ? co->rule_out : planted ? co->bit_out : co->clean;
    if (two_runs || alone) write_role(j, dir, role, co->clean, co->nout, 0); /* the first run, or the full batch */
    write_role(j, dir, role, last, co->nout, alone);
}

/* Judge one case with planted copies of each of `checks` (expect is skipped: a defect control's impl is meant to
 * fail), each with the clean twin of the same check, all in one judge call (more when they need more roles than one
 * call binds). Returns 0 when every check was judged, 1 when this case allows no plant one of them needs (the caller
 * tries its next case: the checks before that one were judged here). */
static int judge_planted(const char *config_name, const cJSON *config, const char *case_text, const cJSON *checks,
                         progress *pr) {
    case_name c;
    parse_case(case_text, &c);
    const family_plan *fp = plan_of(c.family);
    cut_to_host(&c, fp);
    const char *name = format_case(&c);
    int unseen = 0;
    for (const cJSON *ch = checks ? checks->child : NULL; ch; ch = ch->next) {
        const char *key = params_key(fp->family, ch);
        int dup = !strcmp(cJSON_GetObjectItemCaseSensitive(ch, "check")->valuestring, "expect");
        for (int i = 0; i < pr->nseen; i++) dup |= !strcmp(pr->seen[i], key);
        unseen += !dup;
    }
    if (!unseen) return 0;

    static int serial;
    char sub[32];
    snprintf(sub, sizeof sub, "c%d", serial++);
    char *dir = path_in(kpt_dir, sub), *ex = path_in(dir, "export");
    cr_assert_eq(mkdir(dir, 0700), 0);
    char *o, *e;
    char *exp_argv[] = {kpt_binary(), "export", (char *)name, "--out", ex, "--impl", (char *)fp->clean, NULL};
    cr_assert_eq(kpt_run(exp_argv, &o, &e), 0, "%s: export %s: %s", config_name, name, e);
    free(o), free(e);

    array clean[4], rule_out[4], bit_out[4];
    int nout = 0;
    for (; fp->outputs[nout]; nout++) {
        char file[128];
        snprintf(file, sizeof file, "%s%s%s.npy", fp->clean, fp->outputs[nout][0] ? "." : "", fp->outputs[nout]);
        clean[nout] = load(path_in(ex, file));
        rule_out[nout] = copy(&clean[nout]), bit_out[nout] = copy(&clean[nout]);
    }
    const case_outputs co = {fp, clean, rule_out, bit_out, nout};
    const int64_t rows = rows_of(&clean[0]);
    const cJSON *defaults = cJSON_GetObjectItemCaseSensitive(config, "defaults");
    const cJSON *band = defaults ? cJSON_GetObjectItemCaseSensitive(defaults, "band") : NULL;
    /* the plants, where this case allows them: -1 when it does not */
    const int64_t rule_row = !strcmp(fp->family, "topp")   ? plant_extra_token(&rule_out[0], ex, cJSON_IsNumber(band) ? band->valuedouble : 1e-6)
                             : !strcmp(fp->family, "topk") ? plant_swapped_index(&rule_out[0], &rule_out[1], ex, &c)
                                                           : -1;
    int64_t bit_row = 0;
    if (!strcmp(fp->family, "topk")) bit_row = plant_swapped_index(&bit_out[0], &bit_out[1], ex, &c);
    else flip_one_bit(&bit_out[0]);

    int rc = 0;
    cJSON *two_rows = NULL; /* a one-row case's batch checks, judged on two rows */
    judge_call calls[2] = {{.argc = 0}, {.argc = 0}}; /* the case's call, and its batch checks' where they are apart */
    for (const cJSON *ch = checks ? checks->child : NULL; ch && !rc; ch = ch->next) {
        const char *kind = cJSON_GetObjectItemCaseSensitive(ch, "check")->valuestring, *key = params_key(fp->family, ch);
        if (!strcmp(kind, "expect")) continue;
        int dup = 0;
        for (int i = 0; i < pr->nseen; i++) dup |= !strcmp(pr->seen[i], key);
        if (dup) continue;
        if (!strcmp(kind, "batch") && rows == 1) {
            if (!two_rows) two_rows = cJSON_CreateArray();
            cJSON_AddItemToArray(two_rows, cJSON_Duplicate(ch, 1));
            continue;
        }
        if (!strcmp(kind, "rule") && rule_row < 0) {
            fprintf(stderr, "%s: %s allows no rule plant; trying the next case\n", config_name, name);
            rc = 1;
            break;
        }
        if ((!strcmp(kind, "exact") || !strcmp(kind, "repeat") || !strcmp(kind, "batch")) && bit_row != 0) {
            /* batch gives row 0 alone: the plant must be there */
            fprintf(stderr, "%s: %s allows no plant in row 0; trying the next case\n", config_name, name);
            rc = 1;
            break;
        }
        judge_call *jc = &calls[fp->batch_apart && !strcmp(kind, "batch")];
        char roles[6][24];
        const int nroles = roles_of(kind, &co, roles);
        cr_assert(nroles > 0, "%s: a check of kind %s, which this test does not plant for", config_name, kind);
        int fresh = 0;
        for (int r = 0; r < nroles; r++) fresh += !is_bound(jc, roles[r]);
        if (jc->nroles + fresh > MAX_ROLES) run_judge(config_name, defaults, name, dir, jc, fp->family, &pr->judged);
        if (!jc->derived) jc->derived = cJSON_CreateArray();
        for (int r = 0; r < nroles; r++) need_role(jc, dir, roles[r], &co);
        if (!strcmp(kind, "tolerance")) {
            for (int r = 0; r + 1 < nroles; r++) { /* each scaled output on its own, then the clean twin */
                char w[96];
                cJSON_AddItemToArray(jc->derived, derived_check(ch, roles[r], NULL));
                snprintf(w, sizeof w, "tolerance with %s at 0.9x", roles[r] + 7);
                expect_result(jc, roles[r], "INCORRECT", w);
            }
            cJSON_AddItemToArray(jc->derived, derived_check(ch, "clean", NULL));
        } else if (!strcmp(kind, "rule")) {
            cJSON_AddItemToArray(jc->derived, derived_check(ch, "rule", NULL));
            expect_result(jc, "rule", "INCORRECT", !strcmp(fp->family, "topp") ? "rule with one extra boundary token"
                                                                              : "rule with one index swapped");
            cJSON_AddItemToArray(jc->derived, derived_check(ch, "clean", NULL));
        } else if (!strcmp(kind, "exact")) { /* one bit off against the clean outputs; the clean twin against themselves */
            cJSON_AddItemToArray(jc->derived, derived_check(ch, "bits", "clean"));
            expect_result(jc, "bits", "INCORRECT", "exact with one bit off");
            cJSON_AddItemToArray(jc->derived, derived_check(ch, "clean", "cleanb"));
        } else { /* repeat: run 2 one bit off; batch: row 0 alone one bit off */
            const int alone = !strcmp(kind, "batch");
            cJSON_AddItemToArray(jc->derived, derived_check(ch, roles[0], NULL));
            expect_result(jc, roles[0], "INCORRECT", alone ? "batch with row 0 alone one bit off" : "repeat with one bit off in run 2");
            if (alone) jc->want[jc->nwant - 1].differing_probe = "alone.row0";
            cJSON_AddItemToArray(jc->derived, derived_check(ch, roles[1], NULL));
        }
        char what[96];
        snprintf(what, sizeof what, "%s on the clean outputs", kind);
        /* batch is given row 0 alone: the other probes have no outputs, so no verdict on them (NOT_RUN) */
        const char *clean_role = !strcmp(kind, "repeat") || !strcmp(kind, "batch") ? roles[1] : "clean";
        expect_result(jc, clean_role, !strcmp(kind, "batch") ? "NOT_RUN" : "PASSED", what);
        pr->seen = realloc(pr->seen, sizeof *pr->seen * (size_t)(pr->nseen + 1));
        cr_assert(pr->seen);
        pr->seen[pr->nseen++] = (char *)key;
    }
    for (int k = 0; k < 2; k++)
        if (calls[k].derived) run_judge(config_name, defaults, name, dir, &calls[k], fp->family, &pr->judged);
    for (int m = 0; m < nout; m++) free(clean[m].buf), free(rule_out[m].buf), free(bit_out[m].buf);
    if (two_rows && !rc) {
        set_field(&c, fp->rows_field, "2");
        const char *profile = field(&c, "profile");
        if (profile && fp->one_row_profile && !strcmp(profile, fp->one_row_profile)) set_field(&c, "profile", fp->two_row_profile);
        rc = judge_planted(config_name, config, format_case(&c), two_rows, pr);
    }
    cJSON_Delete(two_rows);
    return rc;
}

/* Every check set of a config (named, or written into a case entry) judged once, on the first of its entries' cases
 * that allows each plant it needs. */
static int judge_config(const char *file) {
    char *path = path_in(kpt_source_dir(), file);
    char *text = kpt_read(path, NULL);
    cr_assert(text, "cannot read %s", path);
    cJSON *config = cJSON_Parse(text);
    free(text);
    cr_assert(config, "%s does not parse", file);
    const cJSON *sets = cJSON_GetObjectItemCaseSensitive(config, "check_sets");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(config, "cases");
    progress pr = {0};
    /* named sets, each on its entries in order; then entries that carry their own checks */
    for (const cJSON *set = sets ? sets->child : NULL; set; set = set->next) {
        int done = 0, used = 0;
        for (const cJSON *en = entries->child; en && !done; en = en->next) {
            const cJSON *ref = cJSON_GetObjectItemCaseSensitive(en, "checks");
            if (!cJSON_IsString(ref) || strcmp(ref->valuestring, set->string)) continue;
            used = 1;
            done = !judge_planted(file, config, entry_case(en), set, &pr);
        }
        cr_assert(done || !used, "%s: check set %s: no case of it allows the plants its checks need", file, set->string);
    }
    for (const cJSON *en = entries->child; en; en = en->next) {
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(en, "checks");
        if (cJSON_IsArray(own))
            cr_assert_eq(judge_planted(file, config, entry_case(en), own, &pr), 0, "%s: a case entry's own checks allow no plant",
                         file);
    }
    cJSON_Delete(config);
    free(pr.seen);
    return pr.judged;
}

/* Each shipped config, one test each, so a failure names the config. The count of judged checks is a floor: a config
 * whose checks are all skipped would prove nothing. */
#define SHIPPED(test, file)                                                                                            \
    Test(shipped_gates, test) {                                                                                        \
        const int judged = judge_config(file);                                                                         \
        cr_assert_geq(judged, 2, "%s: only %d checks judged", file, judged);                                          \
    }

SHIPPED(default_gate, "ci/gates/default.json")
SHIPPED(glm_split_topp, "ci/gates/glm-split-topp.json")
SHIPPED(glm_split_topp_cuda, "ci/gates/glm-split-topp-cuda.json")
SHIPPED(indexer_topk, "ci/gates/indexer-topk.json")
SHIPPED(indexer_topk_cuda, "ci/gates/indexer-topk-cuda.json")
SHIPPED(nvfp4_moe, "ci/gates/nvfp4-moe.json")
SHIPPED(nvfp4_moe_cuda, "ci/gates/nvfp4-moe-cuda.json")
SHIPPED(moe_presets_cuda, "ci/gates/moe-presets-cuda.json")
SHIPPED(sparse_mla, "ci/gates/sparse-mla.json")
SHIPPED(sparse_mla_cuda, "ci/gates/sparse-mla-cuda.json")
SHIPPED(matrix_topp, "ci/matrix/topp.json")
SHIPPED(matrix_topk, "ci/matrix/topk.json")
SHIPPED(matrix_moe, "ci/matrix/moe.json")
SHIPPED(matrix_mla, "ci/matrix/mla.json")

/* Every shipped config has a test above: a new one must be added, not forgotten. */
Test(shipped_gates, every_shipped_config_is_listed) {
    static const char *const listed[] = {"default.json", "glm-split-topp.json", "glm-split-topp-cuda.json", "indexer-topk.json",
                                         "indexer-topk-cuda.json", "nvfp4-moe.json", "nvfp4-moe-cuda.json", "moe-presets-cuda.json", "sparse-mla.json",
                                         "sparse-mla-cuda.json", "topp.json", "topk.json", "moe.json", "mla.json"};
    const char *folders[] = {"ci/gates", "ci/matrix"};
    for (int f = 0; f < 2; f++) {
        DIR *d = opendir(path_in(kpt_source_dir(), folders[f]));
        cr_assert(d);
        for (struct dirent *e; (e = readdir(d));) {
            const size_t n = strlen(e->d_name);
            if (n < 5 || strcmp(e->d_name + n - 5, ".json")) continue;
            int found = 0;
            for (size_t i = 0; i < sizeof listed / sizeof *listed; i++) found |= !strcmp(listed[i], e->d_name);
            cr_assert(found, "%s/%s is a shipped config without a planted-defect test here", folders[f], e->d_name);
        }
        closedir(d);
    }
}
