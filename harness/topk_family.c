/* topk_family.c: the topk family's record for the harness: scores and windows in, indices and values
 * out, the reference as arrays (per NaN rank), rows compared as sets, the dropped_values defect, the 32-row
 * threshold, bench shapes and what an export says of each array; the rule's judgement is topk_rule.c's. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "topk_family.h"

/* vLLM's indexer top-k takes an exact path at <= 32 rows and a bucketed one above (families.md §C2). */
static const kp_threshold thresholds[] = {
    {32, "vLLM's indexer top-k (and radix_buffer) runs an exact path at <= 32 rows and a coarse-bin buffer above"},
};

static int topk_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err);

static int topk_prepare(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err) {
    topk_data *d = v->data = kp_calloc(1, sizeof *d, "topk case", err);
    if (!d) return err->code;
    d->tc = *kp_topk_case_of(c);
    (void)extra_rows; /* the view holds them */
    d->scores = v->inputs[0].data, d->starts = v->inputs[1].data, d->ends = v->inputs[2].data;
    return v->cached ? 0 : kp_topk_case_rows(&d->tc, 0, v->rows_total, d->scores, d->starts, d->ends, err);
}

static void topk_release(void *data) {
    topk_data *d = data;
    for (int n = 0; n < 2; n++)
        if (d->have_ref[n] && !d->ref_borrowed[n]) kp_topk_ref_free(&d->ref[n]);
    free(d);
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

/* What prepare, outputs and fill_args make of the case (kp_shapes). */
static int topk_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    const kp_topk_case tc = *kp_topk_case_of(c);
    (void)err; /* decoded once, when the case was normalized */
    s->batch = tc.rows, s->rows_total = tc.rows + extra_rows;
    const int64_t sshape[2] = {tc.rows, tc.width}, wshape[1] = {tc.rows};
    kp_shapes_input(s, "scores", KP_F32, 2, sshape, tc.stride, true);
    kp_shapes_input(s, "starts", KP_I32, 1, wshape, 0, true);
    kp_shapes_input(s, "ends", KP_I32, 1, wshape, 0, true);
    const topk_data d = {.tc = tc};
    s->noutputs = topk_outputs(&d, tc.rows, s->outputs);
    /* the generator's draws for every row and its per-window scratch; the two references (indices and values per
       selected entry, and per row); a judgement: its strict, tie and missing lists per row (2k + 1, 2k + 1, k + 1),
       twice while judging, and per row */
    const double selected = (double)tc.rows * (double)tc.k * 8.0;
    s->private_bytes = (double)s->rows_total * (double)tc.stride * 4.0 + 16.0 * (double)tc.width + selected * 2.0 +
                       (double)tc.rows * 128.0;
    s->judgement_bytes = (double)tc.rows * ((5.0 * (double)tc.k + 3.0) * 8.0 * 2.0 + 128.0);
    const kp_launch_bufs run = {.nrows = kp_shapes_largest_run(s->batch, s->rows_total)};
    topk_fill_args(&d, &run, s->args);
    return 0;
}

/* The recorded reference (hashed, exported, replayed from the case name alone) is the rule's default, NaN below every
 * number, whatever the checks declare: a check with nan "above" judges against that rank's answer, computed beside it
 * (the two differ only in rows whose window holds NaN). */
/* The answer with NaN ranked below, and (state) its per-row records, which the judge reads. */
static void describe_reference(const topk_data *d, const kp_topk_ref *a, kp_reference *ref) {
    ref->digest_tag = "kparity.reference.topk/v1";
    ref->arrays[0] = (kp_tensor){.name = "indices", .dtype = KP_I32, .ndim = 2, .shape = {d->tc.rows, d->tc.k},
                                 .data = a->indices};
    ref->arrays[1] = (kp_tensor){.name = "values", .dtype = KP_F32, .ndim = 2, .shape = {d->tc.rows, d->tc.k},
                                 .data = a->values};
    ref->narrays = 2;
    ref->state[0] = (kp_tensor){.name = "row", .dtype = KP_U8, .ndim = 2,
                                .shape = {d->tc.rows, (int64_t)sizeof(kp_topk_ref_row)}, .data = a->row};
    ref->nstate = 1;
}

static int topk_reference(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    topk_data *d = data;
    const kp_topk_ref *a = kp_topk_answer(d, KP_TOPK_NAN_BELOW, err);
    if (!a) return err->code;
    describe_reference(d, a, ref);
    return 0;
}

static int topk_reference_adopt(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    topk_data *d = data;
    kp_reference want = {0};
    describe_reference(d, &d->ref[KP_TOPK_NAN_BELOW], &want);
    if (kp_reference_matches(ref, &want, err)) return err->code;
    d->ref[KP_TOPK_NAN_BELOW] = (kp_topk_ref){.rows = d->tc.rows, .k = d->tc.k, .index_base = d->tc.index_base,
                                              .fill = d->tc.fill, .nan = KP_TOPK_NAN_BELOW, .row = ref->state[0].data,
                                              .indices = ref->arrays[0].data, .values = ref->arrays[1].data};
    d->have_ref[KP_TOPK_NAN_BELOW] = 1;
    d->ref_borrowed[KP_TOPK_NAN_BELOW] = true;
    return 0;
}

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
    .param_keys = kp_topk_param_keys,
    .defects = defects,
    .thresholds = thresholds,
    .nthresholds = (int)(sizeof thresholds / sizeof thresholds[0]),
    .args_bytes = sizeof(kp_topk_args),
    .prepare = topk_prepare,
    .release = topk_release,
    .shapes = topk_shapes,
    .outputs = topk_outputs,
    .fill_args = topk_fill_args,
    .reference = topk_reference,
    .reference_version = "topk/v1",
    .reference_adopt = topk_reference_adopt,
    .params_bytes = sizeof(topk_params),
    .parse_params = kp_topk_parse_params,
    .describe_params = kp_topk_describe_params,
    .default_params = kp_topk_default_params,
    .rule = &kp_topk_rule,
    .has_defect = topk_has_defect,
    .canonical_row = topk_canonical_row,
    .bytes_moved = topk_bytes_moved,
    .array_docs = array_docs,
};
