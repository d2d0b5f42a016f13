/* tolerance.c: the tolerance check (DESIGN.md "Checks"): continuous outputs against the float64
 * reference. NaN and +-inf positions must match first; then, over the finite pairs, max abs, max rel,
 * NMSE, cosine difference and a bf16 ulp histogram, each bounded where the config declares it, with
 * every row's worst element listed. f32 and bf16 outputs. An output the impl declared absent is NOT_RUN in its
 * entry, never compared with whatever its buffer holds; the verdict is over the others. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../receipts/kp_json.h"
#include "../reference/kp_detmath.h"
#include "kp_checks.h"

static double element(const void *row, kp_dtype dt, int64_t i) {
    if (dt == KP_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)row)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    if (dt == KP_F64) return ((const double *)row)[i];
    return ((const float *)row)[i];
}

/* 0 finite, 1 NaN, 2 +inf, 3 -inf */
static int value_class(double v) { return isnan(v) ? 1 : isinf(v) ? (v > 0 ? 2 : 3) : 0; }

/* v rounded to bf16 (through f32, to nearest even), as an integer that orders like the value. */
static int32_t bf16_ordinal(double v) {
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    const int32_t h = (int32_t)(bits >> 16);
    return (h & 0x8000) ? -(h & 0x7fff) : h;
}

/* v rounded to dt (f32 or bf16), nearest even, in one rounding from the double (no double rounding through f32). */
static double round_to(double v, kp_dtype dt) {
    if (!isfinite(v) || dt == KP_F64) return v;
    const float f = (float)v;
    if (dt == KP_F32 || !isfinite(f)) return f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    const double past = fabs(v) - fabs((double)f); /* where v lies beyond f, when f's low half is exactly the midpoint */
    if ((bits & 0xffffu) == 0x8000u && past != 0) bits = (bits & 0xffff0000u) + (past > 0 ? 0x10000u : 0u);
    else bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

#define ULP_BUCKETS 8
static const char *const ulp_bucket_names[ULP_BUCKETS] = {"0", "1", "2", "3-4", "5-8", "9-16", "17-64", ">64"};
static int ulp_bucket(int64_t d) {
    return d <= 2 ? (int)d : d <= 4 ? 3 : d <= 8 ? 4 : d <= 16 ? 5 : d <= 64 ? 6 : 7;
}

typedef struct worst {
    int64_t index;
    double value, reference, excess; /* excess: |x - r| - (atol + rtol |r|), or - max(atol, rtol |r|) with "both" */
} worst;

/* One tensor's comparison: the metrics, the index lists and every row's worst element. */
typedef struct tensor_result {
    int64_t elements, finite, zero_reference, nonfinite_bad, over;
    int64_t *nonfinite_idx, *over_idx;
    double max_abs, max_rel;
    int64_t max_abs_at, max_rel_at, max_ulp;
    kp_nsum see, srr, sxr, sxx;
    int64_t ulp_hist[ULP_BUCKETS];
    worst *per_row;
} tensor_result;

static const kp_tensor *reference_array(const kp_prepared *p, const char *name) {
    for (int k = 0; k < p->ref.narrays; k++)
        if (!strcmp(p->ref.arrays[k].name, name)) return &p->ref.arrays[k];
    return NULL;
}

/* compare_tensor's work, in blocks of whole rows (about BLOCK_ELEMENTS elements) on every thread, a wave of at most
 * WAVE_BLOCKS blocks at a time. A block finds everything but the four sums: counts, maxima (first where equal), its
 * index lists (written at its own elements' offsets, closed up afterwards), its rows' worst elements, and the finite
 * pairs in order. The sums then take those pairs on one thread, block after block: the same terms in the same order as
 * one pass over the tensor, so the same bits whatever the thread count. The check's serial part is those sums alone. */
#define BLOCK_ELEMENTS 16384
#define WAVE_BLOCKS 32 /* and at most KP_TOLERANCE_WAVE_ELEMENTS pairs a wave (kp_checks.h), unless one row is more */

typedef struct block_result {
    int64_t first_row, end_row, finite, zero_reference, nonfinite_bad, over, max_ulp, npairs;
    double max_abs, max_rel;
    int64_t max_abs_at, max_rel_at;
    int64_t ulp_hist[ULP_BUCKETS];
} block_result;

typedef struct tensor_job {
    const kp_prepared *p;
    const kp_output *o;
    int k;
    const double *ref; /* [rows, per_row] */
    const kp_tolerance *tol;
    int64_t per_row, rows_per_block, nblocks, wave_blocks, first_block;
    tensor_result *t;
    block_result block[WAVE_BLOCKS];
    double *pairs; /* [WAVE_BLOCKS][rows_per_block * per_row][2]: x, y of each finite pair */
} tensor_job;

static void compare_block(void *ctx, int64_t item) {
    tensor_job *job = ctx;
    const int64_t b = job->first_block + item, per_row = job->per_row;
    const kp_dtype dt = job->o->t[job->k].dtype;
    const kp_tolerance *tol = job->tol;
    tensor_result *t = job->t;
    block_result *br = &job->block[item];
    memset(br, 0, sizeof *br);
    br->first_row = b * job->rows_per_block;
    br->end_row = br->first_row + job->rows_per_block < job->o->nrows ? br->first_row + job->rows_per_block : job->o->nrows;
    br->max_abs_at = br->max_rel_at = -1;
    int64_t *nonfinite_idx = t->nonfinite_idx + br->first_row * per_row, *over_idx = t->over_idx + br->first_row * per_row;
    double *pairs = job->pairs + 2 * item * job->rows_per_block * per_row;
    kp_rowbuf buf = {0};
    for (int64_t r = br->first_row; r < br->end_row; r++) {
        int64_t elems;
        const void *row = kp_output_row(job->p, job->o, job->k, r, false, &elems, &buf);
        const double *rr = job->ref + r * per_row;
        worst *w = &t->per_row[r];
        w->index = -1, w->excess = -INFINITY;
        for (int64_t i = 0; i < per_row; i++) {
            const int64_t at = r * per_row + i;
            const double x = element(row, dt, i), y = tol->round_reference ? round_to(rr[i], dt) : rr[i];
            if (value_class(x) != value_class(y)) {
                nonfinite_idx[br->nonfinite_bad++] = at;
                if (w->excess < INFINITY) *w = (worst){at, x, y, INFINITY};
                continue;
            }
            if (value_class(x)) continue; /* the same non-finite value on both sides */
            br->finite++;
            const double rel = tol->rtol * fabs(y);
            const double d = fabs(x - y), allowed = tol->both ? (rel > tol->atol ? rel : tol->atol) : tol->atol + rel;
            const double excess = d - allowed;
            if (d > br->max_abs || br->max_abs_at < 0) br->max_abs = d, br->max_abs_at = at;
            if (y == 0) br->zero_reference++;
            else if (d / fabs(y) > br->max_rel || br->max_rel_at < 0) br->max_rel = d / fabs(y), br->max_rel_at = at;
            if (excess > 0) over_idx[br->over++] = at;
            if (excess > w->excess) *w = (worst){at, x, y, excess};
            pairs[2 * br->npairs] = x, pairs[2 * br->npairs + 1] = y;
            br->npairs++;
            const int32_t a = bf16_ordinal(x), c = bf16_ordinal(y);
            const int64_t u = a > c ? (int64_t)a - c : (int64_t)c - a;
            br->ulp_hist[ulp_bucket(u)]++;
            if (u > br->max_ulp) br->max_ulp = u;
        }
    }
    kp_rowbuf_free(&buf);
}

/* Block `item` of the wave into t, after every block before it: its lists moved down to follow theirs. */
static void merge_block(const tensor_job *job, int64_t item) {
    const block_result *br = &job->block[item];
    tensor_result *t = job->t;
    const int64_t from = br->first_row * job->per_row;
    t->elements += (br->end_row - br->first_row) * job->per_row;
    t->finite += br->finite;
    t->zero_reference += br->zero_reference;
    memmove(t->nonfinite_idx + t->nonfinite_bad, t->nonfinite_idx + from, sizeof(int64_t) * (size_t)br->nonfinite_bad);
    t->nonfinite_bad += br->nonfinite_bad;
    memmove(t->over_idx + t->over, t->over_idx + from, sizeof(int64_t) * (size_t)br->over);
    t->over += br->over;
    /* one pass takes a later element only when strictly larger, or when it has none yet */
    if (br->max_abs_at >= 0 && (br->max_abs > t->max_abs || t->max_abs_at < 0)) t->max_abs = br->max_abs, t->max_abs_at = br->max_abs_at;
    if (br->max_rel_at >= 0 && (br->max_rel > t->max_rel || t->max_rel_at < 0)) t->max_rel = br->max_rel, t->max_rel_at = br->max_rel_at;
    for (int u = 0; u < ULP_BUCKETS; u++) t->ulp_hist[u] += br->ulp_hist[u];
    if (br->max_ulp > t->max_ulp) t->max_ulp = br->max_ulp;
    const double *pairs = job->pairs + 2 * item * job->rows_per_block * job->per_row;
    for (int64_t q = 0; q < br->npairs; q++) {
        const double x = pairs[2 * q], y = pairs[2 * q + 1];
        kp_nsum_add(&t->see, (x - y) * (x - y));
        kp_nsum_add(&t->srr, y * y);
        kp_nsum_add(&t->sxr, x * y);
        kp_nsum_add(&t->sxx, x * x);
    }
}

/* Output k against the reference array `ref_name` (the output's own name, or "<output>@<what>"). */
static int compare_tensor(const kp_prepared *p, const kp_output *o, int k, const char *ref_name, const kp_tolerance *tol,
                          tensor_result *t, kp_error *err) {
    memset(t, 0, sizeof *t);
    if (strcmp(o->t[k].name, p->fam->tolerance_outputs[k]))
        return kp_fail(err, KP_EXIT_ENV, "tolerance: output %d is '%s', the family's tolerance_outputs name '%s' there", k,
                       o->t[k].name, p->fam->tolerance_outputs[k]);
    const kp_tensor *ref = reference_array(p, ref_name);
    if (!ref || ref->dtype != KP_F64 || ref->shape[0] != o->nrows || kp_tensor_slice_bytes(ref) / 8 == 0)
        return kp_fail(err, KP_EXIT_ENV, "tolerance: the reference has no float64 array '%s' of %lld rows", ref_name,
                       (long long)o->nrows);
    const kp_dtype dt = o->t[k].dtype;
    if (dt != KP_F32 && dt != KP_BF16)
        return kp_fail(err, KP_EXIT_ENV, "tolerance: output '%s' is %s; the check reads f32 and bf16", o->t[k].name,
                       kp_dtype_name(dt));
    kp_rowbuf buf = {0};
    int64_t per_row;
    kp_output_row(p, o, k, 0, false, &per_row, &buf);
    kp_rowbuf_free(&buf);
    if ((size_t)per_row != kp_tensor_slice_bytes(ref) / 8)
        return kp_fail(err, KP_EXIT_ENV, "tolerance: output '%s' has %lld elements a row, its reference %zu", o->t[k].name,
                       (long long)per_row, kp_tensor_slice_bytes(ref) / 8);
    const int64_t n = o->nrows * per_row;
    tensor_job *job = calloc(1, sizeof *job);
    t->nonfinite_idx = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    t->over_idx = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    t->per_row = calloc((size_t)o->nrows, sizeof *t->per_row);
    if (job) {
        *job = (tensor_job){.p = p, .o = o, .k = k, .ref = ref->data, .tol = tol, .per_row = per_row, .t = t};
        job->rows_per_block = per_row >= BLOCK_ELEMENTS ? 1 : BLOCK_ELEMENTS / per_row;
        job->nblocks = (o->nrows + job->rows_per_block - 1) / job->rows_per_block;
        const int64_t block_elements = job->rows_per_block * per_row;
        job->wave_blocks = KP_TOLERANCE_WAVE_ELEMENTS / block_elements;
        job->wave_blocks = job->wave_blocks < 1 ? 1 : job->wave_blocks > WAVE_BLOCKS ? WAVE_BLOCKS : job->wave_blocks;
        job->pairs = malloc(sizeof(double) * 2 * (size_t)(job->wave_blocks * block_elements));
    }
    if (!job || !job->pairs || !t->nonfinite_idx || !t->over_idx || !t->per_row) {
        if (job) free(job->pairs);
        free(job);
        return kp_fail(err, KP_EXIT_ENV, "out of host memory for a tolerance check");
    }
    t->max_abs_at = t->max_rel_at = -1;
    for (job->first_block = 0; job->first_block < job->nblocks; job->first_block += job->wave_blocks) {
        const int64_t left = job->nblocks - job->first_block, wave = left < job->wave_blocks ? left : job->wave_blocks;
        kp_parallel_for(wave, compare_block, job);
        for (int64_t item = 0; item < wave; item++) merge_block(job, item);
    }
    free(job->pairs);
    free(job);
    return 0;
}

static void add_bound(cJSON *obj, const char *key, bool has, double v) {
    if (has) kp_json_add_double(obj, key, v);
    else cJSON_AddNullToObject(obj, key);
}

/* Output k against its reference array and every one named "<output>@<what>" (the same bounds, reported under
 * "against", never part of the verdict), one after another, each on every thread (compare_tensor). */
typedef struct comparisons {
    const kp_prepared *p;
    const kp_output *o;
    int k, n;
    const kp_tolerance *tol;
    const char *name[1 + KP_MAX_TENSORS]; /* [0]: the output's own */
    tensor_result t[1 + KP_MAX_TENSORS];
    int rc[1 + KP_MAX_TENSORS];
    kp_error err[1 + KP_MAX_TENSORS];
} comparisons;

static void comparisons_free(comparisons *c) {
    for (int i = 0; i < c->n; i++) free(c->t[i].nonfinite_idx), free(c->t[i].over_idx), free(c->t[i].per_row);
}

/* The "against" entries of e from c's comparisons 1..n-1. */
static void report_against(const comparisons *c, cJSON *e) {
    cJSON *list = NULL;
    for (int i = 1; i < c->n; i++) {
        const tensor_result *t = &c->t[i];
        if (!list) list = cJSON_AddArrayToObject(e, "against");
        cJSON *x = cJSON_CreateObject();
        cJSON_AddItemToArray(list, x);
        cJSON_AddStringToObject(x, "reference", c->name[i]);
        cJSON_AddStringToObject(x, "counts", "no: reported only");
        const double srr = kp_nsum_value(&t->srr), see = kp_nsum_value(&t->see), denom = kp_nsum_value(&t->sxx) + srr;
        kp_json_add_int(x, "over_tolerance", t->over);
        kp_json_add_int(x, "nonfinite_mismatch", t->nonfinite_bad);
        kp_json_add_double(x, "max_abs", t->max_abs);
        kp_json_add_int(x, "max_abs_at", t->max_abs_at);
        kp_json_add_double(x, "nmse", srr > 0 ? see / srr : (see > 0 ? INFINITY : 0.0));
        kp_json_add_double(x, "cosine_diff", denom > 0 ? 1.0 - 2.0 * kp_nsum_value(&t->sxr) / denom : 0.0);
        kp_json_add_int(x, "max_bf16_ulp", t->max_ulp);
    }
}

kp_result kp_tolerance_check(const kp_prepared *p, const kp_check_spec *spec, const kp_output *o, cJSON *chk,
                             kp_evidence *ev) {
    kp_error err = {0};
    cJSON *f = cJSON_AddObjectToObject(chk, "findings");
    cJSON *tensors = cJSON_AddArrayToObject(f, "tensors");
    char summary[1024] = "";
    size_t used = 0;
    bool bad = false;
    int compared = 0;
    for (int k = 0; k < o->ntensors && p->fam->tolerance_outputs && p->fam->tolerance_outputs[k]; k++) {
        const kp_tolerance *tol = &spec->tolerance[k];
        if (kp_impl_output_absent(spec->impl[0], o->t[k].name)) { /* never held to the reference through a stand-in */
            char why[200];
            snprintf(why, sizeof why, "%s: declared absent by %s, not judged", o->t[k].name, spec->impl[0]->name);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToArray(tensors, e);
            cJSON_AddStringToObject(e, "tensor", o->t[k].name);
            cJSON_AddStringToObject(e, "dtype", kp_dtype_name(o->t[k].dtype));
            cJSON_AddStringToObject(e, "result", "NOT_RUN");
            cJSON_AddStringToObject(e, "reason", why);
            const int n = snprintf(summary + used, sizeof summary - used, "%s%s", used ? "; " : "", why);
            if (n > 0) used += (size_t)n < sizeof summary - used ? (size_t)n : sizeof summary - used - 1;
            continue;
        }
        compared++;
        comparisons c = {.p = p, .o = o, .k = k, .tol = tol, .n = 1, .name = {o->t[k].name}};
        const size_t len = strlen(o->t[k].name);
        for (int a = 0; a < p->ref.narrays && c.n < 1 + KP_MAX_TENSORS; a++)
            if (!strncmp(p->ref.arrays[a].name, o->t[k].name, len) && p->ref.arrays[a].name[len] == '@')
                c.name[c.n++] = p->ref.arrays[a].name;
        for (int i = 0; i < c.n; i++) /* one after another, each on every thread (compare_tensor) */
            c.rc[i] = compare_tensor(c.p, c.o, c.k, c.name[i], c.tol, &c.t[i], &c.err[i]);
        for (int i = 0; i < c.n; i++)
            if (c.rc[i]) {
                cJSON_AddStringToObject(chk, "summary", c.err[i].msg);
                comparisons_free(&c);
                return KP_FAILED;
            }
        const tensor_result t = c.t[0];
        const double srr = kp_nsum_value(&t.srr), see = kp_nsum_value(&t.see);
        const double nmse = srr > 0 ? see / srr : (see > 0 ? INFINITY : 0.0);
        const double denom = kp_nsum_value(&t.sxx) + srr;
        const double cosine = denom > 0 ? 1.0 - 2.0 * kp_nsum_value(&t.sxr) / denom : 0.0;
        const bool nmse_bad = tol->has_nmse && !(nmse <= tol->nmse);
        const bool cos_bad = tol->has_cosine && !(cosine <= tol->cosine);
        const bool ulp_bad = tol->has_ulp && t.max_ulp > tol->ulp;
        const bool tensor_bad = t.nonfinite_bad || t.over || nmse_bad || cos_bad || ulp_bad;
        bad |= tensor_bad;

        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(tensors, e);
        cJSON_AddStringToObject(e, "tensor", o->t[k].name);
        cJSON_AddStringToObject(e, "dtype", kp_dtype_name(o->t[k].dtype));
        cJSON_AddStringToObject(e, "result", tensor_bad ? "INCORRECT" : "PASSED");
        kp_json_add_int(e, "elements", t.elements);
        kp_json_add_int(e, "finite_pairs", t.finite);
        char name[160];
        snprintf(name, sizeof name, "tolerance.%s.nonfinite_mismatch", o->t[k].name);
        if (kp_evidence_list(ev, e, "nonfinite_mismatch", name, t.nonfinite_idx, t.nonfinite_bad, &err)) bad = true;
        snprintf(name, sizeof name, "tolerance.%s.over", o->t[k].name);
        if (kp_evidence_list(ev, e, "over_tolerance", name, t.over_idx, t.over, &err)) bad = true;
        cJSON *m = cJSON_AddObjectToObject(e, "metrics");
        kp_json_add_double(m, "max_abs", t.max_abs);
        kp_json_add_int(m, "max_abs_at", t.max_abs_at);
        kp_json_add_double(m, "max_rel", t.max_rel);
        kp_json_add_int(m, "max_rel_at", t.max_rel_at);
        kp_json_add_int(m, "zero_reference", t.zero_reference);
        kp_json_add_double(m, "nmse", nmse);
        kp_json_add_double(m, "cosine_diff", cosine);
        kp_json_add_int(m, "max_bf16_ulp", t.max_ulp);
        cJSON *h = cJSON_AddObjectToObject(m, "bf16_ulp_histogram");
        for (int b = 0; b < ULP_BUCKETS; b++) kp_json_add_int(h, ulp_bucket_names[b], t.ulp_hist[b]);
        report_against(&c, e);
        cJSON *rows = cJSON_AddArrayToObject(e, "worst_per_row");
        for (int64_t r = 0; r < o->nrows; r++) {
            const worst *w = &t.per_row[r];
            cJSON *row = cJSON_CreateObject();
            cJSON_AddItemToArray(rows, row);
            kp_json_add_int(row, "row", r);
            kp_json_add_int(row, "index", w->index);
            if (w->index < 0) continue;
            kp_json_add_double(row, "value", w->value);
            kp_json_add_double(row, "reference", w->reference);
            kp_json_add_double(row, "abs", fabs(w->value - w->reference));
            kp_json_add_double(row, "excess", w->excess);
        }
        int n = snprintf(summary + used, sizeof summary - used,
                         "%s%s: %lld/%lld over atol %g %s rtol %g|r|, %lld NaN/inf misplaced; max abs %.3g, NMSE %.3g, "
                         "cosine diff %.3g, max %lld bf16 ulp%s%s%s",
                         used ? "; " : "", o->t[k].name, (long long)t.over, (long long)t.elements, tol->atol,
                         tol->both ? "and" : "+", tol->rtol,
                         (long long)t.nonfinite_bad, t.max_abs, nmse, cosine, (long long)t.max_ulp,
                         nmse_bad ? "; NMSE over its bound" : "", cos_bad ? "; cosine diff over its bound" : "",
                         ulp_bad ? "; ulp over its bound" : "");
        if (n > 0) used += (size_t)n < sizeof summary - used ? (size_t)n : sizeof summary - used - 1;
        comparisons_free(&c);
    }
    if (err.msg[0]) {
        cJSON_AddStringToObject(chk, "summary", err.msg);
        return KP_FAILED;
    }
    cJSON_AddStringToObject(chk, "summary", summary);
    return bad ? KP_INCORRECT : compared ? KP_PASSED : KP_NOT_RUN; /* over the tensors present; none: no verdict */
}

void kp_tolerance_describe(const kp_family *fam, const kp_check_spec *spec, cJSON *params) {
    cJSON *per = cJSON_AddObjectToObject(params, "tolerance");
    for (int k = 0; fam->tolerance_outputs && fam->tolerance_outputs[k]; k++) {
        const kp_tolerance *tol = &spec->tolerance[k];
        cJSON *t = cJSON_AddObjectToObject(per, fam->tolerance_outputs[k]);
        kp_json_add_double(t, "atol", tol->atol);
        kp_json_add_double(t, "rtol", tol->rtol);
        cJSON_AddStringToObject(t, "element_rule", tol->both ? "both" : "sum");
        cJSON_AddBoolToObject(t, "round_reference", tol->round_reference);
        add_bound(t, "nmse", tol->has_nmse, tol->nmse);
        add_bound(t, "cosine", tol->has_cosine, tol->cosine);
        if (tol->has_ulp) kp_json_add_int(t, "ulp", tol->ulp);
        else cJSON_AddNullToObject(t, "ulp");
    }
    cJSON_AddStringToObject(params, "element_rule", "sum: |x - r| <= atol + rtol * |r|; both: |x - r| <= max(atol, rtol * "
                                                    "|r|); r rounded to the output's dtype first where round_reference; "
                                                    "after NaN and +-inf positions match; null: not bounded (reported only)");
}
