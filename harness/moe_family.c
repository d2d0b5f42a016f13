/* moe_family.c: the moe family's record for the harness: activations, routing and NVFP4 expert
 * weights in; the output and the slot each routed pair took out; the float64 reference for the
 * tolerance check; thresholds from the case's experts and top-k (Marlin's block sizes, its atomic
 * slot path, the 32-row GEMV switch); a row moved by a probe when one of its pairs changed slot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/moe_case.h"
#include "../kernels/kp_formats.h"
#include "../kernels/moe_plan.h"
#include "../reference/moe_ref.h"
#include "kp_device.h"
#include "moe_family.h"

enum { IN_X = 0, IN_IDS, IN_WEIGHTS, IN_W13, IN_S13, IN_W2, IN_S2, IN_SCALES };

static double weight_bytes(const kp_moe_case *mc) {
    return (double)mc->experts * (double)(kp_moe_w13_rows(mc) + mc->inter) * (double)mc->hidden * (0.5 + 1.0 / 16.0);
}

static int moe_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err);

static int moe_prepare(const kp_case *c, int64_t extra_rows, kp_case_view *v, kp_error *err) {
    moe_data *d = v->data = kp_calloc(1, sizeof *d, "moe case", err);
    if (!d) return err->code;
    d->mc = *kp_moe_case_of(c);
    const kp_moe_case *mc = &d->mc;
    (void)extra_rows; /* the view holds them */
    d->x = v->inputs[IN_X].data, d->ids = v->inputs[IN_IDS].data, d->weights = v->inputs[IN_WEIGHTS].data;
    d->w13 = v->inputs[IN_W13].data, d->s13 = v->inputs[IN_S13].data, d->w2 = v->inputs[IN_W2].data;
    d->s2 = v->inputs[IN_S2].data, d->scales = v->inputs[IN_SCALES].data;
    if (v->cached) return 0;
    int rc;
    if ((rc = kp_moe_case_rows(mc, 0, v->rows_total, d->x, d->ids, d->weights, err))) return rc;
    return kp_moe_case_all_experts(mc, d->w13, d->s13, d->scales, d->w2, d->s2, d->scales + mc->experts, err);
}

static void moe_release(void *data) {
    moe_data *d = data;
    if (!d->ref_borrowed) free(d->ref), free(d->ref_bf16);
    free(d);
}

static kp_moe_args args_for(const kp_moe_case *mc, int64_t rows) {
    return (kp_moe_args){.rows = rows, .hidden = mc->hidden, .inter = mc->inter, .experts = mc->experts,
                         .topk = (int32_t)mc->topk, .gated = mc->gated,
                         .scale_dir = mc->scale_dir == KP_NVFP4_MULTIPLY ? KP_MOE_SCALE_MULTIPLY : KP_MOE_SCALE_DIVIDE};
}

static int moe_outputs(const void *data, int64_t nrows, kp_tensor *t) {
    const moe_data *d = data;
    t[0] = (kp_tensor){.name = "out", .dtype = KP_F32, .ndim = 2, .shape = {nrows, d->mc.hidden}, .batched = 1};
    t[1] = (kp_tensor){.name = "slots", .dtype = KP_I32, .ndim = 2, .shape = {nrows, d->mc.topk}, .batched = 1};
    return 2;
}

static void moe_fill_args(const void *data, const kp_launch_bufs *b, void *args) {
    const moe_data *d = data;
    kp_moe_args a = args_for(&d->mc, b->nrows);
    a.x = b->in[IN_X], a.ids = b->in[IN_IDS], a.weights = b->in[IN_WEIGHTS];
    a.w13 = b->in[IN_W13], a.s13 = b->in[IN_S13], a.w2 = b->in[IN_W2], a.s2 = b->in[IN_S2];
    a.g13 = b->in[IN_SCALES], a.g2 = (const float *)b->in[IN_SCALES] + d->mc.experts;
    a.out = b->out[0], a.slots = b->out[1];
    a.sm_count = b->sm_count, a.stream = b->stream, a.workspace = b->workspace, a.workspace_bytes = b->workspace_bytes;
    *(kp_moe_args *)args = a;
}

/* What prepare, outputs and fill_args make of the case (kp_shapes). */
static int moe_shapes(const kp_case *c, int64_t extra_rows, kp_shapes *s, kp_error *err) {
    const kp_moe_case mc = *kp_moe_case_of(c);
    (void)err; /* decoded once, when the case was normalized */
    const int64_t H = mc.hidden, I = mc.inter, E = mc.experts, K = mc.topk, R = kp_moe_w13_rows(&mc);
    s->batch = mc.m, s->rows_total = mc.m + extra_rows;
    const int64_t xs[2] = {mc.m, H}, rs[2] = {mc.m, K}, w13s[3] = {E, R, H / 2}, s13s[3] = {E, R, H / 16},
                  w2s[3] = {E, H, I / 2}, s2s[3] = {E, H, I / 16}, gs[2] = {2, E};
    kp_shapes_input(s, "x", KP_F32, 2, xs, 0, true);
    kp_shapes_input(s, "ids", KP_I32, 2, rs, 0, true);
    kp_shapes_input(s, "weights", KP_F32, 2, rs, 0, true);
    kp_shapes_input(s, "w13", KP_U8, 3, w13s, 0, false);
    kp_shapes_input(s, "s13", KP_U8, 3, s13s, 0, false);
    kp_shapes_input(s, "w2", KP_U8, 3, w2s, 0, false);
    kp_shapes_input(s, "s2", KP_U8, 3, s2s, 0, false);
    kp_shapes_input(s, "global_scales", KP_F32, 2, gs, 0, false);
    const moe_data d = {.mc = mc};
    s->noutputs = moe_outputs(&d, mc.m, s->outputs);
    /* the generator's per-thread scratch (kp_moe_case_experts: one expert's weights and a group's draws, a group
       at most KP_MOE_GEN_DRAWS draws or one expert's, and the quantizer's), the references' two outputs (on x and on x
       in bf16), the bf16 copy of x and the reference's scratch, and
       per expert a few words */
    const double most = (double)(R > H ? R : H) * (double)H, per = (double)(R * H + H * I);
    s->private_bytes = (double)kp_thread_count() * (per + (per > KP_MOE_GEN_DRAWS ? per : KP_MOE_GEN_DRAWS) + most) * 4.0 +
                       (double)mc.m * (double)H * (2.0 * 8.0 + 4.0) + kp_moe_reference_bytes(&mc, mc.m) +
                       (double)E * 32.0;
    kp_moe_args *args = (kp_moe_args *)s->args;
    *args = args_for(&mc, kp_shapes_largest_run(s->batch, s->rows_total));
    args->sm_count = kp_device_sm_count();
    return 0;
}

static void describe_reference(const moe_data *d, kp_reference *ref) {
    ref->digest_tag = "kparity.reference.moe/v1";
    ref->arrays[0] = (kp_tensor){.name = "out", .dtype = KP_F64, .ndim = 2, .shape = {d->mc.m, d->mc.hidden}, .data = d->ref};
    ref->arrays[1] = (kp_tensor){.name = "out@bf16_activations", .dtype = KP_F64, .ndim = 2, .shape = {d->mc.m, d->mc.hidden},
                                 .data = d->ref_bf16};
    ref->narrays = 2;
    ref->computed_on = d->ref_computed_on;
}

/* The rule on x (out) and on x rounded to bf16 (out@bf16_activations): every W4A16 kernel rounds its activations to
 * bf16 before the first GEMM, so the second is the answer such a kernel approximates; a tolerance check reports it
 * beside the verdict, never in it. */
static int moe_reference(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    moe_data *d = data;
    const int64_t n = d->mc.m * d->mc.hidden;
    if (!d->ref) {
        double *out = kp_calloc((size_t)n, sizeof *out, "moe reference output", err);
        double *out_bf16 = out ? kp_calloc((size_t)n, sizeof *out_bf16, "moe bf16-activation reference", err) : NULL;
        float *x_bf16 = out_bf16 ? kp_calloc((size_t)n, sizeof *x_bf16, "moe bf16 activations", err) : NULL;
        if (!x_bf16) return free(out), free(out_bf16), err->code;
        for (int64_t i = 0; i < n; i++) x_bf16[i] = kp_bf16_round(d->x[i]);
        const char *on = NULL;
        kp_moe_ref_in in = {.mc = &d->mc, .rows = d->mc.m, .x = d->x, .ids = d->ids, .weights = d->weights,
                            .w13 = d->w13, .s13 = d->s13, .w2 = d->w2, .s2 = d->s2, .g13 = d->scales,
                            .g2 = d->scales + d->mc.experts, .computed_on = &on};
        int rc = kp_moe_reference_x2(&in, x_bf16, out, out_bf16, err); /* one call: each weight block serves both */
        d->ref_computed_on = on;
        free(x_bf16);
        if (rc) return free(out), free(out_bf16), rc;
        d->ref = out, d->ref_bf16 = out_bf16;
    }
    describe_reference(d, ref);
    return 0;
}

static int moe_reference_adopt(void *data, const void *params, kp_reference *ref, kp_error *err) {
    (void)params;
    moe_data *d = data;
    kp_reference want = {0};
    describe_reference(d, &want);
    if (kp_reference_matches(ref, &want, err)) return err->code;
    d->ref = ref->arrays[0].data, d->ref_bf16 = ref->arrays[1].data;
    d->ref_borrowed = true;
    return 0;
}

static double moe_flops(const void *data, int64_t nrows) {
    const moe_data *d = data;
    return 2.0 * (double)nrows * (double)d->mc.topk * (double)(kp_moe_w13_rows(&d->mc) + d->mc.inter) * (double)d->mc.hidden;
}

/* Weight bytes of the experts a batch of nrows routes to (each read once), activations and outputs. */
static double moe_bytes_moved(const void *data, int64_t nrows) {
    const moe_data *d = data;
    uint8_t *used = calloc((size_t)d->mc.experts, 1);
    int64_t nused = 0;
    for (int64_t i = 0; used && i < nrows * d->mc.topk; i++) nused += !used[d->ids[i]]++;
    free(used);
    return weight_bytes(&d->mc) * (double)nused / (double)d->mc.experts +
           (double)nrows * (double)(2 * d->mc.hidden + 3 * d->mc.topk) * 4.0;
}

static const char *const bench_cases[] = {
    "moe(m=1,model=glm53,profile=single,seed=1)",       "moe(m=32,model=glm53,profile=uniform,seed=1)",
    "moe(m=800,model=glm53,profile=uniform,seed=1)",    "moe(m=2304,model=glm53,profile=uniform,seed=1)",
    "moe(m=1,model=qwen3,profile=single,seed=1)",       "moe(m=32,model=qwen3,profile=uniform,seed=1)",
    "moe(m=800,model=qwen3,profile=uniform,seed=1)",    "moe(m=2304,model=qwen3,profile=uniform,seed=1)",
    NULL,
};
/* Without a GPU: GLM-5.3's 288 experts, top 8, at the host gate's hidden 256 and inter 128 (its real 4096/2048 take
 * 13.8 s a rep at M 32 on 2 cores), one token, and 33 rows routed to straddle the 32-row gemv_rows switch (3 and 19
 * CPU-seconds with the host kernels of 2026-12-02). Every family's host shapes together: about a minute on 2 cores
 * (MEASURED.md). */
static const char *const bench_cases_host[] = {
    "moe(hidden=256,inter=128,m=1,model=glm53,profile=single,seed=1)",
    "moe(hidden=256,inter=128,m=33,model=glm53,profile=straddle,seed=1)",
    NULL,
};
static const char *const tolerance_outputs[] = {"out", NULL};
static const char *const order_outputs[] = {"slots", NULL}; /* where each pair ran, not part of the answer */

static const char *const output_names[] = {"out", "slots", NULL};

const kp_family kp_moe_family = {
    .name = "moe",
    .output_names = output_names,
    .cases = &kp_moe_case_family,
    .reference_provider = "reference.moe@host-f64",
    .reference_rule = "out[t] = sum over j of weights[t, j] * W2_e act(W13_e x_t), e = ids[t, j], in float64 on the NVFP4 "
                      "weights dequantized exactly; act = silu(gate) * up, or relu(up)^2",
    .bench_cases = bench_cases,
    .bench_cases_host = bench_cases_host,
    .tolerance_outputs = tolerance_outputs,
    .order_outputs = order_outputs,
    .args_bytes = sizeof(kp_moe_args),
    .prepare = moe_prepare,
    .release = moe_release,
    .shapes = moe_shapes,
    .outputs = moe_outputs,
    .fill_args = moe_fill_args,
    .reference = moe_reference,
    .reference_version = "moe/v2", /* v2: out@bf16_activations beside out */
    .reference_adopt = moe_reference_adopt,
    .case_thresholds = kp_moe_case_thresholds,
    .row_moved = kp_moe_row_moved,
    .bytes_moved = moe_bytes_moved,
    .flops = moe_flops,
    .array_docs = kp_moe_array_docs,
};
