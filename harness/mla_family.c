/* mla_family.c: the mla family's record for the harness: a request's query rows, their top-k cache slots
 * (optionally topk_length) and the paged cache of every request in; out, lse, max_logits and the split
 * count of each request out; the float64 reference on the dequantized cache, and on the values before
 * quantization as "<output>@unquantized" (reported beside the verdict); the batch size at which
 * split_count's plan stops splitting a full-length request; every batch probe's split counts in its
 * receipt entry. Dim 0 of every batched tensor is the request. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/mla_case.h"
#include "../kernels/mla_plan.h"
#include "../receipts/kp_json.h"
#include "../reference/mla_ref.h"
#include "kp_device.h"
#include "mla_family.h"

static int mla_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err);

static int mla_prepare(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err) {
    mla_data *d = v->data = kp_calloc(1, sizeof *d, "mla case", err);
    if (!d) return err->code;
    d->mc = *kp_mla_case_of(c);
    const kp_mla_case *mc = &d->mc;
    (void)extra_rows; /* the view holds them */
    const int64_t n = v->rows_total;
    kp_mla_case_sizes(mc, n, &d->sz);
    const bool fp8 = mc->cache == KP_MLA_FP8_DS_MLA;
    d->in_tl = d->in_sink = -1; /* the optional inputs, where shapes put them */
    for (int k = 0; k < v->ninputs; k++) {
        if (!strcmp(v->inputs[k].name, "topk_length")) d->in_tl = k;
        if (!strcmp(v->inputs[k].name, "attn_sink")) d->in_sink = k;
    }
    d->positions = v->state[ST_POSITIONS].data, d->pages = v->state[ST_PAGES].data;
    d->kv = fp8 ? v->state[ST_KV].data : NULL;
    const kp_mla_buffers out = {.q = v->inputs[IN_Q].data, .indices = d->positions,
                                .topk_length = d->in_tl >= 0 ? v->inputs[d->in_tl].data : NULL, .page_table = d->pages,
                                .cache = v->inputs[IN_CACHE].data, .kv = d->kv};
    d->q = out.q, d->cache = out.cache, d->topk_length = out.topk_length;
    d->sink = d->in_sink >= 0 ? v->inputs[d->in_sink].data : NULL;
    if (v->cached) return 0;
    int rc;
    if ((rc = kp_mla_case_requests(mc, 0, n, &out, err))) return rc;
    if (d->in_sink >= 0 && (rc = kp_mla_case_sink(mc, v->inputs[d->in_sink].data, err))) return rc;
    /* the impls take cache slots (FlashMLA's indices_in_kvcache): position -> physical page * page + offset */
    kp_mla_case_slots(mc, d->sz.rows, d->sz.pages_per_request, d->pages, d->positions, v->inputs[IN_INDICES].data);
    return 0;
}

static void mla_release(void *data) {
    mla_data *d = data;
    for (int i = 0; i < 6 && !d->ref_borrowed; i++) free(d->ref[i]);
    free(d);
}

static double heads_of(const kp_mla_case *mc, int64_t n) { return (double)n * (double)mc->s_q * (double)mc->h_q; }

static kp_mla_args args_for(const kp_mla_case *mc, const kp_mla_sizes *sz, int64_t n) {
    return (kp_mla_args){.batch = n, .s_q = mc->s_q, .h_q = mc->h_q, .topk = mc->topk, .slots = sz->pages * mc->page,
                         .cache_format = mc->cache == KP_MLA_BF16 ? KP_MLA_CACHE_BF16 : KP_MLA_CACHE_FP8_DS_MLA,
                         .sm_scale = (float)mc->sm_scale};
}

static int mla_outputs(const void *data, int64_t nrows, kp_tensor *t) {
    const kp_mla_case *mc = &((const mla_data *)data)->mc;
    t[0] = (kp_tensor){.name = "out", .dtype = KP_BF16, .ndim = 4, .shape = {nrows, mc->s_q, mc->h_q, KP_MLA_D_V}, .batched = 1};
    t[1] = (kp_tensor){.name = "lse", .dtype = KP_F32, .ndim = 3, .shape = {nrows, mc->s_q, mc->h_q}, .batched = 1};
    t[2] = (kp_tensor){.name = "max_logits", .dtype = KP_F32, .ndim = 3, .shape = {nrows, mc->s_q, mc->h_q}, .batched = 1};
    t[3] = (kp_tensor){.name = "splits", .dtype = KP_I32, .ndim = 1, .shape = {nrows}, .batched = 1};
    return 4;
}

static void mla_fill_args(const void *data, const kp_launch_bufs *b, void *args) {
    const mla_data *d = data;
    kp_mla_args a = args_for(&d->mc, &d->sz, b->nrows);
    a.q = b->in[IN_Q], a.indices = b->in[IN_INDICES], a.cache = b->in[IN_CACHE];
    a.topk_length = d->in_tl >= 0 ? b->in[d->in_tl] : NULL;
    a.attn_sink = d->in_sink >= 0 ? b->in[d->in_sink] : NULL;
    a.out = b->out[0], a.lse = b->out[1], a.max_logits = b->out[2], a.splits = b->out[3];
    a.sm_count = b->sm_count, a.stream = b->stream, a.workspace = b->workspace, a.workspace_bytes = b->workspace_bytes;
    *(kp_mla_args *)args = a;
}

/* What prepare, outputs and fill_args make of the case (kp_shapes). */
static int mla_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    const kp_mla_case mc = *kp_mla_case_of(c);
    mla_data d = {.mc = mc, .in_tl = -1, .in_sink = -1};
    /* the cache (not batched: indices are global slots) holds every request's pages, so its bytes, recorded in
       receipts, must not depend on which checks asked for filler requests: always the family's own count, which
       is what a batch check asks for (replay regenerates with none asked) */
    const int64_t filler = kp_mla_extra_requests(c), n = mc.batch + (extra_rows > filler ? extra_rows : filler);
    kp_mla_case_sizes(&mc, n, &d.sz);
    if (d.sz.pages * mc.page > INT32_MAX)
        return kp_fail(err, KP_EXIT_USAGE, "mla: %lld cache slots for %lld requests exceed int32 indices",
                       (long long)(d.sz.pages * mc.page), (long long)n);
    s->batch = mc.batch, s->rows_total = n;
    const bool fp8 = mc.cache == KP_MLA_FP8_DS_MLA;
    const int64_t qs[4] = {mc.batch, mc.s_q, mc.h_q, KP_MLA_D_QK}, is[3] = {mc.batch, mc.s_q, mc.topk},
                  ls[2] = {mc.batch, mc.s_q}, cs[3] = {d.sz.pages, mc.page, fp8 ? KP_MLA_FP8_TOKEN_BYTES : KP_MLA_D_QK},
                  ss[1] = {mc.h_q};
    kp_shapes_input(s, "q", KP_BF16, 4, qs, 0, true);
    kp_shapes_input(s, "indices", KP_I32, 3, is, 0, true);
    kp_shapes_input(s, "cache", fp8 ? KP_U8 : KP_BF16, 3, cs, 0, false);
    if (mc.topk_length) kp_shapes_input(s, "topk_length", KP_I32, 2, ls, 0, true);
    if (mc.sink != KP_MLA_SINK_OFF) kp_shapes_input(s, "attn_sink", KP_F32, 1, ss, 0, false);
    s->noutputs = mla_outputs(&d, mc.batch, s->outputs);
    /* token positions, the page table and kv (fp8_ds_mla): what the reference and export read */
    const int64_t ps[1] = {(int64_t)d.sz.indices_bytes}, pts[1] = {(int64_t)d.sz.page_table_bytes},
                  kvs[1] = {(int64_t)d.sz.kv_bytes};
    kp_shapes_state(s, "positions", KP_U8, 1, ps);
    kp_shapes_state(s, "page_table", KP_U8, 1, pts);
    if (fp8) kp_shapes_state(s, "kv", KP_U8, 1, kvs);
    /* the reference's six results and its scratch, and per request a few words a block */
    const double heads = heads_of(&mc, mc.batch);
    s->private_bytes = heads * (KP_MLA_D_V + 2.0) * 8.0 * 2.0 + kp_mla_reference_bytes(&mc, d.sz.rows) +
                       (double)(d.sz.rows / mc.s_q) * (double)(mc.topk / KP_MLA_BLOCK + 4) * 16.0;
    const kp_launch_bufs run = {.nrows = kp_shapes_largest_run(s->batch, s->rows_total), .sm_count = kp_device_sm_count()};
    mla_fill_args(&d, &run, s->args);
    return 0;
}

/* out, lse and max_logits on the cache, and (fp8_ds_mla) on the values before quantization. */
static void describe_reference(const mla_data *d, kp_reference *ref) {
    const kp_mla_case *mc = &d->mc;
    ref->digest_tag = "kparity.reference.mla/v1";
    static const char *const names[6] = {"out", "lse", "max_logits", "out@unquantized", "lse@unquantized",
                                         "max_logits@unquantized"};
    ref->narrays = 0;
    for (int i = 0; i < (mc->cache == KP_MLA_FP8_DS_MLA ? 6 : 3); i++) {
        kp_tensor *t = &ref->arrays[ref->narrays++];
        *t = (kp_tensor){.dtype = KP_F64, .ndim = i % 3 ? 3 : 4, .shape = {mc->batch, mc->s_q, mc->h_q, KP_MLA_D_V},
                         .data = d->ref[i]};
        snprintf(t->name, sizeof t->name, "%s", names[i]);
    }
}

static int mla_reference(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    mla_data *d = data;
    const kp_mla_case *mc = &d->mc;
    const bool fp8 = mc->cache == KP_MLA_FP8_DS_MLA;
    const int64_t rows = mc->batch * mc->s_q, heads = rows * mc->h_q;
    if (!d->ref[0]) {
        for (int i = 0; i < (fp8 ? 6 : 3); i++) {
            const int64_t count = i % 3 ? heads : heads * KP_MLA_D_V;
            if (!(d->ref[i] = kp_calloc((size_t)count, sizeof(double), "mla reference output", err))) return err->code;
        }
        const kp_mla_ref_in in = {.mc = mc, .first = 0, .rows = rows, .q = d->q, .indices = d->positions,
                                  .topk_length = d->topk_length, .page_table = d->pages, .cache = d->cache, .kv = d->kv,
                                  .sink = d->sink};
        const kp_mla_ref_out out = {.cache = {d->ref[0], d->ref[1], d->ref[2]}, .kv = {d->ref[3], d->ref[4], d->ref[5]}};
        int rc = kp_mla_reference(&in, &out, err);
        if (rc) {
            for (int i = 0; i < 6; i++) free(d->ref[i]), d->ref[i] = NULL;
            return rc;
        }
    }
    describe_reference(d, ref);
    return 0;
}

static int mla_reference_adopt(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    mla_data *d = data;
    kp_reference want = {0};
    describe_reference(d, &want);
    if (kp_reference_matches(ref, &want, err)) return err->code;
    for (int i = 0; i < ref->narrays; i++) d->ref[i] = ref->arrays[i].data;
    d->ref_borrowed = true;
    return 0;
}

static double mla_flops(const void *data, int64_t nrows) {
    const kp_mla_case *mc = &((const mla_data *)data)->mc;
    return 2.0 * heads_of(mc, nrows) * (double)mc->topk * (double)(KP_MLA_D_QK + KP_MLA_D_V);
}

/* q, each row's indices and the tokens they name (each once a request), and the outputs. */
static double mla_bytes_moved(const void *data, int64_t nrows) {
    const mla_data *d = data;
    const kp_mla_case *mc = &d->mc;
    return (double)nrows * (double)mc->s_q * ((double)mc->h_q * KP_MLA_D_QK * 2.0 + (double)mc->topk * 4.0) +
           (double)nrows * (double)mc->topk * (double)d->sz.token_bytes + heads_of(mc, nrows) * (KP_MLA_D_V * 2.0 + 8.0);
}

static const char *const bench_cases[] = {
    "mla(batch=1,h_q=128,profile=uniform,seed=1,topk=2048)",
    "mla(batch=64,h_q=128,profile=uniform,seed=1,topk=2048)",
    "mla(batch=128,h_q=128,profile=uniform,seed=1,topk=2048)",
    NULL,
};
/* Without a GPU: the host gate's top-k 640 over 1,024 cached tokens, one DeepSeek-V3.2 request (h_q 128) and two of
 * h_q 64 (about 11 CPU-seconds each; one request at top-k 2,048 takes 32). Every family's host shapes together: about
 * a minute on 2 cores (MEASURED.md). */
static const char *const bench_cases_host[] = {
    "mla(batch=1,h_q=128,profile=uniform,s_kv=1024,seed=1,topk=640)",
    "mla(batch=2,h_q=64,profile=uniform,s_kv=1024,seed=1,topk=640)",
    NULL,
};
static const char *const tolerance_outputs[] = {"out", "lse", "max_logits", NULL};
static const char *const order_outputs[] = {"splits", NULL}; /* how the impl cut the work, not part of the answer */

static const char *const output_names[] = {"out", "lse", "max_logits", "splits", NULL};

const kp_family kp_mla_family = {
    .name = "mla",
    .output_names = output_names,
    .cases = &kp_mla_case_family,
    .reference_provider = "reference.mla@host-f64",
    .reference_rule = "out = sum_j softmax(sm_scale q . k_j)_j v_j over the row's counted slots (index != -1, j < "
                      "topk_length), the sink adding exp(sink) to the denominator; lse = ln sum_j exp(s_j), max_logits = "
                      "max_j s_j; empty rows out 0, lse +inf; float64 on the cache dequantized exactly (f32 scales), and "
                      "on the values before quantization as <output>@unquantized",
    .bench_cases = bench_cases,
    .bench_cases_host = bench_cases_host,
    .tolerance_outputs = tolerance_outputs,
    .order_outputs = order_outputs,
    .args_bytes = sizeof(kp_mla_args),
    .prepare = mla_prepare,
    .release = mla_release,
    .shapes = mla_shapes,
    .outputs = mla_outputs,
    .fill_args = mla_fill_args,
    .reference = mla_reference,
    .reference_version = "mla/v1",
    .reference_adopt = mla_reference_adopt,
    .case_thresholds = kp_mla_case_thresholds,
    .describe_probe = kp_mla_describe_probe,
    .bytes_moved = mla_bytes_moved,
    .flops = mla_flops,
    .array_docs = kp_mla_array_docs,
    .export_extras = kp_mla_export_extras,
};
