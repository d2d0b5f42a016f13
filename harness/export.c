/* export.c: `kparity export`: a case's inputs, reference, the family's extras and impl outputs as .npy, with a
 * case.json that says what each file is, written beside the target folder and renamed into place whole (reading one
 * back: harness/export_index.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cases/kp_rng.h"
#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "../receipts/kp_npy.h"
#include "kp_config.h"
#include "kp_device.h"
#include "kp_export.h"

#define MAX_EXPORT_IMPLS 16

static const char *const kind_names[] = {"input", "output", "reference", "extra"};

/* How a bf16 array is stored: numpy has no bfloat16, and the bits are what parity is judged on. */
static const char BF16_STORAGE[] = "a bf16 array is stored as <u2 (uint16): each element's raw 16 bits, the high half of the "
                                   "f32 of the same value; numpy: (np.load(f).astype(np.uint32) << 16).view(np.float32)";

/* ---- the target folder -------------------------------------------------------------------------------------- */

/* What is at --out before the export: nothing or an empty folder, or (with --force) a previous export, whose entries
 * (every one named by its case.json) are removed once the new export is in place. */
typedef struct previous {
    bool replacing;
    char **entries;
    size_t n;
} previous;

static void previous_free(previous *pv) {
    for (size_t i = 0; i < pv->n; i++) free(pv->entries[i]);
    free(pv->entries);
    memset(pv, 0, sizeof *pv);
}

static int list_entries(const char *dir, char ***names, size_t *n, kp_error *err) {
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return kp_fail(err, KP_EXIT_USAGE, "--out %s: cannot list the folder: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char **grown = realloc(*names, sizeof **names * (*n + 1));
        char *copy = grown ? strdup(e->d_name) : NULL;
        if (grown) *names = grown;
        if (!copy) rc = kp_fail(err, KP_EXIT_ENV, "out of host memory listing %s", dir);
        else (*names)[(*n)++] = copy;
    }
    closedir(d);
    return rc;
}

static int check_out(const char *out, bool force, previous *pv, kp_error *err) {
    memset(pv, 0, sizeof *pv);
    struct stat st;
    if (lstat(out, &st)) {
        if (errno == ENOENT) return 0;
        return kp_fail(err, KP_EXIT_USAGE, "--out %s: %s", out, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return kp_fail(err, KP_EXIT_USAGE, "--out %s: exists and is not a folder", out);
    if (list_entries(out, &pv->entries, &pv->n, err)) return err->code;
    if (!pv->n) return 0;
    if (!force)
        return kp_fail(err, KP_EXIT_USAGE, "--out %s: the folder is not empty (%zu entr%s, %s among them); export writes "
                       "into a new or empty folder, or with --force replaces a previous export there", out, pv->n,
                       pv->n == 1 ? "y" : "ies", pv->entries[0]);
    char *index;
    if (asprintf(&index, "%s/%s", out, KP_EXPORT_INDEX) < 0) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    cJSON *doc = NULL;
    kp_export_file *refs = NULL;
    size_t nrefs = 0;
    int rc = 0;
    if (access(index, F_OK))
        rc = kp_fail(err, KP_EXIT_USAGE, "--out %s: the folder is not empty and holds no %s: --force replaces only a "
                     "previous kparity export; give a new or empty folder", out, KP_EXPORT_INDEX);
    if (!rc && (rc = kp_export_index(out, &doc, &refs, &nrefs, err))) kp_error_prefix(err, "--out with --force: ");
    for (size_t i = 0; !rc && i < pv->n; i++) {
        char *path;
        if (asprintf(&path, "%s/%s", out, pv->entries[i]) < 0) {
            rc = kp_fail(err, KP_EXIT_ENV, "out of host memory");
            break;
        }
        int named = !strcmp(pv->entries[i], KP_EXPORT_INDEX);
        for (size_t k = 0; !named && k < nrefs; k++) named = !strcmp(refs[k].file, pv->entries[i]);
        if (!named || lstat(path, &st) || !S_ISREG(st.st_mode))
            rc = kp_fail(err, KP_EXIT_USAGE, "--out %s: --force replaces only a previous kparity export, and %s is not "
                         "one of its files (its %s does not name it%s); move it away or give another folder", out,
                         pv->entries[i], KP_EXPORT_INDEX, named ? ", or it is not a plain file" : "");
        free(path);
    }
    free(refs);
    cJSON_Delete(doc);
    free(index);
    pv->replacing = !rc;
    return rc;
}

/* "<parent>/.<base>.<what>-XXXXXX", made (an empty folder beside out, on its file system, so a rename moves it). */
static char *folder_beside(const char *out, const char *what, kp_error *err) {
    const char *slash = strrchr(out, '/');
    char *tmpl = NULL;
    const int n = slash ? asprintf(&tmpl, "%.*s/.%s.%s-XXXXXX", (int)(slash - out), out, slash + 1, what)
                        : asprintf(&tmpl, ".%s.%s-XXXXXX", out, what);
    if (n < 0) {
        kp_fail(err, KP_EXIT_ENV, "out of host memory");
        return NULL;
    }
    const int fault = kp_fault_point(1);
    if (fault || !mkdtemp(tmpl)) {
        const int e = fault ? fault : errno;
        kp_fail(err, e == ENOSPC || e == EIO ? KP_EXIT_ENV : KP_EXIT_USAGE, "--out %s: cannot make a folder beside it "
                "(%s): %s", out, tmpl, strerror(e));
        free(tmpl);
        return NULL;
    }
    chmod(tmpl, 0755); /* mkdtemp makes 0700; an export is meant to be read by others, as a bundle is */
    return tmpl;
}

/* Remove a folder this export made and every file in it (it holds only what the export wrote). */
static void remove_made(const char *dir) {
    char **names;
    size_t n;
    kp_error ignored = {0};
    if (!list_entries(dir, &names, &n, &ignored))
        for (size_t i = 0; i < n; i++) {
            char *path;
            if (asprintf(&path, "%s/%s", dir, names[i]) >= 0) unlink(path), free(path);
        }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    rmdir(dir);
}

static void sync_parent(const char *out) {
    const char *slash = strrchr(out, '/');
    char *parent = slash ? strndup(out, slash == out ? 1 : (size_t)(slash - out)) : strdup(".");
    const int fd = parent ? open(parent, O_RDONLY | O_DIRECTORY) : -1;
    if (fd >= 0) fsync(fd), close(fd);
    free(parent);
}

/* The previous export's entries (each named by its case.json when it was checked) out of `dir`, then dir itself. Each
 * removal is a file operation KPARITY_FAULT counts, for its kill (removing needs no room: a full disk fails none). */
static void drop_previous(const char *dir, const previous *pv) {
    for (size_t i = 0; i < pv->n; i++) {
        char *path;
        kp_fault_point(1);
        if (asprintf(&path, "%s/%s", dir, pv->entries[i]) >= 0) unlink(path), free(path);
    }
    kp_fault_point(1);
    if (rmdir(dir))
        fprintf(stderr, "kparity: export: the previous export's folder is left at %s: something was added to it during "
                "the export (%s)\n", dir, strerror(errno));
}

/* Move the finished export at tmp to out: one rename onto a missing or empty folder; a previous export is swapped with
 * it in one step (RENAME_EXCHANGE, so out is at every moment the old export or the new one) and then removed. */
static int install(const char *tmp, const char *out, const previous *pv, kp_error *err) {
    const int fault = kp_fault_point(1);
    if (fault) errno = fault;
    if (!pv->replacing) {
        if (fault || rename(tmp, out))
            return kp_fail(err, errno == ENOTEMPTY || errno == EEXIST ? KP_EXIT_USAGE : KP_EXIT_ENV,
                           "--out %s: cannot move the export into place: %s%s", out, strerror(errno),
                           errno == ENOTEMPTY || errno == EEXIST ? " (something was written there during the export)" : "");
        sync_parent(out);
        return 0;
    }
    if (fault || renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE))
        return kp_fail(err, KP_EXIT_ENV, "--out %s: cannot swap the export into place: %s%s", out, strerror(errno),
                       errno == EINVAL ? " (this file system cannot swap two folders in one step: remove the previous "
                                         "export, or export to a new folder)" : "");
    sync_parent(out);
    drop_previous(tmp, pv); /* tmp now holds the previous export */
    return 0;
}

/* ---- writing ------------------------------------------------------------------------------------------------ */

/* The shape with dim 0 n, as a JSON array. */
static cJSON *shape_json(const kp_tensor *t, int64_t n) {
    cJSON *s = cJSON_CreateArray();
    for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(s, kp_json_int(d ? t->shape[d] : n));
    return s;
}

static void describe(cJSON *e, const char *name, const char *file, const kp_tensor *t, int64_t n, const kp_array_doc *doc) {
    cJSON_AddStringToObject(e, "name", name);
    if (file) cJSON_AddStringToObject(e, "file", file);
    cJSON_AddStringToObject(e, "dtype", kp_dtype_name(t->dtype));
    cJSON_AddStringToObject(e, "npy_dtype", kp_dtype_npy(t->dtype));
    cJSON_AddItemToObject(e, "shape", shape_json(t, n));
    if (doc) {
        cJSON_AddStringToObject(e, "layout", doc->layout);
        cJSON_AddStringToObject(e, "meaning", doc->meaning);
    }
}

typedef struct export_run {
    const char *dir; /* the folder being written (beside out) */
    int nfiles;
    char names[64][256]; /* files written, for clashes */
} export_run;

/* t's first n slices of dim 0, densely, as run->dir/file, listed in `list` as array `name` with its documentation and
 * the SHA-256 of the file as written. */
static int write_array(export_run *run, const char *file, const char *name, const kp_tensor *t, int64_t n,
                       const kp_array_doc *doc, cJSON *list, kp_error *err) {
    for (int i = 0; i < run->nfiles; i++)
        if (!strcmp(run->names[i], file)) return kp_fail(err, KP_EXIT_ENV, "export: two arrays would both be %s", file);
    if (run->nfiles == 64 || strlen(file) >= sizeof run->names[0])
        return kp_fail(err, KP_EXIT_ENV, "export: more than 64 files, or the name %s is too long", file);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", run->dir, file) >= (int)sizeof path)
        return kp_fail(err, KP_EXIT_USAGE, "--out: the path of %s is too long", file);
    kp_tensor dense = *t;
    dense.shape[0] = n;
    dense.row_stride = 0;
    const size_t bytes = kp_tensor_slice_bytes(&dense) * (size_t)n;
    void *buf = kp_alloc(bytes ? bytes : 1, "export", err);
    if (!buf) return err->code;
    kp_tensor_copy_dense(t, 0, n, buf);
    int rc = kp_npy_write(path, kp_dtype_npy(t->dtype), t->ndim, dense.shape, buf, bytes, err);
    free(buf);
    char hex[KP_SHA256_HEX_LEN];
    if (!rc) rc = kp_sha256_file_hex(path, hex, err); /* the bytes as they lie on disk */
    if (rc) return rc;
    snprintf(run->names[run->nfiles++], sizeof run->names[0], "%s", file);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToArray(list, e);
    describe(e, name, file, t, n, doc);
    cJSON_AddStringToObject(e, "sha256", hex);
    return 0;
}

static int undocumented(const kp_family *fam, kp_array_kind kind, const char *name, kp_error *err) {
    if (kp_family_array_doc(fam, kind, name)) return 0;
    return kp_fail(err, KP_EXIT_ENV, "export: family %s documents no %s array '%s' (its array_docs, in harness/%s_family.c): "
                   "an export must say what each file is", fam->name, kind_names[kind], name, fam->name);
}

int kp_export_check_docs(kp_prepared *p, kp_error *err) {
    const kp_family *fam = p->fam;
    int rc = kp_reference_run(p, NULL, NULL, err);
    for (int k = 0; !rc && k < p->v.ninputs; k++) rc = undocumented(fam, KP_ARRAY_INPUT, p->v.inputs[k].name, err);
    kp_tensor t[KP_MAX_TENSORS];
    const int nout = rc ? 0 : fam->outputs(p->v.data, p->v.batch, t);
    for (int k = 0; !rc && k < nout; k++) rc = undocumented(fam, KP_ARRAY_OUTPUT, t[k].name, err);
    for (int k = 0; !rc && k < p->ref.narrays; k++) rc = undocumented(fam, KP_ARRAY_REFERENCE, p->ref.arrays[k].name, err);
    if (!rc && fam->export_extras) {
        cJSON *layout = cJSON_CreateObject();
        const int nextra = fam->export_extras(p->v.data, t, layout);
        cJSON_Delete(layout);
        KP_ASSERT(nextra >= 0 && nextra <= KP_MAX_TENSORS);
        for (int k = 0; !rc && k < nextra; k++) rc = undocumented(fam, KP_ARRAY_EXTRA, t[k].name, err);
    }
    return rc;
}

/* The impls to export: those named (each of the case's family, once), else every impl of the family that can run
 * here (host impls, and CUDA ones where a GPU answers). */
static int pick_impls(const kp_export_options *opt, const kp_family *fam, const kp_impl **impls, const char **declared,
                      int *n, kp_error *err) {
    *n = 0;
    if (opt->nimpls > MAX_EXPORT_IMPLS) return kp_fail(err, KP_EXIT_USAGE, "--impl: at most %d impls", MAX_EXPORT_IMPLS);
    for (int i = 0; i < opt->nimpls; i++) {
        const kp_impl *impl;
        if (kp_resolve_impl(opt->impls[i], "--impl", &impl, err)) return err->code;
        if (strcmp(impl->family, fam->name))
            return kp_fail(err, KP_EXIT_USAGE, "--impl %s: of family %s, the case is %s", opt->impls[i], impl->family,
                           fam->name);
        for (int j = 0; j < *n; j++)
            if (impls[j] == impl)
                return kp_fail(err, KP_EXIT_USAGE, "--impl %s: %s is named twice", opt->impls[i], impl->name);
        impls[*n] = impl, declared[(*n)++] = opt->impls[i];
    }
    for (int i = 0; !opt->nimpls && i < kp_impl_count() && *n < MAX_EXPORT_IMPLS; i++) {
        const kp_impl *impl = kp_impl_at(i);
        if (!strcmp(impl->family, fam->name) && (impl->memory == KP_MEMORY_HOST || kp_device_count() > 0))
            impls[*n] = impl, declared[(*n)++] = impl->name;
    }
    return 0;
}

static cJSON *versions_json(const kp_prepared *p) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "kparity", KPARITY_VERSION);
    cJSON *gen = cJSON_AddObjectToObject(v, "generator");
    cJSON_AddStringToObject(gen, "name", KP_GENERATOR_NAME);
    cJSON_AddStringToObject(gen, "inputs", p->fam->cases->generator_version);
    kp_json_add_int(gen, "curand_version", kp_curand_version());
    cJSON *ref = cJSON_AddObjectToObject(v, "reference");
    cJSON_AddStringToObject(ref, "provider", p->fam->reference_provider);
    cJSON_AddStringToObject(ref, "version", p->ref.digest_tag);
    if (p->fam->reference_rule) cJSON_AddStringToObject(ref, "rule", p->fam->reference_rule);
    /* the digest a receipt records as its reference's sha256 (over the tag, then its arrays' bytes): not a file's */
    cJSON_AddStringToObject(ref, "receipt_sha256", p->ref_digest);
    return v;
}

/* One impl run on the whole case and its outputs written. A named impl must run; of the family's impls taken by
 * default, one that refuses the case or has no device here is listed under not_exported instead. */
static int export_impl(export_run *run, kp_prepared *p, const kp_impl *impl, const char *declared, bool named,
                       const int64_t *rows, cJSON *impls, cJSON *skipped, kp_error *err) {
    kp_output *o = NULL;
    const kp_result st = kp_run_rows(p, impl, rows, p->v.batch, &o, NULL, err);
    if (st != KP_PASSED) {
        if (!named && (st == KP_NOT_SUPPORTED || st == KP_NOT_RUN)) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddItemToArray(skipped, s);
            cJSON_AddStringToObject(s, "impl", impl->name);
            cJSON_AddStringToObject(s, "result", kp_result_name(st));
            cJSON_AddStringToObject(s, "why", err->msg);
            err->msg[0] = '\0', err->code = 0;
            return 0;
        }
        kp_error_prefix(err, "--impl %s: %s: ", impl->name, kp_result_name(st));
        err->code = st == KP_NOT_SUPPORTED ? KP_EXIT_USAGE : KP_EXIT_ENV;
        return err->code;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToArray(impls, e);
    cJSON_AddStringToObject(e, "impl", impl->name);
    if (strcmp(declared, impl->name)) cJSON_AddStringToObject(e, "declared", declared);
    cJSON_AddStringToObject(e, "device", impl->memory == KP_MEMORY_CUDA ? "cuda" : "host");
    const char *sha = NULL, *origin = kp_impl_origin(impl, &sha);
    if (origin) {
        cJSON *pl = cJSON_AddObjectToObject(e, "plugin");
        cJSON_AddStringToObject(pl, "path", origin);
        if (sha) cJSON_AddStringToObject(pl, "sha256", sha);
    }
    cJSON *files = cJSON_AddArrayToObject(e, "files");
    int rc = 0;
    for (int k = 0; !rc && k < o->ntensors; k++) {
        char file[256];
        if (o->ntensors == 1) snprintf(file, sizeof file, "%s.npy", impl->name);
        else snprintf(file, sizeof file, "%s.%s.npy", impl->name, o->t[k].name);
        rc = write_array(run, file, o->t[k].name, &o->t[k], o->nrows, NULL, files, err);
    }
    kp_output_free(o);
    return rc;
}

/* Everything into run->dir, case.json last. */
static int write_export(export_run *run, const kp_family *fam, const kp_case *c, const char *canonical,
                        const kp_case *fields, const kp_impl *const *impls, const char *const *declared, int nimpls,
                        bool named, kp_error *err) {
    kp_prepared p;
    int rc = kp_prepare(fam, c, 0, &p, err);
    if (rc) return rc;
    int64_t *rows = NULL;
    cJSON *doc = cJSON_CreateObject();
    if ((rc = kp_export_check_docs(&p, err))) goto out; /* before any file: the reference too is computed here */
    kp_digests_settle(); /* the reference's digest, hashed on a worker thread */
    cJSON_AddStringToObject(doc, "schema", KP_EXPORT_SCHEMA);
    cJSON_AddStringToObject(doc, "case", canonical);
    cJSON_AddStringToObject(doc, "family", fam->name);
    cJSON *f = cJSON_AddObjectToObject(doc, "fields");
    for (int i = 0; i < fields->nparams; i++) cJSON_AddStringToObject(f, fields->params[i].key, fields->params[i].value);
    cJSON_AddItemToObject(doc, "versions", versions_json(&p));
    cJSON_AddStringToObject(doc, "bf16", BF16_STORAGE);
    cJSON *inputs = cJSON_AddArrayToObject(doc, "inputs");
    for (int k = 0; !rc && k < p.v.ninputs; k++) {
        const kp_tensor *t = &p.v.inputs[k];
        char file[128];
        snprintf(file, sizeof file, "%s.npy", t->name);
        rc = write_array(run, file, t->name, t, t->shape[0], kp_family_array_doc(fam, KP_ARRAY_INPUT, t->name), inputs, err);
    }
    cJSON *ref = cJSON_AddArrayToObject(doc, "reference");
    for (int k = 0; !rc && k < p.ref.narrays; k++) {
        const kp_tensor *t = &p.ref.arrays[k];
        char file[128];
        snprintf(file, sizeof file, "reference_%s.npy", t->name);
        rc = write_array(run, file, t->name, t, t->shape[0], kp_family_array_doc(fam, KP_ARRAY_REFERENCE, t->name), ref, err);
    }
    cJSON *extras = cJSON_AddArrayToObject(doc, "extras"), *layout = cJSON_AddObjectToObject(doc, "layout");
    kp_tensor t[KP_MAX_TENSORS];
    const int nextra = !rc && fam->export_extras ? fam->export_extras(p.v.data, t, layout) : 0;
    for (int k = 0; !rc && k < nextra; k++) {
        char file[128];
        snprintf(file, sizeof file, "%.40s.npy", t[k].name);
        rc = write_array(run, file, t[k].name, &t[k], t[k].shape[0], kp_family_array_doc(fam, KP_ARRAY_EXTRA, t[k].name),
                         extras, err);
    }
    cJSON *outputs = cJSON_AddArrayToObject(doc, "outputs");
    const int nout = fam->outputs(p.v.data, p.v.batch, t);
    for (int k = 0; k < nout; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(outputs, e);
        describe(e, t[k].name, NULL, &t[k], p.v.batch, kp_family_array_doc(fam, KP_ARRAY_OUTPUT, t[k].name));
    }
    cJSON *done = cJSON_AddArrayToObject(doc, "impls"), *skipped = cJSON_AddArrayToObject(doc, "not_exported");
    if (!rc && !(rows = kp_alloc(sizeof *rows * (size_t)p.v.batch, "export rows", err))) rc = err->code;
    for (int64_t r = 0; !rc && r < p.v.batch; r++) rows[r] = r;
    for (int i = 0; !rc && i < nimpls; i++) rc = export_impl(run, &p, impls[i], declared[i], named, rows, done, skipped, err);
    if (!rc) {
        char *text = kp_json_print(doc), path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", run->dir, KP_EXPORT_INDEX);
        rc = text ? kp_write_file_atomic(path, text, strlen(text), err) : kp_fail(err, KP_EXIT_ENV, "out of host memory");
        cJSON_free(text);
        if (!rc) run->nfiles++;
    }
out:
    free(rows);
    cJSON_Delete(doc);
    kp_prepared_release(&p);
    return rc;
}

int kp_export_case(const kp_export_options *opt, int *nfiles, kp_error *err) {
    *nfiles = 0;
    if (!opt->case_name || !opt->out || !opt->out[0])
        return kp_fail(err, KP_EXIT_USAGE, "export needs a case name and --out DIR");
    kp_case c, fields;
    char canonical[KP_CASE_NAME_MAX];
    int rc = kp_case_parse(opt->case_name, &c, err);
    if (!rc) rc = kp_case_normalize(&c, err);
    if (rc) return rc;
    const kp_family *fam = kp_family_find(c.family);
    if (!fam) return kp_fail(err, KP_EXIT_USAGE, "%s: family %s has no harness family", opt->case_name, c.family);
    fields = c;
    if (kp_case_format(&c, canonical, sizeof canonical) < 0)
        return kp_fail(err, KP_EXIT_USAGE, "%s: the case name is too long", opt->case_name);
    if ((rc = kp_case_fill_defaults(&fields, err))) return rc;
    const kp_impl *impls[MAX_EXPORT_IMPLS];
    const char *declared[MAX_EXPORT_IMPLS];
    int nimpls;
    if ((rc = pick_impls(opt, fam, impls, declared, &nimpls, err))) return rc;
    char *out = strdup(opt->out);
    if (!out) return kp_fail(err, KP_EXIT_ENV, "out of host memory");
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = '\0';
    previous pv;
    char *tmp = NULL;
    if (!(rc = check_out(out, opt->force, &pv, err)) && !(tmp = folder_beside(out, "kparity-export", err))) rc = err->code;
    export_run *run = rc ? NULL : calloc(1, sizeof *run);
    if (!rc && !run) rc = kp_fail(err, KP_EXIT_ENV, "out of host memory");
    if (!rc) {
        run->dir = tmp;
        rc = write_export(run, fam, &c, canonical, &fields, impls, declared, nimpls, opt->nimpls > 0, err);
        if (rc) kp_error_prefix(err, "nothing exported to %s: ", out);
    }
    if (!rc) rc = install(tmp, out, &pv, err);
    if (tmp && rc) remove_made(tmp);
    if (!rc) *nfiles = run->nfiles;
    free(run);
    free(tmp);
    previous_free(&pv);
    free(out);
    return rc;
}

/* ---- help ----------------------------------------------------------------------------------------------------- */

void kp_export_help(FILE *to) {
    fprintf(to, "files an export writes into DIR (its case.json lists each one written, with its dtype, shape, layout,\n"
                "meaning and SHA-256; an array a case's fields do not ask for is not written):\n"
                "  %-22s the case (every field, defaults filled), versions, arrays in order, impl outputs\n",
                KP_EXPORT_INDEX);
    static const char *const titles[] = {"inputs", "outputs", "reference", "extras"};
    for (int i = 0; i < kp_family_count(); i++) {
        const kp_family *fam = kp_family_at(i);
        if (!fam->array_docs) continue;
        fprintf(to, "  %s:\n", fam->name);
        for (int kind = 0; kind < 4; kind++) {
            if (kind == KP_ARRAY_OUTPUT) continue;
            int any = 0;
            for (const kp_array_doc *d = fam->array_docs; d->name; d++) {
                if ((int)d->kind != kind) continue;
                if (!any++) fprintf(to, "    %-10s", titles[kind]);
                fprintf(to, " %s%s.npy", kind == KP_ARRAY_REFERENCE ? "reference_" : "", d->name);
            }
            if (any) fprintf(to, "\n");
        }
        int nout = 0;
        while (fam->output_names[nout]) nout++;
        fprintf(to, "    %-10s", "impls");
        if (nout == 1) fprintf(to, " IMPL.npy (%s)", fam->output_names[0]);
        for (int k = 0; nout > 1 && k < nout; k++) fprintf(to, " IMPL.%s.npy", fam->output_names[k]);
        fprintf(to, "\n");
    }
    fprintf(to, "IMPL is an impl's name (FAMILY.NAME@DEVICE, as kparity list shows); --impl NAME@auto takes @cuda on a GPU, else @host.\n"
                "Without --impl, every impl of the family that can run here is exported.\n%s.\n"
                "DIR must be new or empty; --force replaces a previous export there (only a folder whose every file its\n"
                "case.json names). The export is written beside DIR and renamed into place: a failure leaves nothing.\n"
                "kparity judge DIR --config FILE --out B judges the exported impl outputs by the config's roles.\n",
                BF16_STORAGE);
}
