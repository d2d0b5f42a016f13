/* judge.c: `kparity judge CASE --impl NAME=FILE[,FILE...] ... --config FILE --out B`: outputs made outside kparity
 * (PyTorch, Triton, another project: anything that writes .npy) judged by the family's checks as if the impl had
 * run inside. Each --impl NAME=... is one full-batch run's outputs, one file per output tensor in the family's
 * order (an order output, which records the order an impl worked in, may be left out; --absent NAME=OUT[,OUT...] declares
 * outputs the impl does not produce, which have no file and no check judges); NAME given again is another run
 * (for repeat); NAME@N=... is the outputs of the case's first N rows run as a batch of N (the same case name with
 * batch/rows N holds the same rows), which a batch check compares with the full batch's rows. The checks come
 * from the config: the case entry of the same name, else its check set "judge"; a role named NAME (or
 * "<family>.NAME") is bound to the files, other roles run inside as usual. A judged impl's identity in receipts
 * is the SHA-256 of its files' digests, each file named with its own. Every file is checked against the family's
 * output dtype and shape before anything runs: wrong dtype, shape, a truncated or non-.npy file is exit 2 naming
 * the file and what is wrong. A bf16 output may come as <u2 or <i2 bits. --exec ROLE=COMMAND binds a role to an
 * outside program instead (kp_exec.h), which then gets every launch the checks make, batch probes included.
 * `kparity judge DIR` takes a `kparity export` folder instead of CASE: its case.json gives the case, every file it
 * names must have the SHA-256 it records (else exit 2 naming the file), and each exported impl's outputs are bound, as
 * an --impl ROLE=FILE,... set given first, to every role of the config that names that impl (or its @auto form). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_npy.h"
#include "kp_exec.h"
#include "kp_export.h"
#include "kp_judge.h"
#include "kp_launch.h"
#include "kp_runner.h"
#include "kp_worker.h"

#define MAX_JUDGED 8
#define MAX_SETS 64 /* runs and sub-batches of one judged impl */

typedef struct file_set {
    int64_t rows;                  /* the batch these outputs are of: the case's or a first-N sub-batch */
    int full;                      /* a full-batch run (else a sub-batch) */
    unsigned char *data[KP_MAX_TENSORS]; /* dense arrays as read (NULL: an order output not given) */
} file_set;

typedef struct judged {
    char role[48];
    char impl_name[96];
    kp_impl impl;
    bool absent[KP_MAX_TENSORS]; /* outputs declared absent (--absent): no file, never judged */
    file_set sets[MAX_SETS];
    int nsets, next_full;
    char *origin;
    char identity[KP_SHA256_HEX_LEN];
} judged;

static judged g_judged[MAX_JUDGED];
static int g_njudged;
static char *g_exec_args[MAX_JUDGED]; /* --exec ROLE=COMMAND: outside programs bound to roles */
static int g_nexec_args;
static kp_export_folder g_export;     /* judge DIR: the export read back */
static char *g_bound[MAX_JUDGED];      /* its impls' outputs as --impl ROLE=FILE,... arguments */
static int g_nbound;

/* Copy a given set's rows into the run's output buffers, honouring each tensor's row stride. */
static void serve(const file_set *s, const kp_launch_view *v) {
    for (int k = 0; k < v->nout; k++) {
        const kp_tensor *t = &v->outs[k];
        const size_t es = kp_dtype_size(t->dtype);
        const int64_t cols = kp_tensor_cols(t), stride = kp_tensor_stride(t), sub = kp_tensor_rows(t);
        unsigned char *dst = v->out[k];
        for (int64_t r = 0; r < sub; r++) {
            if (s->data[k]) memcpy(dst + (size_t)(r * stride) * es, s->data[k] + (size_t)(r * cols) * es, (size_t)cols * es);
            else memset(dst + (size_t)(r * stride) * es, 0xff, (size_t)cols * es); /* an order output not given: -1 */
        }
    }
}

static int identity_rows(const int64_t *rows, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (rows[i] != i) return 0;
    return 1;
}

/* A full-batch run gets the next full set given (run 1, then repeat's runs, in order); a run of the first N rows
 * gets the NAME@N set; any other row set was given no outputs and is refused. */
static int judged_run(judged *j, char *message, size_t len) {
    const kp_launch_view *v = kp_launch_current();
    if (!v) return snprintf(message, len, "%s: called outside a run", j->impl_name), KP_RUN_FAILED;
    const int prefix = identity_rows(v->rows, v->nrows);
    int seen = 0, full_rows = 0;
    for (int i = 0; prefix && i < j->nsets; i++) {
        const file_set *s = &j->sets[i];
        if (s->rows != v->nrows) continue;
        if (s->full) full_rows = 1;
        if (s->full && seen++ != j->next_full) continue;
        if (s->full) j->next_full++;
        serve(s, v);
        return KP_RUN_OK;
    }
    if (full_rows)
        snprintf(message, len, "%s: %d full-batch runs were given and this is run %d (give --impl %s=... once per run)",
                 j->impl_name, seen, j->next_full + 1, j->role);
    else
        snprintf(message, len, "%s: no outputs were given for this set of %lld rows (judge serves the full batch and "
                 "first-N sub-batches given as --impl %s@N=...)", j->impl_name, (long long)v->nrows, j->role);
    return KP_RUN_NOT_SUPPORTED;
}

#define RUNNER(i) static int run_##i(const void *a, char *m, size_t n) { (void)a; return judged_run(&g_judged[i], m, n); }
RUNNER(0) RUNNER(1) RUNNER(2) RUNNER(3) RUNNER(4) RUNNER(5) RUNNER(6) RUNNER(7)
static int (*const runners[MAX_JUDGED])(const void *, char *, size_t) = {run_0, run_1, run_2, run_3,
                                                                           run_4, run_5, run_6, run_7};

static int fail_usage(kp_error *err) {
    fprintf(stderr, "kparity: %s\n", err->msg);
    return err->code;
}

/* A role name: lowercase letters, digits and '_'. */
static int role_name_ok(const char *name) {
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
    return name[0] != '\0';
}

/* --absent NAME=OUT[,OUT...]: the outputs role NAME does not give, each an output of the family, into absent[]. */
static int parse_absent_arg(const kp_family *fam, const char *arg, char *name, size_t name_len, bool absent[KP_MAX_TENSORS],
                            kp_error *err) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1] || (size_t)(eq - arg) >= name_len)
        return kp_fail(err, KP_EXIT_USAGE, "--absent '%s': expected NAME=OUTPUT[,OUTPUT...]", arg);
    memcpy(name, arg, (size_t)(eq - arg)), name[eq - arg] = '\0';
    if (!role_name_ok(name))
        return kp_fail(err, KP_EXIT_USAGE, "--absent '%s': a name is lowercase letters, digits and '_' (a role of the config)", arg);
    char *list = strdup(eq + 1), *save = NULL;
    if (!list) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    int rc = 0;
    for (char *o = strtok_r(list, ",", &save); o && !rc; o = strtok_r(NULL, ",", &save)) {
        const int k = kp_family_output_index(fam, o);
        if (k < 0) {
            char names[256];
            kp_family_output_list(fam, names, sizeof names);
            rc = kp_fail(err, KP_EXIT_USAGE, "--absent %s: '%s' is not an output of %s (its outputs: %s)", arg, o, fam->name, names);
        } else {
            absent[k] = true;
        }
    }
    free(list);
    return rc;
}

/* NAME[@N]=FILE[,FILE...] */
static int parse_impl_arg(const char *arg, char *name, size_t name_len, int64_t *sub_rows, char ***files, int *nfiles,
                          kp_error *err) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return kp_fail(err, KP_EXIT_USAGE, "--impl '%s': expected NAME=FILE.npy[,FILE.npy...] or NAME@N=...", arg);
    const char *at = memchr(arg, '@', (size_t)(eq - arg));
    const size_t nlen = (size_t)((at ? at : eq) - arg);
    if (nlen >= name_len) return kp_fail(err, KP_EXIT_USAGE, "--impl '%s': the name is too long", arg);
    memcpy(name, arg, nlen), name[nlen] = '\0';
    if (!role_name_ok(name))
        return kp_fail(err, KP_EXIT_USAGE, "--impl '%s': a name is lowercase letters, digits and '_' (a role of the config)",
                       arg);
    *sub_rows = 0;
    if (at) {
        char *end;
        *sub_rows = strtoll(at + 1, &end, 10);
        if (end != eq || *sub_rows < 1) return kp_fail(err, KP_EXIT_USAGE, "--impl '%s': @N must be a row count of 1 or more", arg);
    }
    *nfiles = 0;
    *files = NULL;
    char *list = strdup(eq + 1), *save = NULL;
    for (char *f = list ? strtok_r(list, ",", &save) : NULL; f; f = strtok_r(NULL, ",", &save)) {
        char **grown = realloc(*files, sizeof **files * (size_t)(*nfiles + 1));
        if (!grown) break;
        *files = grown;
        (*files)[(*nfiles)++] = strdup(f);
    }
    free(list);
    return 0;
}

/* Read one output file and check it against tensor t of `rows` rows. */
static int read_output(const char *path, const kp_tensor *t, int64_t rows, unsigned char **data, char hex[KP_SHA256_HEX_LEN],
                       kp_error *err) {
    char *buf;
    size_t len;
    int rc = kp_read_file(path, &buf, &len, err);
    if (rc) return rc;
    kp_sha256_hex(buf, len, hex);
    kp_npy_info info;
    if ((rc = kp_judge_check_output(path, (const unsigned char *)buf, len, t, rows, &info, err))) {
        free(buf);
        return rc;
    }
    *data = malloc(info.data_bytes ? info.data_bytes : 1);
    if (!*data) {
        free(buf);
        return kp_fail(err, KP_EXIT_ENV, "out of host memory reading %s", path);
    }
    memcpy(*data, buf + info.data_offset, info.data_bytes);
    free(buf);
    return 0;
}

static int is_order_output(const kp_family *fam, const char *name) {
    for (int i = 0; fam->order_outputs && fam->order_outputs[i]; i++)
        if (!strcmp(fam->order_outputs[i], name)) return 1;
    return 0;
}

/* Bind --impl arguments to judged impls: files read and checked against the case's outputs, each role's files the
 * outputs its --absent arguments leave, in order. */
static int load_judged(const kp_family *fam, const kp_case *c, int nargs, char **args, int nabsent, char **absent_args,
                       kp_error *err) {
    struct {
        char role[48];
        bool absent[KP_MAX_TENSORS];
        int bound;
    } decl[64];
    memset(decl, 0, sizeof decl);
    int ndecl = 0;
    for (int a = 0; a < nabsent; a++) {
        char name[48];
        bool absent[KP_MAX_TENSORS] = {0};
        int rc = parse_absent_arg(fam, absent_args[a], name, sizeof name, absent, err);
        if (rc) return rc;
        int i = 0;
        while (i < ndecl && strcmp(decl[i].role, name)) i++;
        if (i == ndecl) snprintf(decl[ndecl++].role, sizeof decl->role, "%s", name);
        for (int k = 0; k < KP_MAX_TENSORS; k++) decl[i].absent[k] |= absent[k];
    }
    kp_prepared p;
    int rc = kp_prepare(fam, c, 0, &p, err);
    if (rc) return rc;
    const int64_t B = p.v.batch;
    for (int a = 0; !rc && a < nargs; a++) {
        char name[48], **files = NULL;
        int nfiles = 0;
        int64_t sub = 0;
        if ((rc = parse_impl_arg(args[a], name, sizeof name, &sub, &files, &nfiles, err))) break;
        judged *j = NULL;
        for (int i = 0; i < g_njudged; i++)
            if (!strcmp(g_judged[i].role, name)) j = &g_judged[i];
        if (!j && g_njudged == MAX_JUDGED) rc = kp_fail(err, KP_EXIT_USAGE, "judge: at most %d impls", MAX_JUDGED);
        if (!rc && !j) {
            j = &g_judged[g_njudged];
            memset(j, 0, sizeof *j);
            snprintf(j->role, sizeof j->role, "%s", name);
            snprintf(j->impl_name, sizeof j->impl_name, "%s.judged_%s@file", fam->name, name);
            j->impl = (kp_impl){KP_ABI_VERSION, fam->name, j->impl_name, KP_MEMORY_HOST, NULL, NULL, runners[g_njudged]};
            for (int i = 0; i < ndecl; i++)
                if (!strcmp(decl[i].role, name)) memcpy(j->absent, decl[i].absent, sizeof j->absent), decl[i].bound = 1;
            g_njudged++;
        }
        if (!rc && sub >= B)
            rc = kp_fail(err, KP_EXIT_USAGE, "--impl %s: @%lld rows; a sub-batch is fewer than the case's %lld rows (the full batch "
                         "is NAME=...)", args[a], (long long)sub, (long long)B);
        if (!rc && j->nsets == MAX_SETS) rc = kp_fail(err, KP_EXIT_USAGE, "--impl %s: more than %d file sets", name, MAX_SETS);
        kp_tensor outs[KP_MAX_TENSORS];
        const int64_t rows = sub ? sub : B;
        const int nout = rc ? 0 : fam->outputs(p.v.data, rows, outs);
        int required = 0, given[KP_MAX_TENSORS], ngiven = 0; /* given[f]: the output file f holds */
        for (int k = 0; k < nout; k++) {
            if (j->absent[k]) continue;
            required += !is_order_output(fam, outs[k].name);
            given[ngiven++] = k;
        }
        if (!rc && (nfiles < required || nfiles > ngiven)) {
            char names[320] = "";
            for (int k = 0; k < nout; k++) {
                const size_t l = strlen(names);
                snprintf(names + l, sizeof names - l, "%s%.31s%s", k ? ", " : "", outs[k].name,
                         j->absent[k] ? " (declared absent: no file)" : is_order_output(fam, outs[k].name) ? " (may be left out)" : "");
            }
            rc = kp_fail(err, KP_EXIT_USAGE, "--impl %s: %d files; %s outputs are, in order: %s (an output the impl does not "
                         "produce: --absent %s=OUTPUT)", args[a], nfiles, fam->name, names, name);
        }
        file_set *s = rc ? NULL : &j->sets[j->nsets];
        if (s) memset(s, 0, sizeof *s), s->rows = rows, s->full = !sub;
        for (int f = 0; !rc && f < nfiles; f++) {
            const int k = given[f];
            char hex[KP_SHA256_HEX_LEN], *grown = NULL;
            rc = read_output(files[f], &outs[k], rows, &s->data[k], hex, err);
            char tag[32] = "";
            if (sub) snprintf(tag, sizeof tag, "@%lld ", (long long)sub);
            if (!rc && asprintf(&grown, "%s%s%s%s (sha256 %s)", j->origin ? j->origin : "judged outputs: ", j->origin ? ", " : "",
                                tag, files[f], hex) > 0) {
                free(j->origin);
                j->origin = grown;
            }
        }
        if (!rc) j->nsets++;
        for (int k = 0; k < nfiles; k++) free(files[k]);
        free(files);
    }
    kp_prepared_release(&p);
    for (int i = 0; !rc && i < ndecl; i++)
        if (!decl[i].bound) rc = kp_fail(err, KP_EXIT_USAGE, "--absent %s=...: no --impl %s=... was given", decl[i].role, decl[i].role);
    for (int i = 0; !rc && i < g_njudged; i++) {
        judged *j = &g_judged[i];
        int full = 0;
        for (int s = 0; s < j->nsets; s++) full += j->sets[s].full;
        if (!full) rc = kp_fail(err, KP_EXIT_USAGE, "--impl %s: no full-batch outputs (NAME=...) were given, only sub-batches", j->role);
        kp_sha256_hex(j->origin, strlen(j->origin), j->identity);
        if (!rc) rc = kp_impl_register_judged(&j->impl, j->origin, j->identity, err);
        for (int k = 0; !rc && fam->output_names[k]; k++)
            if (j->absent[k]) rc = kp_family_declare_absent(&j->impl, fam->output_names[k], err);
    }
    return rc;
}

/* The config at config_path as a JSON object (exit 2 when it is not one). */
static int read_config_object(const char *config_path, cJSON **doc_out, kp_error *err) {
    char *text;
    size_t len;
    const int rc = kp_read_file(config_path, &text, &len, err);
    if (rc) return rc;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return kp_fail(err, KP_EXIT_USAGE, "config %s: not a JSON object", config_path);
    }
    *doc_out = doc;
    return 0;
}

/* The checks for CASE from the config, roles bound to the judged impls, repeat's runs set to the runs given. */
static int judge_config(const char *config_path, const char *case_name, const kp_family *fam, char **out_path, kp_error *err) {
    cJSON *doc = NULL;
    int rc = read_config_object(config_path, &doc, err);
    if (rc) return rc;
    cJSON *checks = NULL, *entry;
    cJSON_ArrayForEach(entry, cJSON_GetObjectItemCaseSensitive(doc, "cases")) { /* names compared in canonical form */
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "case"));
        kp_case ec;
        kp_error ignored = {0};
        char canonical[KP_CASE_NAME_MAX];
        if (name && !kp_case_parse(name, &ec, &ignored) && !kp_case_normalize(&ec, &ignored) &&
            kp_case_format(&ec, canonical, sizeof canonical) > 0 && !strcmp(canonical, case_name))
            checks = cJSON_GetObjectItemCaseSensitive(entry, "checks");
    }
    if (!checks) checks = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "check_sets"), "judge");
    if (!checks) {
        cJSON_Delete(doc);
        return kp_fail(err, KP_EXIT_USAGE, "config %s: no case '%s' and no check set \"judge\": nothing says which checks to run",
                       config_path, case_name);
    }
    checks = cJSON_Duplicate(checks, 1);
    /* repeat on a judged role: as many runs as full-batch file sets were given */
    cJSON *set = cJSON_IsString(checks) ? cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "check_sets"), checks->valuestring), 1) : NULL;
    if (set) cJSON_Delete(checks), checks = set;
    cJSON *chk;
    cJSON_ArrayForEach(chk, checks) {
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "check"));
        const char *impl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "impl"));
        const char *of = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(chk, "of"));
        const int repeat = kind && (!strcmp(kind, "repeat") || (!strcmp(kind, "expect") && of && !strcmp(of, "repeat")));
        for (int i = 0; repeat && impl && i < g_njudged; i++) {
            if (strcmp(impl, g_judged[i].role)) continue;
            int full = 0;
            for (int s = 0; s < g_judged[i].nsets; s++) full += g_judged[i].sets[s].full;
            if (full < 2) {
                kp_fail(err, KP_EXIT_USAGE, "repeat on %s needs at least two runs' outputs: give --impl %s=... once per run",
                        g_judged[i].role, g_judged[i].role);
                cJSON_Delete(doc), cJSON_Delete(checks);
                return err->code;
            }
            cJSON_DeleteItemFromObjectCaseSensitive(chk, "runs");
            cJSON_AddNumberToObject(chk, "runs", full);
        }
    }
    cJSON *impls = cJSON_GetObjectItemCaseSensitive(doc, "impls");
    if (!cJSON_IsObject(impls)) cJSON_DeleteItemFromObjectCaseSensitive(doc, "impls"), impls = cJSON_AddObjectToObject(doc, "impls");
    for (int i = 0; i < g_njudged; i++) {
        char scoped[160];
        snprintf(scoped, sizeof scoped, "%.31s.%.47s", fam->name, g_judged[i].role);
        const char *key = cJSON_GetObjectItemCaseSensitive(impls, scoped) ? scoped : g_judged[i].role;
        cJSON_DeleteItemFromObjectCaseSensitive(impls, key);
        cJSON_AddStringToObject(impls, key, g_judged[i].impl_name);
    }
    for (int i = 0; i < g_nexec_args; i++) { /* a program bound to a role: the config's object form, loaded as any */
        kp_exec_decl decl;
        if (kp_exec_arg(g_exec_args[i], fam->name, &decl, err)) {
            cJSON_Delete(doc), cJSON_Delete(checks);
            return err->code;
        }
        /* in judge, NAME of --exec NAME=COMMAND is the role; the program runs the one impl it serves */
        snprintf(decl.role, sizeof decl.role, "%s", decl.program_impl);
        decl.program_impl[0] = '\0';
        const char *role = decl.role;
        int ok = role[0] != '\0';
        for (const char *r = role; *r; r++) ok &= (*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9') || *r == '_';
        if (!ok) {
            kp_exec_decl_free(&decl);
            cJSON_Delete(doc), cJSON_Delete(checks);
            return kp_fail(err, KP_EXIT_USAGE, "--exec %s: ROLE is lowercase letters, digits and '_' (a role of the config; the "
                           "program must serve an impl of that name)", g_exec_args[i]);
        }
        cJSON *obj = cJSON_CreateObject(), *argv = cJSON_AddArrayToObject(obj, "exec");
        for (int a = 0; decl.argv[a]; a++) cJSON_AddItemToArray(argv, cJSON_CreateString(decl.argv[a]));
        cJSON_AddStringToObject(obj, "family", fam->name);
        char scoped[160];
        snprintf(scoped, sizeof scoped, "%.31s.%.47s", fam->name, role);
        const char *key = cJSON_GetObjectItemCaseSensitive(impls, scoped) ? scoped : role;
        cJSON_DeleteItemFromObjectCaseSensitive(impls, key);
        cJSON_AddItemToObject(impls, key, obj);
        kp_exec_decl_free(&decl);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(doc, "cases");
    cJSON *cases = cJSON_AddArrayToObject(doc, "cases"), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "case", case_name);
    cJSON_AddItemToObject(c, "checks", checks);
    cJSON_AddItemToArray(cases, c);
    char *printed = cJSON_Print(doc);
    cJSON_Delete(doc);
    const char *tmpdir = getenv("TMPDIR");
    if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
    char tmpl[4096];
    if (snprintf(tmpl, sizeof tmpl, "%s/kparity-judge-XXXXXX.json", tmpdir) >= (int)sizeof tmpl) {
        free(printed);
        return kp_fail(err, KP_EXIT_ENV, "judge: TMPDIR is too long a path");
    }
    const int fd = printed ? mkstemps(tmpl, 5) : -1;
    if (fd < 0) {
        free(printed);
        return kp_fail(err, KP_EXIT_ENV, "judge: cannot write the judging config into %s (TMPDIR, else /tmp): %s",
                       tmpdir, strerror(errno));
    }
    const size_t n = strlen(printed);
    const int ok = write(fd, printed, n) == (ssize_t)n;
    close(fd);
    free(printed);
    if (!ok) {
        unlink(tmpl);
        return kp_fail(err, KP_EXIT_ENV, "judge: cannot write the judging config %s", tmpl);
    }
    *out_path = strdup(tmpl);
    return 0;
}

/* judge DIR: each impl exported there, bound to every role of the config that names it (the config's impls, as
 * "<family>.ROLE" or "ROLE": the impl's own name, or its "@auto" form whichever device it was exported from), as an
 * --impl ROLE=FILE,... argument in g_bound. KP_EXIT_USAGE when no role names any. */
static int bind_exported(const char *dir, const char *config_path, const kp_family *fam, int announce, kp_error *err) {
    if (strchr(dir, ','))
        return kp_fail(err, KP_EXIT_USAGE, "judge %s: a folder whose path holds ',' cannot be judged (an output set's "
                       "files are separated by ','): move or link it", dir);
    cJSON *doc = NULL;
    int rc = read_config_object(config_path, &doc, err);
    if (rc) return rc;
    const cJSON *impls = cJSON_GetObjectItemCaseSensitive(doc, "impls"), *m;
    const size_t flen = strlen(fam->name);
    char roles[512] = "", exported[512] = "";
    for (int i = 0; !rc && i < g_export.nimpls; i++) {
        const kp_export_impl *e = &g_export.impls[i];
        snprintf(exported + strlen(exported), sizeof exported - strlen(exported), "%s%s", i ? ", " : "", e->name);
        const char *e_at = strrchr(e->name, '@');
        cJSON_ArrayForEach(m, impls) {
            const char *v = cJSON_GetStringValue(m), *role = m->string;
            if (!v || !role) continue;
            if (!i) snprintf(roles + strlen(roles), sizeof roles - strlen(roles), "%s%s = %s", roles[0] ? ", " : "", role, v);
            if (!strncmp(role, fam->name, flen) && role[flen] == '.') role += flen + 1;
            else if (strchr(role, '.')) continue; /* another family's role */
            const char *at = strrchr(v, '@');
            const int names = !strcmp(v, e->name) || (at && e_at && !strcmp(at, "@auto") && at - v == e_at - e->name &&
                                                       !strncmp(v, e->name, (size_t)(at - v)));
            int seen = !names || !role_name_ok(role);
            for (int b = 0; !seen && b < g_nbound; b++)
                seen = !strncmp(g_bound[b], role, strlen(role)) && g_bound[b][strlen(role)] == '=';
            if (seen) continue;
            if (g_nbound == MAX_JUDGED) {
                rc = kp_fail(err, KP_EXIT_USAGE, "judge %s: more than %d roles to bind", dir, MAX_JUDGED);
                break;
            }
            char *arg = NULL;
            size_t alen = 0;
            FILE *f = open_memstream(&arg, &alen);
            if (!f) {
                rc = kp_fail(err, KP_EXIT_ENV, "out of host memory");
                break;
            }
            fprintf(f, "%s=", role);
            for (int k = 0; k < e->nfiles; k++) fprintf(f, "%s%s", k ? "," : "", e->files[k]);
            fclose(f);
            g_bound[g_nbound++] = arg;
            if (announce) fprintf(stderr, "kparity: judge: role %s takes %s's outputs exported in %s\n", role, e->name, dir);
        }
    }
    cJSON_Delete(doc);
    if (!rc && !g_nbound)
        rc = kp_fail(err, KP_EXIT_USAGE, "judge %s: no role of config %s names an impl exported there (exported: %s; the "
                     "config's roles: %s): a role judges an export's outputs when it names that impl (or its @auto form)",
                     dir, config_path, exported[0] ? exported : "none", roles[0] ? roles : "none");
    return rc;
}

int kp_cmd_judge(int argc, char **argv) {
    kp_error err = {0};
    const char *case_name = NULL, *config = NULL, *out = NULL;
    char *impl_args[64], *absent_args[64];
    const char *plugins[32];
    int nimpl = 0, nabsent = 0, nplugin = 0, quiet = 0;
    for (int i = 0; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--impl") && more && nimpl < 64) impl_args[nimpl++] = argv[++i];
        else if (!strcmp(argv[i], "--exec") && more && g_nexec_args < MAX_JUDGED) g_exec_args[g_nexec_args++] = argv[++i];
        else if (!strcmp(argv[i], "--absent") && more && nabsent < 64) absent_args[nabsent++] = argv[++i];
        else if (!strcmp(argv[i], "--config") && more) config = argv[++i];
        else if (!strcmp(argv[i], "--out") && more) out = argv[++i];
        else if (!strcmp(argv[i], "--quiet")) quiet = 1;
        else if (!strcmp(argv[i], "--plugin") && more) {
            if (nplugin == 32) {
                kp_fail(&err, KP_EXIT_USAGE, "judge: --plugin: at most 32 plugins");
                return fail_usage(&err);
            }
            plugins[nplugin++] = argv[++i];
        }
        else if (argv[i][0] != '-' && !case_name) case_name = argv[i];
        else {
            kp_fail(&err, KP_EXIT_USAGE, "judge: unknown or incomplete argument '%s' (kparity judge CASE --impl NAME=FILE.npy ... "
                    "--config FILE --out B)", argv[i]);
            return fail_usage(&err);
        }
    }
    /* judge DIR: a kparity export's folder gives the case and, bound below, the outputs */
    struct stat st;
    const char *export_dir = case_name && !stat(case_name, &st) && S_ISDIR(st.st_mode) ? case_name : NULL;
    if (export_dir) {
        if (kp_export_read(export_dir, &g_export, &err)) return fail_usage(&err);
        case_name = g_export.case_name;
    }
    if (!case_name || !(nimpl || g_nexec_args || export_dir) || !config || !out) {
        kp_fail(&err, KP_EXIT_USAGE, "judge needs a case and at least one --impl NAME=FILE.npy or --exec ROLE=COMMAND (or a "
                "kparity export's folder), --config FILE and --out B");
        return fail_usage(&err);
    }
    kp_case c;
    if (kp_case_parse(case_name, &c, &err) || kp_case_normalize(&c, &err)) return fail_usage(&err);
    const kp_family *fam = kp_family_find(c.family);
    if (!fam) {
        kp_fail(&err, KP_EXIT_USAGE, "judge: %s: no family '%s'", case_name, c.family);
        return fail_usage(&err);
    }
    char canonical[KP_CASE_NAME_MAX];
    if (kp_case_format(&c, canonical, sizeof canonical) < 0) {
        kp_fail(&err, KP_EXIT_USAGE, "judge: the case name is too long");
        return fail_usage(&err);
    }
    if (export_dir) {
        if (bind_exported(export_dir, config, fam, !quiet && !kp_worker_is_one(), &err)) return fail_usage(&err);
        if (nimpl + g_nbound > 64) {
            kp_fail(&err, KP_EXIT_USAGE, "judge: at most 64 output sets, %d bound from %s among them", g_nbound, export_dir);
            return fail_usage(&err);
        }
        for (int i = 0; i < g_nbound; i++) { /* the exported outputs first, then --impl's */
            memmove(impl_args + 1, impl_args, sizeof *impl_args * (size_t)nimpl++);
            impl_args[0] = g_bound[g_nbound - 1 - i];
        }
    }
    /* As gate and run do: the checks run in a worker process (this command line again), so a plugin's impl that
     * crashes or hangs fails the case instead of ending judge; this process loads no plugin and reads no output. */
    kp_run_options opt = {.out_dir = out, .quiet = quiet, .command = "judge", .isolate = 1};
    if (kp_run_supervises(&opt)) {
        const int code = kp_run_supervise(config, &opt, &err);
        if ((code == KP_EXIT_USAGE || code == KP_EXIT_ENV || code == KP_EXIT_TIMEOUT) && err.msg[0]) return fail_usage(&err);
        return code;
    }
    for (int i = 0; i < nplugin; i++)
        if (kp_plugin_load(plugins[i], &err)) return fail_usage(&err);
    if (load_judged(fam, &c, nimpl, impl_args, nabsent, absent_args, &err)) return fail_usage(&err);
    char *generated = NULL;
    if (judge_config(config, canonical, fam, &generated, &err)) return fail_usage(&err);
    kp_config cfg;
    const int lrc = kp_config_load(generated, &cfg, &err);
    unlink(generated);
    free(generated);
    if (lrc) {
        kp_config_free(&cfg);
        return fail_usage(&err);
    }
    snprintf(cfg.path, sizeof cfg.path, "kparity judge, checks from %s", config);
    const int code = kp_run_config(&cfg, &opt, &err);
    kp_config_free(&cfg);
    if (code == KP_EXIT_USAGE || ((code == KP_EXIT_ENV || code == KP_EXIT_TIMEOUT) && err.msg[0])) return fail_usage(&err);
    return code;
}
