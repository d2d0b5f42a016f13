/* prepared.c: one case, prepared for every check: the family generates its inputs; here they are
 * described and hashed, and the reference is computed once and hashed (harness/export.c writes it all out). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../receipts/kp_fileio.h"
#include "../receipts/kp_json.h"
#include "kp_cache.h"
#include "kp_launch.h"

static uint64_t g_generation;

static int view_tensor(kp_tensor *t, const kp_tensor *declared, int64_t slices, kp_error *err) {
    int rc = kp_tensor_alloc(t, declared->name, declared->dtype, declared->ndim, declared->shape, declared->row_stride,
                             slices, err);
    if (!rc) t->batched = declared->batched;
    return rc;
}

void kp_shapes_input(kp_shapes *s, const char *name, kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride,
                     bool batched) {
    KP_ASSERT(s->ninputs < KP_MAX_TENSORS && ndim >= 1 && ndim <= KP_MAX_DIMS && (!batched || shape[0] == s->batch));
    kp_tensor *t = &s->inputs[s->ninputs++];
    *t = (kp_tensor){.dtype = dtype, .ndim = ndim, .row_stride = row_stride, .batched = batched};
    snprintf(t->name, sizeof t->name, "%s", name);
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
}

void kp_shapes_state(kp_shapes *s, const char *name, kp_dtype dtype, int ndim, const int64_t *shape) {
    KP_ASSERT(s->nstate < KP_MAX_TENSORS && ndim >= 1 && ndim <= KP_MAX_DIMS);
    kp_tensor *t = &s->state[s->nstate++];
    *t = (kp_tensor){.dtype = dtype, .ndim = ndim};
    snprintf(t->name, sizeof t->name, "%s", name);
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
}

/* The family's declaration (kp_family.shapes), which the budgets were estimated from and the view's tensors were
 * allocated from, describes what outputs make: a family whose two drift apart is a programmer error, caught on every
 * case it prepares. */
static void check_declared(const kp_family *fam, const kp_shapes *s, const kp_case_view *v) {
    kp_tensor outs[KP_MAX_TENSORS];
    const int nout = fam->outputs(v->data, v->batch, outs);
    bool same = s->noutputs == nout;
    for (int k = 0; same && k < nout; k++) same = kp_tensors_alike(&s->outputs[k], &outs[k]);
    if (!same) kp_abort(__FILE__, __LINE__, "family %s: its shapes hook declares other outputs than outputs makes", fam->name);
}

/* The view's batch, rows, inputs and state as the family's shapes declares them for these extra rows, zeroed. */
static int view_declared(kp_case_view *v, const kp_shapes *s, kp_error *err) {
    v->batch = s->batch, v->rows_total = s->rows_total;
    int rc = 0;
    for (int k = 0; !rc && k < s->ninputs; k++, v->ninputs += !rc)
        rc = view_tensor(&v->inputs[k], &s->inputs[k], s->inputs[k].batched ? v->rows_total : s->inputs[k].shape[0], err);
    for (int k = 0; !rc && k < s->nstate; k++, v->nstate += !rc)
        rc = view_tensor(&v->state[k], &s->state[k], s->state[k].shape[0], err);
    return rc;
}

static void view_free(const kp_family *fam, kp_judgements *judged, kp_case_view *v) {
    if (judged->fam) kp_judgements_clear(judged); /* judgements may point into the family's data */
    if (v->data) fam->release(v->data);
    for (int k = 0; k < v->ninputs; k++) kp_tensor_free(&v->inputs[k]);
    for (int k = 0; k < v->nstate; k++) kp_tensor_free(&v->state[k]);
    memset(v, 0, sizeof *v);
}

int kp_reference_matches(const kp_reference *got, const kp_reference *want, kp_error *err) {
    if (got->narrays != want->narrays || got->nstate != want->nstate)
        return kp_fail(err, KP_EXIT_ENV, "%d arrays and %d state arrays, not %d and %d", got->narrays, got->nstate,
                       want->narrays, want->nstate);
    for (int k = 0; k < got->narrays + got->nstate; k++) {
        const kp_tensor *a = k < got->narrays ? &got->arrays[k] : &got->state[k - got->narrays];
        const kp_tensor *b = k < got->narrays ? &want->arrays[k] : &want->state[k - got->narrays];
        if (!kp_tensors_alike(a, b)) return kp_fail(err, KP_EXIT_ENV, "'%s' is not the '%s' the family describes", a->name, b->name);
    }
    return 0;
}

/* The view's tensors and, when they were allocated here, free them; those in the inputs' mapped entry go with it. */
static void prepared_free(kp_prepared *p) {
    if (p->map) {
        for (int k = 0; k < p->v.ninputs; k++) p->v.inputs[k].data = NULL;
        for (int k = 0; k < p->v.nstate; k++) p->v.state[k].data = NULL;
    }
    view_free(p->fam, &p->judged, &p->v);
    if (p->map) munmap(p->map, p->map_len);
    if (p->ref_map) munmap(p->ref_map, p->ref_map_len); /* after release: the family's reference was in it */
    p->map = p->ref_map = NULL;
    for (int k = 0; k < KP_MAX_TENSORS; k++) kp_sha256_points_free(&p->input_points[k]);
    kp_sha256_points_free(&p->ref_points);
}

static int prepare(const kp_family *fam, const kp_case *c, int64_t extra_rows, bool use_cache, kp_prepared *p,
                   kp_error *err) {
    memset(p, 0, sizeof *p);
    p->fam = fam;
    p->c = *c;
    p->generation = ++g_generation;
    p->cache_inputs = p->cache_reference = use_cache && kp_cache_dir();
    const double t0 = kp_now();
    kp_shapes s;
    memset(&s, 0, sizeof s);
    int rc = fam->shapes(c, extra_rows, &s, err);
    KP_ASSERT(rc || (s.ninputs > 0 && s.ninputs <= KP_MAX_TENSORS && s.nstate <= KP_MAX_TENSORS &&
                     s.rows_total >= s.batch + extra_rows));
    if (!rc && p->cache_inputs) p->v.cached = p->inputs_cached = kp_cache_inputs_read(p, &s, extra_rows);
    if (!rc && !p->v.cached) rc = view_declared(&p->v, &s, err);
    const double t1 = kp_now();
    if (!rc) rc = fam->prepare(c, extra_rows, &p->v, err);
    const double made = kp_now() - t1;
    kp_stage_add(p->cache_inputs ? KP_STAGE_CACHE : KP_STAGE_GENERATION, t1 - t0); /* shapes and allocation are cheap */
    kp_stage_add(KP_STAGE_GENERATION, made);
    if (!rc && p->cache_inputs && !p->inputs_cached) { /* their digests, checked on every thread, when an entry has them */
        p->digests_checked = kp_cache_digests_read(p, extra_rows);
        kp_stage_add(KP_STAGE_CACHE, kp_now() - t1 - made);
    }
    if (rc) {
        prepared_free(p);
        p->fam = NULL;
        return rc;
    }
    KP_ASSERT(p->v.batch == s.batch && p->v.rows_total == s.rows_total && p->v.ninputs == s.ninputs && p->v.nstate == s.nstate);
    kp_tensor outs[KP_MAX_TENSORS]; /* output_names is outputs' names, in order: what absent declarations name */
    const int nout = fam->outputs(p->v.data, 1, outs);
    for (int k = 0; k < nout; k++) KP_ASSERT(fam->output_names[k] && !strcmp(fam->output_names[k], outs[k].name));
    KP_ASSERT(!fam->output_names[nout]);
    if (fam->rule) p->judged = (kp_judgements){.fam = fam, .data = p->v.data};
    check_declared(fam, &s, &p->v);
    if (p->cache_inputs && !p->inputs_cached) p->inputs_store = kp_cache_inputs_worth(p, made);
    return 0;
}

int kp_prepare(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err) {
    return prepare(fam, c, extra_rows, true, p, err);
}

int kp_prepare_uncached(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err) {
    return prepare(fam, c, extra_rows, false, p, err);
}

/* A released case's entries, written on a thread of its own while the next case runs: one case at a time (the next
 * release, and the end of the process, wait for it), so a run holds at most one released case beside its current one;
 * a case whose inputs pass a quarter of the machine's memory, and any run with a fault armed (crash tests keep their
 * operation order), write before release returns. The cache's files are the only state the writer shares. */
static pthread_t g_writer;
static bool g_writing, g_flush_registered;
static kp_prepared g_written; /* the case the writer owns */

static void write_entries(kp_prepared *p, bool digests_store) {
    if (digests_store) kp_cache_digests_write(p);
    if (p->inputs_store) kp_cache_inputs_write(p);
    if (p->ref_store) kp_cache_ref_write(p, p->ref_has_params ? p->ref_params : NULL);
}

static void *writer_main(void *arg) {
    kp_prepared *p = arg;
    write_entries(p, p->cache_inputs && !p->inputs_cached && !p->digests_checked);
    prepared_free(p);
    return NULL;
}

void kp_prepared_flush(void) {
    if (!g_writing) return;
    const double t0 = kp_now();
    pthread_join(g_writer, NULL);
    g_writing = false;
    memset(&g_written, 0, sizeof g_written);
    kp_stage_add(KP_STAGE_CACHE, kp_now() - t0); /* the wait, not the writing the case overlapped */
}

static void flush_at_exit(void) { kp_prepared_flush(); }

static bool write_behind(const kp_prepared *p) {
    if (kp_fault_armed()) return false;
    double bytes = 0;
    for (int k = 0; k < p->v.ninputs; k++) {
        const kp_tensor *t = &p->v.inputs[k];
        bytes += (double)kp_tensor_slice_bytes(t) * (double)(t->batched ? p->v.rows_total : t->shape[0]);
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 && bytes <= (double)pages * (double)page / 4;
}

void kp_prepared_release(kp_prepared *p) {
    if (!p->fam) return;
    kp_digests_settle(); /* digests may still be reading the inputs or the reference */
    const bool digests_store = p->cache_inputs && !p->inputs_cached && !p->digests_checked; /* tiny: always */
    if (p->inputs_store || p->ref_store || digests_store) { /* what was made here, for the next run */
        kp_prepared_flush(); /* the previous case's first */
        kp_launch_case_done();
        if (write_behind(p)) {
            if (!g_flush_registered) g_flush_registered = !atexit(flush_at_exit);
            g_written = *p; /* the writer owns the case's memory now */
            if (g_flush_registered && !pthread_create(&g_writer, NULL, writer_main, &g_written)) {
                g_writing = true;
                memset(p, 0, sizeof *p);
                return;
            }
            memset(&g_written, 0, sizeof g_written);
        }
        const double t0 = kp_now();
        write_entries(p, digests_store);
        kp_stage_add(KP_STAGE_CACHE, kp_now() - t0);
        prepared_free(p);
        memset(p, 0, sizeof *p);
        return;
    }
    prepared_free(p);
    kp_launch_case_done();
    memset(p, 0, sizeof *p);
}

void kp_describe_inputs(kp_prepared *p, cJSON *inputs) {
    for (int k = 0; k < p->v.ninputs; k++) {
        const kp_tensor *t = &p->v.inputs[k];
        cJSON *o = cJSON_AddObjectToObject(inputs, t->name);
        cJSON_AddStringToObject(o, "dtype", kp_dtype_name(t->dtype));
        cJSON *s = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(s, kp_json_int(t->shape[d]));
        if (t->ndim > 1) kp_json_add_int(o, "row_stride", kp_tensor_stride(t));
        if (p->input_sha[k][0]) { /* checked against the cache's digests */
            cJSON_AddStringToObject(o, "sha256", p->input_sha[k]);
            continue;
        }
        unsigned char prefix[KP_TENSOR_PREFIX_MAX];
        kp_span *rows;
        size_t nrows;
        const size_t n = kp_buffer_digest_parts(t->dtype, t->ndim, t->shape, t->row_stride, t->data, prefix, &rows, &nrows);
        kp_digest_start_points(prefix, n, rows, nrows, p->input_sha[k], &p->input_points[k], o, "sha256"); /* at settle */
        free(rows);
    }
}

int kp_reference_run(kp_prepared *p, const void *params, cJSON *desc, kp_error *err) {
    if (!p->have_ref) {
        const double t0 = kp_now();
        const bool cacheable = p->cache_reference && p->fam->reference_adopt;
        if (cacheable) {
            if (kp_cache_ref_read(p, params, err)) p->ref_cached = true;
            else if (err->code) return err->code;
        }
        if (p->ref_cached) {
            p->ref_seconds = kp_now() - t0;
            kp_stage_add(KP_STAGE_CACHE, p->ref_seconds);
        } else {
            memset(&p->ref, 0, sizeof p->ref);
            int rc = p->fam->reference(p->v.data, params, &p->ref, err);
            if (rc) return rc;
            p->ref_seconds = kp_now() - t0;
            kp_stage_add(KP_STAGE_REFERENCE, p->ref_seconds);
            if (cacheable) p->ref_store = kp_cache_ref_worth(p);
            if ((p->ref_has_params = params != NULL)) memcpy(p->ref_params, params, p->fam->params_bytes);
            KP_ASSERT(p->ref.narrays > 0 && p->ref.narrays <= KP_MAX_TENSORS && p->ref.digest_tag);
            kp_span parts[KP_MAX_TENSORS]; /* hashed on a worker thread into ref_digest */
            kp_reference_parts(&p->ref, parts);
            kp_digest_start_points(p->ref.digest_tag, strlen(p->ref.digest_tag) + 1, parts, (size_t)p->ref.narrays,
                                   p->ref_digest, &p->ref_points, NULL, NULL);
        }
        p->have_ref = true;
    }
    if (desc && !cJSON_GetObjectItemCaseSensitive(desc, "sha256")) {
        cJSON_AddStringToObject(desc, "provider", p->fam->reference_provider);
        kp_digest_record(desc, "sha256", p->ref_digest);
        if (p->fam->reference_rule) cJSON_AddStringToObject(desc, "rule", p->fam->reference_rule);
        kp_json_add_double(desc, "seconds", p->ref_seconds);
        kp_json_add_int(desc, "threads", kp_thread_count());
        if (p->ref.computed_on) cJSON_AddStringToObject(desc, "computed_on", p->ref.computed_on);
    }
    return 0;
}
