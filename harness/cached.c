/* cached.c: a prepared case's cache entries (kp_cache.h): what its inputs' and its reference's entries hold, the key
 * each goes by, every check before one is used, and whether one is worth writing. cache.c keeps the files. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_cache.h"
#include "kp_launch.h"

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
bool kp_cache_inputs_read(kp_prepared *p, const kp_shapes *s, int64_t extra_rows) {
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
        ok = kp_tensors_alike(&t, want) && e.slices[k] == (want->batched ? s->rows_total : want->shape[0]);
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

bool kp_cache_inputs_worth(kp_prepared *p, double seconds) {
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    int64_t slices[2 * KP_MAX_TENSORS];
    const int n = view_tensors(&p->v, ts);
    for (int k = 0; k < n; k++) slices[k] = view_slices(&p->v, ts[k]);
    return worth_storing(ts, slices, n, seconds, p->inputs_skip, sizeof p->inputs_skip);
}

bool kp_cache_ref_worth(kp_prepared *p) {
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    int64_t slices[2 * KP_MAX_TENSORS];
    for (int k = 0; k < p->ref.narrays + p->ref.nstate; k++) {
        ts[k] = k < p->ref.narrays ? &p->ref.arrays[k] : &p->ref.state[k - p->ref.narrays];
        slices[k] = ts[k]->shape[0];
    }
    return worth_storing(ts, slices, p->ref.narrays + p->ref.nstate, p->ref_seconds, p->ref_skip, sizeof p->ref_skip);
}

void kp_cache_inputs_write(kp_prepared *p) {
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
void kp_reference_parts(const kp_reference *ref, kp_span parts[KP_MAX_TENSORS]) {
    for (int k = 0; k < ref->narrays; k++) {
        const kp_tensor *a = &ref->arrays[k];
        KP_ASSERT(a->row_stride == 0 || a->row_stride == kp_tensor_cols(a));
        parts[k] = (kp_span){a->data, kp_tensor_slice_bytes(a) * (size_t)a->shape[0]};
    }
}

/* The reference from its entry, when its arrays hash to the digest it recorded (the receipt's) and its state to its
 * own, and the family takes it (reference_adopt); then described into p->ref. */
bool kp_cache_ref_read(kp_prepared *p, const void *params, kp_error *err) {
    inputs_digests(p); /* its key */
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
        kp_reference_parts(&ref, parts);
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

void kp_cache_ref_write(kp_prepared *p, const void *params) {
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

