/* topk_ref.c: the indexer top-k reference (a selection over (key, index) pairs, rows in parallel) and the
 * order-insensitive judge that classifies any output against it. Written from the rule alone. */
#include "topk_ref.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- the total order ---------------------------------------------------------------------- */

/* Larger key, earlier in the order: -0 is +0; NaN (any sign or payload: one value) below -inf (key 0), or with
 * KP_TOPK_NAN_ABOVE above +inf (key 0xffffffff, past +inf's 0xff800000). */
static uint32_t order_key(float v, kp_topk_nan nan) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if ((b & 0x7fffffffu) > 0x7f800000u) return nan == KP_TOPK_NAN_ABOVE ? 0xffffffffu : 0;
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* (key, index) as one integer: larger first means value descending, then index ascending. */
static uint64_t item(float v, int32_t i, kp_topk_nan nan) {
    return (uint64_t)order_key(v, nan) << 32 | (uint32_t)(0xffffffffu - (uint32_t)i);
}
static int32_t item_index(uint64_t it) { return (int32_t)(0xffffffffu - (uint32_t)it); }

/* Move the n_top largest of items[0, n) to the front (in no particular order): quickselect, median of three. */
static void select_top(uint64_t *items, int64_t n, int64_t n_top) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        const int64_t mid = lo + (hi - lo) / 2;
        uint64_t a = items[lo], b = items[mid], c = items[hi];
        const uint64_t pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        int64_t i = lo, j = hi;
        while (i <= j) { /* descending: larger items to the left */
            while (items[i] > pivot) i++;
            while (items[j] < pivot) j--;
            if (i <= j) {
                const uint64_t t = items[i];
                items[i++] = items[j], items[j--] = t;
            }
        }
        if (n_top - 1 <= j) hi = j;
        else if (n_top - 1 >= i) lo = i;
        else return;
    }
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

typedef struct ref_job {
    const float *scores;
    int64_t stride;
    kp_topk_ref *ref;
    atomic_int failed;
} ref_job;

static void ref_row(void *ctx, int64_t r) {
    ref_job *job = ctx;
    kp_topk_ref *ref = job->ref;
    kp_topk_ref_row *row = &ref->row[r];
    const float *x = job->scores + r * job->stride;
    int32_t *idx = ref->indices + r * ref->k;
    float *val = ref->values + r * ref->k;
    uint64_t *items = malloc(sizeof *items * (size_t)(row->len ? row->len : 1));
    if (!items) {
        atomic_store(&job->failed, 1);
        return;
    }
    for (int32_t i = 0; i < row->len; i++) {
        items[i] = item(x[row->start + i], row->start + i, ref->nan);
        row->nan_count += x[row->start + i] != x[row->start + i];
    }
    if (row->count > 0 && row->len > 0) {
        select_top(items, row->len, row->count);
        uint64_t boundary = UINT64_MAX;
        for (int32_t q = 0; q < row->count; q++) {
            if (items[q] < boundary) boundary = items[q];
            idx[q] = item_index(items[q]);
        }
        row->boundary_key = (uint32_t)(boundary >> 32);
        row->boundary_value = x[item_index(boundary)];
        for (int32_t i = 0; i < row->len; i++) {
            const uint32_t key = order_key(x[row->start + i], ref->nan);
            row->above += key > row->boundary_key;
            row->group_size += key == row->boundary_key;
        }
        row->group_needed = row->count - row->above;
        qsort(idx, (size_t)row->count, sizeof *idx, cmp_i32);
        for (int32_t q = 0; q < row->count; q++) {
            val[q] = x[idx[q]];
            if (ref->index_base == 1) idx[q] -= row->start;
        }
    }
    for (int32_t q = row->count; q < ref->k; q++) {
        idx[q] = ref->fill;
        memcpy(&val[q], &(uint32_t){0xff800000u}, sizeof val[q]); /* -inf */
    }
    free(items);
}

int kp_topk_reference(const float *scores, int64_t rows, int64_t width, int64_t stride, const int32_t *starts,
                      const int32_t *ends, int32_t k, int32_t index_base, int32_t fill, kp_topk_nan nan, kp_topk_ref *out,
                      kp_error *err) {
    memset(out, 0, sizeof *out);
    if (rows < 1 || width < 1 || width > INT32_MAX || stride < width)
        return kp_fail(err, KP_EXIT_USAGE, "topk reference: rows %lld, width %lld, stride %lld", (long long)rows,
                       (long long)width, (long long)stride);
    if (k < 1 || k > 8192 || (fill != -1 && fill != INT32_MAX) || (index_base != 0 && index_base != 1))
        return kp_fail(err, KP_EXIT_USAGE, "topk reference: k %d, fill %d or index base %d", k, fill, index_base);
    if (nan != KP_TOPK_NAN_BELOW && nan != KP_TOPK_NAN_ABOVE)
        return kp_fail(err, KP_EXIT_USAGE, "topk reference: NaN rank %d is unknown", (int)nan);
    out->rows = rows, out->k = k, out->index_base = index_base, out->fill = fill, out->nan = nan;
    out->row = kp_calloc((size_t)rows, sizeof *out->row, "topk reference rows", err);
    out->indices = kp_calloc((size_t)rows * (size_t)k, sizeof *out->indices, "topk reference indices", err);
    out->values = kp_calloc((size_t)rows * (size_t)k, sizeof *out->values, "topk reference values", err);
    if (!out->row || !out->indices || !out->values) return kp_topk_ref_free(out), err->code;
    for (int64_t r = 0; r < rows; r++) {
        if (starts[r] < 0 || starts[r] > ends[r] || ends[r] > width) {
            kp_topk_ref_free(out);
            return kp_fail(err, KP_EXIT_USAGE, "topk reference: row %lld's window [%d, %d) is not inside [0, %lld)",
                           (long long)r, starts[r], ends[r], (long long)width);
        }
        out->row[r].start = starts[r], out->row[r].len = ends[r] - starts[r];
        out->row[r].count = out->row[r].len < k ? out->row[r].len : k;
    }
    ref_job job = {.scores = scores, .stride = stride, .ref = out};
    atomic_init(&job.failed, 0);
    kp_parallel_for(rows, ref_row, &job);
    if (atomic_load(&job.failed)) {
        kp_topk_ref_free(out);
        return kp_fail(err, KP_EXIT_ENV, "topk reference: out of host memory for a row");
    }
    return 0;
}

void kp_topk_ref_free(kp_topk_ref *ref) {
    free(ref->row), free(ref->indices), free(ref->values);
    memset(ref, 0, sizeof *ref);
}

/* ---- the judge ----------------------------------------------------------------------------- */

const char *kp_topk_nan_name(kp_topk_nan n) { return n == KP_TOPK_NAN_ABOVE ? "above" : "below"; }
const char *kp_topk_ties_name(kp_topk_ties t) { return t == KP_TOPK_TIES_ANY ? "any" : "lowest_index"; }
const char *kp_topk_order_name(kp_topk_order o) {
    return o == KP_TOPK_ORDER_INDEX ? "index" : o == KP_TOPK_ORDER_VALUE ? "value" : "any";
}

typedef struct judge_job {
    const kp_topk_ref *ref;
    const float *scores;
    int64_t stride;
    const int32_t *indices;
    const float *values;
    kp_topk_judgement *j;
    int64_t **strict, **tie, **missing; /* per row, malloc'd; counts in the row judgement */
    atomic_int failed;
} judge_job;

static uint32_t bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static void judge_row(void *ctx, int64_t r) {
    judge_job *job = ctx;
    const kp_topk_ref *ref = job->ref;
    const kp_topk_ref_row *rr = &ref->row[r];
    kp_topk_row_judgement *rj = &job->j->row[r];
    const float *x = job->scores + r * job->stride;
    const int32_t *idx = job->indices + r * ref->k, *want = ref->indices + r * ref->k;
    const float *val = job->values + r * ref->k;
    uint8_t *mine = calloc((size_t)(rr->len ? rr->len : 1), 1), *theirs = calloc((size_t)(rr->len ? rr->len : 1), 1);
    int32_t *order = malloc(sizeof *order * (size_t)ref->k), *sorted = malloc(sizeof *sorted * (size_t)ref->k);
    int64_t *strict = malloc(sizeof *strict * (size_t)(2 * ref->k + 1)), *tie = malloc(sizeof *tie * (size_t)(2 * ref->k + 1));
    int64_t *missing = malloc(sizeof *missing * (size_t)(ref->k + 1));
    if (!mine || !theirs || !order || !sorted || !strict || !tie || !missing) {
        atomic_store(&job->failed, 1);
        free(mine), free(theirs), free(order), free(sorted), free(strict), free(tie), free(missing);
        return;
    }
    const int32_t shift = ref->index_base == 1 ? 0 : rr->start; /* declared base -> window position */
    for (int32_t q = 0; q < ref->k; q++) {
        if (idx[q] == ref->fill) {
            rj->fill_misplaced += q < rr->count;
            rj->fill_value_bad += bits(val[q]) != 0xff800000u;
            continue;
        }
        rj->fill_misplaced += q >= rr->count;
        const int64_t w = (int64_t)idx[q] - shift;
        if (w < 0 || w >= rr->len) {
            rj->out_of_window++;
            continue;
        }
        if (mine[w]) {
            rj->duplicates++;
            continue;
        }
        mine[w] = 1;
        rj->value_mismatch += bits(val[q]) != bits(x[rr->start + w]);
        order[rj->valid] = (int32_t)(rr->start + w);
        sorted[rj->valid++] = (int32_t)(rr->start + w);
    }
    for (int32_t q = 0; q < rr->count; q++) theirs[want[q] - (ref->index_base == 1 ? 0 : rr->start)] = 1;
    for (int32_t w = 0; w < rr->len; w++) {
        if (mine[w] == theirs[w]) continue;
        const uint32_t key = order_key(x[rr->start + w], ref->nan);
        if (key == rr->boundary_key) tie[rj->tie_count++] = rr->start + w;
        else strict[rj->strict_count++] = rr->start + w;
        if (theirs[w]) missing[rj->missing_count++] = rr->start + w;
        rj->dropped += !mine[w] && key > rr->boundary_key;
    }
    rj->order_ok = true;
    for (int64_t q = 1; q < rj->valid && job->j->order != KP_TOPK_ORDER_ANY; q++) {
        const uint64_t a = item(x[order[q - 1]], order[q - 1], ref->nan), b = item(x[order[q]], order[q], ref->nan);
        rj->order_ok &= job->j->order == KP_TOPK_ORDER_INDEX ? order[q - 1] < order[q] : a > b;
    }
    qsort(sorted, (size_t)rj->valid, sizeof *sorted, cmp_i32); /* the set's digest: int32 LE, ascending */
    kp_sha256_hex(sorted, sizeof *sorted * (size_t)rj->valid, rj->set_sha256);
    rj->rule_ok = rj->strict_count == 0 && rj->out_of_window == 0 && rj->duplicates == 0 && rj->value_mismatch == 0 &&
                  rj->fill_misplaced == 0 && rj->fill_value_bad == 0 && rj->valid == rr->count && rj->order_ok &&
                  (job->j->ties == KP_TOPK_TIES_ANY || rj->tie_count == 0);
    job->strict[r] = strict, job->tie[r] = tie, job->missing[r] = missing;
    free(mine), free(theirs), free(order), free(sorted);
}

int kp_topk_judge(const kp_topk_ref *ref, const float *scores, int64_t stride, const int32_t *indices,
                  const float *values, kp_topk_ties ties, kp_topk_order order, kp_topk_judgement *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    if (ties != KP_TOPK_TIES_LOWEST_INDEX && ties != KP_TOPK_TIES_ANY)
        return kp_fail(err, KP_EXIT_USAGE, "topk judge: tie policy %d is unknown", (int)ties);
    if (order != KP_TOPK_ORDER_INDEX && order != KP_TOPK_ORDER_VALUE && order != KP_TOPK_ORDER_ANY)
        return kp_fail(err, KP_EXIT_USAGE, "topk judge: order %d is unknown", (int)order);
    const int64_t R = ref->rows;
    out->rows = R, out->ties = ties, out->order = order;
    out->row = kp_calloc((size_t)R, sizeof *out->row, "topk judgement", err);
    out->strict_off = kp_calloc((size_t)R + 1, sizeof(int64_t), "topk judgement", err);
    out->tie_off = kp_calloc((size_t)R + 1, sizeof(int64_t), "topk judgement", err);
    out->missing_off = kp_calloc((size_t)R + 1, sizeof(int64_t), "topk judgement", err);
    judge_job job = {.ref = ref, .scores = scores, .stride = stride, .indices = indices, .values = values, .j = out};
    job.strict = kp_calloc((size_t)R, sizeof *job.strict, "topk judgement", err);
    job.tie = kp_calloc((size_t)R, sizeof *job.tie, "topk judgement", err);
    job.missing = kp_calloc((size_t)R, sizeof *job.missing, "topk judgement", err);
    int rc = 0;
    if (!out->row || !out->strict_off || !out->tie_off || !out->missing_off || !job.strict || !job.tie || !job.missing)
        rc = err->code;
    if (!rc) {
        atomic_init(&job.failed, 0);
        kp_parallel_for(R, judge_row, &job);
        if (atomic_load(&job.failed)) rc = kp_fail(err, KP_EXIT_ENV, "topk judge: out of host memory for a row");
    }
    for (int64_t r = 0; !rc && r < R; r++) {
        out->strict_off[r + 1] = out->strict_off[r] + out->row[r].strict_count;
        out->tie_off[r + 1] = out->tie_off[r] + out->row[r].tie_count;
        out->missing_off[r + 1] = out->missing_off[r] + out->row[r].missing_count;
        out->rows_rule_ok += out->row[r].rule_ok;
    }
    if (!rc) {
        out->strict_idx = kp_calloc((size_t)out->strict_off[R] + 1, sizeof(int64_t), "topk judgement", err);
        out->tie_idx = kp_calloc((size_t)out->tie_off[R] + 1, sizeof(int64_t), "topk judgement", err);
        out->missing_idx = kp_calloc((size_t)out->missing_off[R] + 1, sizeof(int64_t), "topk judgement", err);
        if (!out->strict_idx || !out->tie_idx || !out->missing_idx) rc = err->code;
    }
    for (int64_t r = 0; !rc && r < R; r++) {
        memcpy(out->strict_idx + out->strict_off[r], job.strict[r], sizeof(int64_t) * (size_t)out->row[r].strict_count);
        memcpy(out->tie_idx + out->tie_off[r], job.tie[r], sizeof(int64_t) * (size_t)out->row[r].tie_count);
        memcpy(out->missing_idx + out->missing_off[r], job.missing[r], sizeof(int64_t) * (size_t)out->row[r].missing_count);
    }
    for (int64_t r = 0; job.strict && r < R; r++) free(job.strict[r]);
    for (int64_t r = 0; job.tie && r < R; r++) free(job.tie[r]);
    for (int64_t r = 0; job.missing && r < R; r++) free(job.missing[r]);
    free(job.strict), free(job.tie), free(job.missing);
    if (rc) kp_topk_judgement_free(out);
    return rc;
}

void kp_topk_judgement_free(kp_topk_judgement *j) {
    free(j->row), free(j->strict_off), free(j->strict_idx), free(j->tie_off), free(j->tie_idx);
    free(j->missing_off), free(j->missing_idx);
    memset(j, 0, sizeof *j);
}
