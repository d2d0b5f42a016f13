/* merge.c: `kparity merge B1 B2 ... --out B`: the parts of one config run as shards (`kparity run --shard I/N`)
 * joined into one bundle, as if one run had made it. Each part must verify and come from the same config (its
 * SHA-256) and the same kparity version, as shard I of the same N, each shard once and all N present; anything
 * else is refused with exit 2 naming the part and the reason. Receipts go in config order (each carries its
 * case.config_index) and are re-chained; artifacts are copied (content addressed, checked on the way); one
 * verdict is the runner's over the merged receipts (merged_verdict); bundle.json records the parts. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../receipts/kp_bundle.h"
#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_verdict.h"
#include "../receipts/kp_verify.h"
#include "kp_harness.h"

#define MAX_PARTS 256

typedef struct part {
    const char *dir;
    cJSON *doc; /* bundle.json */
    int shard, count;
} part;

static const char *doc_string(const cJSON *doc, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(doc, a);
    return cJSON_GetStringValue(b ? cJSON_GetObjectItemCaseSensitive(x, b) : x);
}

static int doc_int(const cJSON *doc, const char *a, const char *b, int64_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(doc, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (!cJSON_IsNumber(x)) return -1;
    *out = (int64_t)x->valuedouble;
    return 0;
}

static int read_part(const char *dir, part *p, kp_error *err) {
    memset(p, 0, sizeof *p);
    p->dir = dir;
    kp_error verr = {0};
    if (kp_bundle_verify(dir, &verr))
        return kp_fail(err, KP_EXIT_USAGE, "merge: part %s does not verify: %s", dir, verr.msg);
    char *path = NULL;
    if (asprintf(&path, "%s/bundle.json", dir) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    int rc = kp_bundle_read_json(path, &p->doc, err);
    free(path);
    if (rc) return rc;
    int64_t index, count;
    if (doc_int(p->doc, "shard", "index", &index) || doc_int(p->doc, "shard", "count", &count))
        return kp_fail(err, KP_EXIT_USAGE, "merge: part %s was not run with --shard I/N (bundle.json has no shard)", dir);
    if (!doc_string(p->doc, "config", "sha256") || !doc_string(p->doc, "environment", "kparity_version"))
        return kp_fail(err, KP_EXIT_USAGE, "merge: part %s: bundle.json lacks config.sha256 or environment.kparity_version", dir);
    p->shard = (int)index, p->count = (int)count;
    return 0;
}

/* The receipt's position in its config. */
static int64_t config_index(const cJSON *receipt) {
    int64_t i;
    return doc_int(cJSON_GetObjectItemCaseSensitive(receipt, "case"), "config_index", NULL, &i) ? -1 : i;
}

typedef struct entry {
    int64_t index;
    cJSON *receipt;
    const part *from;
} entry;

static int by_index(const void *a, const void *b) {
    const int64_t x = ((const entry *)a)->index, y = ((const entry *)b)->index;
    return (x > y) - (x < y);
}

/* Copy the part's artifacts/ into the merged bundle, checking each file's bytes against its name. */
static int copy_artifacts(const part *p, const char *out, kp_error *err) {
    char **files = NULL;
    size_t n = 0;
    int rc = kp_bundle_list_files(p->dir, &files, &n, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (strncmp(files[i], "artifacts/", 10)) continue;
        char *src = NULL, *dst = NULL, *buf = NULL, hex[KP_SHA256_HEX_LEN];
        size_t len = 0;
        struct stat st;
        if (asprintf(&src, "%s/%s", p->dir, files[i]) < 0 || asprintf(&dst, "%s/%s", out, files[i]) < 0)
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
        else if (!(rc = kp_read_file(src, &buf, &len, err))) {
            kp_sha256_hex(buf, len, hex);
            if (strlen(files[i]) != 10 + 64 + 4 || strncmp(files[i] + 10, hex, 64))
                rc = kp_fail(err, KP_EXIT_USAGE, "merge: part %s: %s does not hold the bytes its name says", p->dir, files[i]);
            else if (stat(dst, &st) != 0) rc = kp_write_file_atomic(dst, buf, len, err); /* else: the same bytes */
        }
        free(src), free(dst), free(buf);
    }
    kp_bundle_free_list(files, n);
    return rc;
}

/* The verdict of the whole, as one run of every case would have given it: the runner's rule (kp_bundle_verdict)
 * over the merged receipts, with what receipts cannot show carried from the parts' verdicts (a part that timed out,
 * a part whose device was lost: FAILED with no FAILED receipt). */
static const char *merged_verdict(const part *parts, int n, const cJSON *rows, int *code) {
    int timed_out = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        const char *v = doc_string(parts[i].doc, "verdict", NULL);
        timed_out |= v && !strcmp(v, "TIMEOUT");
        failed |= v && !strcmp(v, "FAILED");
    }
    return kp_bundle_rows_verdict(rows, timed_out, failed, code);
}

int kp_cmd_merge(int argc, char **argv) {
    kp_error err = {0};
    const char *out = NULL, *dirs[MAX_PARTS];
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "kparity: merge: unknown or incomplete option '%s' (kparity merge B1 B2 ... --out B)\n", argv[i]);
            return KP_EXIT_USAGE;
        } else if (n < MAX_PARTS) dirs[n++] = argv[i];
        else {
            fprintf(stderr, "kparity: merge: more than %d parts\n", MAX_PARTS);
            return KP_EXIT_USAGE;
        }
    }
    if (!out || n < 1) {
        fprintf(stderr, "kparity: merge: needs the parts and --out B (kparity merge B1 B2 ... --out B)\n");
        return KP_EXIT_USAGE;
    }
    part *parts = calloc((size_t)n, sizeof *parts);
    entry *entries = NULL;
    int nentries = 0, rc = parts ? 0 : kp_fail(&err, KP_EXIT_ENV, "out of memory");
    for (int i = 0; !rc && i < n; i++) rc = read_part(dirs[i], &parts[i], &err);
    /* one config, one version, shards 1..N of one N, each once */
    for (int i = 1; !rc && i < n; i++) {
        if (strcmp(doc_string(parts[i].doc, "config", "sha256"), doc_string(parts[0].doc, "config", "sha256")))
            rc = kp_fail(&err, KP_EXIT_USAGE, "merge: %s ran config %s (sha256 %.12s...), %s config %s (sha256 %.12s...): parts of "
                         "different configs do not make one run", parts[i].dir, doc_string(parts[i].doc, "config", "name"),
                         doc_string(parts[i].doc, "config", "sha256"), parts[0].dir, doc_string(parts[0].doc, "config", "name"),
                         doc_string(parts[0].doc, "config", "sha256"));
        else if (strcmp(doc_string(parts[i].doc, "environment", "kparity_version"),
                        doc_string(parts[0].doc, "environment", "kparity_version")))
            rc = kp_fail(&err, KP_EXIT_USAGE, "merge: %s was made by kparity %s, %s by kparity %s", parts[i].dir,
                         doc_string(parts[i].doc, "environment", "kparity_version"), parts[0].dir,
                         doc_string(parts[0].doc, "environment", "kparity_version"));
        else if (parts[i].count != parts[0].count)
            rc = kp_fail(&err, KP_EXIT_USAGE, "merge: %s is a shard of %d, %s of %d", parts[i].dir, parts[i].count, parts[0].dir,
                         parts[0].count);
    }
    for (int s = 1; !rc && s <= parts[0].count; s++) {
        int seen = 0;
        for (int i = 0; i < n; i++)
            if (parts[i].shard == s && seen++) rc = kp_fail(&err, KP_EXIT_USAGE, "merge: shard %d/%d is given twice (%s)", s, parts[0].count, parts[i].dir);
        if (!rc && !seen)
            rc = kp_fail(&err, KP_EXIT_USAGE, "merge: shard %d/%d is missing: the merged bundle would not be the whole config", s,
                         parts[0].count);
    }
    /* every receipt of every part, in config order */
    for (int i = 0; !rc && i < n; i++) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(parts[i].doc, "receipts"), *r;
        cJSON_ArrayForEach(r, list) {
            const char *file = doc_string(r, "file", NULL);
            char *path = NULL;
            entry e = {.from = &parts[i]};
            if (!file || asprintf(&path, "%s/%s", parts[i].dir, file) < 0) {
                rc = kp_fail(&err, KP_EXIT_USAGE, "merge: part %s: a bundle.json receipt entry has no file", parts[i].dir);
                break;
            }
            rc = kp_bundle_read_json(path, &e.receipt, &err);
            free(path);
            if (rc) break;
            if ((e.index = config_index(e.receipt)) < 0) {
                cJSON_Delete(e.receipt);
                rc = kp_fail(&err, KP_EXIT_USAGE, "merge: part %s: %s has no case.config_index (made before shards existed?)",
                             parts[i].dir, file);
                break;
            }
            entry *grown = realloc(entries, sizeof *entries * (size_t)(nentries + 1));
            if (!grown) {
                cJSON_Delete(e.receipt);
                rc = kp_fail(&err, KP_EXIT_ENV, "out of memory");
                break;
            }
            entries = grown;
            entries[nentries++] = e;
        }
    }
    if (!rc) qsort(entries, (size_t)nentries, sizeof *entries, by_index);
    for (int i = 1; !rc && i < nentries; i++)
        if (entries[i].index == entries[i - 1].index)
            rc = kp_fail(&err, KP_EXIT_USAGE, "merge: case %lld of the config is in both %s and %s", (long long)entries[i].index,
                         entries[i - 1].from->dir, entries[i].from->dir);
    kp_bundle *b = NULL;
    if (!rc) rc = kp_bundle_open(&b, out, &err);
    for (int i = 0; !rc && i < n; i++) rc = copy_artifacts(&parts[i], out, &err);
    for (int i = 0; !rc && i < nentries; i++) {
        rc = kp_bundle_add_receipt(b, entries[i].receipt, &err); /* takes the receipt; re-indexes and re-chains it */
        entries[i].receipt = NULL;
    }
    int code = 0;
    if (!rc) {
        const char *verdict = merged_verdict(parts, n, kp_bundle_rows(b), &code);
        cJSON *meta = cJSON_CreateObject();
        const char *keep[] = {"config", "host_budget_bytes", "device_budget_bytes", "timeout_s", "environment"};
        for (size_t k = 0; k < sizeof keep / sizeof *keep; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(parts[0].doc, keep[k]);
            if (x) cJSON_AddItemToObject(meta, keep[k], cJSON_Duplicate(x, 1));
        }
        cJSON_AddStringToObject(meta, "command", "merge");
        double wall = 0;
        cJSON *from = cJSON_AddArrayToObject(meta, "merged_from");
        for (int i = 0; i < n; i++) {
            cJSON *f = cJSON_CreateObject();
            cJSON_AddItemToArray(from, f);
            cJSON_AddStringToObject(f, "bundle", parts[i].dir);
            kp_json_add_int(f, "shard", parts[i].shard);
            kp_json_add_int(f, "of", parts[i].count);
            cJSON_AddStringToObject(f, "verdict", doc_string(parts[i].doc, "verdict", NULL) ? doc_string(parts[i].doc, "verdict", NULL) : "");
            const char *head = doc_string(parts[i].doc, "chain_head", NULL);
            cJSON_AddStringToObject(f, "chain_head", head ? head : "");
            const cJSON *env = cJSON_GetObjectItemCaseSensitive(parts[i].doc, "environment");
            if (env) cJSON_AddItemToObject(f, "environment", cJSON_Duplicate(env, 1));
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(parts[i].doc, "wall_s");
            if (cJSON_IsNumber(w)) wall += w->valuedouble;
        }
        kp_json_add_double(meta, "parts_wall_s", wall);
        rc = kp_bundle_finish(b, verdict, code, meta, &err);
        if (!rc) printf("%s: %d receipts from %d parts; verdict %s (exit %d)\n", out, nentries, n, verdict, code);
    }
    for (int i = 0; i < nentries; i++) cJSON_Delete(entries[i].receipt);
    for (int i = 0; parts && i < n; i++) cJSON_Delete(parts[i].doc);
    free(entries), free(parts);
    kp_bundle_free(b);
    if (rc) {
        fprintf(stderr, "kparity: %s\n", err.msg);
        return rc;
    }
    return code;
}
