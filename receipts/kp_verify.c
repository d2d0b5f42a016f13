/* kp_verify.c: `kparity verify`: recheck a bundle byte for byte (manifest.sha256, no file added or
 * removed) and then what the digests alone cannot show (bundle.json's receipt list, the chain, artifacts, and
 * what the receipts give: the verdict, junit.xml, summary.md, report.html).
 * A signed bundle's envelope (kp_sign.h) lies outside the manifest; `--pubkey` checks it there. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kp_verify.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kp_bundle.h"
#include "kp_fileio.h"
#include "kp_json.h"
#include "kp_report.h"
#include "kp_sign.h"
#include "kp_verdict.h"

typedef struct {
    char *path;
    char hex[KP_SHA256_HEX_LEN];
    int line;
} manifest_entry;

typedef struct {
    const char *dir;
    manifest_entry *entries;
    size_t count;
} manifest;

static void free_manifest(manifest *m) {
    for (size_t i = 0; i < m->count; i++) free(m->entries[i].path);
    free(m->entries);
}

/* A path the writer could have produced: relative, '/'-separated, no empty, "." or ".." part. */
static int clean_relative_path(const char *p, size_t n) {
    if (n == 0 || p[0] == '/' || p[n - 1] == '/') return 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && ((unsigned char)p[i] < 0x20 || p[i] == 0x7F || p[i] == '\\')) return 0;
        if (i == n || p[i] == '/') {
            size_t part = i - start;
            if (part == 0 || (part == 1 && p[start] == '.') || (part == 2 && p[start] == '.' && p[start + 1] == '.'))
                return 0;
            start = i + 1;
        }
    }
    return 1;
}

/* Strict on purpose: the writer emits one canonical form, so any other byte means the manifest changed. */
static int parse_manifest(manifest *m, const char *text, size_t len, kp_error *err) {
    size_t pos = 0, cap = 0;
    int line = 0;
    while (pos < len) {
        line++;
        const char *at = text + pos, *eol = memchr(at, '\n', len - pos);
        size_t n = eol ? (size_t)(eol - at) : len - pos;
        int ok = eol && n > 66 && at[64] == ' ' && at[65] == ' ' && clean_relative_path(at + 66, n - 66);
        for (int i = 0; ok && i < 64; i++) ok = (at[i] >= '0' && at[i] <= '9') || (at[i] >= 'a' && at[i] <= 'f');
        if (!ok) {
            /* Quote the line: it usually still shows which file it was about. */
            char shown[160];
            size_t k = 0;
            for (; k < n && k + 1 < sizeof shown; k++) shown[k] = (unsigned char)at[k] < 0x20 ? '?' : at[k];
            shown[k] = '\0';
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: manifest.sha256: line %d is malformed (expected "
                           "'<64 lowercase hex>  <relative path>' and a newline): '%s'", m->dir, line, shown);
        }
        if (m->count == cap) {
            cap = cap ? 2 * cap : 32;
            manifest_entry *grown = realloc(m->entries, cap * sizeof *grown);
            if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of memory reading manifest.sha256");
            m->entries = grown;
        }
        manifest_entry *e = &m->entries[m->count];
        if (!(e->path = strndup(at + 66, n - 66))) return kp_fail(err, KP_EXIT_ENV, "out of memory reading manifest.sha256");
        m->count++;
        memcpy(e->hex, at, 64);
        e->hex[64] = '\0';
        e->line = line;
        if (strcmp(e->path, "manifest.sha256") == 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: manifest.sha256: line %d lists the manifest itself", m->dir, line);
        if (m->count > 1 && strcmp(m->entries[m->count - 2].path, e->path) >= 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: manifest.sha256: line %d (%s) is out of order or repeated",
                           m->dir, line, e->path);
        pos += n + 1;
    }
    return 0;
}

static const manifest_entry *lookup(const manifest *m, const char *path) {
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->entries[mid].path, path);
        if (c == 0) return &m->entries[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Walk the manifest and the files on disk together, both sorted, so the first bad path in path
 * order is the one reported, whatever kind of damage it is. */
static int check_files(const manifest *m, char **disk, size_t n_disk, kp_error *err) {
    size_t i = 0, j = 0;
    while (i < m->count || j < n_disk) {
        /* The signature envelope is written after the manifest and checked by kp_sign_check (and a sign that
         * never finished may have left a temporary file of it); a manifest that lists either is held to it. */
        if (j < n_disk && (strcmp(disk[j], "manifest.sha256") == 0 ||
                           ((strcmp(disk[j], KP_SIGN_ENVELOPE) == 0 || kp_sign_is_leftover(disk[j])) && !lookup(m, disk[j])))) {
            j++;
            continue;
        }
        const manifest_entry *e = i < m->count ? &m->entries[i] : NULL;
        int c = !e ? 1 : j == n_disk ? -1 : strcmp(e->path, disk[j]);
        if (c < 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: listed in manifest.sha256 (line %d) but missing",
                           m->dir, e->path, e->line);
        if (c > 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: present but not listed in manifest.sha256 (an added file)",
                           m->dir, disk[j]);
        char *full = NULL, hex[KP_SHA256_HEX_LEN];
        if (asprintf(&full, "%s/%s", m->dir, e->path) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
        int rc = kp_sha256_file_hex(full, hex, err);
        free(full);
        if (rc) return rc;
        if (strcmp(hex, e->hex) != 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: SHA-256 %s does not match manifest.sha256 line %d (%s)",
                           m->dir, e->path, hex, e->line, e->hex);
        i++;
        j++;
    }
    return 0;
}

static const char *str_at(const cJSON *obj, const char *key) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(obj, key));
}

static int same(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

/* Receipt `file`, number `index`, read whole into *out, its own index and its chain link to `prev` checked. `alone`:
 * the walk of an unfinished bundle, whose messages say more about how a run writes. */
static int read_linked_receipt(const manifest *m, const char *file, int64_t index, const char *prev, int alone, cJSON **out,
                               kp_error *err) {
    *out = NULL;
    char *path = NULL;
    if (asprintf(&path, "%s/%s", m->dir, file) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    cJSON *r = NULL;
    int rc = kp_bundle_read_json(path, &r, err);
    free(path);
    if (rc) return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: not valid JSON%s", m->dir, file,
                           alone ? " (a receipt is written whole or not at all, so this one was damaged after)" : "");
    int64_t got = 0;
    const char *chain_prev = str_at(cJSON_GetObjectItemCaseSensitive(r, "chain"), "prev");
    if (kp_json_get_int(r, "index", &got) != 0 || got != index)
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: \"index\" is not %lld (receipts out of order)", m->dir, file,
                     (long long)index);
    else if (!same(chain_prev, prev) && alone)
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: chain.prev %s is not the digest of receipts/%04lld.json, %s "
                     "(chain broken: one of the two was changed)", m->dir, file, chain_prev ? chain_prev : "(none)",
                     (long long)index - 1, prev);
    else if (!same(chain_prev, prev))
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: chain.prev %s is not the previous receipt's digest %s "
                     "(chain broken)", m->dir, file, chain_prev ? chain_prev : "(none)", prev);
    *out = r;
    return rc;
}

/* The artifacts receipt `r` (`file`) names: each held by the bundle, with the digest the receipt records. */
static int check_named_artifacts(const manifest *m, const char *file, const cJSON *r, int alone, kp_error *err) {
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(r, "artifacts")) {
        const char *af = str_at(a, "file"), *sha = str_at(a, "sha256");
        const manifest_entry *ae = af ? lookup(m, af) : NULL;
        if (!ae)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: names artifact '%s', which the bundle does not hold%s",
                           m->dir, file, af ? af : "(no file)", alone ? " (a run writes a receipt's artifacts before it)" : "");
        if (!same(sha, ae->hex))
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: %s records sha256 %s, the artifact has %s", m->dir, af,
                           file, sha ? sha : "(none)", ae->hex);
    }
    return 0;
}

/* bundle.json's entry of a receipt is {file, sha256, case, result}: what the bundle writes, nothing else. */
static int entry_members(const cJSON *entry) {
    static const char *const keys[] = {"file", "sha256", "case", "result"};
    int n = 0;
    for (const cJSON *x = cJSON_IsObject(entry) ? entry->child : NULL; x; x = x->next, n++) {
        int known = 0;
        for (size_t k = 0; k < 4; k++) known |= x->string && !strcmp(x->string, keys[k]);
        if (!known) return 0;
    }
    return n == 4;
}

/* One receipt against bundle.json's entry, the chain, and the artifacts it names; its report row appended to
 * `rows` when given. */
static int check_receipt(const manifest *m, const cJSON *entry, int64_t index, const char *prev, cJSON *rows,
                         kp_error *err) {
    char file[64];
    snprintf(file, sizeof file, "receipts/%04lld.json", (long long)index);
    const char *listed = str_at(entry, "file");
    if (rows && !entry_members(entry))
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: the entry of receipt %lld is not {file, sha256, "
                       "case, result}, as the bundle writes it", m->dir, (long long)index);
    if (!same(listed, file))
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: receipt %lld is listed as '%s', expected %s",
                       m->dir, (long long)index, listed ? listed : "(none)", file);
    const manifest_entry *me = lookup(m, file);
    if (!me) return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: listed in bundle.json but missing", m->dir, file);
    if (!same(str_at(entry, "sha256"), me->hex))
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: bundle.json records sha256 %s, the file has %s", m->dir, file,
                       str_at(entry, "sha256") ? str_at(entry, "sha256") : "(none)", me->hex);
    cJSON *r = NULL;
    int rc = read_linked_receipt(m, file, index, prev, 0, &r, err);
    if (!rc && (!same(str_at(cJSON_GetObjectItemCaseSensitive(r, "case"), "name"), str_at(entry, "case")) ||
                !same(str_at(r, "result"), str_at(entry, "result"))))
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: case name or result differs from its bundle.json entry",
                     m->dir, file);
    if (!rc) rc = check_named_artifacts(m, file, r, 0, err);
    if (!rc && rows && kp_bundle_add_row(rows, file, me->hex, r)) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
    cJSON_Delete(r);
    return rc;
}

/* A member name given twice in one object, anywhere in `node`: readers differ on which one counts (cJSON, so
 * kparity, takes the first; jq and Python the last), so a second "verdict" could say PASSED to them alone. */
static const char *repeated_member(const cJSON *node) {
    for (const cJSON *x = node->child; x; x = x->next) {
        if (cJSON_IsObject(node))
            for (const cJSON *y = x->next; y; y = y->next)
                if (x->string && y->string && !strcmp(x->string, y->string)) return x->string;
        const char *inner = repeated_member(x);
        if (inner) return inner;
    }
    return NULL;
}

/* The first line where `want` and `got` differ, for the message: "line N: the receipts give '...', the file has
 * '...'", each cut short and with control bytes shown as '?'. */
static void first_difference(const char *want, const char *got, size_t got_len, char *out, size_t out_size) {
    size_t i = 0, line = 1, start = 0, want_len = strlen(want);
    while (i < want_len && i < got_len && want[i] == got[i]) {
        if (want[i] == '\n') line++, start = i + 1;
        i++;
    }
    char shown[2][100];
    const char *texts[2] = {want, got};
    const size_t lens[2] = {want_len, got_len};
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        for (size_t j = start; j < lens[k] && texts[k][j] != '\n' && n + 4 < sizeof shown[k]; j++)
            shown[k][n++] = (unsigned char)texts[k][j] < 0x20 || texts[k][j] == 0x7F ? '?' : texts[k][j];
        if (start + n < lens[k] && texts[k][start + n] != '\n') shown[k][n++] = '.', shown[k][n++] = '.', shown[k][n++] = '.';
        shown[k][n] = '\0';
    }
    snprintf(out, out_size, "line %zu: the receipts give '%s'%s, the file has '%s'%s", line, shown[0],
             i >= want_len ? " and end there" : "", shown[1], i >= got_len ? " and ends there" : "");
}

/* junit.xml, summary.md and report.html against what the receipts give: rendered again from `rows` (kp_report_*, as
 * finish renders them), with the verdict and exit code bundle.json records (checked before), byte for byte. */
static int check_reports(const manifest *m, const cJSON *rows, const char *verdict, int exit_code, kp_error *err) {
    static const char *const names[] = {"junit.xml", "summary.md", "report.html"};
    for (int k = 0; k < 3; k++) {
        char *want = k == 0 ? kp_report_junit(rows) : k == 1 ? kp_report_summary_md(rows, verdict, exit_code)
                                                            : kp_report_html(rows, verdict, exit_code);
        char *path = NULL, *got = NULL;
        size_t len = 0;
        int rc = !want || asprintf(&path, "%s/%s", m->dir, names[k]) < 0 ? kp_fail(err, KP_EXIT_ENV, "out of memory") : 0;
        if (!rc && !lookup(m, names[k])) /* the manifest lists every file there (checked before) */
            rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: missing (a finished bundle has the junit.xml, summary.md "
                         "and report.html its receipts give)", m->dir, names[k]);
        if (!rc) rc = kp_read_file(path, &got, &len, err);
        if (!rc && (len != strlen(want) || memcmp(want, got, len))) {
            char where[300];
            first_difference(want, got, len, where, sizeof where);
            rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s does not match what the receipts give (%s)", m->dir,
                         names[k], where);
        }
        free(want), free(path), free(got);
        if (rc) return rc;
    }
    return 0;
}

/* What a finished bundle derives from its receipts (`rows`): bundle.json's verdict and exit code, then the reports.
 * bundle.json is held to its content, not its spelling: its receipts list, chain_head and schema (checked before),
 * verdict and exit_code are what the receipts give, and no member name is given twice; its other members (config,
 * environment, timings: nothing a receipt holds) and its whitespace are covered by the manifest and a signature. */
static int check_derived(const manifest *m, const cJSON *doc, const cJSON *rows, kp_error *err) {
    const char *twice = repeated_member(doc);
    if (twice)
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: member '%s' appears twice in one object (readers "
                       "differ on which counts; the bundle writes each once)", m->dir, twice);
    const char *verdict = str_at(doc, "verdict");
    int64_t code = 0;
    char why[300];
    if (kp_json_get_int(doc, "exit_code", &code))
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: no integer exit_code (verdict %s)", m->dir,
                       verdict ? verdict : "(missing)");
    if (!kp_bundle_verdict_fits(rows, verdict, code, why, sizeof why))
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: %s", m->dir, why);
    return check_reports(m, rows, verdict, (int)code, err);
}

/* bundle.json against the receipts; `finished` (the manifest is there): also what it and the reports derive from them. */
static int check_bundle_json(const manifest *m, int finished, kp_error *err) {
    char *path = NULL;
    if (asprintf(&path, "%s/bundle.json", m->dir) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    cJSON *doc = NULL;
    struct stat st;
    int there = stat(path, &st) == 0;
    int rc = kp_bundle_read_json(path, &doc, err);
    free(path);
    if (rc && !there)
        return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: missing, though manifest.sha256 is there (a run "
                       "writes bundle.json before its manifest)", m->dir);
    if (rc) return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: not valid JSON", m->dir);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(doc, "receipts"), *entry;
    cJSON *rows = finished ? cJSON_CreateArray() : NULL;
    if (finished && !rows) rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
    char prev[KP_SHA256_HEX_LEN] = KP_ZERO_DIGEST;
    int64_t index = 0;
    if (!rc && (!same(str_at(doc, "schema"), "kparity.bundle/v1") || !cJSON_IsArray(list)))
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: not a kparity.bundle/v1 document with a receipts list",
                     m->dir);
    cJSON_ArrayForEach(entry, list) {
        if (rc) break;
        rc = check_receipt(m, entry, ++index, prev, rows, err);
        if (!rc) memcpy(prev, lookup(m, str_at(entry, "file"))->hex, KP_SHA256_HEX_LEN);
    }
    /* Every file in receipts/ must be one bundle.json lists: receipts/0001.json .. receipts/<count>.json. */
    for (size_t i = 0; !rc && i < m->count; i++) {
        const char *p = m->entries[i].path;
        if (strncmp(p, "receipts/", 9) != 0) continue;
        long long k = 0;
        char again[64];
        int listed = sscanf(p, "receipts/%lld.json", &k) == 1 && k >= 1 && k <= index &&
                     (snprintf(again, sizeof again, "receipts/%04lld.json", k), strcmp(again, p) == 0);
        if (!listed)
            rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: in receipts/ but not listed in bundle.json", m->dir, p);
    }
    if (!rc && !same(str_at(doc, "chain_head"), prev))
        rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: bundle.json: chain_head %s is not the last receipt's digest %s",
                     m->dir, str_at(doc, "chain_head") ? str_at(doc, "chain_head") : "(none)", prev);
    if (!rc && finished) rc = check_derived(m, doc, rows, err);
    cJSON_Delete(rows);
    cJSON_Delete(doc);
    return rc;
}

/* Artifacts are named by their digest; one whose bytes no longer match its name was swapped. */
static int check_artifact_names(const manifest *m, kp_error *err) {
    for (size_t i = 0; i < m->count; i++) {
        const manifest_entry *e = &m->entries[i];
        if (strncmp(e->path, "artifacts/", 10) != 0) continue;
        char expected[128];
        snprintf(expected, sizeof expected, "artifacts/%s.npy", e->hex);
        if (strcmp(expected, e->path) != 0)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: content does not match its name (artifacts are "
                           "named artifacts/<sha256>.npy)", m->dir, e->path);
    }
    return 0;
}

/* Whether dir/rel exists (as a folder when `folder`). */
static int present(const char *dir, const char *rel, int folder) {
    char *p = NULL;
    struct stat st;
    if (asprintf(&p, "%s/%s", dir, rel) < 0) return 0;
    int there = stat(p, &st) == 0 && (!folder || S_ISDIR(st.st_mode));
    free(p);
    return there;
}

/* The files a run writes, by name: receipts/NNNN.json, artifacts/<sha256>.npy and the finished bundle's own. */
static int written_by_a_run(const char *path) {
    static const char *const finish[] = {"bundle.json", "junit.xml", "summary.md", "report.html"};
    for (size_t i = 0; i < sizeof finish / sizeof *finish; i++)
        if (strcmp(path, finish[i]) == 0) return 1;
    long long k;
    char again[64];
    if (sscanf(path, "receipts/%lld.json", &k) == 1 && k >= 1 &&
        (snprintf(again, sizeof again, "receipts/%04lld.json", k), strcmp(again, path) == 0))
        return 1;
    size_t n = strlen(path);
    if (n != 10 + 64 + 4 || strncmp(path, "artifacts/", 10) != 0 || strcmp(path + n - 4, ".npy") != 0) return 0;
    for (size_t i = 10; i < 74; i++)
        if (!((path[i] >= '0' && path[i] <= '9') || (path[i] >= 'a' && path[i] <= 'f'))) return 0;
    return 1;
}

/* A temporary file of a write that never finished, in a folder a run writes into. */
static int unfinished_write(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t folder = slash ? (size_t)(slash - path) : 0;
    int in_run_folder = !slash || (folder == 8 && !strncmp(path, "receipts", 8)) || (folder == 9 && !strncmp(path, "artifacts", 9));
    return in_run_folder && kp_bundle_is_temp_name(base);
}

/* The receipts of a bundle without bundle.json, walked as a run writes them: 0001 on, each whole, its index
 * its own, chained to the one before, naming only artifacts the bundle holds with their digests. */
static int check_receipts_alone(const manifest *m, int64_t *count, cJSON **last, kp_error *err) {
    char prev[KP_SHA256_HEX_LEN] = KP_ZERO_DIGEST;
    *count = 0;
    *last = NULL;
    for (int64_t index = 1;; index++) {
        char file[64];
        snprintf(file, sizeof file, "receipts/%04lld.json", (long long)index);
        const manifest_entry *me = lookup(m, file);
        if (!me) break;
        cJSON *r = NULL;
        int rc = read_linked_receipt(m, file, index, prev, 1, &r, err);
        if (!rc) rc = check_named_artifacts(m, file, r, 1, err);
        if (rc) {
            cJSON_Delete(r);
            return rc;
        }
        cJSON_Delete(*last);
        *last = r;
        *count = index;
        memcpy(prev, me->hex, KP_SHA256_HEX_LEN);
    }
    for (size_t i = 0; i < m->count; i++) {
        long long k = 0;
        if (sscanf(m->entries[i].path, "receipts/%lld.json", &k) == 1 && k > *count)
            return kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: present, but receipt %lld is not (a run writes them in "
                           "order)", m->dir, m->entries[i].path, (long long)*count + 1);
    }
    return 0;
}

/* A bundle with no manifest: its run stopped before the end (killed, the disk full, a crash), or the manifest
 * was removed. Everything there is checked as verify checks a finished bundle, with digests taken from the
 * files themselves; when all of it is whole, the answer is "incomplete", naming the last receipt and what
 * is missing, never "intact". */
static int check_unfinished(const char *dir, kp_error *err) {
    manifest m = {.dir = dir};
    char **disk = NULL, unfinished[400] = "";
    size_t n_disk = 0, n_unfinished = 0, n_artifacts = 0, used = 0;
    int64_t count = 0;
    cJSON *last = NULL;
    int rc = kp_bundle_list_files(dir, &disk, &n_disk, err);
    if (rc == KP_EXIT_USAGE) {
        kp_error_prefix(err, "bundle %s: ", dir);
        rc = err->code = KP_EXIT_INCORRECT;
    }
    for (size_t i = 0; !rc && i < n_disk; i++) {
        if (unfinished_write(disk[i])) {
            if (n_unfinished++ < 3 && used + 1 < sizeof unfinished) {
                int w = snprintf(unfinished + used, sizeof unfinished - used, "%s%s", n_unfinished > 1 ? ", " : "", disk[i]);
                used = w < 0 || (size_t)w >= sizeof unfinished - used ? sizeof unfinished - 1 : used + (size_t)w;
            }
            continue;
        }
        if (!written_by_a_run(disk[i])) {
            rc = kp_fail(err, KP_EXIT_INCORRECT, "bundle %s: %s: present, but no kparity run writes such a file", dir, disk[i]);
            break;
        }
        manifest_entry *grown = realloc(m.entries, (m.count + 1) * sizeof *grown);
        if (!grown) {
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
            break;
        }
        m.entries = grown;
        manifest_entry *e = &m.entries[m.count];
        char *full = NULL;
        if (asprintf(&full, "%s/%s", dir, disk[i]) < 0 || !(e->path = strdup(disk[i]))) {
            free(full);
            rc = kp_fail(err, KP_EXIT_ENV, "out of memory");
            break;
        }
        m.count++;
        e->line = 0;
        rc = kp_sha256_file_hex(full, e->hex, err);
        free(full);
        n_artifacts += strncmp(disk[i], "artifacts/", 10) == 0;
    }
    if (!rc) rc = check_artifact_names(&m, err);
    if (!rc) rc = check_receipts_alone(&m, &count, &last, err);
    int have_bundle_json = lookup(&m, "bundle.json") != NULL;
    if (!rc && have_bundle_json) rc = check_bundle_json(&m, 0, err); /* the run stopped between bundle.json and the manifest */
    if (!rc) {
        char missing[160] = "";
        const char *finish[] = {"junit.xml", "summary.md", "report.html", "bundle.json"};
        for (size_t i = 0; i < 4; i++)
            if (!lookup(&m, finish[i])) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s, ", finish[i]);
        char *stopped = NULL, more[160] = "";
        const char *name = str_at(cJSON_GetObjectItemCaseSensitive(last, "case"), "name"), *result = str_at(last, "result");
        if (last ? asprintf(&stopped, "after receipt %lld (%s: %s)", (long long)count, name ? name : "?",
                            result ? result : "?") < 0
                 : !(stopped = strdup("before its first receipt")))
            stopped = NULL;
        int64_t planned = -1;
        if (last && kp_json_get_int(cJSON_GetObjectItemCaseSensitive(last, "run"), "cases", &planned)) planned = -1;
        if (planned > count)
            snprintf(more, sizeof more, ", and the receipts of %lld more of the %lld cases the run had (receipts/%04lld.json on)",
                     (long long)(planned - count), (long long)planned, (long long)count + 1);
        else if (planned < 0 && !have_bundle_json) /* no receipt says how many the run had */
            snprintf(more, sizeof more, ", and the receipts of any case after it");
        char whole[160] = "";
        if (count || n_artifacts)
            snprintf(whole, sizeof whole, "; what is there is whole (%lld receipt%s, chained, and %zu artifact%s matching "
                     "%s names)", (long long)count, count == 1 ? "" : "s", n_artifacts, n_artifacts == 1 ? "" : "s",
                     n_artifacts == 1 ? "its" : "their");
        char *text = NULL;
        int w = !stopped ? -1 : asprintf(&text, "bundle %s: incomplete: the run stopped %s; missing: %smanifest.sha256%s%s%s%s%s%s",
                         dir, stopped, missing, more, whole, n_unfinished ? "; " : "", n_unfinished ? "writes that never finished "
                         "(temporary files, no part of the record): " : "", unfinished, n_unfinished > 3 ? ", ..." : "");
        rc = kp_fail(err, KP_EXIT_INCORRECT, "%s", w < 0 ? "incomplete (out of memory describing it)" : text);
        free(text);
        free(stopped);
    }
    cJSON_Delete(last);
    kp_bundle_free_list(disk, n_disk);
    free_manifest(&m);
    return rc;
}

int kp_bundle_verify(const char *dir, kp_error *err) {
    struct stat st;
    if (stat(dir, &st) != 0) return kp_fail(err, KP_EXIT_USAGE, "%s: not a bundle: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return kp_fail(err, KP_EXIT_USAGE, "%s: not a bundle: not a folder", dir);
    if (!present(dir, "manifest.sha256", 0)) {
        /* receipts/ and artifacts/ are the first thing a run makes: with neither, it is no bundle at all */
        if (!present(dir, "receipts", 1) && !present(dir, "artifacts", 1) && !present(dir, "bundle.json", 0))
            return kp_fail(err, KP_EXIT_USAGE, "%s: not a kparity bundle (no manifest.sha256); hint: pass the folder given "
                           "to --out", dir);
        return check_unfinished(dir, err);
    }
    manifest m = {.dir = dir};
    char *text = NULL, *path = NULL, **disk = NULL;
    size_t len = 0, n_disk = 0;
    int rc;
    if (asprintf(&path, "%s/manifest.sha256", dir) < 0) return kp_fail(err, KP_EXIT_ENV, "out of memory");
    if ((rc = kp_read_file(path, &text, &len, err))) goto out;
    if ((rc = parse_manifest(&m, text, len, err))) goto out;
    if ((rc = kp_bundle_list_files(dir, &disk, &n_disk, err))) {
        /* a symlink, socket or unlistable name inside the bundle is damage, not a usage error */
        if (rc == KP_EXIT_USAGE) {
            kp_error_prefix(err, "bundle %s: ", dir);
            rc = err->code = KP_EXIT_INCORRECT;
        }
        goto out;
    }
    if ((rc = check_files(&m, disk, n_disk, err))) goto out;
    if ((rc = check_artifact_names(&m, err))) goto out;
    rc = check_bundle_json(&m, 1, err);
out:
    free(path);
    free(text);
    kp_bundle_free_list(disk, n_disk);
    free_manifest(&m);
    return rc;
}
