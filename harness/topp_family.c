/* topp_family.c: the topp family's record for the harness: its tensors and args, the float64
 * reference as arrays, the all_neginf defect, its batch threshold, bench shapes and what an export says
 * of each array; the rule's judgement is topp_rule.c's. The machinery is the harness's. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_device.h"
#include "topp_family.h"

/* Batch sizes where a topp impl changes path: probes of T and T + 1 rows straddle each (63/64/65). */
static const kp_threshold thresholds[] = {
    {63, "split_prob@cuda runs a batch of 64 rows or more as two halves on two streams"},
    {64, "vLLM's split top-p pipeline takes batches of at most 64 rows"},
};

static int topp_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err);

static int topp_prepare(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err) {
    topp_data *d = v->data = kp_calloc(1, sizeof *d, "topp case", err);
    if (!d) return err->code;
    d->tc = *kp_topp_case_of(c);
    (void)extra_rows; /* the view holds them */
    d->logits = v->inputs[0].data, d->top_p = v->inputs[1].data;
    return v->cached ? 0 : kp_topp_case_rows(&d->tc, 0, v->rows_total, d->logits, d->top_p, &v->borrowed_s, err);
}

static void topp_release(void *data) {
    topp_data *d = data;
    if (d->have_ref && !d->ref_borrowed) kp_topp_ref_free(&d->ref);
    free(d);
}

static int topp_outputs(const void *data, int64_t nrows, kp_tensor *t) {
    const topp_data *d = data;
    t[0] = (kp_tensor){.name = "out", .dtype = KP_F32, .ndim = 2, .shape = {nrows, d->tc.vocab},
                       .row_stride = d->tc.stride, .batched = 1};
    return 1;
}

static void topp_fill_args(const void *data, const kp_launch_bufs *b, void *args) {
    const topp_data *d = data;
    *(kp_topp_args *)args = (kp_topp_args){.logits = b->in[0], .out = b->out[0], .top_p = b->in[1], .batch = b->nrows,
                                           .vocab = d->tc.vocab, .row_stride = d->tc.stride, .stream = b->stream,
                                           .workspace = b->workspace, .workspace_bytes = b->workspace_bytes,
                                           .sm_count = b->sm_count};
}

/* What prepare, outputs and fill_args make of the case (kp_shapes). */
static int topp_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    const kp_topp_case tc = *kp_topp_case_of(c);
    (void)err; /* decoded once, when the case was normalized */
    s->batch = tc.batch, s->rows_total = tc.batch + extra_rows;
    const int64_t lshape[2] = {tc.batch, tc.vocab}, pshape[1] = {tc.batch};
    kp_shapes_input(s, "logits", KP_F32, 2, lshape, tc.stride, true);
    kp_shapes_input(s, "top_p", KP_F32, 1, pshape, 0, true);
    const topp_data d = {.tc = tc};
    s->noutputs = topp_outputs(&d, tc.batch, s->outputs);
    /* the reference (keep, in_group: 1 byte; prob, mass_before: 8 bytes; its rows) and the sort scratch of the
       reference and the judge, per thread; a judgement: every differing token in one of its index lists, and its rows */
    const double cells = (double)tc.batch * (double)tc.vocab, rows = (double)tc.batch * 256.0;
    s->private_bytes = cells * (2.0 + 16.0) + rows + (double)kp_thread_count() * (double)tc.vocab * 32.0;
    s->judgement_bytes = cells * 8.0 + rows;
    const kp_launch_bufs run = {.nrows = kp_shapes_largest_run(s->batch, s->rows_total), .sm_count = kp_device_sm_count()};
    topp_fill_args(&d, &run, s->args);
    return 0;
}

/* What the rule decided: keep mask, probabilities and C_t, all machine-independent; and (state) the per-row records
 * and the boundary tie groups, which the judge reads. */
static void describe_reference(const topp_data *d, kp_reference *ref) {
    const int64_t shape[2] = {d->tc.batch, d->tc.vocab};
    ref->digest_tag = "kparity.reference.topp/v1";
    ref->arrays[0] = (kp_tensor){.name = "keep", .dtype = KP_U8, .ndim = 2, .shape = {shape[0], shape[1]}, .data = d->ref.keep};
    ref->arrays[1] = (kp_tensor){.name = "prob", .dtype = KP_F64, .ndim = 2, .shape = {shape[0], shape[1]}, .data = d->ref.prob};
    ref->arrays[2] = (kp_tensor){.name = "mass_before", .dtype = KP_F64, .ndim = 2, .shape = {shape[0], shape[1]},
                                 .data = d->ref.mass_before};
    ref->narrays = 3;
    ref->state[0] = (kp_tensor){.name = "rows", .dtype = KP_U8, .ndim = 2,
                                .shape = {shape[0], (int64_t)sizeof(kp_topp_ref_row)}, .data = d->ref.rows};
    ref->state[1] = (kp_tensor){.name = "in_group", .dtype = KP_U8, .ndim = 2, .shape = {shape[0], shape[1]},
                                .data = d->ref.in_group};
    ref->nstate = 2;
}

static int topp_reference(void *data, const void *params, kp_reference *ref, kp_error *err) {
    topp_data *d = data;
    const topp_params *tp = params;
    if (!d->have_ref) {
        int rc = kp_topp_reference(d->logits, d->tc.batch, d->tc.vocab, d->tc.stride, d->top_p,
                                   tp ? tp->band : 0.0, &d->ref, err);
        if (rc) return rc;
        d->have_ref = 1;
    }
    describe_reference(d, ref);
    return 0;
}

static int topp_reference_adopt(void *data, const void *params, kp_reference *ref, kp_error *err) {
    topp_data *d = data;
    const topp_params *tp = params;
    kp_reference want = {0};
    describe_reference(d, &want);
    if (kp_reference_matches(ref, &want, err)) return err->code;
    d->ref = (kp_topp_ref){.batch = d->tc.batch, .vocab = d->tc.vocab, .band = tp ? tp->band : 0.0,
                           .rows = ref->state[0].data, .keep = ref->arrays[0].data, .in_group = ref->state[1].data,
                           .prob = ref->arrays[1].data, .mass_before = ref->arrays[2].data};
    d->have_ref = 1;
    d->ref_borrowed = true;
    return 0;
}

/* Whether row r of the output is all -inf where its input has a finite token: all_neginf's rows, one per
 * kp_parallel_for item. */
typedef struct neginf_rows {
    const topp_data *d;
    const float *out;
    uint8_t *all_neginf;
} neginf_rows;

static void neginf_row(void *ctx, int64_t r) {
    const neginf_rows *n = ctx;
    const float *x = n->out + r * n->d->tc.stride, *in = n->d->logits + r * n->d->tc.stride;
    int finite_in = 0, all = 1;
    for (int64_t i = 0; i < n->d->tc.vocab && all; i++) { /* one token not -inf settles the row */
        finite_in |= isfinite(in[i]);
        all &= isinf(x[i]) && x[i] < 0;
    }
    n->all_neginf[r] = finite_in && all;
}

static int topp_has_defect(void *data, kp_judgements *js, const kp_output *out, const char *defect, int64_t *rows_with) {
    (void)js;
    topp_data *d = data;
    *rows_with = 0;
    if (strcmp(defect, "all_neginf")) return 0;
    neginf_rows n = {d, out->t[0].data, calloc((size_t)d->tc.batch, 1)};
    if (!n.all_neginf) KP_OUT_OF_MEMORY("for the rows of an all_neginf defect");
    kp_parallel_for(d->tc.batch, neginf_row, &n);
    for (int64_t r = 0; r < d->tc.batch; r++) *rows_with += n.all_neginf[r];
    free(n.all_neginf);
    return *rows_with == d->tc.batch;
}

static double topp_bytes_moved(const void *data, int64_t nrows) {
    const topp_data *d = data;
    return (double)nrows * (double)d->tc.vocab * 8.0 + (double)nrows * 4.0; /* read logits, write out, top_p */
}

static const char *const bench_cases[] = {
    "topp(batch=64,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)",
    "topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)",
    NULL,
};
/* Without a GPU: the seed's 4 x 131,072 and 8 rows of GLM's 154,856 (5 and 12 CPU-seconds for bench's 50 reps of each
 * host port and its reference; 64 rows would be eight times that). Every family's host shapes together: about a
 * minute on 2 cores (MEASURED.md). */
static const char *const bench_cases_host[] = {
    "topp(batch=4,profile=ordinary,seed=58231,top_p=0.95,vocab=131072)",
    "topp(batch=8,profile=ordinary,seed=58231,top_p=0.95,vocab=154856)",
    NULL,
};
static const char *const defects[] = {"all_neginf", NULL}; /* every row masked entirely: the seed's defect */

static const char *const output_names[] = {"out", NULL};

/* What an export says of each array (kparity export, case.json). */
static const kp_array_doc array_docs[] = {
    {KP_ARRAY_INPUT, "logits", "[batch, vocab]: row r is the case's row r (dense: a stride field's padding is left out)",
     "the logits each row filters (the case's profile says how they were drawn)"},
    {KP_ARRAY_INPUT, "top_p", "[batch]: one per row", "each row's top_p: keep the shortest prefix, in (p desc, index asc), "
     "whose mass reaches it (>= 1 keeps every finite token)"},
    {KP_ARRAY_OUTPUT, "out", "[batch, vocab]: as logits", "the filtered logits: a kept token's logit bit for bit, a dropped "
     "one -inf"},
    {KP_ARRAY_REFERENCE, "keep", "[batch, vocab]: as logits", "1 where the rule keeps the token, else 0 (the boundary tie "
     "group's lowest indices first: minimal_index)"},
    {KP_ARRAY_REFERENCE, "prob", "[batch, vocab]: as logits", "each token's probability exp(x - max) / Z in float64 (0 for "
     "-inf and NaN)"},
    {KP_ARRAY_REFERENCE, "mass_before", "[batch, vocab]: as logits", "C_t, the float64 mass strictly before the token in "
     "rule order (the rule keeps it iff C_t < top_p); NaN for a non-finite logit"},
    {0, NULL, NULL, NULL},
};

const kp_family kp_topp_family = {
    .name = "topp",
    .output_names = output_names,
    .cases = &kp_topp_case_family,
    .reference_provider = "reference.topp@host-f64",
    .reference_rule = "keep t iff mass strictly before t in (p desc, index asc) order < top_p; at least one; "
                      "top_p >= 1 keeps every finite token; NaN never kept",
    .bench_cases = bench_cases,
    .bench_cases_host = bench_cases_host,
    .param_keys = kp_topp_param_keys,
    .defects = defects,
    .thresholds = thresholds,
    .nthresholds = (int)(sizeof thresholds / sizeof thresholds[0]),
    .args_bytes = sizeof(kp_topp_args),
    .prepare = topp_prepare,
    .release = topp_release,
    .shapes = topp_shapes,
    .outputs = topp_outputs,
    .fill_args = topp_fill_args,
    .reference = topp_reference,
    .reference_version = "topp/v1",
    .reference_adopt = topp_reference_adopt,
    .params_bytes = sizeof(topp_params),
    .parse_params = kp_topp_parse_params,
    .describe_params = kp_topp_describe_params,
    .default_params = kp_topp_default_params,
    .rule = &kp_topp_rule,
    .has_defect = topp_has_defect,
    .bytes_moved = topp_bytes_moved,
    .array_docs = array_docs,
};
