/* export_index.c: an export's case.json read back: the files it names, checked as names and against the SHA-256s it
 * records, for `kparity export --force` (what it may replace) and `kparity judge DIR` (the case and the outputs). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "kp_export.h"

/* A file name case.json may give: one plain name in the folder. */
static int plain_name(const char *s) {
    return s && s[0] && s[0] != '.' && !strchr(s, '/') && strcmp(s, KP_EXPORT_INDEX) != 0 && strlen(s) < 256;
}

static int hex_digest(const char *s) {
    if (!s || strlen(s) != 64) return 0;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
    return 1;
}

static int add_ref(const cJSON *entry, const char *where, const char *index, kp_export_file **refs, size_t *n, kp_error *err) {
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "file"));
    const char *sha = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(entry, "sha256"));
    if (!plain_name(file))
        return kp_fail(err, KP_EXIT_USAGE, "%s: %s.file: expected the name of a file in the folder (no '/', not hidden)",
                       index, where);
    if (!hex_digest(sha))
        return kp_fail(err, KP_EXIT_USAGE, "%s: %s.sha256: expected 64 lowercase hex digits", index, where);
    for (size_t i = 0; i < *n; i++)
        if (!strcmp((*refs)[i].file, file))
            return kp_fail(err, KP_EXIT_USAGE, "%s: %s.file: '%s' is listed twice (also at %s)", index, where, file,
                           (*refs)[i].where);
    kp_export_file *grown = realloc(*refs, sizeof **refs * (*n + 1));
    if (!grown) return kp_fail(err, KP_EXIT_ENV, "out of host memory reading %s", index);
    *refs = grown;
    grown[*n] = (kp_export_file){file, sha, ""};
    snprintf(grown[*n].where, sizeof grown[*n].where, "%s", where);
    (*n)++;
    return 0;
}

/* Every file a case.json names (inputs, reference, extras, each impl's files), checked as names and digests; the refs
 * point into doc. `index` names case.json in messages. */
static int index_files(const cJSON *doc, const char *index, kp_export_file **refs, size_t *n, kp_error *err) {
    *refs = NULL, *n = 0;
    static const char *const lists[] = {"inputs", "reference", "extras"};
    char where[96];
    for (size_t l = 0; l < sizeof lists / sizeof *lists; l++) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(doc, lists[l]), *e;
        if (!cJSON_IsArray(list)) return kp_fail(err, KP_EXIT_USAGE, "%s: %s: expected an array", index, lists[l]);
        int i = 0;
        cJSON_ArrayForEach(e, list) {
            snprintf(where, sizeof where, "%s[%d]", lists[l], i++);
            if (add_ref(e, where, index, refs, n, err)) return err->code;
        }
    }
    const cJSON *impls = cJSON_GetObjectItemCaseSensitive(doc, "impls"), *impl;
    if (!cJSON_IsArray(impls)) return kp_fail(err, KP_EXIT_USAGE, "%s: impls: expected an array", index);
    int i = 0;
    cJSON_ArrayForEach(impl, impls) {
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(impl, "files"), *f;
        if (!cJSON_IsArray(files)) return kp_fail(err, KP_EXIT_USAGE, "%s: impls[%d].files: expected an array", index, i);
        int j = 0;
        cJSON_ArrayForEach(f, files) {
            snprintf(where, sizeof where, "impls[%d].files[%d]", i, j++);
            if (add_ref(f, where, index, refs, n, err)) return err->code;
        }
        i++;
    }
    return 0;
}

/* dir/case.json, parsed, of this schema. */
static int read_index(const char *dir, const char *index, cJSON **doc, kp_error *err) {
    char *text;
    size_t len;
    *doc = NULL;
    int rc = kp_read_file(index, &text, &len, err);
    if (rc) return rc;
    *doc = kp_json_parse(text, len, NULL);
    free(text);
    if (!cJSON_IsObject(*doc)) {
        cJSON_Delete(*doc), *doc = NULL;
        return kp_fail(err, KP_EXIT_USAGE, "%s: not a JSON object", index);
    }
    const char *schema = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*doc, "schema"));
    if (!schema || strcmp(schema, KP_EXPORT_SCHEMA)) {
        cJSON_Delete(*doc), *doc = NULL;
        return kp_fail(err, KP_EXIT_USAGE, "%s: schema: expected \"%s\" (the folder %s is not a kparity export)", index,
                       KP_EXPORT_SCHEMA, dir);
    }
    return 0;
}

int kp_export_index(const char *dir, cJSON **doc, kp_export_file **files, size_t *n, kp_error *err) {
    char *index;
    *doc = NULL, *files = NULL, *n = 0;
    if (asprintf(&index, "%s/%s", dir, KP_EXPORT_INDEX) < 0) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    int rc = read_index(dir, index, doc, err);
    if (!rc) rc = index_files(*doc, index, files, n, err);
    if (rc) cJSON_Delete(*doc), *doc = NULL, free(*files), *files = NULL;
    free(index);
    return rc;
}

void kp_export_folder_free(kp_export_folder *f) {
    for (int i = 0; i < f->nimpls; i++)
        for (int k = 0; k < f->impls[i].nfiles; k++) free(f->impls[i].files[k]);
    free(f->impls);
    memset(f, 0, sizeof *f);
}

static int verify_files(const char *dir, const char *index, const kp_export_file *refs, size_t n, kp_error *err) {
    for (size_t i = 0; i < n; i++) {
        char *path, hex[KP_SHA256_HEX_LEN];
        if (asprintf(&path, "%s/%s", dir, refs[i].file) < 0) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
        int rc = kp_sha256_file_hex(path, hex, err);
        if (!rc && strcmp(hex, refs[i].sha256))
            rc = kp_fail(err, KP_EXIT_USAGE, "%s: its SHA-256 is %s, and %s records %s (%s.sha256): the file changed "
                         "since it was exported", path, hex, index, refs[i].sha256, refs[i].where);
        free(path);
        if (rc) return rc;
    }
    return 0;
}

static int read_impls(const char *dir, const char *index, const cJSON *doc, const kp_family *fam, kp_export_folder *out,
                      kp_error *err) {
    const cJSON *impls = cJSON_GetObjectItemCaseSensitive(doc, "impls"), *impl;
    const int n = cJSON_GetArraySize(impls);
    out->impls = calloc(n ? (size_t)n : 1, sizeof *out->impls);
    if (!out->impls) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    int i = 0;
    cJSON_ArrayForEach(impl, impls) {
        kp_export_impl *e = &out->impls[out->nimpls++];
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(impl, "impl"));
        if (!name || strlen(name) >= sizeof e->name)
            return kp_fail(err, KP_EXIT_USAGE, "%s: impls[%d].impl: expected an impl's name", index, i);
        snprintf(e->name, sizeof e->name, "%s", name);
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(impl, "files"), *f;
        const char *by_output[KP_MAX_TENSORS] = {0}; /* each output's file */
        cJSON_ArrayForEach(f, files) { /* every file names an output of the family, once */
            const char *o = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "name"));
            const int k = kp_family_output_index(fam, o);
            if (k < 0) {
                char names[256];
                kp_family_output_list(fam, names, sizeof names);
                return kp_fail(err, KP_EXIT_USAGE, "%s: impls[%d].files: '%s' is not an output of %s (its outputs: %s)",
                               index, i, o ? o : "(no name)", fam->name, names);
            }
            if (by_output[k]) return kp_fail(err, KP_EXIT_USAGE, "%s: impls[%d].files: output %s twice", index, i, o);
            by_output[k] = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "file"));
        }
        for (int k = 0; fam->output_names[k]; k++) { /* in the family's order */
            if (!by_output[k]) continue;
            if (asprintf(&e->files[e->nfiles], "%s/%s", dir, by_output[k]) < 0) {
                e->files[e->nfiles] = NULL;
                return kp_fail(err, KP_EXIT_ENV, "out of host memory");
            }
            e->nfiles++;
        }
        i++;
    }
    return 0;
}

int kp_export_read(const char *dir, kp_export_folder *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    char *index;
    if (asprintf(&index, "%s/%s", dir, KP_EXPORT_INDEX) < 0) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    cJSON *doc = NULL;
    kp_export_file *refs = NULL;
    size_t nrefs = 0;
    int rc = read_index(dir, index, &doc, err);
    const char *name = rc ? NULL : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "case"));
    kp_case c;
    if (!rc && !name) rc = kp_fail(err, KP_EXIT_USAGE, "%s: case: expected the case's name", index);
    if (!rc && (kp_case_parse(name, &c, err) || kp_case_normalize(&c, err))) rc = err->code, kp_error_prefix(err, "%s: case: ", index);
    if (!rc && (kp_case_format(&c, out->case_name, sizeof out->case_name) < 0 || strcmp(out->case_name, name)))
        rc = kp_fail(err, KP_EXIT_USAGE, "%s: case: '%s' is not in canonical form (kparity writes %s)", index, name,
                     out->case_name);
    const kp_family *fam = rc ? NULL : kp_family_find(c.family);
    if (!rc && !fam) rc = kp_fail(err, KP_EXIT_USAGE, "%s: case: family %s has no harness family", index, c.family);
    if (!rc) rc = index_files(doc, index, &refs, &nrefs, err);
    if (!rc) rc = verify_files(dir, index, refs, nrefs, err);
    if (!rc) rc = read_impls(dir, index, doc, fam, out, err);
    if (rc) kp_export_folder_free(out);
    free(refs);
    cJSON_Delete(doc);
    free(index);
    return rc;
}
