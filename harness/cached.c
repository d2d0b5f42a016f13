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

/* The stream receipts hash for slices [first, first + n) of t (kp_buffer_digest): its header and its rows. */
typedef struct stream {
    unsigned char prefix[KP_TENSOR_PREFIX_MAX];
    size_t prefix_len, nrows;
    kp_span *rows;
} stream;

static void stream_of(const kp_tensor *t, int64_t first, int64_t n, stream *st) {
    int64_t shape[KP_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = n;
    const void *at = (const unsigned char *)t->data + (size_t)first * kp_tensor_slice_bytes(t);
    st->prefix_len = kp_buffer_digest_parts(t->dtype, t->ndim, shape, t->row_stride, at, st->prefix, &st->rows, &st->nrows);
}

/* A job hashing slices [first, first + n) of t the way receipts hash a tensor, checkpoints and all. */
static kp_sha256_job *slices_job(const kp_tensor *t, int64_t first, int64_t n) {
    stream st;
    stream_of(t, first, n, &st);
    kp_sha256_job *job = kp_sha256_job_start(st.prefix, st.prefix_len, st.rows, st.nrows);
    free(st.rows);
    return job;
}

/* The view's tensors in an entry's order: inputs, then state. */
static int view_tensors(kp_case_view *v, kp_tensor **t) {
    for (int k = 0; k < v->ninputs; k++) t[k] = &v->inputs[k];
    for (int k = 0; k < v->nstate; k++) t[v->ninputs + k] = &v->state[k];
    return v->ninputs + v->nstate;
}

/* A stream's digest and checkpoints, as an entry records them. */
typedef struct sums {
    char sha[KP_SHA256_HEX_LEN];
    kp_sha256_points points;
} sums;

/* Whether input k's digest and checkpoints are known (the receipt's hashing yields both; a hit's check, the digest). */
static bool input_sums_known(const kp_prepared *p, int k) { return p->input_sha[k][0] && p->input_points[k].len; }

/* Every input's and state array's sums, hashed at once, one thread each: head[k] of tensor k's shape[0] slices (an
 * input's: the receipt's), more[k] of a batched input's rows past them (sha "" when none). An input's sums known
 * already (from the receipt's hashing: p->input_points) are taken, not hashed again. */
static void view_sums(kp_prepared *p, sums *head, sums *more) {
    kp_sha256_job *jobs[2 * 2 * KP_MAX_TENSORS] = {0};
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    const int n = view_tensors(&p->v, ts);
    for (int k = 0; k < n; k++) {
        const int64_t slices = view_slices(&p->v, ts[k]);
        head[k] = more[k] = (sums){.sha = {0}};
        if (k < p->v.ninputs && input_sums_known(p, k)) {
            memcpy(head[k].sha, p->input_sha[k], KP_SHA256_HEX_LEN);
            head[k].points = p->input_points[k];
            p->input_points[k] = (kp_sha256_points){0};
        } else {
            jobs[2 * k] = slices_job(ts[k], 0, ts[k]->shape[0]);
        }
        if (slices > ts[k]->shape[0]) jobs[2 * k + 1] = slices_job(ts[k], ts[k]->shape[0], slices - ts[k]->shape[0]);
    }
    for (int k = 0; k < n; k++) {
        if (jobs[2 * k]) kp_sha256_job_join_points(jobs[2 * k], head[k].sha, &head[k].points);
        if (jobs[2 * k + 1]) kp_sha256_job_join_points(jobs[2 * k + 1], more[k].sha, &more[k].points);
    }
}

/* A stream's sums into an entry's metadata: "<key>" its digest, "<key>_points" its checkpoints. */
static void add_sums(cJSON *d, const char *key, const sums *s) {
    char name[64];
    cJSON_AddStringToObject(d, key, s->sha);
    char *hex = kp_sha256_points_hex(&s->points);
    snprintf(name, sizeof name, "%s_points", key);
    cJSON_AddStringToObject(d, name, hex);
    free(hex);
}

/* A claim that slices [first, first + n) of t hash to the sums recorded under key in d: false when d records none
 * (or not that stream's length's points); the stream's rows and points are the claim's until claim_free. */
static bool claim_of(const kp_tensor *t, int64_t first, int64_t n, const cJSON *d, const char *key, stream *st,
                     kp_sha256_points *pts, kp_sha256_claim *c) {
    char name[64];
    snprintf(name, sizeof name, "%s_points", key);
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(d, key), *ph = cJSON_GetObjectItemCaseSensitive(d, name);
    stream_of(t, first, n, st);
    uint64_t len = st->prefix_len;
    for (size_t i = 0; i < st->nrows; i++) len += st->rows[i].len;
    *c = (kp_sha256_claim){st->prefix, st->prefix_len, st->rows, st->nrows, pts, NULL, false};
    memset(pts, 0, sizeof *pts);
    if (!cJSON_IsString(sha) || strlen(sha->valuestring) != KP_SHA256_HEX_LEN - 1 || !cJSON_IsString(ph) ||
        !kp_sha256_points_parse(ph->valuestring, len, pts))
        return false;
    c->hex = sha->valuestring;
    return true;
}

static void claim_free(stream *st, kp_sha256_points *pts) {
    free(st->rows);
    kp_sha256_points_free(pts);
}

/* Every input's digest in p->input_sha (a reference entry's key): those being hashed for the receipt waited for,
 * any not started (no receipt asked) hashed now. All known (taken from a checked entry, as every warm run's are): no
 * wait, since settling waits for every pending digest, other buffers' too (0.1 s of the 2-core warm default gate). */
static void inputs_digests(kp_prepared *p) {
    bool known = true;
    for (int k = 0; k < p->v.ninputs; k++) known &= p->input_sha[k][0] != 0;
    if (known) return;
    kp_digests_settle();
    kp_sha256_job *jobs[KP_MAX_TENSORS] = {0};
    for (int k = 0; k < p->v.ninputs; k++)
        if (!p->input_sha[k][0]) jobs[k] = slices_job(&p->v.inputs[k], 0, p->v.inputs[k].shape[0]);
    for (int k = 0; k < p->v.ninputs; k++)
        if (jobs[k]) kp_sha256_job_join(jobs[k], p->input_sha[k]);
}

/* The key texts' versions: v3 entries record checkpoints KP_SHA256_POINT_BYTES (1 MiB) apart, v2's 16 MiB; a v2 entry
 * is another key's, so absent here (and gone past the cap in time) rather than refused with a line each. */
static void inputs_key_text(const kp_prepared *p, int64_t extra_rows, char *text, size_t len) {
    char name[KP_CASE_NAME_MAX];
    if (kp_case_format(&p->c, name, sizeof name) < 0) snprintf(name, sizeof name, "?");
    snprintf(text, len, "kparity.cache.inputs/v3\nfamily %s\ncase %s\ngenerator %s\nextra_rows %lld\n", p->fam->name, name,
             p->fam->cases->generator_version, (long long)extra_rows);
}

/* Check the claims that each of the n tensors ts hashes to what digests (an entry's list, one object a tensor) records:
 * its shape[0] slices as "sha256", its slices past them up to slices[k] as "more_sha256" (ts[k]->shape[0] == slices[k]:
 * none). All at once on every thread (kp_sha256_check). True when every one holds; else why says which failed. */
static bool check_sums(kp_tensor *const *ts, const int64_t *slices, int n, const cJSON *digests, char *why, size_t why_len) {
    stream st[2 * 2 * KP_MAX_TENSORS];
    kp_sha256_points pts[2 * 2 * KP_MAX_TENSORS];
    kp_sha256_claim c[2 * 2 * KP_MAX_TENSORS];
    int owner[2 * 2 * KP_MAX_TENSORS], nc = 0;
    bool recorded = cJSON_GetArraySize(digests) == n;
    for (int k = 0; k < n; k++) {
        const cJSON *d = cJSON_GetArrayItem(digests, k);
        recorded &= claim_of(ts[k], 0, ts[k]->shape[0], d, "sha256", &st[nc], &pts[nc], &c[nc]);
        owner[nc++] = k;
        if (slices[k] > ts[k]->shape[0]) {
            recorded &= claim_of(ts[k], ts[k]->shape[0], slices[k] - ts[k]->shape[0], d, "more_sha256", &st[nc], &pts[nc], &c[nc]);
            owner[nc++] = k;
        }
    }
    bool ok = recorded;
    if (!recorded) snprintf(why, why_len, "refused: its metadata lacks a digest or checkpoints of a tensor");
    if (recorded) kp_sha256_check(c, nc);
    for (int i = 0; ok && i < nc; i++)
        if (!(ok = c[i].ok)) snprintf(why, why_len, "refused: '%s' does not hash to the digest its entry recorded (%.16s...)",
                                      ts[owner[i]]->name, c[i].hex);
    for (int i = 0; i < nc; i++) claim_free(&st[i], &pts[i]);
    return ok;
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
        kp_tensor *ts[2 * KP_MAX_TENSORS];
        int64_t slices[2 * KP_MAX_TENSORS];
        for (int k = 0; k < e.ntensors; k++) {
            kp_tensor *t = k < s->ninputs ? &v->inputs[k] : &v->state[k - s->ninputs];
            *t = e.tensors[k];
            t->batched = k < s->ninputs && s->inputs[k].batched;
            ts[k] = t, slices[k] = e.slices[k];
        }
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(e.meta, "digests");
        ok = check_sums(ts, slices, e.ntensors, want, p->inputs_note, sizeof p->inputs_note);
        if (ok) {
            for (int k = 0; k < v->ninputs; k++) {
                const cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(want, k), "sha256");
                memcpy(p->input_sha[k], d->valuestring, KP_SHA256_HEX_LEN);
            }
            p->map = e.map, p->map_len = e.len, e.map = NULL; /* the view's tensors live there now */
            kp_cache_touch("digests", text); /* the case's record when this entry goes: kept beside it */
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

bool kp_cache_digests_read(kp_prepared *p, int64_t extra_rows) {
    char text[KP_CASE_NAME_MAX + 256];
    inputs_key_text(p, extra_rows, text, sizeof text);
    kp_cache_entry e;
    const int got = kp_cache_open("digests", text, &e, p->digests_note, sizeof p->digests_note);
    bool ok = got == 1 && e.ntensors == 0;
    if (got == 1 && !ok) snprintf(p->digests_note, sizeof p->digests_note, "refused: it holds tensors");
    if (ok) {
        kp_tensor *ts[KP_MAX_TENSORS];
        int64_t slices[KP_MAX_TENSORS];
        for (int k = 0; k < p->v.ninputs; k++) ts[k] = &p->v.inputs[k], slices[k] = p->v.inputs[k].shape[0];
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(e.meta, "digests");
        ok = check_sums(ts, slices, p->v.ninputs, want, p->digests_note, sizeof p->digests_note);
        for (int k = 0; ok && k < p->v.ninputs; k++) {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(want, k), "sha256");
            memcpy(p->input_sha[k], d->valuestring, KP_SHA256_HEX_LEN);
        }
    } else if (got < 0) {
        char why[sizeof p->digests_note];
        snprintf(why, sizeof why, "%s", p->digests_note);
        snprintf(p->digests_note, sizeof p->digests_note, "refused: %.180s", why);
    }
    kp_cache_close(&e);
    if (got != 0 && !ok)
        fprintf(stderr, "kparity: cache: the inputs generated here do not check against their digests entry: %s\n",
                p->digests_note);
    return ok;
}

void kp_cache_digests_write(kp_prepared *p) {
    char text[KP_CASE_NAME_MAX + 256];
    inputs_key_text(p, p->v.rows_total - p->v.batch, text, sizeof text);
    cJSON *meta = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(meta, "digests");
    for (int k = 0; k < p->v.ninputs; k++) {
        sums one = {.sha = {0}};
        if (!input_sums_known(p, k)) /* none from the receipt's hashing: hashed now, kept */
            kp_sha256_job_join_points(slices_job(&p->v.inputs[k], 0, p->v.inputs[k].shape[0]), p->input_sha[k],
                                      &p->input_points[k]);
        memcpy(one.sha, p->input_sha[k], KP_SHA256_HEX_LEN);
        one.points = p->input_points[k];
        cJSON *d = cJSON_CreateObject();
        add_sums(d, "sha256", &one);
        cJSON_AddItemToArray(list, d);
    }
    kp_error err = {0};
    if (kp_cache_put("digests", text, meta, NULL, 0, &err)) fprintf(stderr, "kparity: %s (the run goes on)\n", err.msg);
    cJSON_Delete(meta);
}

/* Whether an entry of these tensors, made in `seconds` (`borrowed` of them spent by an earlier case whose work this one
 * reused), is worth writing (kp_cache_worth); why not into why. */
static bool worth_storing(kp_tensor *const *ts, const int64_t *slices, int n, double seconds, double borrowed, char *why,
                          size_t len) {
    double bytes = 0;
    for (int k = 0; k < n; k++) bytes += (double)kp_tensor_slice_bytes(ts[k]) * (double)slices[k];
    if (kp_cache_worth(bytes, seconds)) {
        if (kp_cache_fits(bytes)) return true;
        snprintf(why, len, "%.1f MB would pass the cache's cap (%.3g GB, $KPARITY_CACHE_MAX_GB) beside this run's entries",
                 bytes / 1e6, kp_cache_cap_bytes() / 1e9);
        return false;
    }
    char part[96] = "";
    if (borrowed > 0) snprintf(part, sizeof part, ", %.3f s of it an earlier case's work reused", borrowed);
    if (!kp_cache_write_rate())
        snprintf(why, len, "made at %.2f GB/s (%.3f s for %.1f MB%s): a hit hashes at %.2f GB/s (worth it below that; the "
                 "folder's write rate is not yet known)", bytes / seconds / 1e9, seconds, bytes / 1e6, part,
                 kp_cache_hash_rate() * kp_thread_count() / 1e9);
    else
        snprintf(why, len, "made at %.2f GB/s (%.3f s for %.1f MB%s): a hit hashes at %.2f GB/s, the cache writes at %.2f "
                 "GB/s (worth it below the first, and below %d times the second)", bytes / seconds / 1e9, seconds,
                 bytes / 1e6, part, kp_cache_hash_rate() * kp_thread_count() / 1e9, kp_cache_write_rate() / 1e9,
                 KP_CACHE_PAYBACK_HITS);
    return false;
}

bool kp_cache_inputs_worth(kp_prepared *p, double seconds) {
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    int64_t slices[2 * KP_MAX_TENSORS];
    const int n = view_tensors(&p->v, ts);
    for (int k = 0; k < n; k++) slices[k] = view_slices(&p->v, ts[k]);
    /* what a run without the earlier case would spend making them */
    return worth_storing(ts, slices, n, seconds + p->v.borrowed_s, p->v.borrowed_s, p->inputs_skip, sizeof p->inputs_skip);
}

bool kp_cache_ref_worth(kp_prepared *p) {
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    int64_t slices[2 * KP_MAX_TENSORS];
    for (int k = 0; k < p->ref.narrays + p->ref.nstate; k++) {
        ts[k] = k < p->ref.narrays ? &p->ref.arrays[k] : &p->ref.state[k - p->ref.narrays];
        slices[k] = ts[k]->shape[0];
    }
    return worth_storing(ts, slices, p->ref.narrays + p->ref.nstate, p->ref_seconds, 0, p->ref_skip, sizeof p->ref_skip);
}

void kp_cache_inputs_write(kp_prepared *p) {
    kp_case_view *v = &p->v;
    kp_tensor *ts[2 * KP_MAX_TENSORS];
    const int n = view_tensors(v, ts);
    char text[KP_CASE_NAME_MAX + 256];
    inputs_key_text(p, v->rows_total - v->batch, text, sizeof text);
    sums head[2 * KP_MAX_TENSORS], more[2 * KP_MAX_TENSORS];
    view_sums(p, head, more);
    cJSON *meta = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(meta, "digests");
    kp_cache_tensor ct[2 * KP_MAX_TENSORS];
    for (int k = 0; k < n; k++) {
        ct[k] = (kp_cache_tensor){ts[k], view_slices(v, ts[k])};
        cJSON *d = cJSON_CreateObject();
        add_sums(d, "sha256", &head[k]);
        if (more[k].sha[0]) add_sums(d, "more_sha256", &more[k]);
        cJSON_AddItemToArray(list, d);
        kp_sha256_points_free(&head[k].points);
        kp_sha256_points_free(&more[k].points);
    }
    kp_error err = {0};
    if (kp_cache_put("inputs", text, meta, ct, n, &err)) fprintf(stderr, "kparity: %s (the run goes on)\n", err.msg);
    cJSON_Delete(meta);
}

static void ref_key_text(const kp_prepared *p, const void *params, char *text, size_t len) {
    char name[KP_CASE_NAME_MAX];
    if (kp_case_format(&p->c, name, sizeof name) < 0) snprintf(name, sizeof name, "?");
    int at = snprintf(text, len, "kparity.cache.reference/v3\nfamily %s\ncase %s\ngenerator %s\nreference %s\nparams ",
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
    if (!p->inputs_cached && !p->digests_checked) {
        /* inputs the cache has no record of (neither entry: both are written with every reference entry) have no
           reference entry either; looking would wait for their digests, hashed on one thread a tensor, for nothing */
        snprintf(p->ref_note, sizeof p->ref_note, "absent: the cache has no record of these inputs");
        return false;
    }
    inputs_digests(p); /* its key */
    char text[KP_CASE_NAME_MAX + 2048];
    ref_key_text(p, params, text, sizeof text);
    kp_cache_key(text, p->ref_key);
    kp_cache_entry e;
    const int got = kp_cache_open("reference", text, &e, p->ref_note, sizeof p->ref_note);
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(e.meta, "tag"), *sha = cJSON_GetObjectItemCaseSensitive(e.meta, "sha256");
    const cJSON *na = cJSON_GetObjectItemCaseSensitive(e.meta, "arrays"), *st_list = cJSON_GetObjectItemCaseSensitive(e.meta, "state");
    kp_reference ref = {0};
    bool ok = got == 1 && cJSON_IsString(tag) && cJSON_IsString(sha) && cJSON_IsNumber(na) && na->valuedouble >= 1 &&
              na->valuedouble <= e.ntensors && na->valuedouble <= KP_MAX_TENSORS &&
              e.ntensors - na->valuedouble <= KP_MAX_TENSORS && cJSON_IsArray(st_list) &&
              cJSON_GetArraySize(st_list) == e.ntensors - (int)na->valuedouble;
    for (int k = 0; ok && k < e.ntensors; k++) ok = e.tensors[k].row_stride == 0 && e.slices[k] == e.tensors[k].shape[0];
    if (got == 1 && !ok) snprintf(p->ref_note, sizeof p->ref_note, "refused: malformed metadata");
    if (ok) {
        ref.narrays = (int)na->valuedouble, ref.nstate = e.ntensors - ref.narrays;
        for (int k = 0; k < e.ntensors; k++) *(k < ref.narrays ? &ref.arrays[k] : &ref.state[k - ref.narrays]) = e.tensors[k];
        /* the arrays, after the tag, to the receipt's digest; each state array to its own */
        kp_span parts[KP_MAX_TENSORS];
        kp_reference_parts(&ref, parts);
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e.meta, "sha256_points");
        uint64_t len = strlen(tag->valuestring) + 1;
        for (int k = 0; k < ref.narrays; k++) len += parts[k].len;
        stream st[KP_MAX_TENSORS + 1];
        memset(st, 0, sizeof st);
        kp_sha256_points pts[KP_MAX_TENSORS + 1] = {{0}};
        kp_sha256_claim c[KP_MAX_TENSORS + 1];
        c[0] = (kp_sha256_claim){tag->valuestring, strlen(tag->valuestring) + 1, parts, (size_t)ref.narrays, &pts[0],
                                 sha->valuestring, false};
        bool recorded = cJSON_IsString(ph) && kp_sha256_points_parse(ph->valuestring, len, &pts[0]);
        for (int k = 0; k < ref.nstate; k++)
            recorded &= claim_of(&ref.state[k], 0, ref.state[k].shape[0], cJSON_GetArrayItem(st_list, k), "sha256", &st[k + 1],
                                 &pts[k + 1], &c[k + 1]);
        if (recorded) kp_sha256_check(c, ref.nstate + 1);
        ok = recorded;
        for (int k = 0; ok && k <= ref.nstate; k++) ok = c[k].ok;
        kp_sha256_points_free(&pts[0]);
        for (int k = 0; k < ref.nstate; k++) claim_free(&st[k + 1], &pts[k + 1]);
        if (!ok) snprintf(p->ref_note, sizeof p->ref_note, "refused: its bytes do not hash to the digests it recorded");
    } else if (got < 0) {
        char why[sizeof p->ref_note];
        snprintf(why, sizeof why, "%s", p->ref_note);
        snprintf(p->ref_note, sizeof p->ref_note, "refused: %.180s", why);
    }
    if (ok) { /* read where they lie: p keeps the entry's map until the case is released (not copied: a copy cost more
                 than the check on two cores) */
        kp_error why = {0};
        if (p->fam->reference_adopt(p->v.data, params, &ref, &why)) {
            snprintf(p->ref_note, sizeof p->ref_note, "refused by the family: %.160s", why.msg);
            ok = false;
        } else {
            p->ref_map = e.map, p->ref_map_len = e.len, e.map = NULL;
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
    sums all = {.sha = {0}};
    memcpy(all.sha, p->ref_digest, KP_SHA256_HEX_LEN);
    all.points = p->ref_points; /* the receipt's hashing of it (settled at release) */
    add_sums(meta, "sha256", &all);
    kp_json_add_int(meta, "arrays", p->ref.narrays);
    cJSON *st = cJSON_AddArrayToObject(meta, "state");
    kp_cache_tensor ct[2 * KP_MAX_TENSORS];
    for (int k = 0; k < p->ref.narrays; k++) ct[k] = (kp_cache_tensor){&p->ref.arrays[k], p->ref.arrays[k].shape[0]};
    for (int k = 0; k < p->ref.nstate; k++) {
        const kp_tensor *t = &p->ref.state[k];
        KP_ASSERT(t->row_stride == 0 || t->row_stride == kp_tensor_cols(t));
        ct[p->ref.narrays + k] = (kp_cache_tensor){t, t->shape[0]};
        sums one = {.sha = {0}};
        kp_sha256_job_join_points(slices_job(t, 0, t->shape[0]), one.sha, &one.points);
        cJSON *d = cJSON_CreateObject();
        add_sums(d, "sha256", &one);
        cJSON_AddItemToArray(st, d);
        kp_sha256_points_free(&one.points);
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
    if (!reference) { /* the digests receipts record: checked against the cache's on every thread, or hashed here */
        cJSON_AddStringToObject(obj, "digests", p->digests_checked ? "checked against the cache's" : "hashed");
        if (!p->digests_checked && p->digests_note[0]) cJSON_AddStringToObject(obj, "digests_why", p->digests_note);
    }
    cJSON_AddBoolToObject(obj, "stored", store); /* at the end of the case */
    if (!store) cJSON_AddStringToObject(obj, "not_stored", reference ? p->ref_skip : p->inputs_skip);
}

