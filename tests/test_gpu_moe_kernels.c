/* test_gpu_moe_kernels.c: moe.invariant@cuda, moe.marlin_like@cuda and moe.marlin_gemv32@cuda against a
 * float64 computation on the dequantized weights (the oracle: this file's loop over the routed pairs),
 * and the properties each is built for or models: the candidate's token-order slots and bit-identical
 * rows whatever the batch, the incumbent's run-to-run changes on the atomic slot path and stability off
 * it, gemv32's change of path at 32 rows, and refusals. Exit 77 without a GPU or the CUDA impls.
 * CUDA state is created only inside tests (Criterion forks; see kp_gpu_test.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/kp_nvfp4.h"
#include "../cases/moe_case.h"
#include "../kernels/kp_registry.h"
#include "../kernels/moe_plan.h"
#include "kp_gpu_test.h"
#include "kp_test_util.h"

#define ATOL 4e-2     /* Marlin NVFP4 MoE's tolerance (families.md §A) */
#define REL_OF_MAX 0.05 /* and at most 5% of the largest reference value: the outputs are small */
#define NMSE_MAX 1e-3   /* the gates' NMSE bound (ci/gates/nvfp4-moe*.json "nmse": sum (x - r)^2 / sum r^2) */

static const char *const impl_names[] = {"moe.invariant@cuda", "moe.marlin_like@cuda", "moe.marlin_gemv32@cuda"};
#define IMPLS 3


static uint32_t bits_of(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}


/* ---- inputs: a case's expert weights (all experts) and its rows ---- */

typedef struct moe_in {
    kp_moe_case mc;
    int64_t w13_rows;
    uint8_t *w13, *s13, *w2, *s2; /* [experts, ...] as kp_moe_args wants them */
    float *g13, *g2;              /* [experts] */
    float *x, *w;                 /* [m, hidden], [m, topk] */
    int32_t *ids;                 /* [m, topk] */
} moe_in;

static moe_in make_in(const char *name) {
    moe_in in;
    memset(&in, 0, sizeof in);
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_moe_case_read(&c, &in.mc, &err), 0,
                 "%s: %s", name, err.msg);
    const kp_moe_case *mc = &in.mc;
    const int64_t E = mc->experts, H = mc->hidden, I = mc->inter;
    in.w13_rows = kp_moe_w13_rows(mc);
    const size_t c13 = (size_t)(in.w13_rows * H / 2), q13 = (size_t)(in.w13_rows * H / 16);
    const size_t c2 = (size_t)(H * I / 2), q2 = (size_t)(H * I / 16);
    in.w13 = alloc_or_die(c13 * (size_t)E), in.s13 = alloc_or_die(q13 * (size_t)E);
    in.w2 = alloc_or_die(c2 * (size_t)E), in.s2 = alloc_or_die(q2 * (size_t)E);
    in.g13 = alloc_or_die(sizeof(float) * (size_t)E), in.g2 = alloc_or_die(sizeof(float) * (size_t)E);
    in.x = alloc_or_die(sizeof(float) * (size_t)(mc->m * H));
    in.w = alloc_or_die(sizeof(float) * (size_t)(mc->m * mc->topk));
    in.ids = alloc_or_die(sizeof(int32_t) * (size_t)(mc->m * mc->topk));
    cr_assert_eq(kp_moe_case_rows(mc, 0, mc->m, in.x, in.ids, in.w, &err), 0, "%s: %s", name, err.msg);
    /* every expert in one call when most are routed, else the routed ones alone (each call has a fixed
     * cost); the rest stay zero with global scale 1 */
    bool *used = alloc_or_die(sizeof(bool) * (size_t)E);
    int64_t routed = 0;
    for (int64_t i = 0; i < mc->m * mc->topk; i++) routed += !used[in.ids[i]], used[in.ids[i]] = true;
    if (routed > E / 4)
        cr_assert_eq(kp_moe_case_experts(mc, 0, E, in.w13, in.s13, in.g13, in.w2, in.s2, in.g2, &err), 0, "%s: %s", name,
                     err.msg);
    else
        for (int64_t e = 0; e < E; e++) {
            in.g13[e] = in.g2[e] = 1.0f;
            if (used[e])
                cr_assert_eq(kp_moe_case_expert(mc, e, in.w13 + c13 * (size_t)e, in.s13 + q13 * (size_t)e, &in.g13[e],
                                                in.w2 + c2 * (size_t)e, in.s2 + q2 * (size_t)e, &in.g2[e], &err),
                             0, "%s expert %lld: %s", name, (long long)e, err.msg);
        }
    free(used);
    return in;
}

static void free_in(moe_in *in) {
    free(in->w13), free(in->s13), free(in->w2), free(in->s2), free(in->g13), free(in->g2);
    free(in->x), free(in->w), free(in->ids);
}

/* A batch: rows src[0 .. n) of a case, in that order, with their ids (editable). */
typedef struct batch {
    int64_t n;
    int32_t topk;
    int64_t hidden;
    float *x, *w;
    int32_t *ids;
} batch;

static batch make_batch(const moe_in *in, const int64_t *src, int64_t n) {
    const int64_t H = in->mc.hidden, K = in->mc.topk;
    batch b = {n, (int32_t)K, H, alloc_or_die(sizeof(float) * (size_t)(n * H)), alloc_or_die(sizeof(float) * (size_t)(n * K)),
               alloc_or_die(sizeof(int32_t) * (size_t)(n * K))};
    for (int64_t r = 0; r < n; r++) {
        const int64_t s = src ? src[r] : r;
        memcpy(b.x + r * H, in->x + s * H, sizeof(float) * (size_t)H);
        memcpy(b.w + r * K, in->w + s * K, sizeof(float) * (size_t)K);
        memcpy(b.ids + r * K, in->ids + s * K, sizeof(int32_t) * (size_t)K);
    }
    return b;
}
static batch first_rows(const moe_in *in, int64_t n) { return make_batch(in, NULL, n); }
static void free_batch(batch *b) { free(b->x), free(b->w), free(b->ids); }

/* One call's outputs. */
typedef struct moe_out {
    float *out;     /* [n, hidden] */
    int32_t *slots; /* [n, topk] */
} moe_out;

static moe_out alloc_out(const batch *b) {
    return (moe_out){alloc_or_die(sizeof(float) * (size_t)(b->n * b->hidden)), alloc_or_die(sizeof(int32_t) * (size_t)(b->n * b->topk))};
}
static void free_out(moe_out *o) { free(o->out), free(o->slots); }

/* ---- device plumbing ---- */

#define GUARD 64        /* entries past each output that no call may write */
#define GUARD_BYTE 0xab /* every output byte before a call: an entry left unwritten shows */

/* The case's weights on the device, shared by a test's calls. */
typedef struct dev_weights {
    uint8_t *w13, *s13, *w2, *s2;
    float *g13, *g2;
} dev_weights;

static void *upload(const void *host, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static dev_weights upload_weights(const moe_in *in) {
    const int64_t E = in->mc.experts, H = in->mc.hidden, I = in->mc.inter;
    dev_weights d;
    d.w13 = upload(in->w13, (size_t)(E * in->w13_rows * H / 2));
    d.s13 = upload(in->s13, (size_t)(E * in->w13_rows * H / 16));
    d.w2 = upload(in->w2, (size_t)(E * H * I / 2));
    d.s2 = upload(in->s2, (size_t)(E * H * I / 16));
    d.g13 = upload(in->g13, sizeof(float) * (size_t)E);
    d.g2 = upload(in->g2, sizeof(float) * (size_t)E);
    return d;
}
static void free_weights(dev_weights *d) {
    void *p[6] = {d->w13, d->s13, d->w2, d->s2, d->g13, d->g2};
    for (int i = 0; i < 6; i++) CUDA_OK(cudaFree(p[i]));
}

static kp_moe_args args_of(const moe_in *in, int64_t rows) {
    const kp_moe_case *mc = &in->mc;
    return (kp_moe_args){.rows = rows, .hidden = mc->hidden, .inter = mc->inter, .experts = mc->experts,
                         .topk = (int32_t)mc->topk, .gated = mc->gated,
                         .scale_dir = mc->scale_dir == KP_NVFP4_MULTIPLY ? KP_MOE_SCALE_MULTIPLY : KP_MOE_SCALE_DIVIDE};
}

/* One call of impl on batch b, start to end: outputs guarded, synchronized, fetched. */
static void gpu_run(const gpu *g, const kp_impl *impl, const moe_in *in, const dev_weights *dw, const batch *b,
                    moe_out *o) {
    const int64_t n = b->n, H = b->hidden, K = b->topk;
    kp_moe_args a = args_of(in, n);
    a.w13 = dw->w13, a.s13 = dw->s13, a.g13 = dw->g13, a.w2 = dw->w2, a.s2 = dw->s2, a.g2 = dw->g2;
    a.x = upload(b->x, sizeof(float) * (size_t)(n * H));
    a.ids = upload(b->ids, sizeof(int32_t) * (size_t)(n * K));
    a.weights = upload(b->w, sizeof(float) * (size_t)(n * K));
    const size_t out_n = (size_t)(n * H) + GUARD, slot_n = (size_t)(n * K) + GUARD;
    CUDA_OK(cudaMalloc((void **)&a.out, sizeof(float) * out_n));
    CUDA_OK(cudaMalloc((void **)&a.slots, sizeof(int32_t) * slot_n));
    a.sm_count = g->sm_count, a.stream = g->stream;
    a.workspace_bytes = impl->workspace_bytes(&a);
    cr_assert_gt(a.workspace_bytes, 0, "%s: workspace_bytes 0 for a valid call", impl->name);
    CUDA_OK(cudaMalloc(&a.workspace, a.workspace_bytes));
    CUDA_OK(cudaMemset(a.workspace, 0xcd, a.workspace_bytes)); /* nothing may be read before it is written */
    CUDA_OK(cudaMemsetAsync(a.out, GUARD_BYTE, sizeof(float) * out_n, g->stream));
    CUDA_OK(cudaMemsetAsync(a.slots, GUARD_BYTE, sizeof(int32_t) * slot_n, g->stream));
    char msg[512] = "";
    cr_assert_eq(impl->supports(&a, msg, sizeof msg), KP_RUN_OK, "%s refuses: %s", impl->name, msg);
    const int rc = impl->run(&a, msg, sizeof msg);
    cr_assert_eq(rc, KP_RUN_OK, "%s run: %s", impl->name, msg);
    CUDA_OK(cudaStreamSynchronize(g->stream));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(o->out, a.out, sizeof(float) * (size_t)(n * H), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o->slots, a.slots, sizeof(int32_t) * (size_t)(n * K), cudaMemcpyDeviceToHost));
    unsigned char guard[2][GUARD * 4];
    CUDA_OK(cudaMemcpy(guard[0], a.out + n * H, sizeof guard[0], cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard[1], a.slots + n * K, sizeof guard[1], cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < sizeof guard[0]; i++)
        cr_assert(guard[0][i] == GUARD_BYTE && guard[1][i] == GUARD_BYTE, "%s wrote past an output (byte %zu of a guard)",
                  impl->name, i);
    void *p[6] = {(void *)a.x, (void *)a.ids, (void *)a.weights, a.out, a.slots, a.workspace};
    for (int i = 0; i < 6; i++) CUDA_OK(cudaFree(p[i]));
}

/* ---- the float64 oracle ---- */

/* out[r] = sum over j of w[r, j] * W2_e act(W13_e x_r), e = ids[r, j], on the exactly dequantized
 * weights, in float64; pairs whose id is outside [0, experts) add nothing. */
static void reference(const moe_in *in, const batch *b, double *out) {
    const kp_moe_case *mc = &in->mc;
    const int64_t E = mc->experts, H = mc->hidden, I = mc->inter, R13 = in->w13_rows, K = b->topk;
    const kp_nvfp4_scale_dir dir = mc->scale_dir;
    double *w13 = alloc_or_die(sizeof(double) * (size_t)(R13 * H)), *w2 = alloc_or_die(sizeof(double) * (size_t)(H * I));
    double *h = alloc_or_die(sizeof(double) * (size_t)R13), *act = alloc_or_die(sizeof(double) * (size_t)I);
    memset(out, 0, sizeof(double) * (size_t)(b->n * H));
    for (int64_t e = 0; e < E; e++) {
        bool used = false;
        for (int64_t i = 0; i < b->n * K && !used; i++) used = b->ids[i] == e;
        if (!used) continue;
        kp_nvfp4_dequantize(in->w13 + e * R13 * H / 2, in->s13 + e * R13 * H / 16, R13, H, in->g13[e], dir, w13);
        kp_nvfp4_dequantize(in->w2 + e * H * I / 2, in->s2 + e * H * I / 16, H, I, in->g2[e], dir, w2);
        for (int64_t i = 0; i < b->n * K; i++) {
            if (b->ids[i] != e) continue;
            const float *x = b->x + (i / K) * H;
            for (int64_t n = 0; n < R13; n++) {
                double s = 0;
                for (int64_t k = 0; k < H; k++) s += w13[n * H + k] * (double)x[k];
                h[n] = s;
            }
            for (int64_t n = 0; n < I; n++)
                act[n] = mc->gated ? h[n] / (1.0 + exp(-h[n])) * h[I + n] : (h[n] > 0 ? h[n] * h[n] : 0.0);
            for (int64_t n = 0; n < H; n++) {
                double s = 0;
                for (int64_t k = 0; k < I; k++) s += w2[n * I + k] * act[k];
                out[(i / K) * H + n] += (double)b->w[i] * s;
            }
        }
    }
    free(w13), free(w2), free(h), free(act);
}

/* Why got is not within tolerance of want, NULL if it is: no NaN or inf, |got - want| <= ATOL and
 * <= REL_OF_MAX * max |want| everywhere, NMSE <= NMSE_MAX (the gates hold every impl to it; 1294f26's judge did not),
 * and not all zero. */
static const char *judge(const double *want, const float *got, int64_t count, char *why, size_t why_len) {
    double top = 0, worst = 0, see = 0, srr = 0;
    int64_t at = 0, nonzero = 0;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(got[i])) {
            snprintf(why, why_len, "element %lld is %g", (long long)i, (double)got[i]);
            return why;
        }
        top = fmax(top, fabs(want[i]));
        nonzero += got[i] != 0.0f;
        const double d = fabs((double)got[i] - want[i]);
        if (d > worst) worst = d, at = i;
        see += d * d, srr += want[i] * want[i];
    }
    if (nonzero == 0) return "every output is zero";
    const double nmse = srr > 0 ? see / srr : (see > 0 ? INFINITY : 0.0);
    if (!(nmse <= NMSE_MAX)) {
        snprintf(why, why_len, "NMSE %.3g over the gates' %g (worst element %lld: |diff| %.3g)", nmse, NMSE_MAX,
                 (long long)at, worst);
        return why;
    }
    if (worst > ATOL || worst > REL_OF_MAX * top) {
        snprintf(why, why_len, "element %lld: %.6g against %.6g (|diff| %.3g; atol %g, %g of max |ref| %.4g)", (long long)at,
                 (double)got[at], want[at], worst, ATOL, REL_OF_MAX, top);
        return why;
    }
    return NULL;
}

/* Pair (r, j)'s position among its expert's pairs in pair order (the candidate's slots); -1 unrouted. */
static void token_order_slots(const batch *b, int64_t experts, int32_t *slots) {
    int32_t *count = alloc_or_die(sizeof(int32_t) * (size_t)experts);
    for (int64_t i = 0; i < b->n * b->topk; i++) {
        const int32_t e = b->ids[i];
        slots[i] = e >= 0 && e < experts ? count[e]++ : -1;
    }
    free(count);
}

/* Why slots are not a numbering 0 .. count - 1 of each expert's pairs, NULL if they are. */
static const char *slots_problem(const batch *b, int64_t experts, const int32_t *slots, char *why, size_t why_len) {
    int32_t *count = alloc_or_die(sizeof(int32_t) * (size_t)experts);
    for (int64_t i = 0; i < b->n * b->topk; i++) count[b->ids[i]]++;
    int64_t *first = alloc_or_die(sizeof(int64_t) * (size_t)(experts + 1));
    for (int64_t e = 0; e < experts; e++) first[e + 1] = first[e] + count[e];
    unsigned char *seen = alloc_or_die((size_t)first[experts] + 1);
    const char *problem = NULL;
    for (int64_t i = 0; i < b->n * b->topk && !problem; i++) {
        const int32_t e = b->ids[i], s = slots[i];
        if (s < 0 || s >= count[e]) {
            snprintf(why, why_len, "pair %lld (expert %d of %d pairs) has slot %d", (long long)i, e, count[e], s);
            problem = why;
        } else if (seen[first[e] + s]++) {
            snprintf(why, why_len, "pair %lld: slot %d of expert %d given twice", (long long)i, s, e);
            problem = why;
        }
    }
    free(count), free(first), free(seen);
    return problem;
}

/* The first row where two outputs differ in any bit, -1 if none. */
static int64_t first_differing_row(const float *a, const float *b, int64_t rows, int64_t hidden) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < hidden; h++)
            if (bits_of(a[r * hidden + h]) != bits_of(b[r * hidden + h])) return r;
    return -1;
}
static int64_t differing_rows(const float *a, const float *b, int64_t rows, int64_t hidden) {
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) n += memcmp(a + r * hidden, b + r * hidden, sizeof(float) * (size_t)hidden) != 0;
    return n;
}

/* ---- 1. accuracy and slots ---- */

Test(gpu_moe, judge_catches_a_planted_error) {
    const double want[4] = {0.01, -0.02, 0.03, 0.005};
    float got[4] = {0.0101f, -0.0199f, 0.0301f, 0.005f};
    char why[256];
    cr_assert_null(judge(want, got, 4, why, sizeof why), "a close answer judged wrong");
    got[2] = 0.0301f + 0.002f; /* above 5% of max |ref| */
    cr_assert_not_null(judge(want, got, 4, why, sizeof why), "a planted error of 0.002 on 0.03 passed");
    got[2] = NAN;
    cr_assert_not_null(judge(want, got, 4, why, sizeof why), "a NaN passed");
    float zeros[4] = {0};
    cr_assert_not_null(judge(want, zeros, 4, why, sizeof why), "all zeros passed");
    /* every element 0.0014 off: inside ATOL and 5% of max |ref| (0.0015), NMSE 5.5e-3 past the gates' 1e-3 */
    for (int i = 0; i < 4; i++) got[i] = (float)(want[i] + 0.0014);
    cr_assert_not_null(judge(want, got, 4, why, sizeof why), "an NMSE past the gates' bound passed");
}

/* Shapes: tails of K and N (hidden 208 = 13 x 16: codes 8-byte aligned only, scales by bytes; inter
 * 80), both scale directions, relu^2 with top 6 (marlin's f32 slot sum), top 4 (its bf16 steps),
 * the atomic slot path (288 and 128 experts) and token order (glm47, 800 pairs < 1024), a hot expert
 * past 64 rows (two m tiles) and experts either side of 32 rows (gemv32's two paths). */
Test(gpu_moe, every_impl_within_tolerance_of_float64, .timeout = 600) {
    static const char *const cases[] = {
        "moe(hidden=256,inter=128,m=300,model=glm53,profile=uniform,seed=3)",
        "moe(hidden=208,inter=80,m=70,model=qwen3,profile=hot,scale_dir=multiply,seed=4)",
        "moe(hidden=128,inter=96,m=40,model=nemotron,profile=uniform,seed=5)",
        "moe(hidden=128,inter=64,m=200,model=glm47,profile=uniform,seed=6)",
        "moe(hidden=128,inter=64,m=40,model=qwen3,profile=straddle,seed=7)",
    };
    gpu g = gpu_open();
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        moe_in in = make_in(cases[c]);
        dev_weights dw = upload_weights(&in);
        batch b = first_rows(&in, in.mc.m);
        const int64_t count = b.n * b.hidden;
        double *want = alloc_or_die(sizeof(double) * (size_t)count);
        reference(&in, &b, want);
        int32_t *token = alloc_or_die(sizeof(int32_t) * (size_t)(b.n * b.topk));
        token_order_slots(&b, in.mc.experts, token);
        for (int i = 0; i < IMPLS; i++) {
            const kp_impl *impl = impl_named(impl_names[i]);
            moe_out o = alloc_out(&b);
            gpu_run(&g, impl, &in, &dw, &b, &o);
            char why[256];
            const char *p = judge(want, o.out, count, why, sizeof why);
            cr_assert_null(p, "%s on %s: %s", impl->name, cases[c], p);
            p = slots_problem(&b, in.mc.experts, o.slots, why, sizeof why);
            cr_assert_null(p, "%s on %s: %s", impl->name, cases[c], p);
            const bool token_order = i == 0 || !kp_marlin_atomic_order(b.n, b.topk, in.mc.experts);
            if (token_order)
                for (int64_t q = 0; q < b.n * b.topk; q++)
                    cr_assert_eq(o.slots[q], token[q], "%s on %s: pair %lld has slot %d, token order %d", impl->name,
                                 cases[c], (long long)q, o.slots[q], token[q]);
            free_out(&o);
        }
        free(want), free(token), free_batch(&b), free_weights(&dw), free_in(&in);
    }
}

/* ---- 2. the candidate's rows are batch-invariant ---- */

Test(gpu_moe, invariant_rows_are_the_same_alone_repeated_and_reversed, .timeout = 600) {
    /* 128 experts, 144 rows each: rows sit in m tiles 0, 1 and 2 of their experts */
    moe_in in = make_in("moe(hidden=128,inter=64,m=2304,model=qwen3,profile=uniform,seed=8)");
    gpu g = gpu_open();
    const kp_impl *impl = impl_named("moe.invariant@cuda");
    dev_weights dw = upload_weights(&in);
    const int64_t M = in.mc.m, H = in.mc.hidden, K = in.mc.topk;
    batch full = first_rows(&in, M);
    moe_out a = alloc_out(&full), b = alloc_out(&full);
    gpu_run(&g, impl, &in, &dw, &full, &a);
    gpu_run(&g, impl, &in, &dw, &full, &b);
    cr_assert_eq(first_differing_row(a.out, b.out, M, H), -1, "a repeated batch changed row %lld",
                 (long long)first_differing_row(a.out, b.out, M, H));
    cr_assert(!memcmp(a.slots, b.slots, sizeof(int32_t) * (size_t)(M * K)), "a repeated batch changed its slots");
    int64_t nonzero = 0;
    for (int64_t i = 0; i < M * H; i++) nonzero += a.out[i] != 0.0f;
    cr_assert_gt(nonzero, M * H / 2, "mostly zero outputs: the probe would be vacuous");

    /* rows alone: slot 0 of one-row experts, against positions up to ~150 in the batch */
    static const int64_t probes[] = {0, 1, 777, 1500, 2303};
    int32_t deepest = 0;
    for (size_t p = 0; p < sizeof probes / sizeof *probes; p++) {
        const int64_t r = probes[p];
        batch one = make_batch(&in, &r, 1);
        moe_out o = alloc_out(&one);
        gpu_run(&g, impl, &in, &dw, &one, &o);
        cr_assert_eq(first_differing_row(o.out, a.out + r * H, 1, H), -1, "row %lld alone differs from the batch's",
                     (long long)r);
        for (int64_t j = 0; j < K; j++) deepest = a.slots[r * K + j] > deepest ? a.slots[r * K + j] : deepest;
        free_out(&o), free_batch(&one);
    }
    cr_assert_geq(deepest, 2 * 64, "no probed pair sat past its expert's first two m tiles (deepest slot %d)", deepest);

    /* reversed */
    int64_t *rev = alloc_or_die(sizeof(int64_t) * (size_t)M);
    for (int64_t r = 0; r < M; r++) rev[r] = M - 1 - r;
    batch back = make_batch(&in, rev, M);
    moe_out c = alloc_out(&back);
    gpu_run(&g, impl, &in, &dw, &back, &c);
    int64_t moved = 0;
    for (int64_t r = 0; r < M; r++) {
        cr_assert_eq(first_differing_row(c.out + (M - 1 - r) * H, a.out + r * H, 1, H), -1,
                     "row %lld changed when the batch was reversed", (long long)r);
        for (int64_t j = 0; j < K; j++) moved += c.slots[(M - 1 - r) * K + j] != a.slots[r * K + j];
    }
    cr_assert_gt(moved, 0, "reversing the batch moved no pair: the probe would be vacuous");
    /* the comparison itself catches one flipped bit */
    float *copy = alloc_or_die(sizeof(float) * (size_t)H);
    memcpy(copy, a.out + 9 * H, sizeof(float) * (size_t)H);
    const uint32_t flip = bits_of(copy[H - 1]) ^ 1u;
    memcpy(&copy[H - 1], &flip, sizeof flip);
    cr_assert_eq(first_differing_row(copy, a.out + 9 * H, 1, H), 0, "a flipped low bit went unseen");
    free(copy);
    cr_log_info("invariant: %lld pairs moved by the reversal, deepest probed slot %d", (long long)moved, deepest);
    free(rev), free_out(&a), free_out(&b), free_out(&c), free_batch(&full), free_batch(&back), free_weights(&dw), free_in(&in);
}

/* ---- 3. the incumbent: atomic slot order changes the bits; off that path it is stable ---- */

Test(gpu_moe, marlin_like_changes_run_to_run_on_the_atomic_path_only, .timeout = 600) {
    gpu g = gpu_open();
    const kp_impl *impl = impl_named("moe.marlin_like@cuda");
    /* At hidden 256 only rows of experts past 64 rows change block, and a changed cut moves a bf16
     * result in a few rows a run: 7 reruns leave a vanishing chance that none differs. */
    enum { RUNS = 4, ATOMIC_RUNS = 8 };
    { /* glm53 at M = 2304: 18,432 pairs, 288 experts, atomic slots, block_size_m 64 */
        moe_in in = make_in("moe(hidden=256,inter=128,m=2304,model=glm53,profile=uniform,seed=9)");
        cr_assert(kp_marlin_atomic_order(in.mc.m, (int32_t)in.mc.topk, in.mc.experts));
        dev_weights dw = upload_weights(&in);
        batch full = first_rows(&in, in.mc.m);
        moe_out o[ATOMIC_RUNS];
        int slot_changes = 0, out_changes = 0;
        for (int k = 0; k < ATOMIC_RUNS; k++) {
            o[k] = alloc_out(&full);
            gpu_run(&g, impl, &in, &dw, &full, &o[k]);
            char why[256];
            const char *p = slots_problem(&full, in.mc.experts, o[k].slots, why, sizeof why);
            cr_assert_null(p, "run %d: %s", k, p);
            if (k > 0) {
                slot_changes += memcmp(o[k].slots, o[0].slots, sizeof(int32_t) * (size_t)(full.n * full.topk)) != 0;
                out_changes += differing_rows(o[k].out, o[0].out, full.n, full.hidden) > 0;
            }
        }
        cr_assert_gt(slot_changes, 0, "%d runs gave the same slots: no atomic arrival order seen", ATOMIC_RUNS);
        cr_assert_gt(out_changes, 0, "%d runs gave the same bits although the slots moved", ATOMIC_RUNS);
        cr_log_info("marlin_like glm53 M=2304: slots changed in %d of %d reruns, outputs in %d (run 1: %lld rows)",
                    slot_changes, ATOMIC_RUNS - 1, out_changes,
                    (long long)differing_rows(o[1].out, o[0].out, full.n, full.hidden));
        for (int k = 0; k < ATOMIC_RUNS; k++) free_out(&o[k]);
        free_batch(&full), free_weights(&dw), free_in(&in);
    }
    static const char *const stable[] = {
        "moe(hidden=256,inter=128,m=1,model=glm53,profile=single,seed=10)", /* atomic path, one row an expert */
        "moe(hidden=128,inter=64,m=200,model=glm47,profile=uniform,seed=11)", /* 800 pairs, 64 experts: token order */
    };
    for (size_t c = 0; c < sizeof stable / sizeof *stable; c++) {
        moe_in in = make_in(stable[c]);
        dev_weights dw = upload_weights(&in);
        batch full = first_rows(&in, in.mc.m);
        int32_t *token = alloc_or_die(sizeof(int32_t) * (size_t)(full.n * full.topk));
        token_order_slots(&full, in.mc.experts, token);
        moe_out o[RUNS];
        for (int k = 0; k < RUNS; k++) {
            o[k] = alloc_out(&full);
            gpu_run(&g, impl, &in, &dw, &full, &o[k]);
            cr_assert(!memcmp(o[k].slots, token, sizeof(int32_t) * (size_t)(full.n * full.topk)),
                      "%s run %d: slots not in token order", stable[c], k);
            if (k > 0)
                cr_assert_eq(first_differing_row(o[k].out, o[0].out, full.n, full.hidden), -1, "%s run %d changed row %lld",
                             stable[c], k, (long long)first_differing_row(o[k].out, o[0].out, full.n, full.hidden));
        }
        for (int k = 0; k < RUNS; k++) free_out(&o[k]);
        free(token), free_batch(&full), free_weights(&dw), free_in(&in);
    }
}

/* ---- 4. gemv32: a row's bits change when its expert crosses 32 rows ---- */

Test(gpu_moe, gemv32_changes_when_an_expert_crosses_32_rows, .timeout = 600) {
    /* straddle, m = 33: expert 2 holds all 33 rows (tensor path); the first 32 rows alone give it 32 (f32) */
    moe_in in = make_in("moe(hidden=128,inter=64,m=33,model=qwen3,profile=straddle,seed=12)");
    gpu g = gpu_open();
    dev_weights dw = upload_weights(&in);
    batch full = first_rows(&in, 33), sub = first_rows(&in, 32);
    int64_t rows_with_2 = 0;
    for (int64_t i = 0; i < 33 * in.mc.topk; i++) rows_with_2 += full.ids[i] == 2;
    cr_assert_eq(rows_with_2, 33, "straddle: expert 2 should hold 33 rows");
    int64_t changed[IMPLS];
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        moe_out a = alloc_out(&full), b = alloc_out(&sub);
        gpu_run(&g, impl, &in, &dw, &full, &a);
        gpu_run(&g, impl, &in, &dw, &sub, &b);
        changed[i] = differing_rows(a.out, b.out, 32, full.hidden);
        free_out(&a), free_out(&b);
    }
    cr_assert_gt(changed[2], 0, "gemv32: no row of the first 32 changed when expert 2 went from 33 rows to 32");
    cr_assert_eq(changed[0], 0, "invariant: %lld rows changed with the batch", (long long)changed[0]);
    cr_log_info("rows of 32 changed by dropping row 32: invariant %lld, marlin_like %lld, gemv32 %lld",
                (long long)changed[0], (long long)changed[1], (long long)changed[2]);
    free_batch(&full), free_batch(&sub), free_weights(&dw), free_in(&in);
}

/* ---- 5. refusals ---- */

Test(gpu_moe, bad_args_are_refused_with_a_message) {
    gpu g = gpu_open();
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        cr_assert_str_eq(impl->family, "moe");
        cr_assert_eq(impl->memory, KP_MEMORY_CUDA);
        const kp_moe_args good = {.rows = 4, .hidden = 64, .inter = 32, .experts = 8, .topk = 2, .gated = 1,
                                  .scale_dir = KP_MOE_SCALE_DIVIDE, .sm_count = g.sm_count, .stream = g.stream};
        char msg[256] = "";
        cr_assert_eq(impl->supports(&good, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
        cr_assert_gt(impl->workspace_bytes(&good), 0);
        kp_moe_args bad[10];
        for (int k = 0; k < 10; k++) bad[k] = good;
        bad[0].rows = 0;
        bad[1].hidden = 100;          /* not a multiple of 16 */
        bad[2].inter = 8;
        bad[3].topk = 0;
        bad[4].topk = 9;              /* above experts */
        bad[5].gated = 2;
        bad[6].scale_dir = 7;
        bad[7].experts = 0;
        bad[8].x = (const float *)(uintptr_t)4; /* misaligned for vector loads */
        bad[9].rows = (1ll << 28) / 2 + 1;    /* rows * topk above 2^28 */
        for (int k = 0; k < 10; k++) {
            msg[0] = 0;
            cr_assert_eq(impl->supports(&bad[k], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s accepted bad args %d", impl->name, k);
            cr_assert(strstr(msg, impl->name), "%s: refusal %d's message '%s' does not name the impl", impl->name, k, msg);
            msg[0] = 0;
            cr_assert_eq(impl->run(&bad[k], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s ran bad args %d", impl->name, k);
            cr_assert_gt(strlen(msg), strlen(impl->name), "%s: run gave no reason for bad args %d", impl->name, k);
        }
        msg[0] = 0; /* a valid call without its workspace fails with a reason, touching nothing */
        cr_assert_eq(impl->run(&good, msg, sizeof msg), KP_RUN_FAILED, "%s ran without a workspace", impl->name);
        cr_assert(strstr(msg, "workspace"), "%s: '%s'", impl->name, msg);
    }
}

/* An id outside [0, experts) cannot be refused without a sync: the pair is not routed (slot -1, adds
 * nothing) and nothing outside the buffers is touched (compute-sanitizer memcheck runs this). */
Test(gpu_moe, out_of_range_ids_are_not_routed) {
    moe_in in = make_in("moe(hidden=64,inter=32,m=20,model=glm47,profile=uniform,seed=13)");
    gpu g = gpu_open();
    dev_weights dw = upload_weights(&in);
    batch b = first_rows(&in, 20);
    b.ids[0] = (int32_t)in.mc.experts + 5, b.ids[7] = -3; /* row 0 slot 0, row 1 slot 3 */
    double *want = alloc_or_die(sizeof(double) * (size_t)(b.n * b.hidden));
    reference(&in, &b, want);
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        moe_out o = alloc_out(&b);
        gpu_run(&g, impl, &in, &dw, &b, &o);
        cr_assert(o.slots[0] == -1 && o.slots[7] == -1, "%s: slots %d and %d for unroutable pairs", impl->name, o.slots[0],
                  o.slots[7]);
        char why[256];
        const char *p = judge(want, o.out, b.n * b.hidden, why, sizeof why);
        cr_assert_null(p, "%s: %s", impl->name, p);
        free_out(&o);
    }
    free(want), free_batch(&b), free_weights(&dw), free_in(&in);
}

int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_moe_kernels", "moe.invariant@cuda"); }
