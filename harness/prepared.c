/* prepared.c: one case, prepared for every check: the family generates its inputs; here they are
 * described and hashed, and the reference is computed once and hashed (harness/export.c writes it all out). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Whether two tensors are declared alike: name, dtype, shape, row stride, batched (data aside). */
static bool same_tensor(const kp_tensor *a, const kp_tensor *b) {
    bool same = !strcmp(a->name, b->name) && a->dtype == b->dtype && a->ndim == b->ndim &&
                kp_tensor_stride(a) == kp_tensor_stride(b) && !a->batched == !b->batched;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    return same;
}

/* The family's declaration (kp_family.shapes), which the budgets were estimated from and the view's tensors were
 * allocated from, describes what outputs make: a family whose two drift apart is a programmer error, caught on every
 * case it prepares. */
static void check_declared(const kp_family *fam, const kp_shapes *s, const kp_case_view *v) {
    kp_tensor outs[KP_MAX_TENSORS];
    const int nout = fam->outputs(v->data, v->batch, outs);
    bool same = s->noutputs == nout;
    for (int k = 0; same && k < nout; k++) same = same_tensor(&s->outputs[k], &outs[k]);
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
        if (!same_tensor(a, b)) return kp_fail(err, KP_EXIT_ENV, "'%s' is not the '%s' the family describes", a->name, b->name);
    }
    return 0;
}

/* ---- the cache's entries: what they hold and how each is checked (kp_cache.h) ------------------------------ */

/* The slices of a view tensor an entry holds: a batched input's every row, else shape[0]. */
static int64_t view_slices(const kp_case_view *v, const kp_tensor *t) { return t->batched ? v->rows_total : t->shape[0]; }

/* A job hashing slices [first, first + n) of t the way receipts hash a tensor (kp_buffer_digest). */
static kp_sha256_job *slices_job(const kp_tensor *t, int64_t first, int64_t n) {
    int64_t shape[KP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = n;
    unsigned char prefix[KP_TENSOR_PREFIX_MAX];
    kp_span *rows;
    size_t nrows;
    const void *at = (const unsigned char *)t->data + (size_t)first * kp_tensor_slice_bytes(t);
    const size_t len = kp_buffer_digest_parts(t->dtype, t->ndim, shape, t->row_stride, at, prefix, &rows, &nrows);
    kp_sha256_job *job = kp_sha256_job_start(prefix, len, rows, nrows);
    free(rows);
    return job;
}

/* The view's tensors in an entry's order: inputs, then state. */
static int view_tensors(kp_case_view *v, kp_tensor **t) {
    for (int k = 0; k < v->ninputs; k++) t[k] = &v->inputs[k];
    for (int k = 0; k < v->nstate; k++) t[v->ninputs + k] = &v->state[k];
    return v->ninputs + v->nstate;
}

/* Every input's and state array's digests, hashed at once, one thread each: sha[k] of tensor k's shape[0] slices
 * (an input's: the receipt's), more[k] of a batched input's rows past them ("" when none). Digests known already
 * (known[k][0], inputs only) are not hashed again. */
static void view_digests(kp_case_view *v, char (*known)[KP_SHA256_HEX_LEN], char (*sha)[KP_SHA256_HEX_LEN],
                         char (*more)[KP_SHA256_HEX_LEN]) {
    kp_sha256_job *jobs[2 * 2 * KP_MAX_TENSORS] = {0};
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    const int n = view_tensors(v, ts);
    for (int k = 0; k < n; k++) {
        const int64_t slices = view_slices(v, ts[k]);
        more[k][0] = 0;
        if (known && k < v->ninputs && known[k][0]) memcpy(sha[k], known[k], KP_SHA256_HEX_LEN);
        else jobs[2 * k] = slices_job(ts[k], 0, ts[k]->shape[0]);
        if (slices > ts[k]->shape[0]) jobs[2 * k + 1] = slices_job(ts[k], ts[k]->shape[0], slices - ts[k]->shape[0]);
    }
    for (int k = 0; k < n; k++) {
        if (jobs[2 * k]) kp_sha256_job_join(jobs[2 * k], sha[k]);
        if (jobs[2 * k + 1]) kp_sha256_job_join(jobs[2 * k + 1], more[k]);
    }
}

/* Every input's digest in p->input_sha (a reference entry's key): those being hashed for the receipt waited for,
 * any not started (no receipt asked) hashed now. */
static void inputs_digests(kp_prepared *p) {
    kp_digests_settle();
    kp_sha256_job *jobs[KP_MAX_TENSORS] = {0};
    for (int k = 0; k < p->v.ninputs; k++)
        if (!p->input_sha[k][0]) jobs[k] = slices_job(&p->v.inputs[k], 0, p->v.inputs[k].shape[0]);
    for (int k = 0; k < p->v.ninputs; k++)
        if (jobs[k]) kp_sha256_job_join(jobs[k], p->input_sha[k]);
}

static void inputs_key_text(const kp_prepared *p, int64_t extra_rows, char *text, size_t len) {
    char name[KP_CASE_NAME_MAX];
    if (kp_case_format(&p->c, name, sizeof name) < 0) snprintf(name, sizeof name, "?");
    snprintf(text, len, "kparity.cache.inputs/v1\nfamily %s\ncase %s\ngenerator %s\nextra_rows %lld\n", p->fam->name, name,
             p->fam->cases->generator_version, (long long)extra_rows);
}

/* The view from the inputs' entry, when it holds the tensors s declares and every byte hashes to the digests it
 * recorded: the view's tensors then point into the entry's map, which p keeps until release. */
static bool inputs_from_cache(kp_prepared *p, const kp_shapes *s, int64_t extra_rows) {
    kp_case_view *v = &p->v;
    char text[KP_CASE_NAME_MAX + 256];
    inputs_key_text(p, extra_rows, text, sizeof text);
    kp_cache_key(text, p->inputs_key);
    kp_cache_entry e;
    const int got = kp_cache_open("inputs", text, &e, p->inputs_note, sizeof p->inputs_note);
    bool ok = got == 1 && e.ntensors == s->ninputs + s->nstate;
    for (int k = 0; ok && k < e.ntensors; k++) {
        const kp_tensor *want = k < s->ninputs ? &s->inputs[k] : &s->state[k - s->ninputs];
        kp_tensor t = e.tensors[k]; /* an entry does not say which inputs are batched: the case's shapes do */
        t.batched = want->batched;
        ok = same_tensor(&t, want) && e.slices[k] == (want->batched ? s->rows_total : want->shape[0]);
    }
    if (got == 1 && !ok) snprintf(p->inputs_note, sizeof p->inputs_note, "refused: it holds other tensors than the case's");
    if (ok) {
        *v = (kp_case_view){.batch = s->batch, .rows_total = s->rows_total, .ninputs = s->ninputs, .nstate = s->nstate};
        for (int k = 0; k < e.ntensors; k++) {
            kp_tensor *t = k < s->ninputs ? &v->inputs[k] : &v->state[k - s->ninputs];
            *t = e.tensors[k];
            t->batched = k < s->ninputs && s->inputs[k].batched;
        }
        char sha[2 * KP_MAX_TENSORS][KP_SHA256_HEX_LEN], more[2 * KP_MAX_TENSORS][KP_SHA256_HEX_LEN];
        view_digests(v, NULL, sha, more);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(e.meta, "digests");
        for (int k = 0; ok && k < e.ntensors; k++) {
            const cJSON *d = cJSON_GetArrayItem(want, k);
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, "sha256"), *b = cJSON_GetObjectItemCaseSensitive(d, "more_sha256");
            const bool head = cJSON_IsString(a) && !strcmp(a->valuestring, sha[k]);
            ok = head && cJSON_IsString(b) && !strcmp(b->valuestring, more[k]);
            if (!ok) snprintf(p->inputs_note, sizeof p->inputs_note, "refused: '%s' hashes to %.16s..., its entry recorded %.16s...",
                              e.tensors[k].name, head ? more[k] : sha[k],
                              !head ? (cJSON_IsString(a) ? a->valuestring : "nothing") : cJSON_IsString(b) ? b->valuestring : "nothing");
        }
        if (ok) {
            for (int k = 0; k < v->ninputs; k++) memcpy(p->input_sha[k], sha[k], KP_SHA256_HEX_LEN);
            p->map = e.map, p->map_len = e.len, e.map = NULL; /* the view's tensors live there now */
        } else {
            memset(v, 0, sizeof *v);
        }
    } else if (got < 0) {
        char why[sizeof p->inputs_note];
        snprintf(why, sizeof why, "%s", p->inputs_note);
        snprintf(p->inputs_note, sizeof p->inputs_note, "refused: %.180s", why);
    }
    kp_cache_close(&e);
    if (got != 0 && !ok) fprintf(stderr, "kparity: cache: inputs entry %.16s... %s; generating\n", p->inputs_key, p->inputs_note);
    return ok;
}

/* Whether an entry of these tensors, made in `seconds`, is worth writing (kp_cache_worth); why not into why. */
static bool worth_storing(kp_tensor *const *ts, const int64_t *slices, int n, double seconds, char *why, size_t len) {
    double bytes = 0;
    for (int k = 0; k < n; k++) bytes += (double)kp_tensor_slice_bytes(ts[k]) * (double)slices[k];
    if (kp_cache_worth(bytes, seconds)) return true;
    snprintf(why, len, "made at %.2f GB/s (%.3f s for %.1f MB): a hit hashes at %.2f GB/s, the cache writes at %.2f GB/s "
             "(worth it below the first, and below %d times the second)", bytes / seconds / 1e9, seconds, bytes / 1e6,
             kp_cache_hash_rate() / 1e9, kp_cache_write_rate() / 1e9, KP_CACHE_PAYBACK_HITS);
    return false;
}

static void inputs_to_cache(kp_prepared *p) {
    kp_case_view *v = &p->v;
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    const int n = view_tensors(v, ts);
    char text[KP_CASE_NAME_MAX + 256];
    inputs_key_text(p, v->rows_total - v->batch, text, sizeof text);
    char sha[2 * KP_MAX_TENSORS][KP_SHA256_HEX_LEN], more[2 * KP_MAX_TENSORS][KP_SHA256_HEX_LEN];
    view_digests(v, p->input_sha, sha, more);
    cJSON *meta = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(meta, "digests");
    kp_cache_tensor ct[2 * KP_MAX_TENSORS];
    for (int k = 0; k < n; k++) {
        ct[k] = (kp_cache_tensor){ts[k], view_slices(v, ts[k])};
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "sha256", sha[k]);
        cJSON_AddStringToObject(d, "more_sha256", more[k]);
        cJSON_AddItemToArray(list, d);
    }
    kp_error err = {0};
    if (kp_cache_put("inputs", text, meta, ct, n, &err)) fprintf(stderr, "kparity: %s (the run goes on)\n", err.msg);
    cJSON_Delete(meta);
}

static void ref_key_text(const kp_prepared *p, const void *params, char *text, size_t len) {
    char name[KP_CASE_NAME_MAX];
    if (kp_case_format(&p->c, name, sizeof name) < 0) snprintf(name, sizeof name, "?");
    int at = snprintf(text, len, "kparity.cache.reference/v1\nfamily %s\ncase %s\ngenerator %s\nreference %s\nparams ",
                      p->fam->name, name, p->fam->cases->generator_version, p->fam->reference_version);
    KP_ASSERT(p->fam->params_bytes <= KP_PARAMS_MAX && len >= KP_CASE_NAME_MAX + 256 + 2 * KP_PARAMS_MAX + 80 * KP_MAX_TENSORS);
    for (size_t i = 0; params && i < p->fam->params_bytes; i++)
        at += snprintf(text + at, len - (size_t)at, "%02x", ((const unsigned char *)params)[i]);
    for (int k = 0; k < p->v.ninputs; k++) at += snprintf(text + at, len - (size_t)at, "\ninput %s", p->input_sha[k]);
}

/* What the reference digest receipts record hashes after the tag: every array's bytes, in order (the arrays are dense
 * and machine-independent, so the digest is too). */
static void ref_parts(const kp_reference *ref, kp_span parts[KP_MAX_TENSORS]) {
    for (int k = 0; k < ref->narrays; k++) {
        const kp_tensor *a = &ref->arrays[k];
        KP_ASSERT(a->row_stride == 0 || a->row_stride == kp_tensor_cols(a));
        parts[k] = (kp_span){a->data, kp_tensor_slice_bytes(a) * (size_t)a->shape[0]};
    }
}

/* The reference from its entry, when its arrays hash to the digest it recorded (the receipt's) and its state to its
 * own, and the family takes it (reference_adopt); then described into p->ref. */
static bool ref_from_cache(kp_prepared *p, const void *params, kp_error *err) {
    char text[KP_CASE_NAME_MAX + 2048];
    ref_key_text(p, params, text, sizeof text);
    kp_cache_key(text, p->ref_key);
    kp_cache_entry e;
    const int got = kp_cache_open("reference", text, &e, p->ref_note, sizeof p->ref_note);
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(e.meta, "tag"), *sha = cJSON_GetObjectItemCaseSensitive(e.meta, "sha256");
    const cJSON *na = cJSON_GetObjectItemCaseSensitive(e.meta, "arrays"), *st = cJSON_GetObjectItemCaseSensitive(e.meta, "state");
    kp_reference ref = {0};
    bool ok = got == 1 && cJSON_IsString(tag) && cJSON_IsString(sha) && cJSON_IsNumber(na) && na->valuedouble >= 1 &&
              na->valuedouble <= e.ntensors && na->valuedouble <= KP_MAX_TENSORS &&
              e.ntensors - na->valuedouble <= KP_MAX_TENSORS && cJSON_IsArray(st) &&
              cJSON_GetArraySize(st) == e.ntensors - (int)na->valuedouble;
    for (int k = 0; ok && k < e.ntensors; k++) ok = e.tensors[k].row_stride == 0 && e.slices[k] == e.tensors[k].shape[0];
    if (got == 1 && !ok) snprintf(p->ref_note, sizeof p->ref_note, "refused: malformed metadata");
    if (ok) {
        ref.narrays = (int)na->valuedouble, ref.nstate = e.ntensors - ref.narrays;
        for (int k = 0; k < e.ntensors; k++) *(k < ref.narrays ? &ref.arrays[k] : &ref.state[k - ref.narrays]) = e.tensors[k];
        char hex[KP_SHA256_HEX_LEN], one[KP_MAX_TENSORS][KP_SHA256_HEX_LEN];
        kp_sha256_job *jobs[KP_MAX_TENSORS + 1];
        kp_span parts[KP_MAX_TENSORS];
        ref_parts(&ref, parts);
        jobs[0] = kp_sha256_job_start(tag->valuestring, strlen(tag->valuestring) + 1, parts, (size_t)ref.narrays);
        for (int k = 0; k < ref.nstate; k++) jobs[k + 1] = slices_job(&ref.state[k], 0, ref.state[k].shape[0]);
        kp_sha256_job_join(jobs[0], hex);
        for (int k = 0; k < ref.nstate; k++) kp_sha256_job_join(jobs[k + 1], one[k]);
        ok = !strcmp(hex, sha->valuestring);
        for (int k = 0; ok && k < ref.nstate; k++) {
            const cJSON *want = cJSON_GetArrayItem(st, k);
            ok = cJSON_IsString(want) && !strcmp(want->valuestring, one[k]);
        }
        if (!ok) snprintf(p->ref_note, sizeof p->ref_note, "refused: its bytes do not hash to the digests it recorded");
    } else if (got < 0) {
        char why[sizeof p->ref_note];
        snprintf(why, sizeof why, "%s", p->ref_note);
        snprintf(p->ref_note, sizeof p->ref_note, "refused: %.180s", why);
    }
    if (ok) { /* the family's own copies, which it frees */
        for (int k = 0; k < ref.narrays + ref.nstate; k++) {
            kp_tensor *t = k < ref.narrays ? &ref.arrays[k] : &ref.state[k - ref.narrays];
            const size_t bytes = kp_tensor_slice_bytes(t) * (size_t)t->shape[0];
            void *copy = malloc(bytes ? bytes : 1);
            if (!copy) KP_OUT_OF_MEMORY("a cached reference");
            memcpy(copy, t->data, bytes);
            t->data = copy;
        }
        kp_error why = {0};
        if (p->fam->reference_adopt(p->v.data, params, &ref, &why)) { /* refused: the copies are still ours */
            snprintf(p->ref_note, sizeof p->ref_note, "refused by the family: %.160s", why.msg);
            for (int k = 0; k < ref.narrays + ref.nstate; k++)
                free(k < ref.narrays ? ref.arrays[k].data : ref.state[k - ref.narrays].data);
            ok = false;
        }
    }
    if (ok) {
        char was[128];
        snprintf(was, sizeof was, "%s", tag->valuestring);
        memcpy(p->ref_digest, sha->valuestring, KP_SHA256_HEX_LEN);
        kp_cache_close(&e);
        if (p->fam->reference(p->v.data, params, &p->ref, err)) return false; /* described, not computed */
        if (strcmp(was, p->ref.digest_tag)) /* its digest was taken with that tag: the family's reference changed */
            return kp_fail(err, KP_EXIT_ENV, "cache: reference entry %.16s... was tagged %s, family %s tags %s now; "
                           "bump its reference_version", p->ref_key, was, p->fam->name, p->ref.digest_tag), false;
        return true;
    }
    kp_cache_close(&e);
    if (got != 0) fprintf(stderr, "kparity: cache: reference entry %.16s... %s; computing\n", p->ref_key, p->ref_note);
    return false;
}

static void ref_to_cache(kp_prepared *p, const void *params) {
    char text[KP_CASE_NAME_MAX + 2048];
    ref_key_text(p, params, text, sizeof text);
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "tag", p->ref.digest_tag);
    cJSON_AddStringToObject(meta, "sha256", p->ref_digest);
    kp_json_add_int(meta, "arrays", p->ref.narrays);
    cJSON *st = cJSON_AddArrayToObject(meta, "state");
    kp_cache_tensor ct[2 * KP_MAX_TENSORS];
    for (int k = 0; k < p->ref.narrays; k++) ct[k] = (kp_cache_tensor){&p->ref.arrays[k], p->ref.arrays[k].shape[0]};
    for (int k = 0; k < p->ref.nstate; k++) {
        const kp_tensor *t = &p->ref.state[k];
        KP_ASSERT(t->row_stride == 0 || t->row_stride == kp_tensor_cols(t));
        ct[p->ref.narrays + k] = (kp_cache_tensor){t, t->shape[0]};
        char hex[KP_SHA256_HEX_LEN];
        kp_sha256_job_join(slices_job(t, 0, t->shape[0]), hex);
        cJSON_AddItemToArray(st, cJSON_CreateString(hex));
    }
    kp_error err = {0};
    if (kp_cache_put("reference", text, meta, ct, p->ref.narrays + p->ref.nstate, &err))
        fprintf(stderr, "kparity: %s (the run goes on)\n", err.msg);
    cJSON_Delete(meta);
}

void kp_describe_cache(const kp_prepared *p, bool reference, cJSON *obj) {
    if (!(reference ? p->cache_reference && p->fam->reference_adopt : p->cache_inputs)) return;
    const bool cached = reference ? p->ref_cached : p->inputs_cached, store = reference ? p->ref_store : p->inputs_store;
    cJSON_AddStringToObject(obj, "from", cached ? "cache" : reference ? "computed" : "generated");
    if (cached) {
        cJSON_AddStringToObject(obj, "entry", reference ? p->ref_key : p->inputs_key);
        return;
    }
    cJSON_AddStringToObject(obj, "why", reference ? p->ref_note : p->inputs_note);
    cJSON_AddBoolToObject(obj, "stored", store); /* at the end of the case */
    if (!store) cJSON_AddStringToObject(obj, "not_stored", reference ? p->ref_skip : p->inputs_skip);
}

/* The view's tensors and, when they were allocated here, free them; those in the inputs' mapped entry go with it. */
static void prepared_free(kp_prepared *p) {
    if (p->map) {
        for (int k = 0; k < p->v.ninputs; k++) p->v.inputs[k].data = NULL;
        for (int k = 0; k < p->v.nstate; k++) p->v.state[k].data = NULL;
    }
    view_free(p->fam, &p->judged, &p->v);
    if (p->map) munmap(p->map, p->map_len);
    p->map = NULL;
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
    if (!rc && p->cache_inputs) p->v.cached = p->inputs_cached = inputs_from_cache(p, &s, extra_rows);
    if (!rc && !p->v.cached) rc = view_declared(&p->v, &s, err);
    const double t1 = kp_now();
    if (!rc) rc = fam->prepare(c, extra_rows, &p->v, err);
    const double made = kp_now() - t1;
    kp_stage_add(p->cache_inputs ? KP_STAGE_CACHE : KP_STAGE_GENERATION, t1 - t0); /* shapes and allocation are cheap */
    kp_stage_add(KP_STAGE_GENERATION, made);
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
    if (p->cache_inputs && !p->inputs_cached) {
        kp_tensor *ts[2 * KP_MAX_TENSORS];
        int64_t slices[2 * KP_MAX_TENSORS];
        const int n = view_tensors(&p->v, ts);
        for (int k = 0; k < n; k++) slices[k] = view_slices(&p->v, ts[k]);
        p->inputs_store = worth_storing(ts, slices, n, made, p->inputs_skip, sizeof p->inputs_skip);
    }
    return 0;
}

int kp_prepare(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err) {
    return prepare(fam, c, extra_rows, true, p, err);
}

int kp_prepare_uncached(const kp_family *fam, const kp_case *c, int64_t extra_rows, kp_prepared *p, kp_error *err) {
    return prepare(fam, c, extra_rows, false, p, err);
}

void kp_prepared_release(kp_prepared *p) {
    if (!p->fam) return;
    kp_digests_settle(); /* digests may still be reading the inputs or the reference */
    if (p->inputs_store || p->ref_store) { /* what was made here, for the next run */
        const double t0 = kp_now();
        if (p->inputs_store) inputs_to_cache(p);
        if (p->ref_store) ref_to_cache(p, p->ref_has_params ? p->ref_params : NULL);
        kp_stage_add(KP_STAGE_CACHE, kp_now() - t0);
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
        if (p->input_sha[k][0]) { /* checked as the inputs came from the cache */
            cJSON_AddStringToObject(o, "sha256", p->input_sha[k]);
            continue;
        }
        unsigned char prefix[KP_TENSOR_PREFIX_MAX];
        kp_span *rows;
        size_t nrows;
        const size_t n = kp_buffer_digest_parts(t->dtype, t->ndim, t->shape, t->row_stride, t->data, prefix, &rows, &nrows);
        kp_digest_start(prefix, n, rows, nrows, p->input_sha[k], o, "sha256"); /* kp_buffer_digest's hex, at settle */
        free(rows);
    }
}

int kp_reference_run(kp_prepared *p, const void *params, cJSON *desc, kp_error *err) {
    if (!p->have_ref) {
        const double t0 = kp_now();
        const bool cacheable = p->cache_reference && p->fam->reference_adopt;
        if (cacheable) {
            inputs_digests(p); /* its key */
            if (ref_from_cache(p, params, err)) p->ref_cached = true;
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
            if (cacheable) {
                kp_tensor *ts[2 * KP_MAX_TENSORS];
                int64_t slices[2 * KP_MAX_TENSORS];
                for (int k = 0; k < p->ref.narrays + p->ref.nstate; k++) {
                    ts[k] = k < p->ref.narrays ? &p->ref.arrays[k] : &p->ref.state[k - p->ref.narrays];
                    slices[k] = ts[k]->shape[0];
                }
                p->ref_store = worth_storing(ts, slices, p->ref.narrays + p->ref.nstate, p->ref_seconds, p->ref_skip,
                                             sizeof p->ref_skip);
            }
            if ((p->ref_has_params = params != NULL)) memcpy(p->ref_params, params, p->fam->params_bytes);
            KP_ASSERT(p->ref.narrays > 0 && p->ref.narrays <= KP_MAX_TENSORS && p->ref.digest_tag);
            kp_span parts[KP_MAX_TENSORS]; /* hashed on a worker thread into ref_digest */
            ref_parts(&p->ref, parts);
            kp_digest_start(p->ref.digest_tag, strlen(p->ref.digest_tag) + 1, parts, (size_t)p->ref.narrays,
                            p->ref_digest, NULL, NULL);
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
