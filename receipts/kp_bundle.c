/* kp_bundle.c: writing a bundle: the folder, content-addressed artifacts, hash-chained receipts,
 * then the reports, bundle.json and, last, manifest.sha256 over everything else. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_bundle.h"
#include "kp_fileio.h"
#include "kp_report.h"
#include "kp_verdict.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kp_json.h"
#include "kp_npy.h"


/* An artifact encoded but not yet written. */
typedef struct pending {
    char *path;
    unsigned char *bytes;
    size_t len;
    char digest[KP_SHA256_HEX_LEN];
} pending;

struct kp_bundle {
    char *dir;
    int64_t count;                 /* receipts written */
    char prev[KP_SHA256_HEX_LEN];  /* digest of the last receipt file, the next receipt's chain.prev */
    cJSON *rows;                   /* per receipt: file, sha256, case, result, reasons, checks (for the reports) */
    int finished;
    pthread_mutex_t pend_lock;     /* a watchdog may write a receipt while a check adds artifacts */
    pending *pend;                 /* artifacts to write before the next receipt (kp_bundle_add_artifact) */
    size_t npend, pend_cap, pend_bytes;
};

#define PENDING_MAX_BYTES ((size_t)64 << 20) /* written at once past this, not held for the receipt */
#define WRITERS 16                           /* syncs in flight: they wait on the disk, not on a core */

static int in_vocabulary(const char *s) { return kp_result_parse(s) >= 0; }

static char *join(const char *dir, const char *rel) {
    char *p = NULL;
    return asprintf(&p, "%s/%s", dir, rel) < 0 ? NULL : p;
}

static char *parent_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* mkdir, as one file operation of the fault hook (kp_fault_point). */
static int fault_mkdir(const char *path) {
    int f = kp_fault_point(1);
    if (f) errno = f;
    return f ? -1 : mkdir(path, 0755);
}

/* Every write past kp_bundle_open: a failure there is the machine's (kp_bundle_open made the folder and
 * wrote in it), and the run stops with the bundle unfinished, which verify calls incomplete. */
static int bundle_write_failed(const kp_bundle *b, kp_error *err) {
    err->code = KP_EXIT_ENV;
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n, "; the bundle stays unfinished (kparity verify %s says what is missing)",
             b->dir);
    return KP_EXIT_ENV;
}

static int bundle_write(const kp_bundle *b, const char *path, const void *data, size_t len, kp_error *err) {
    return kp_write_file_atomic(path, data, len, err) ? bundle_write_failed(b, err) : 0;
}

/* Explain a failed mkdir of the bundle folder in terms of its parent, since that is what the
 * user has to fix. */
static int creation_failed(const char *dir, int e, kp_error *err) {
    char *parent = parent_of(dir);
    const char *p = parent ? parent : "its parent";
    struct stat st;
    int rc;
    if (e == ENOENT) rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot create the bundle folder: parent %s does not exist", dir, p);
    else if (e == ENOTDIR || (stat(p, &st) == 0 && !S_ISDIR(st.st_mode)))
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot create the bundle folder: %s (a parent of it is a file, not a folder)",
                     dir, strerror(e));
    else rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot create the bundle folder: %s (is %s writable?)", dir, strerror(e), p);
    free(parent);
    return rc;
}

/* An empty handle on folder `dir` (trailing slashes dropped), its chain at the zero digest; NULL with err filled. */
static kp_bundle *bundle_new(const char *dir, const char *doing, kp_error *err) {
    kp_bundle *b = calloc(1, sizeof *b);
    if (b) pthread_mutex_init(&b->pend_lock, NULL);
    if (!b || !(b->dir = strdup(dir)) || !(b->rows = cJSON_CreateArray())) {
        kp_bundle_free(b);
        kp_fail(err, KP_EXIT_ENV, "out of memory %s bundle %s", doing, dir);
        return NULL;
    }
    size_t n = strlen(b->dir);
    while (n > 1 && b->dir[n - 1] == '/') b->dir[--n] = '\0';
    memcpy(b->prev, KP_ZERO_DIGEST, KP_SHA256_HEX_LEN);
    return b;
}

int kp_bundle_open(kp_bundle **out, const char *dir, kp_error *err) {
    *out = NULL;
    if (!dir || !*dir) return kp_fail(err, KP_EXIT_USAGE, "bundle folder: empty path");
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return kp_fail(err, KP_EXIT_USAGE, "%s: exists and is not a folder; a bundle needs a new or empty folder", dir);
        DIR *d = opendir(dir);
        if (!d) return kp_fail(err, KP_EXIT_USAGE, "%s: cannot read the folder: %s", dir, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            /* Refusing beats mixing: an old manifest or stray receipt would make the new bundle fail verify. */
            kp_fail(err, KP_EXIT_USAGE, "%s: folder is not empty (it holds '%s'); a bundle needs a new or empty folder",
                    dir, e->d_name);
            closedir(d);
            return KP_EXIT_USAGE;
        }
        closedir(d);
    } else if (errno != ENOENT || fault_mkdir(dir) != 0) {
        return creation_failed(dir, errno, err);
    }

    kp_bundle *b = bundle_new(dir, "opening", err);
    if (!b) return err->code;
    /* Making the two subfolders is also the writability check: it is the first write into `dir`. */
    const char *subs[] = {"receipts", "artifacts"};
    for (int i = 0; i < 2; i++) {
        char *p = join(b->dir, subs[i]);
        int ok = p && fault_mkdir(p) == 0;
        int e = errno;
        free(p);
        if (!ok) {
            kp_fail(err, KP_EXIT_USAGE, "%s: cannot create %s/ in it: %s (is the folder writable?)", dir, subs[i], strerror(e));
            kp_bundle_free(b);
            return KP_EXIT_USAGE;
        }
    }
    *out = b;
    return 0;
}


/* The pending artifacts written, each atomically and synced (kp_write_file_atomic), then forgotten; the first
 * failure in their order is err. With a fault armed, one after the other, so its operations keep their count. */
struct writers {
    pending *p;
    size_t n;
    atomic_size_t next;
    kp_error *errs;
    int *rcs;
};

static void *write_pending(void *arg) {
    struct writers *w = arg;
    for (size_t i; (i = atomic_fetch_add(&w->next, 1)) < w->n;)
        w->rcs[i] = kp_write_file_atomic_in(w->p[i].path, w->p[i].bytes, w->p[i].len, false, &w->errs[i]);
    return NULL;
}

static int flush_pending(kp_bundle *b, kp_error *err) {
    pthread_mutex_lock(&b->pend_lock); /* taken whole: those added from now on wait for the next flush */
    pending *p = b->pend;
    const size_t n = b->npend;
    b->pend = NULL, b->npend = b->pend_cap = b->pend_bytes = 0;
    pthread_mutex_unlock(&b->pend_lock);
    if (!n) return free(p), 0;
    int rc = 0;
    kp_error *errs = calloc(n, sizeof *errs);
    int *rcs = calloc(n, sizeof *rcs);
    if (!errs || !rcs) {
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory writing %zu artifacts", n);
    } else {
        struct writers w = {p, n, 0, errs, rcs};
        pthread_t th[WRITERS];
        int started = 0;
        if (!kp_fault_armed())
            while (started < WRITERS && (size_t)started < n / 2 && !pthread_create(&th[started], NULL, write_pending, &w))
                started++;
        write_pending(&w); /* this thread too; alone when no other started */
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        for (size_t i = 0; i < n && !rc; i++)
            if (rcs[i]) *err = errs[i], rc = bundle_write_failed(b, err);
        char *folder = rc ? NULL : join(b->dir, "artifacts"); /* their names, in one sync of the folder */
        if (!rc && !folder) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
        else if (!rc && kp_sync_folder(folder, p[0].path, err)) rc = bundle_write_failed(b, err);
        free(folder);
    }
    free(errs), free(rcs);
    for (size_t i = 0; i < n; i++) free(p[i].path), free(p[i].bytes);
    free(p);
    return rc;
}

int kp_bundle_add_artifact(kp_bundle *b, const char *descr, int ndim, const int64_t *shape, const void *data,
                           size_t data_bytes, char digest[KP_SHA256_HEX_LEN], char relpath[128], kp_error *err) {
    if (b->finished) return kp_fail(err, KP_EXIT_USAGE, "%s: bundle already finished; no artifact can be added", b->dir);
    unsigned char *buf;
    size_t len;
    if (kp_npy_encode(descr, ndim, shape, data, data_bytes, &buf, &len, err)) return err->code;
    kp_sha256_hex(buf, len, digest);
    snprintf(relpath, 128, "artifacts/%s.npy", digest);
    char *path = join(b->dir, relpath);
    struct stat st;
    if (!path) return free(buf), kp_fail(err, KP_EXIT_ENV, "out of memory");
    if (stat(path, &st) == 0) return free(path), free(buf), 0; /* named by the digest of these bytes: held already */
    pthread_mutex_lock(&b->pend_lock);
    int rc = 0, held = 0;
    for (size_t i = 0; i < b->npend && !held; i++) held = !memcmp(b->pend[i].digest, digest, KP_SHA256_HEX_LEN);
    if (!held && b->npend == b->pend_cap) {
        const size_t cap = b->pend_cap ? 2 * b->pend_cap : 64;
        pending *grown = realloc(b->pend, sizeof *grown * cap);
        if (grown) b->pend = grown, b->pend_cap = cap;
        else rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
    }
    if (!held && !rc) {
        pending *p = &b->pend[b->npend++];
        p->path = path, p->bytes = buf, p->len = len, path = NULL, buf = NULL;
        memcpy(p->digest, digest, KP_SHA256_HEX_LEN);
        b->pend_bytes += len;
    }
    const bool full = b->pend_bytes > PENDING_MAX_BYTES;
    pthread_mutex_unlock(&b->pend_lock);
    free(path), free(buf); /* held already, or not queued */
    return rc ? rc : full ? flush_pending(b, err) : 0;
}

static int replace_member(cJSON *obj, const char *key, cJSON *value) {
    if (!value) return 0;
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, value);
    if (cJSON_AddItemToObject(obj, key, value)) return 1;
    cJSON_Delete(value);
    return 0;
}

/* What the reports and verify rely on, checked while the harness can still say which receipt. */
static int check_receipt(const kp_bundle *b, const cJSON *r, int64_t index, kp_error *err) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "case");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"));
    const char *result = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(r, "result"));
    if (!cJSON_IsObject(r) || !name)
        return kp_fail(err, KP_EXIT_USAGE, "receipt %lld: no case.name string", (long long)index);
    if (!in_vocabulary(result))
        return kp_fail(err, KP_EXIT_USAGE, "receipt %lld (%s): result '%s' is not PASSED, INCORRECT, FAILED, NOT_RUN or "
                       "NOT_SUPPORTED", (long long)index, name, result ? result : "(missing)");
    const cJSON *checks = cJSON_GetObjectItemCaseSensitive(r, "checks"), *x;
    if (checks && !cJSON_IsArray(checks))
        return kp_fail(err, KP_EXIT_USAGE, "receipt %lld (%s): \"checks\" is not an array", (long long)index, name);
    cJSON_ArrayForEach(x, checks) {
        const char *cr = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "result"));
        if (!in_vocabulary(cr))
            return kp_fail(err, KP_EXIT_USAGE, "receipt %lld (%s): a check's result '%s' is not in the result vocabulary",
                           (long long)index, name, cr ? cr : "(missing)");
    }
    const cJSON *artifacts = cJSON_GetObjectItemCaseSensitive(r, "artifacts");
    if (artifacts && !cJSON_IsArray(artifacts))
        return kp_fail(err, KP_EXIT_USAGE, "receipt %lld (%s): \"artifacts\" is not an array", (long long)index, name);
    cJSON_ArrayForEach(x, artifacts) {
        const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "file"));
        const char *sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(x, "sha256"));
        char expected[128];
        snprintf(expected, sizeof expected, "artifacts/%s.npy", sha ? sha : "");
        char *path = file ? join(b->dir, file) : NULL;
        struct stat st;
        int held = path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
        free(path);
        if (!file || !sha || strlen(sha) != 64 || strcmp(file, expected) != 0 || !held)
            return kp_fail(err, KP_EXIT_USAGE, "receipt %lld (%s): artifact entry '%s' is not a file this bundle holds "
                           "(add it with kp_bundle_add_artifact; \"file\" must be artifacts/<sha256>.npy)",
                           (long long)index, name, file ? file : "(no file)");
    }
    return 0;
}

int kp_bundle_add_row(cJSON *rows, const char *file, const char *digest, const cJSON *receipt) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(receipt, "case");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"));
    const char *result = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(receipt, "result"));
    cJSON *reasons = cJSON_GetObjectItemCaseSensitive(receipt, "reasons");
    cJSON *checks = cJSON_GetObjectItemCaseSensitive(receipt, "checks");
    cJSON *impls = cJSON_GetObjectItemCaseSensitive(receipt, "impls"); /* report.html's impl times */
    cJSON *row = name && result ? cJSON_CreateObject() : NULL;
    if (!row || !cJSON_AddItemToArray(rows, row)) {
        cJSON_Delete(row);
        return -1;
    }
    if (!cJSON_AddStringToObject(row, "file", file) || !cJSON_AddStringToObject(row, "sha256", digest) ||
        !cJSON_AddStringToObject(row, "case", name) || !cJSON_AddStringToObject(row, "result", result) ||
        !replace_member(row, "reasons", reasons ? cJSON_Duplicate(reasons, 1) : cJSON_CreateArray()) ||
        !replace_member(row, "checks", checks ? cJSON_Duplicate(checks, 1) : cJSON_CreateArray()) ||
        (impls && !replace_member(row, "impls", cJSON_Duplicate(impls, 1))))
        return -1;
    return 0;
}

/* Record a written receipt for the reports and bundle.json, and make it the chain's head. */
static int add_row(kp_bundle *b, const char *rel, const char digest[KP_SHA256_HEX_LEN], const cJSON *receipt,
                   int64_t index, kp_error *err) {
    if (kp_bundle_add_row(b->rows, rel, digest, receipt))
        return kp_fail(err, KP_EXIT_ENV, "out of memory recording receipt %lld", (long long)index);
    memcpy(b->prev, digest, KP_SHA256_HEX_LEN);
    b->count = index;
    return 0;
}

int kp_bundle_add_receipt(kp_bundle *b, cJSON *receipt, kp_error *err) {
    int64_t index = b->count + 1;
    char rel[64], digest[KP_SHA256_HEX_LEN];
    char *text = NULL, *path = NULL;
    int rc = 0;
    if (b->finished) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: bundle already finished; no receipt can be added", b->dir);
        goto out;
    }
    if ((rc = flush_pending(b, err))) goto out; /* its artifacts are on disk before it is */
    if ((rc = check_receipt(b, receipt, index, err))) goto out;
    cJSON *chain = cJSON_CreateObject();
    if (!replace_member(receipt, "index", kp_json_int(index)) || !chain ||
        !cJSON_AddStringToObject(chain, "prev", b->prev) || !replace_member(receipt, "chain", chain)) {
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory building receipt %lld", (long long)index);
        goto out;
    }
    char *printed = kp_json_print(receipt);
    if (!printed || asprintf(&text, "%s\n", printed) < 0) text = NULL;
    cJSON_free(printed);
    snprintf(rel, sizeof rel, "receipts/%04lld.json", (long long)index);
    if (!text || !(path = join(b->dir, rel))) {
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory printing receipt %lld", (long long)index);
        goto out;
    }
    if ((rc = bundle_write(b, path, text, strlen(text), err))) goto out;
    kp_sha256_hex(text, strlen(text), digest);
    rc = add_row(b, rel, digest, receipt, index, err);
out:
    free(text);
    free(path);
    cJSON_Delete(receipt);
    return rc;
}

static int write_text(const kp_bundle *b, const char *rel, char *text, kp_error *err) {
    if (!text) return kp_fail(err, KP_EXIT_ENV, "out of memory rendering %s", rel);
    char *path = join(b->dir, rel);
    int rc = path ? bundle_write(b, path, text, strlen(text), err) : kp_fail(err, KP_EXIT_ENV, "out of memory");
    free(path);
    free(text);
    return rc;
}

static cJSON *bundle_doc(const kp_bundle *b, const char *verdict, int exit_code, cJSON *meta, kp_error *err) {
    cJSON *doc = cJSON_CreateObject(), *list = NULL;
    if (!doc || !cJSON_AddStringToObject(doc, "schema", "kparity.bundle/v1") || !cJSON_AddStringToObject(doc, "verdict", verdict) ||
        !kp_json_add_int(doc, "exit_code", exit_code) || !(list = cJSON_AddArrayToObject(doc, "receipts")))
        goto oom;
    const cJSON *row;
    cJSON_ArrayForEach(row, b->rows) {
        cJSON *entry = cJSON_CreateObject();
        if (!entry || !cJSON_AddItemToArray(list, entry)) {
            cJSON_Delete(entry);
            goto oom;
        }
        const char *keys[] = {"file", "sha256", "case", "result"};
        for (int k = 0; k < 4; k++)
            if (!cJSON_AddStringToObject(entry, keys[k], cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(row, keys[k]))))
                goto oom;
    }
    if (!cJSON_AddStringToObject(doc, "chain_head", b->prev)) goto oom;
    /* meta adds to the bundle's own members and never replaces one: verify trusts receipts and chain_head. */
    while (meta && meta->child) {
        cJSON *m = cJSON_DetachItemViaPointer(meta, meta->child);
        if (!m->string || cJSON_GetObjectItemCaseSensitive(doc, m->string)) {
            kp_fail(err, KP_EXIT_USAGE, "%s/bundle.json: meta member '%s' clashes with one the bundle writes",
                    b->dir, m->string ? m->string : "(unnamed)");
            cJSON_Delete(m);
            cJSON_Delete(doc);
            return NULL;
        }
        if (!cJSON_AddItemToObject(doc, m->string, m)) {
            cJSON_Delete(m);
            goto oom;
        }
    }
    return doc;
oom:
    cJSON_Delete(doc);
    kp_fail(err, KP_EXIT_ENV, "out of memory building bundle.json");
    return NULL;
}

int kp_bundle_finish(kp_bundle *b, const char *verdict, int exit_code, cJSON *meta, kp_error *err) {
    int rc = 0;
    if (b->finished) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: bundle already finished", b->dir);
        goto out;
    }
    if (meta && !cJSON_IsObject(meta)) {
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: bundle meta is not a JSON object", b->dir);
        goto out;
    }
    if ((rc = flush_pending(b, err))) goto out;
    if (!verdict) verdict = "";
    char why[300];
    if (!kp_bundle_verdict_fits(b->rows, verdict, exit_code, why, sizeof why)) { /* verify would refuse the bundle */
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: cannot finish the bundle: %s", b->dir, why);
        goto out;
    }
    /* bundle.json first in memory: a meta clash then fails before any file is written. */
    cJSON *doc = bundle_doc(b, verdict, exit_code, meta, err);
    if (!doc) {
        rc = err->code;
        goto out;
    }
    char *printed = kp_json_print(doc), *text = NULL;
    cJSON_Delete(doc);
    if (!printed || asprintf(&text, "%s\n", printed) < 0) text = NULL;
    cJSON_free(printed);
    if (!text) {
        rc = kp_fail(err, KP_EXIT_ENV, "out of memory printing bundle.json");
        goto out;
    }
    if ((rc = write_text(b, "junit.xml", kp_report_junit(b->rows), err)) ||
        (rc = write_text(b, "summary.md", kp_report_summary_md(b->rows, verdict, exit_code), err)) ||
        (rc = write_text(b, "report.html", kp_report_html(b->rows, verdict, exit_code), err))) {
        free(text);
        goto out;
    }
    if ((rc = write_text(b, "bundle.json", text, err))) goto out;
    /* Last, so it covers every other file in its final form. */
    if ((rc = kp_bundle_write_manifest(b->dir, err))) {
        bundle_write_failed(b, err);
        goto out;
    }
    b->finished = 1;
out:
    cJSON_Delete(meta);
    return rc;
}

void kp_bundle_free(kp_bundle *b) {
    if (!b) return;
    for (size_t i = 0; i < b->npend; i++) free(b->pend[i].path), free(b->pend[i].bytes); /* never referenced */
    free(b->pend);
    pthread_mutex_destroy(&b->pend_lock);
    free(b->dir);
    cJSON_Delete(b->rows);
    free(b);
}

int64_t kp_bundle_count(const kp_bundle *b) { return b->count; }
const cJSON *kp_bundle_rows(const kp_bundle *b) { return b->rows; }

/* Remove what writes that never finished left in one folder of the bundle (kp_write_file_atomic's
 * temporary files); nothing else is touched. */
int kp_bundle_drop_temp_files(const char *folder, kp_error *err) {
    DIR *d = opendir(folder);
    if (!d) return kp_fail(err, KP_EXIT_ENV, "%s: cannot read the folder: %s", folder, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d)) != NULL) {
        if (!kp_bundle_is_temp_name(e->d_name)) continue;
        char *p = join(folder, e->d_name);
        if (!p || unlink(p) != 0) rc = kp_fail(err, KP_EXIT_ENV, "%s/%s: cannot remove a write that never finished: %s",
                                                folder, e->d_name, p ? strerror(errno) : "out of memory");
        free(p);
    }
    closedir(d);
    return rc;
}

int kp_bundle_resume(kp_bundle **out, const char *dir, kp_error *err) {
    *out = NULL;
    kp_bundle *b = bundle_new(dir, "reopening", err);
    if (!b) return err->code;
    int rc = 0;
    struct stat st;
    const char *finished[] = {"bundle.json", "manifest.sha256"}, *subs[] = {"", "receipts", "artifacts"};
    for (int i = 0; !rc && i < 2; i++) {
        char *p = join(dir, finished[i]);
        if (!p) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
        else if (stat(p, &st) == 0) rc = kp_fail(err, KP_EXIT_ENV, "%s: already finished (it has %s); nothing can be added", dir, finished[i]);
        free(p);
    }
    for (int i = 0; !rc && i < 3; i++) {
        char *p = *subs[i] ? join(dir, subs[i]) : strdup(dir);
        rc = p ? kp_bundle_drop_temp_files(p, err) : kp_fail(err, KP_EXIT_ENV, "out of memory");
        free(p);
    }
    for (int64_t index = 1; !rc; index++) {
        char rel[64], digest[KP_SHA256_HEX_LEN], *path = NULL, *text = NULL;
        size_t len = 0, at = 0;
        snprintf(rel, sizeof rel, "receipts/%04lld.json", (long long)index);
        if (!(path = join(dir, rel))) {
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
            break;
        }
        if (stat(path, &st) != 0) { /* the first receipt not written: the end */
            free(path);
            break;
        }
        cJSON *r = NULL;
        int64_t got = 0;
        if (kp_read_file(path, &text, &len, err)) rc = KP_EXIT_ENV;
        else if (!(r = kp_json_parse(text, len, &at)))
            rc = kp_fail(err, KP_EXIT_ENV, "%s: does not parse as JSON (byte %zu); the bundle cannot be continued", path, at);
        else {
            kp_sha256_hex(text, len, digest);
            const char *prev = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "chain"), "prev"));
            if (kp_json_get_int(r, "index", &got) || got != index || !prev || strcmp(prev, b->prev))
                rc = kp_fail(err, KP_EXIT_ENV, "%s: its index or chain.prev is not what receipt %lld of this bundle would hold",
                             path, (long long)index);
            else rc = add_row(b, rel, digest, r, index, err);
        }
        cJSON_Delete(r);
        free(text);
        free(path);
    }
    if (rc) {
        kp_bundle_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

int kp_bundle_write_manifest(const char *dir, kp_error *err) {
    char **paths;
    size_t count;
    if (kp_bundle_list_files(dir, &paths, &count, err)) return err->code;
    size_t cap = count * 80 + 1; /* 64 hex + 2 spaces + newline + the path, below */
    for (size_t i = 0; i < count; i++) cap += strlen(paths[i]);
    char *text = malloc(cap), *at = text;
    int rc = text ? 0 : kp_fail(err, KP_EXIT_ENV, "out of memory writing the manifest");
    for (size_t i = 0; !rc && i < count; i++) {
        if (strcmp(paths[i], "manifest.sha256") == 0) continue;
        char *full = join(dir, paths[i]), hex[KP_SHA256_HEX_LEN];
        if (!full) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
        else if (!(rc = kp_sha256_file_hex(full, hex, err))) at += sprintf(at, "%s  %s\n", hex, paths[i]);
        free(full);
    }
    if (!rc) {
        char *path = join(dir, "manifest.sha256");
        rc = path ? kp_write_file_atomic(path, text, (size_t)(at - text), err) : kp_fail(err, KP_EXIT_ENV, "out of memory");
        free(path);
    }
    free(text);
    kp_bundle_free_list(paths, count);
    return rc;
}

int kp_bundle_read_json(const char *path, cJSON **out, kp_error *err) {
    *out = NULL;
    char *text;
    size_t len, at = 0;
    if (kp_read_file(path, &text, &len, err)) return err->code;
    cJSON *doc = kp_json_parse(text, len, &at);
    if (!doc) {
        size_t line = 1;
        for (size_t i = 0; i < at && i < len; i++) line += text[i] == '\n';
        free(text);
        return kp_fail(err, KP_EXIT_USAGE, "%s: not valid JSON (line %zu, byte %zu)", path, line, at);
    }
    free(text);
    *out = doc;
    return 0;
}
