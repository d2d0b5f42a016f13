/* prepared.c: one case, prepared for every check: the family generates its inputs; here they are
 * described and hashed, and the reference is computed once and hashed (harness/export.c writes it all out). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "kp_launch.h"

static uint64_t g_generation;

int kp_view_input(kp_case_view *v, const char *name, kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride,
                  bool batched, kp_error *err) {
    KP_ASSERT(v->ninputs < KP_MAX_TENSORS && (!batched || shape[0] == v->batch));
    kp_tensor *t = &v->inputs[v->ninputs];
    int rc = kp_tensor_alloc(t, name, dtype, ndim, shape, row_stride, batched ? v->rows_total : shape[0], err);
    if (rc) return rc;
    t->batched = batched;
    v->ninputs++;
    return 0;
}

void kp_shapes_input(kp_shapes *s, const char *name, kp_dtype dtype, int ndim, const int64_t *shape, int64_t row_stride,
                     bool batched) {
    KP_ASSERT(s->ninputs < KP_MAX_TENSORS && ndim >= 1 && ndim <= KP_MAX_DIMS && (!batched || shape[0] == s->batch));
    kp_tensor *t = &s->inputs[s->ninputs++];
    *t = (kp_tensor){.dtype = dtype, .ndim = ndim, .row_stride = row_stride, .batched = batched};
    snprintf(t->name, sizeof t->name, "%s", name);
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
}

/* Whether two tensors are declared alike: name, dtype, shape, row stride, batched (data aside). */
static bool same_tensor(const kp_tensor *a, const kp_tensor *b) {
    bool same = !strcmp(a->name, b->name) && a->dtype == b->dtype && a->ndim == b->ndim &&
                kp_tensor_stride(a) == kp_tensor_stride(b) && !a->batched == !b->batched;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    return same;
}

/* The family's declaration (kp_family.shapes), which the budgets were estimated from, describes what prepare and
 * outputs made: a family whose two drift apart is a programmer error, caught on every case it prepares. */
static void check_declared(const kp_family *fam, const kp_case *c, int64_t extra_rows, const kp_case_view *v) {
    kp_shapes s;
    memset(&s, 0, sizeof s);
    kp_error err = {0};
    if (fam->shapes(c, extra_rows, &s, &err)) kp_abort(__FILE__, __LINE__, "%s: shapes: %s", fam->name, err.msg);
    kp_tensor outs[KP_MAX_TENSORS];
    const int nout = fam->outputs(v->data, v->batch, outs);
    bool same = s.batch == v->batch && s.rows_total == v->rows_total && s.ninputs == v->ninputs && s.noutputs == nout;
    for (int k = 0; same && k < v->ninputs; k++) same = same_tensor(&s.inputs[k], &v->inputs[k]);
    for (int k = 0; same && k < nout; k++) same = same_tensor(&s.outputs[k], &outs[k]);
    if (!same) kp_abort(__FILE__, __LINE__, "family %s: its shapes hook declares other tensors than prepare and outputs make", fam->name);
}

int kp_view_declared(kp_case_view *v, int (*shapes)(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err),
                     const kp_case *c, int64_t extra_rows, kp_error *err) {
    kp_shapes s;
    memset(&s, 0, sizeof s);
    int rc = shapes(c, extra_rows, &s, err);
    v->batch = s.batch, v->rows_total = s.rows_total;
    for (int k = 0; !rc && k < s.ninputs; k++) {
        const kp_tensor *t = &s.inputs[k];
        rc = kp_view_input(v, t->name, t->dtype, t->ndim, t->shape, t->row_stride, t->batched, err);
    }
    return rc;
}

static void view_free(const kp_family *fam, kp_judgements *judged, kp_case_view *v) {
    if (judged->fam) kp_judgements_clear(judged); /* judgements may point into the family's data */
    if (v->data) fam->release(v->data);
    for (int k = 0; k < v->ninputs; k++) kp_tensor_free(&v->inputs[k]);
    memset(v, 0, sizeof *v);
}

int kp_prepare(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err) {
    memset(p, 0, sizeof *p);
    p->fam = fam;
    p->c = *c;
    p->generation = ++g_generation;
    const double t0 = kp_now();
    int rc = fam->prepare(c, extra_rows, &p->v, err);
    kp_stage_add(KP_STAGE_GENERATION, kp_now() - t0);
    if (rc) {
        view_free(fam, &p->judged, &p->v);
        p->fam = NULL;
        return rc;
    }
    KP_ASSERT(p->v.ninputs > 0 && p->v.ninputs <= KP_MAX_TENSORS && p->v.rows_total >= p->v.batch + extra_rows);
    for (int k = 0; k < p->v.ninputs; k++) KP_ASSERT(!p->v.inputs[k].batched || p->v.inputs[k].shape[0] == p->v.batch);
    kp_tensor outs[KP_MAX_TENSORS]; /* output_names is outputs' names, in order: what absent declarations name */
    const int nout = fam->outputs(p->v.data, 1, outs);
    for (int k = 0; k < nout; k++) KP_ASSERT(fam->output_names[k] && !strcmp(fam->output_names[k], outs[k].name));
    KP_ASSERT(!fam->output_names[nout]);
    if (fam->rule) p->judged = (kp_judgements){.fam = fam, .data = p->v.data};
    check_declared(fam, c, extra_rows, &p->v);
    return 0;
}

void kp_prepared_release(kp_prepared *p) {
    if (!p->fam) return;
    kp_digests_settle(); /* digests may still be reading the inputs or the reference */
    view_free(p->fam, &p->judged, &p->v);
    kp_launch_case_done();
    memset(p, 0, sizeof *p);
}

void kp_describe_inputs(const kp_prepared *p, cJSON *inputs) {
    for (int k = 0; k < p->v.ninputs; k++) {
        const kp_tensor *t = &p->v.inputs[k];
        cJSON *o = cJSON_AddObjectToObject(inputs, t->name);
        cJSON_AddStringToObject(o, "dtype", kp_dtype_name(t->dtype));
        cJSON *s = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(s, kp_json_int(t->shape[d]));
        if (t->ndim > 1) kp_json_add_int(o, "row_stride", kp_tensor_stride(t));
        unsigned char prefix[KP_TENSOR_PREFIX_MAX];
        kp_span *rows;
        size_t nrows;
        const size_t n = kp_buffer_digest_parts(t->dtype, t->ndim, t->shape, t->row_stride, t->data, prefix, &rows, &nrows);
        kp_digest_start(prefix, n, rows, nrows, NULL, o, "sha256"); /* kp_buffer_digest's hex, at settle */
        free(rows);
    }
}

int kp_reference_run(kp_prepared *p, const void *params, cJSON *desc, kp_error *err) {
    if (!p->have_ref) {
        const double t0 = kp_now();
        int rc = p->fam->reference(p->v.data, params, &p->ref, err);
        if (rc) return rc;
        p->ref_seconds = kp_now() - t0;
        kp_stage_add(KP_STAGE_REFERENCE, p->ref_seconds);
        p->have_ref = true;
        KP_ASSERT(p->ref.narrays > 0 && p->ref.narrays <= KP_MAX_TENSORS && p->ref.digest_tag);
        /* every array's bytes after the tag (hashed on a worker thread into ref_digest): the arrays are
           dense and machine-independent, so the digest is too */
        kp_span parts[KP_MAX_TENSORS];
        for (int k = 0; k < p->ref.narrays; k++) {
            const kp_tensor *a = &p->ref.arrays[k];
            KP_ASSERT(a->row_stride == 0 || a->row_stride == kp_tensor_cols(a));
            parts[k] = (kp_span){a->data, kp_tensor_slice_bytes(a) * (size_t)a->shape[0]};
        }
        kp_digest_start(p->ref.digest_tag, strlen(p->ref.digest_tag) + 1, parts, (size_t)p->ref.narrays, p->ref_digest,
                        NULL, NULL);
    }
    if (desc && !cJSON_GetObjectItemCaseSensitive(desc, "sha256")) {
        cJSON_AddStringToObject(desc, "provider", p->fam->reference_provider);
        kp_digest_record(desc, "sha256", p->ref_digest);
        if (p->fam->reference_rule) cJSON_AddStringToObject(desc, "rule", p->fam->reference_rule);
        kp_json_add_double(desc, "seconds", p->ref_seconds);
        kp_json_add_int(desc, "threads", kp_thread_count());
    }
    return 0;
}
