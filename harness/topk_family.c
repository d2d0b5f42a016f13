/* topk_family.c: the topk family's record for the harness: scores and windows in, indices and values
 * out, the reference as arrays, the judge's rule check (strict and tie differences, dropped candidates,
 * order), exact-parity evidence, the dropped_values defect, the 32-row threshold and bench shapes. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/topk_case.h"
#include "../receipts/kp_json.h"
#include "../reference/topk_ref.h"
#include "kp_harness.h"

/* The rule parameters: which members of the boundary tie group an output may take, its order, and where NaN ranks
 * (below every number by default; torch.topk ranks it above). */
typedef struct topk_params {
    kp_topk_ties ties;
    kp_topk_order order;
    kp_topk_nan nan;
} topk_params;

typedef struct topk_data {
    kp_topk_case tc;
    float *scores; /* the inputs (the harness holds them): [rows_total, stride] */
    int32_t *starts, *ends;
    int have_ref[2];
    kp_topk_ref ref[2]; /* the answer per NaN rank (kp_topk_nan), each computed when first asked for */
} topk_data;

/* vLLM's indexer top-k takes an exact path at <= 32 rows and a bucketed one above (families.md §C2). */
static const kp_threshold thresholds[] = {
    {32, "vLLM's indexer top-k (and radix_buffer) runs an exact path at <= 32 rows and a coarse-bin buffer above"},
};
/* filler rows a batch check needs (33) */
#define PROBE_ROWS kp_threshold_probe_rows(thresholds, (int)(sizeof thresholds / sizeof thresholds[0]))

static int topk_prepare(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err) {
    topk_data *d = v->data = kp_calloc(1, sizeof *d, "topk case", err);
    if (!d) return err->code;
    d->tc = *kp_topk_case_of(c);
    int rc;
    v->batch = d->tc.rows, v->rows_total = d->tc.rows + extra_rows;
    const int64_t sshape[2] = {d->tc.rows, d->tc.width}, wshape[1] = {d->tc.rows};
    if ((rc = kp_view_input(v, "scores", KP_F32, 2, sshape, d->tc.stride, true, err)) ||
        (rc = kp_view_input(v, "starts", KP_I32, 1, wshape, 0, true, err)) ||
        (rc = kp_view_input(v, "ends", KP_I32, 1, wshape, 0, true, err)))
        return rc;
    d->scores = v->inputs[0].data, d->starts = v->inputs[1].data, d->ends = v->inputs[2].data;
    return kp_topk_case_rows(&d->tc, 0, v->rows_total, d->scores, d->starts, d->ends, err);
}

static void topk_release(void *data) {
    topk_data *d = data;
    for (int n = 0; n < 2; n++)
        if (d->have_ref[n]) kp_topk_ref_free(&d->ref[n]);
    free(d);
}

static size_t topk_estimate(const kp_case *c, int nimpls, kp_error *err) {
    const kp_topk_case tc = *kp_topk_case_of(c);
    (void)err; /* decoded once, when the case was normalized */
    /* scores (+ filler rows) and the generator's draws; per impl run kept at once an output of indices and
       values (+ repeat/probe scratch); the reference and judgements: a few words per selected entry */
    const double rows = (double)tc.rows + PROBE_ROWS, out = (double)tc.rows * (double)tc.k * 8.0;
    const double bytes = rows * (double)tc.stride * 4.0 * 2.0 + 16.0 * (double)tc.width + out * (double)(nimpls + 3) +
                         out * 6.0 + (double)tc.rows * 64.0;
    return bytes > 1.8e19 ? 0 : (size_t)bytes;
}

static size_t topk_estimate_device(const kp_case *c, const kp_impl *impl, kp_error *err) {
    const kp_topk_case tc = *kp_topk_case_of(c);
    (void)err; /* decoded once, when the case was normalized */
    const int64_t rows = tc.rows > PROBE_ROWS ? tc.rows : PROBE_ROWS;
    kp_topk_args args = {.rows = rows, .width = tc.width, .row_stride = tc.stride, .k = tc.k, .index_base = tc.index_base,
                         .fill = tc.fill};
    const size_t ws = impl->workspace_bytes ? impl->workspace_bytes(&args) : 0;
    /* every row uploaded once, then the gathered rows of a run and its outputs, each with guards */
    const double bytes = 2.0 * (double)(tc.rows + PROBE_ROWS) * ((double)tc.stride * 4.0 + 8.0) +
                         (double)rows * (double)tc.k * 8.0 + (double)ws + 8.0 * 2 * 4096;
    return bytes > 1.8e19 ? 0 : (size_t)bytes;
}

static int topk_outputs(const void *data, int64_t nrows, kp_tensor *t) {
    const topk_data *d = data;
    t[0] = (kp_tensor){.name = "indices", .dtype = KP_I32, .ndim = 2, .shape = {nrows, d->tc.k}, .batched = 1};
    t[1] = (kp_tensor){.name = "values", .dtype = KP_F32, .ndim = 2, .shape = {nrows, d->tc.k}, .batched = 1};
    return 2;
}

static void topk_fill_args(const void *data, const kp_launch_bufs *b, void *args) {
    const topk_data *d = data;
    *(kp_topk_args *)args = (kp_topk_args){.scores = b->in[0], .starts = b->in[1], .ends = b->in[2], .indices = b->out[0],
                                           .values = b->out[1], .rows = b->nrows, .width = d->tc.width,
                                           .row_stride = d->tc.stride, .k = d->tc.k, .index_base = d->tc.index_base,
                                           .fill = d->tc.fill, .sm_count = b->sm_count, .stream = b->stream,
                                           .workspace = b->workspace, .workspace_bytes = b->workspace_bytes};
}

/* The answer with NaN ranked as `nan` says. */
static const kp_topk_ref *answer(topk_data *d, kp_topk_nan nan, kp_error *err) {
    if (!d->have_ref[nan]) {
        if (kp_topk_reference(d->scores, d->tc.rows, d->tc.width, d->tc.stride, d->starts, d->ends, d->tc.k,
                              d->tc.index_base, d->tc.fill, nan, &d->ref[nan], err))
            return NULL;
        d->have_ref[nan] = 1;
    }
    return &d->ref[nan];
}

/* The recorded reference (hashed, exported, replayed from the case name alone) is the rule's default, NaN below every
 * number, whatever the checks declare: a check with nan "above" judges against that rank's answer, computed beside it
 * (the two differ only in rows whose window holds NaN). */
static int topk_reference(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    topk_data *d = data;
    const kp_topk_ref *a = answer(d, KP_TOPK_NAN_BELOW, err);
    if (!a) return err->code;
    ref->digest_tag = "kparity.reference.topk/v1";
    ref->arrays[0] = (kp_tensor){.name = "indices", .dtype = KP_I32, .ndim = 2, .shape = {d->tc.rows, d->tc.k},
                                 .data = a->indices};
    ref->arrays[1] = (kp_tensor){.name = "values", .dtype = KP_F32, .ndim = 2, .shape = {d->tc.rows, d->tc.k},
                                 .data = a->values};
    ref->narrays = 2;
    return 0;
}

static const char *const param_keys[] = {"ties", "order", "nan", NULL};

static int topk_parse_params(const kp_param_reader *r, void *params, kp_error *err) {
    static const char *const ties[] = {"lowest_index", "any", NULL}, *const orders[] = {"index", "value", "any", NULL};
    static const char *const nans[] = {"below", "above", NULL};
    topk_params *p = params;
    const char *t, *o, *n = "below"; /* nan is optional: a check without it ranks NaN below, as it always has */
    if (kp_param_string(r, "ties", ties, &t, err) || kp_param_string(r, "order", orders, &o, err) ||
        (kp_param_get(r, "nan") && kp_param_string(r, "nan", nans, &n, err)))
        return err->code;
    p->ties = !strcmp(t, "any") ? KP_TOPK_TIES_ANY : KP_TOPK_TIES_LOWEST_INDEX;
    p->order = !strcmp(o, "index") ? KP_TOPK_ORDER_INDEX : !strcmp(o, "value") ? KP_TOPK_ORDER_VALUE : KP_TOPK_ORDER_ANY;
    p->nan = !strcmp(n, "above") ? KP_TOPK_NAN_ABOVE : KP_TOPK_NAN_BELOW;
    return 0;
}

static void topk_describe_params(const void *params, cJSON *out) {
    const topk_params *p = params;
    cJSON_AddStringToObject(out, "ties", kp_topk_ties_name(p->ties));
    cJSON_AddStringToObject(out, "order", kp_topk_order_name(p->order));
    cJSON_AddStringToObject(out, "nan", kp_topk_nan_name(p->nan));
}

/* What an exact check explains its differences with when the config declares no rule parameters: the
 * strictest tie policy, and no order (exact compares sets). */
static void topk_default_params(void *params) {
    topk_params *p = params;
    p->ties = KP_TOPK_TIES_LOWEST_INDEX, p->order = KP_TOPK_ORDER_ANY, p->nan = KP_TOPK_NAN_BELOW;
}

/* --- the rule: the family judges (reference/topk_ref.c), the harness reports (harness/rule.c) --- */

static void *topk_judge(void *data, const void *params, const kp_output *o, kp_error *err) {
    topk_data *d = data;
    const topk_params *p = params;
    KP_ASSERT(d->have_ref[KP_TOPK_NAN_BELOW]); /* the harness computes the reference before any judging */
    const kp_topk_ref *ref = answer(d, p->nan, err);
    kp_topk_judgement *j = ref ? kp_calloc(1, sizeof *j, "a judgement", err) : NULL;
    if (j && kp_topk_judge(ref, d->scores, d->tc.stride, o->t[0].data, o->t[1].data, p->ties, p->order, j, err))
        return free(j), NULL;
    return j;
}

static void free_judgement(void *j) {
    kp_topk_judgement_free(j);
    free(j);
}

static bool row_ok(const void *j, int64_t r) { return ((const kp_topk_judgement *)j)->row[r].rule_ok; }

static void row_figures(const void *judgement, int64_t r, cJSON *row) {
    const kp_topk_row_judgement *rj = &((const kp_topk_judgement *)judgement)->row[r];
    kp_json_add_int(row, "valid", rj->valid);
    kp_json_add_int(row, "dropped", rj->dropped);
    kp_json_add_int(row, "out_of_window", rj->out_of_window);
    kp_json_add_int(row, "duplicates", rj->duplicates);
    kp_json_add_int(row, "value_mismatch", rj->value_mismatch);
    kp_json_add_int(row, "fill_misplaced", rj->fill_misplaced + rj->fill_value_bad);
    cJSON_AddBoolToObject(row, "order_ok", rj->order_ok);
    cJSON_AddStringToObject(row, "set_sha256", rj->set_sha256);
}

/* Indices held past the answer's boundary (strict) or from its tie group against the policy (tie), and the answer's
 * indices the output misses. */
static const char *const lists[] = {"strict", "tie", "missing", NULL};

static kp_index_list row_list(const void *judgement, int list, int64_t r) {
    const kp_topk_judgement *j = judgement;
    const int64_t *idx = list == 0 ? j->strict_idx : list == 1 ? j->tie_idx : j->missing_idx;
    const int64_t *off = list == 0 ? j->strict_off : list == 1 ? j->tie_off : j->missing_off;
    return (kp_index_list){idx + off[r], off[r + 1] - off[r]};
}

static void reference_row(const void *data, const void *params, int64_t r, cJSON *row) {
    const kp_topk_ref_row *rr = &((const topk_data *)data)->ref[((const topk_params *)params)->nan].row[r];
    kp_json_add_int(row, "window_start", rr->start);
    kp_json_add_int(row, "window_len", rr->len);
    kp_json_add_int(row, "count", rr->count);
    if (rr->count > 0) kp_json_add_f32_bits(row, "boundary_value", rr->boundary_value);
    kp_json_add_int(row, "tie_group_size", rr->group_size);
    kp_json_add_int(row, "tie_group_needed", rr->group_needed);
    if (rr->nan_count) kp_json_add_int(row, "nan_in_window", rr->nan_count); /* where the NaN rank decides */
}

static void totals(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *f, char *summary,
                   size_t len) {
    (void)data, (void)params;
    const kp_topk_judgement *j = judgement;
    int64_t strict = 0, tie = 0, dropped = 0, dropped_rows = 0, bad_order = 0, malformed = 0;
    for (int64_t r = 0; r < rows; r++) {
        const kp_topk_row_judgement *rj = &j->row[r];
        strict += rj->strict_count, tie += rj->tie_count, dropped += rj->dropped, dropped_rows += rj->dropped > 0;
        bad_order += !rj->order_ok;
        malformed += rj->out_of_window + rj->duplicates + rj->value_mismatch + rj->fill_misplaced + rj->fill_value_bad;
    }
    kp_json_add_int(f, "strict", strict);
    kp_json_add_int(f, "tie", tie);
    kp_json_add_int(f, "dropped", dropped);
    kp_json_add_int(f, "rows_with_dropped", dropped_rows);
    kp_json_add_int(f, "rows_out_of_order", bad_order);
    kp_json_add_int(f, "malformed_entries", malformed);
    snprintf(summary, len, "%lld strict, %lld tie; %lld dropped in %lld rows; %lld out of order; %lld malformed",
             (long long)strict, (long long)tie, (long long)dropped, (long long)dropped_rows, (long long)bad_order,
             (long long)malformed);
}

/* Rows that fail with NaN in their window, named: where a NaN rank convention (nan: below or above) may be why. */
static void notes(const void *data, const void *params, const void *judgement, int64_t rows, cJSON *f, char *summary,
                  size_t len) {
    const topk_data *d = data;
    const topk_params *p = params;
    const kp_topk_judgement *j = judgement;
    cJSON *nan_rows = NULL;
    size_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (j->row[r].rule_ok || !d->ref[p->nan].row[r].nan_count) continue;
        if (!nan_rows) {
            nan_rows = cJSON_AddArrayToObject(f, "rows_failing_with_nan");
            n += (size_t)snprintf(summary, len, "; rows failing with NaN in their window (NaN ranked %s every number):",
                                  kp_topk_nan_name(p->nan));
        }
        cJSON_AddItemToArray(nan_rows, kp_json_int(r));
        if (n < len) n += (size_t)snprintf(summary + n, len - n, " %lld", (long long)r);
    }
}

static const kp_rule rule = {
    .judge = topk_judge,
    .free_judgement = free_judgement,
    .row_ok = row_ok,
    .row_figures = row_figures,
    .lists = lists,
    .row_list = row_list,
    .reference_row = reference_row,
    .totals = totals,
    .notes = notes,
};

/* dropped_values: some row misses an entry strictly before its boundary value (a lost candidate). */
static int topk_has_defect(void *data, kp_judgements *js, const kp_output *out, const char *defect, int64_t *rows_with) {
    topk_data *d = data;
    *rows_with = 0;
    kp_error err = {0};
    kp_reference unused;
    const topk_params params = {KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY, KP_TOPK_NAN_BELOW};
    if (strcmp(defect, "dropped_values") || (!d->have_ref[KP_TOPK_NAN_BELOW] && topk_reference(d, NULL, &unused, &err))) return 0;
    const kp_topk_judgement *j = kp_judgement(js, &params, out, &err);
    for (int64_t r = 0; j && r < j->rows; r++) *rows_with += j->row[r].dropped > 0;
    return *rows_with > 0;
}

static int cmp_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A row compares as a set: indices ascending (as unsigned, so fill sorts last), values by their bits. */
static void topk_canonical_row(const void *data, int tensor, const void *row, void *canon, int64_t elems) {
    (void)data, (void)tensor;
    memcpy(canon, row, sizeof(uint32_t) * (size_t)elems);
    qsort(canon, (size_t)elems, sizeof(uint32_t), cmp_u32);
}

static double topk_bytes_moved(const void *data, int64_t nrows) {
    const topk_data *d = data;
    return (double)nrows * ((double)d->tc.width * 4.0 + 8.0 + (double)d->tc.k * 8.0); /* scores, window, outputs */
}

static const char *const bench_cases[] = {
    "topk(k=2048,profile=randn,rows=64,seed=1,width=131072)",
    "topk(k=2048,profile=randn,rows=64,seed=1,width=262144)",
    "topk(k=2048,profile=randn,rows=2048,seed=1,width=65536)",
    NULL,
};
/* Without a GPU: each side of the 32-row threshold (radix_buffer's exact path, then its coarse-bin buffer) at 65,536
 * wide, k 2,048 (3 and 5 CPU-seconds). Every family's host shapes together: about a minute on 2 cores (MEASURED.md). */
static const char *const bench_cases_host[] = {
    "topk(k=2048,profile=randn,rows=32,seed=1,width=65536)",
    "topk(k=2048,profile=randn,rows=33,seed=1,width=65536)",
    NULL,
};
static const char *const defects[] = {"dropped_values", NULL};

static const char *const output_names[] = {"indices", "values", NULL};

/* What an export says of each array (kparity export, case.json). */
static const kp_array_doc array_docs[] = {
    {KP_ARRAY_INPUT, "scores", "[rows, width]: row r is the case's row r (dense: a stride field's padding is left out)",
     "the scores; outside a row's window they hold the NaN 0x7fc0dead, which no impl may read"},
    {KP_ARRAY_INPUT, "starts", "[rows]", "where each row's window starts: row r selects from scores[r, starts[r]:ends[r]]"},
    {KP_ARRAY_INPUT, "ends", "[rows]", "where each row's window ends (exclusive)"},
    {KP_ARRAY_OUTPUT, "indices", "[rows, k]", "the min(k, window length) selected entries' indices (of the row, or of the "
     "window with base=window), in the impl's order, then the fill (-1, or INT32_MAX with fill=int32_max)"},
    {KP_ARRAY_OUTPUT, "values", "[rows, k]: as indices", "the selected entries' scores bit for bit, then -inf"},
    {KP_ARRAY_REFERENCE, "indices", "[rows, k]", "the rule's selection: the first min(k, window length) entries in (value "
     "desc, index asc) over the window, -0 == +0, NaN below every number; ascending, in the case's base, then the fill"},
    {KP_ARRAY_REFERENCE, "values", "[rows, k]: as indices", "the selected entries' scores bit for bit, then -inf"},
    {0, NULL, NULL, NULL},
};

const kp_family kp_topk_family = {
    .name = "topk",
    .output_names = output_names,
    .cases = &kp_topk_case_family,
    .reference_provider = "reference.topk@host",
    .reference_rule = "the min(k, window) entries first in (value desc, index asc) over the row's window; -0 == +0; "
                      "NaN below every number; indices ascending in the declared base, then fill",
    .bench_cases = bench_cases,
    .bench_cases_host = bench_cases_host,
    .param_keys = param_keys,
    .defects = defects,
    .thresholds = thresholds,
    .nthresholds = (int)(sizeof thresholds / sizeof thresholds[0]),
    .args_bytes = sizeof(kp_topk_args),
    .prepare = topk_prepare,
    .release = topk_release,
    .estimate_bytes = topk_estimate,
    .estimate_device_bytes = topk_estimate_device,
    .outputs = topk_outputs,
    .fill_args = topk_fill_args,
    .reference = topk_reference,
    .params_bytes = sizeof(topk_params),
    .parse_params = topk_parse_params,
    .describe_params = topk_describe_params,
    .default_params = topk_default_params,
    .rule = &rule,
    .has_defect = topk_has_defect,
    .canonical_row = topk_canonical_row,
    .bytes_moved = topk_bytes_moved,
    .array_docs = array_docs,
};
