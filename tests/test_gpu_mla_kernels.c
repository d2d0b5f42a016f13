/* test_gpu_mla_kernels.c: mla.split_count@cuda, mla.split_size@cuda and mla.split_size_wg@cuda (split_size's plan on a
 * wgmma core, sm_90a) against the float64 reference (reference/mla_ref.h,
 * the oracle) at FlashMLA's decode tolerances, their distance from the host ports (kernels/host/mla.c, reported: the
 * order of summation differs), the plans they report, the candidate's bit-identical requests whatever the batch, the
 * incumbent's batch-dependent splits and bits, run-to-run bits, out-of-range indices, refusals, and a printed (not
 * asserted) timing at DeepSeek-V3.2's decode shape. Exit 77 without a GPU or the CUDA impls. CUDA state is created
 * only inside tests (Criterion forks; see kp_gpu_test.h). */
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

#include "../cases/mla_case.h"
#include "../kernels/kp_formats.h"
#include "../kernels/kp_registry.h"
#include "../kernels/mla_plan.h"
#include "../reference/mla_ref.h"
#include "kp_gpu_test.h"
#include "kp_test_util.h"

#define SMS 132 /* the incumbent plans for an H200 in every test, so its splits match the host port's model */
static int run_sms = SMS; /* the sm_count a call passes: whole_runs_give_the_bits_of_split_runs sets 1 */

static const char *const impl_names[] = {"mla.split_count@cuda", "mla.split_size@cuda", "mla.split_size_wg@cuda"};
static const char *const host_names[] = {"mla.split_count@host", "mla.split_size@host", "mla.split_size@host"};
#define IMPLS 3
#define CANDIDATES 2 /* impl_names[1 ..]: split_size's plan, whose bits must not depend on the batch */

static uint32_t f32_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}
static float bf16f(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* ---- inputs: a case on the host and on the device ---- */

typedef struct gen {
    kp_mla_case mc;
    kp_mla_sizes s;
    kp_mla_buffers b;
    int32_t *slots; /* indices as cache slots, the form impls take */
    float sink[128];
    int64_t cache_slots; /* tokens the cache holds */
    /* the device copies */
    uint16_t *d_q;
    void *d_cache;
    int32_t *d_slots, *d_len;
    float *d_sink;
} gen;

static gen make(const char *name, bool with_kv) {
    gen g;
    memset(&g, 0, sizeof g);
    kp_case c;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_mla_case_read(&c, &g.mc, &err), 0,
                 "%s: %s", name, err.msg);
    kp_mla_case_sizes(&g.mc, g.mc.batch, &g.s);
    g.b.q = alloc_or_die(g.s.q_bytes), g.b.indices = alloc_or_die(g.s.indices_bytes);
    g.b.page_table = alloc_or_die(g.s.page_table_bytes);
    g.b.topk_length = g.mc.topk_length ? alloc_or_die(g.s.topk_length_bytes) : NULL;
    g.b.cache = alloc_or_die(g.s.cache_bytes), g.b.kv = with_kv ? alloc_or_die(g.s.kv_bytes) : NULL;
    g.slots = alloc_or_die(g.s.indices_bytes);
    cr_assert_eq(kp_mla_case_requests(&g.mc, 0, g.mc.batch, &g.b, &err), 0, "%s", err.msg);
    cr_assert_eq(kp_mla_case_sink(&g.mc, g.sink, &err), 0, "%s", err.msg);
    for (int64_t r = 0; r < g.s.rows; r++)
        for (int64_t j = 0; j < g.mc.topk; j++)
            g.slots[r * g.mc.topk + j] = (int32_t)kp_mla_cache_slot(&g.mc, g.b.page_table + (r / g.mc.s_q) * g.s.pages_per_request,
                                                                   g.b.indices[r * g.mc.topk + j]);
    g.cache_slots = g.s.pages * g.mc.page;
    return g;
}

static void *upload(const void *host, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CUDA_OK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void upload_gen(gen *g) {
    g->d_q = upload(g->b.q, g->s.q_bytes);
    g->d_cache = upload(g->b.cache, g->s.cache_bytes);
    g->d_slots = upload(g->slots, g->s.indices_bytes);
    g->d_len = g->b.topk_length ? upload(g->b.topk_length, g->s.topk_length_bytes) : NULL;
    g->d_sink = upload(g->sink, sizeof g->sink);
}

static void drop(gen *g) {
    free(g->b.q), free(g->b.indices), free(g->b.topk_length), free(g->b.page_table), free(g->b.cache), free(g->b.kv);
    free(g->slots);
    void *d[5] = {g->d_q, g->d_cache, g->d_slots, g->d_len, g->d_sink};
    for (int i = 0; i < 5; i++)
        if (d[i]) CUDA_OK(cudaFree(d[i]));
}

/* One call's outputs, on the host. */
typedef struct run_out {
    int64_t n, heads; /* requests, rows * h_q */
    uint16_t *out;    /* [heads, 512] */
    float *lse, *max; /* [heads] */
    int32_t *splits;  /* [n] */
} run_out;

static run_out alloc_out(const gen *g, int64_t n) {
    const int64_t heads = n * g->mc.s_q * g->mc.h_q;
    return (run_out){n, heads, alloc_or_die(sizeof(uint16_t) * (size_t)(heads * KP_MLA_D_V)),
                     alloc_or_die(sizeof(float) * (size_t)heads), alloc_or_die(sizeof(float) * (size_t)heads),
                     alloc_or_die(sizeof(int32_t) * (size_t)n)};
}
static void free_out(run_out *o) { free(o->out), free(o->lse), free(o->max), free(o->splits); }

/* n requests' shape (pointers unset). */
static kp_mla_args args_of(const gen *g, int64_t n) {
    return (kp_mla_args){.batch = n, .s_q = g->mc.s_q, .h_q = g->mc.h_q, .topk = g->mc.topk, .slots = g->cache_slots,
                         .cache_format = g->mc.cache == KP_MLA_BF16 ? KP_MLA_CACHE_BF16 : KP_MLA_CACHE_FP8_DS_MLA,
                         .sm_scale = (float)g->mc.sm_scale, .sm_count = run_sms};
}

#define GUARD 64        /* entries past each output that no call may write */
#define GUARD_BYTE 0xab /* every output byte before a call: an entry left unwritten shows */

/* Requests [first, first + n) of g through a CUDA impl, start to end: outputs guarded and all written, synchronized,
 * fetched. slots: the indices to use ([rows, topk] on the device; NULL: the case's). */
static run_out gpu_run(const gpu *gp, const kp_impl *impl, const gen *g, int64_t first, int64_t n, const int32_t *slots) {
    run_out o = alloc_out(g, n);
    const int64_t r0 = first * g->mc.s_q, heads = o.heads;
    kp_mla_args a = args_of(g, n);
    a.q = g->d_q + r0 * g->mc.h_q * KP_MLA_D_QK;
    a.cache = g->d_cache;
    a.indices = (slots ? slots : g->d_slots) + r0 * g->mc.topk;
    a.topk_length = g->d_len ? g->d_len + r0 : NULL;
    a.attn_sink = g->mc.sink ? g->d_sink : NULL;
    const size_t out_n = (size_t)(heads * KP_MLA_D_V) + GUARD, head_n = (size_t)heads + GUARD, split_n = (size_t)n + GUARD;
    CUDA_OK(cudaMalloc((void **)&a.out, sizeof(uint16_t) * out_n));
    CUDA_OK(cudaMalloc((void **)&a.lse, sizeof(float) * head_n));
    CUDA_OK(cudaMalloc((void **)&a.max_logits, sizeof(float) * head_n));
    CUDA_OK(cudaMalloc((void **)&a.splits, sizeof(int32_t) * split_n));
    a.stream = gp->stream;
    a.workspace_bytes = impl->workspace_bytes(&a);
    cr_assert_gt(a.workspace_bytes, 0, "%s: workspace_bytes 0 for a valid call", impl->name);
    CUDA_OK(cudaMalloc(&a.workspace, a.workspace_bytes));
    CUDA_OK(cudaMemset(a.workspace, 0xcd, a.workspace_bytes)); /* nothing may be read before it is written */
    CUDA_OK(cudaMemset(a.out, GUARD_BYTE, sizeof(uint16_t) * out_n));
    CUDA_OK(cudaMemset(a.lse, GUARD_BYTE, sizeof(float) * head_n));
    CUDA_OK(cudaMemset(a.max_logits, GUARD_BYTE, sizeof(float) * head_n));
    CUDA_OK(cudaMemset(a.splits, GUARD_BYTE, sizeof(int32_t) * split_n));
    char msg[512] = "";
    cr_assert_eq(impl->supports(&a, msg, sizeof msg), KP_RUN_OK, "%s refuses: %s", impl->name, msg);
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s run: %s", impl->name, msg);
    CUDA_OK(cudaStreamSynchronize(gp->stream));
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(o.out, a.out, sizeof(uint16_t) * (size_t)(heads * KP_MLA_D_V), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o.lse, a.lse, sizeof(float) * (size_t)heads, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o.max, a.max_logits, sizeof(float) * (size_t)heads, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o.splits, a.splits, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToHost));
    unsigned char guard[4][GUARD * 4];
    CUDA_OK(cudaMemcpy(guard[0], a.out + heads * KP_MLA_D_V, GUARD * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard[1], a.lse + heads, GUARD * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard[2], a.max_logits + heads, GUARD * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(guard[3], a.splits + n, GUARD * 4, cudaMemcpyDeviceToHost));
    static const char *const outputs[4] = {"out", "lse", "max_logits", "splits"};
    for (int k = 0; k < 4; k++) {
        size_t at = 0;
        while (at < (k ? GUARD * 4 : GUARD * 2) && guard[k][at] == GUARD_BYTE) at++;
        cr_assert_eq(at, (size_t)(k ? GUARD * 4 : GUARD * 2), "%s wrote past %s (byte %zu of its guard)", impl->name, outputs[k], at);
    }
    const uint16_t fill16 = GUARD_BYTE * 0x0101u;
    const uint32_t fill32 = GUARD_BYTE * 0x01010101u;
    int64_t unwritten = -1;
    for (int64_t i = 0; i < heads * KP_MLA_D_V && unwritten < 0; i++)
        if (o.out[i] == fill16) unwritten = i;
    cr_assert_eq(unwritten, -1, "%s left out element %lld unwritten", impl->name, (long long)unwritten);
    for (int64_t h = 0; h < heads && unwritten < 0; h++)
        if (f32_bits(o.lse[h]) == fill32 || f32_bits(o.max[h]) == fill32) unwritten = h;
    cr_assert_eq(unwritten, -1, "%s left lse or max_logits of head %lld unwritten", impl->name, (long long)unwritten);
    for (int64_t b = 0; b < n && unwritten < 0; b++)
        if ((uint32_t)o.splits[b] == fill32) unwritten = b;
    cr_assert_eq(unwritten, -1, "%s left splits[%lld] unwritten", impl->name, (long long)unwritten);
    void *p[6] = {a.out, a.lse, a.max_logits, a.splits, a.workspace, NULL};
    for (int i = 0; p[i]; i++) CUDA_OK(cudaFree(p[i]));
    return o;
}

/* The same requests through a host port (kernels/host/mla.c), with the same model of the device (132 SMs). */
static run_out host_run(const kp_impl *impl, const gen *g, int64_t first, int64_t n) {
    run_out o = alloc_out(g, n);
    const int64_t r0 = first * g->mc.s_q;
    kp_mla_args a = args_of(g, n);
    a.q = g->b.q + r0 * g->mc.h_q * KP_MLA_D_QK, a.cache = g->b.cache, a.indices = g->slots + r0 * g->mc.topk;
    a.topk_length = g->b.topk_length ? g->b.topk_length + r0 : NULL;
    a.attn_sink = g->mc.sink ? g->sink : NULL;
    a.out = o.out, a.lse = o.lse, a.max_logits = o.max, a.splits = o.splits;
    a.workspace_bytes = impl->workspace_bytes(&a);
    a.workspace = alloc_or_die(a.workspace_bytes);
    char msg[256] = "";
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
    free(a.workspace);
    return o;
}

/* ---- the judge: FlashMLA's decode tolerances against the reference on the dequantized cache ---- */

typedef struct verdict {
    double cos_diff, worst_abs, worst_lse, worst_max; /* worst_lse / worst_max: |err| over the tolerance (pass <= 1) */
    int64_t over_both, elements, empty_rows, nonzero;
    char why[256]; /* the first failure, "" if none */
} verdict;

/* The gates' rule (ci/gates/sparse-mla*.json as harness/tolerance.c applies it): the reference rounded once to the
 * output's dtype, an element failing only past both bounds; lse and max_logits abs 1e-6, rel 8.01/65536. */
#define GATE_LSE_ATOL 1e-6
#define GATE_LSE_RTOL 0.0001222229
/* |x - f32(ref)| over its allowance max(abs, rel |f32(ref)|): pass <= 1 */
static double lse_excess(float x, double ref) {
    const double y = (float)ref;
    return fabs((double)x - y) / fmax(GATE_LSE_ATOL, GATE_LSE_RTOL * fabs(y));
}
/* r rounded to bf16 in one rounding (nearest even; out's values are normal or zero) */
static double round_bf16(double r) {
    if (!isfinite(r) || r == 0) return r;
    int e;
    const double m = frexp(r, &e);
    return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

/* got (heads of out, lse, max) against ref, by the gates' rule: empty rows (reference lse +inf) must be out 0, lse
 * +inf, max -inf; every other head's lse and max_logits within abs 1e-6 or rel 8.01/65536 of the reference rounded to
 * f32 (FlashMLA's decode lse tolerance; max_logits' error is the same dot's); out, against the reference rounded to
 * bf16: cosine difference within 5e-6, no element past both abs 1e-3 and rel 2.01/128 (FlashMLA's rule); no NaN or
 * inf; not all zero. (1294f26 allowed abs + rel for lse and max_logits, looser than the gates' max of the two, and
 * compared out with the unrounded reference, which differs from the gates' by up to half a bf16 ulp either way.) */
static verdict judge(const run_out *o, const double *ro, const double *rl, const double *rm) {
    verdict v;
    memset(&v, 0, sizeof v);
    double sxx = 0, srr = 0, sxr = 0;
    for (int64_t h = 0; h < o->heads; h++) { /* every head, for the figures; why keeps the first failure */
        if (isinf(rl[h])) { /* an empty row: out 0, lse +inf, max -inf */
            v.empty_rows++;
            if (!v.why[0] && (!(isinf(o->lse[h]) && o->lse[h] > 0) || !(isinf(o->max[h]) && o->max[h] < 0)))
                snprintf(v.why, sizeof v.why, "empty head %lld: lse %g, max_logits %g (want +inf, -inf)", (long long)h,
                         o->lse[h], o->max[h]);
            for (int d = 0; d < KP_MLA_D_V && !v.why[0]; d++)
                if (o->out[h * KP_MLA_D_V + d] != 0)
                    snprintf(v.why, sizeof v.why, "empty head %lld: out[%d] bits 0x%04x, want 0", (long long)h, d,
                             o->out[h * KP_MLA_D_V + d]);
            continue;
        }
        const double el = lse_excess(o->lse[h], rl[h]), em = lse_excess(o->max[h], rm[h]);
        if (!v.why[0] && (!(el <= 1.0) || !(em <= 1.0)))
            snprintf(v.why, sizeof v.why, "head %lld: lse %.9g against %.9g, max_logits %.9g against %.9g", (long long)h,
                     o->lse[h], rl[h], o->max[h], rm[h]);
        v.worst_lse = fmax(v.worst_lse, el), v.worst_max = fmax(v.worst_max, em);
        for (int d = 0; d < KP_MLA_D_V; d++) {
            const double x = bf16f(o->out[h * KP_MLA_D_V + d]), r = round_bf16(ro[h * KP_MLA_D_V + d]), diff = fabs(x - r);
            if (!isfinite(x) && !v.why[0])
                snprintf(v.why, sizeof v.why, "head %lld out[%d] is %g", (long long)h, d, x);
            sxx += x * x, srr += r * r, sxr += x * r, v.elements++, v.nonzero += x != 0;
            v.over_both += diff > 1e-3 && diff > 2.01 / 128 * fabs(r);
            v.worst_abs = fmax(v.worst_abs, diff);
        }
    }
    v.cos_diff = v.elements ? 1.0 - 2.0 * sxr / (sxx + srr) : 0.0;
    if (!v.why[0] && v.elements && !(v.cos_diff <= 5e-6))
        snprintf(v.why, sizeof v.why, "out's cosine difference %.3g above 5e-6", v.cos_diff);
    if (!v.why[0] && v.over_both)
        snprintf(v.why, sizeof v.why, "%lld of %lld out elements past both abs 1e-3 and rel 2.01/128", (long long)v.over_both,
                 (long long)v.elements);
    if (!v.why[0] && v.elements && !v.nonzero) snprintf(v.why, sizeof v.why, "every out element is zero");
    return v;
}

/* The distance between two impls' outputs: the largest |difference| of out (as values) and lse, and the count of out
 * elements whose bits differ. */
typedef struct distance {
    double out_abs, lse_abs, max_abs;
    int64_t out_bits;
} distance;

static distance distance_of(const run_out *a, const run_out *b) {
    distance d = {0, 0, 0, 0};
    for (int64_t i = 0; i < a->heads * KP_MLA_D_V; i++) {
        d.out_bits += a->out[i] != b->out[i];
        const double x = fabs((double)bf16f(a->out[i]) - bf16f(b->out[i]));
        if (x > d.out_abs) d.out_abs = x;
    }
    for (int64_t h = 0; h < a->heads; h++) {
        if (isfinite(a->lse[h]) && isfinite(b->lse[h])) d.lse_abs = fmax(d.lse_abs, fabs(a->lse[h] - b->lse[h]));
        if (isfinite(a->max[h]) && isfinite(b->max[h])) d.max_abs = fmax(d.max_abs, fabs(a->max[h] - b->max[h]));
    }
    return d;
}

/* Whether request ra of run a and request rb of run b (counted from each run's first request) have the same bits in
 * out, lse and max_logits. */
static bool same_request(const gen *g, const run_out *a, int64_t ra, const run_out *b, int64_t rb) {
    const int64_t per = g->mc.s_q * g->mc.h_q;
    return !memcmp(a->out + ra * per * KP_MLA_D_V, b->out + rb * per * KP_MLA_D_V, sizeof(uint16_t) * (size_t)(per * KP_MLA_D_V)) &&
           !memcmp(a->lse + ra * per, b->lse + rb * per, sizeof(float) * (size_t)per) &&
           !memcmp(a->max + ra * per, b->max + rb * per, sizeof(float) * (size_t)per);
}
static bool same_run(const run_out *a, const run_out *b) {
    return a->heads == b->heads && !memcmp(a->out, b->out, sizeof(uint16_t) * (size_t)(a->heads * KP_MLA_D_V)) &&
           !memcmp(a->lse, b->lse, sizeof(float) * (size_t)a->heads) && !memcmp(a->max, b->max, sizeof(float) * (size_t)a->heads) &&
           !memcmp(a->splits, b->splits, sizeof(int32_t) * (size_t)a->n);
}

/* The reference on the case's cache (and, with kv, on the values before quantization). */
typedef struct ref {
    double *out, *lse, *max;
    double *kv_out, *kv_lse, *kv_max;
} ref;

static ref reference(const gen *g) {
    const int64_t heads = g->s.rows * g->mc.h_q;
    ref r = {alloc_or_die(sizeof(double) * (size_t)(heads * KP_MLA_D_V)), alloc_or_die(sizeof(double) * (size_t)heads),
             alloc_or_die(sizeof(double) * (size_t)heads), NULL, NULL, NULL};
    if (g->b.kv)
        r.kv_out = alloc_or_die(sizeof(double) * (size_t)(heads * KP_MLA_D_V)), r.kv_lse = alloc_or_die(sizeof(double) * (size_t)heads),
        r.kv_max = alloc_or_die(sizeof(double) * (size_t)heads);
    const kp_mla_ref_in in = {.mc = &g->mc, .first = 0, .rows = g->s.rows, .q = g->b.q, .indices = g->b.indices,
                              .topk_length = g->b.topk_length, .page_table = g->b.page_table, .cache = g->b.cache,
                              .kv = g->b.kv, .sink = g->sink};
    const kp_mla_ref_out out = {.cache = {r.out, r.lse, r.max}, .kv = {r.kv_out, r.kv_lse, r.kv_max}};
    kp_error err = {0};
    cr_assert_eq(kp_mla_reference(&in, &out, &err), 0, "reference: %s", err.msg);
    return r;
}
static void free_ref(ref *r) { free(r->out), free(r->lse), free(r->max), free(r->kv_out), free(r->kv_lse), free(r->kv_max); }

/* ---- 1. the judge's positive controls ---- */

Test(gpu_mla, judge_catches_planted_errors) {
    enum { HEADS = 2 };
    uint16_t out[HEADS * KP_MLA_D_V];
    float lse[HEADS] = {1.5f, INFINITY}, mx[HEADS] = {0.7f, -INFINITY};
    double ro[HEADS * KP_MLA_D_V], rl[HEADS] = {1.5, INFINITY}, rm[HEADS] = {0.7, -INFINITY};
    for (int d = 0; d < KP_MLA_D_V; d++) {
        const float v = 0.01f * (float)((d % 17) - 8);
        out[d] = kp_bf16_bits(v), ro[d] = bf16f(out[d]);
        out[KP_MLA_D_V + d] = 0, ro[KP_MLA_D_V + d] = 0;
    }
    run_out o = {1, HEADS, out, lse, mx, NULL};
    verdict v = judge(&o, ro, rl, rm);
    cr_assert_eq(v.why[0], 0, "an exact answer judged wrong: %s", v.why);
    cr_assert_eq(v.empty_rows, 1);
    out[5] = kp_bf16_bits(bf16f(out[5]) + 0.01f); /* past abs 1e-3 and rel 2.01/128 */
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "a planted out error of 0.01 passed");
    out[5] = kp_bf16_bits((float)ro[5]);
    lse[0] = 1.5f + 4e-4f; /* past 1e-6 + 8.01/65536 * 1.5 = 1.84e-4 */
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "a planted lse error passed");
    lse[0] = 1.5f, mx[0] = 0.7f + 2e-4f;
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "a planted max_logits error passed");
    /* errors inside 1294f26's abs + rel but past the gates' max(abs, rel): 1.3e-6 at 0.005 (allowed 1e-6, was 1.6e-6) */
    mx[0] = 0.7f, rl[0] = 0.005, lse[0] = (float)(0.005 + 1.3e-6);
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "an lse error past the gates' bound passed");
    rl[0] = 1.5, lse[0] = 1.5f, rm[0] = 0.005, mx[0] = (float)(0.005 - 1.3e-6);
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "a max_logits error past the gates' bound passed");
    rm[0] = 0.7, mx[0] = 0.7f;
    cr_assert_eq(judge(&o, ro, rl, rm).why[0], 0, "restored answer judged wrong");
    mx[0] = 0.7f, out[KP_MLA_D_V + 3] = 0x8000; /* -0 in an empty row */
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "an empty row's nonzero bits passed");
    out[KP_MLA_D_V + 3] = 0, lse[1] = 0.0f;
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "an empty row's finite lse passed");
    lse[1] = INFINITY, out[9] = 0x7fc0;
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "a NaN passed");
    memset(out, 0, sizeof out);
    cr_assert_neq(judge(&o, ro, rl, rm).why[0], 0, "all zeros passed");
}

/* ---- 2. both against the reference, and the host ports ---- */

/* Caches whose bf16(scale) is exact (pow2, bf16) are asserted; raw f32 scales only reported: rounding a raw scale to
 * bf16 is the production kernel's own error against the f32-scale reference (families.md §D2). The cases: every index
 * profile, topk_length, the sink on and +-inf, h_q 64 and 128, s_q 1 and 2, topk from 128 to 2048 (1 to 32 blocks:
 * split_size's one split at <= KP_MLA_SPLIT_BLOCKS blocks and several past it; split_count from 1 to 16 splits). */
Test(gpu_mla, both_within_flashmla_tolerances_of_the_reference, .timeout = 1200) {
    static const struct {
        const char *name;
        bool asserted;
    } cases[] = {
        {"mla(batch=3,cache=bf16,h_q=64,profile=mixed,s_kv=700,s_q=2,seed=5,topk=256)", true},
        {"mla(batch=2,h_q=64,profile=holes,s_kv=600,scale=pow2,seed=6,topk=128,topk_length=on)", true},
        {"mla(batch=2,h_q=128,profile=dup,s_kv=2100,scale=pow2,seed=11,sink=on,topk=2048)", true},
        {"mla(batch=4,h_q=128,profile=short,s_kv=1000,s_q=2,scale=pow2,seed=12,sink=inf,topk=512,topk_length=on)", true},
        {"mla(batch=3,h_q=64,profile=invalid,s_kv=300,scale=pow2,seed=13,topk=128)", true},
        {"mla(batch=5,h_q=128,profile=mixed,s_kv=1500,scale=pow2,seed=14,sink=on,topk=1024,topk_length=on)", true},
        {"mla(batch=2,cache=bf16,h_q=128,profile=uniform,s_kv=1100,seed=16,sink=inf,topk=1024)", true},
        {"mla(batch=2,h_q=128,profile=uniform,s_kv=1200,scale=raw,seed=15,topk=1024)", false},
    };
    gpu gp = gpu_open();
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const char *name = cases[c].name;
        gen g = make(name, !cases[c].asserted);
        upload_gen(&g);
        ref rf = reference(&g);
        for (int i = 0; i < IMPLS; i++) {
            const kp_impl *impl = impl_named(impl_names[i]);
            run_out o = gpu_run(&gp, impl, &g, 0, g.mc.batch, NULL);
            const verdict v = judge(&o, rf.out, rf.lse, rf.max);
            run_out h = host_run(impl_named(host_names[i]), &g, 0, g.mc.batch);
            const distance d = distance_of(&o, &h);
            fprintf(stderr,
                    "%s %s: cos diff %.3g, worst abs %.3g, %lld/%lld out past both bounds, worst lse %.3g and max_logits "
                    "%.3g of their tolerance, %lld empty heads; against %s: out max |diff| %.3g (%lld elements' bits "
                    "differ), lse %.3g, max_logits %.3g; splits[0] %d%s\n",
                    impl->name, name, v.cos_diff, v.worst_abs, (long long)v.over_both, (long long)v.elements, v.worst_lse,
                    v.worst_max, (long long)v.empty_rows, host_names[i], d.out_abs, (long long)d.out_bits, d.lse_abs,
                    d.max_abs, o.splits[0], cases[c].asserted ? "" : " (raw scales: reported, not asserted)");
            if (rf.kv_out) {
                const verdict kv = judge(&o, rf.kv_out, rf.kv_lse, rf.kv_max);
                fprintf(stderr, "%s %s: against the values before quantization: cos diff %.3g, worst abs %.3g\n", impl->name,
                        name, kv.cos_diff, kv.worst_abs);
            }
            if (cases[c].asserted) cr_assert_eq(v.why[0], 0, "%s on %s: %s", impl->name, name, v.why);
            else
                cr_assert(v.cos_diff < 1e-3, "%s on %s (raw): cosine difference %g, far past a rounding error", impl->name,
                          name, v.cos_diff);
            /* the same plan as the host port */
            for (int64_t b = 0; b < g.mc.batch; b++)
                cr_assert_eq(o.splits[b], h.splits[b], "%s on %s: splits[%lld] %d, the host port's %d", impl->name, name,
                             (long long)b, o.splits[b], h.splits[b]);
            free_out(&o), free_out(&h);
        }
        free_ref(&rf);
        drop(&g);
    }
}

/* ---- 3. batches: the candidate's bits never move, the incumbent's do ---- */

/* DeepSeek-V3.2's decode shape (h_q 128, s_q 1, topk 2048 = 32 blocks): split_count on 132 SMs cuts request 0 into 32
 * splits alone, 16 at batch 2, 2 or 3 at 33 and 1 at 64 (families.md §D4); split_size always into 4. */
#define BIG "mla(batch=64,h_q=128,profile=uniform,s_kv=2048,scale=pow2,seed=21,topk=2048)"

Test(gpu_mla, split_size_bits_do_not_depend_on_the_batch, .timeout = 900) {
    gpu gp = gpu_open();
    for (int ci = 0; ci < CANDIDATES; ci++) {
        const kp_impl *impl = impl_named(impl_names[1 + ci]);
        {
            gen g = make(BIG, false);
            upload_gen(&g);
            run_out full = gpu_run(&gp, impl, &g, 0, 64, NULL), b33 = gpu_run(&gp, impl, &g, 0, 33, NULL),
                    b2 = gpu_run(&gp, impl, &g, 0, 2, NULL);
            int64_t nonzero = 0;
            for (int64_t i = 0; i < full.heads * KP_MLA_D_V; i++) nonzero += full.out[i] != 0;
            cr_assert_gt(nonzero, full.heads * KP_MLA_D_V / 2, "mostly zero outputs: the probe would be vacuous");
            for (int64_t b = 0; b < 64; b++)
                cr_assert_eq(full.splits[b], kp_mla_split_size_splits(32), "splits[%lld] = %d", (long long)b, full.splits[b]);
            for (int64_t r = 0; r < 33; r++)
                cr_assert(same_request(&g, &full, r, &b33, r), "batches 33 and 64 disagree on request %lld", (long long)r);
            for (int64_t r = 0; r < 2; r++)
                cr_assert(same_request(&g, &full, r, &b2, r), "batches 2 and 64 disagree on request %lld", (long long)r);
            static const int64_t probes[] = {0, 1, 32, 63};
            for (size_t p = 0; p < sizeof probes / sizeof *probes; p++) {
                run_out one = gpu_run(&gp, impl, &g, probes[p], 1, NULL);
                cr_assert(same_request(&g, &full, probes[p], &one, 0), "request %lld alone differs from the batch of 64's",
                          (long long)probes[p]);
                free_out(&one);
            }
            /* the comparison itself catches one flipped low bit */
            run_out one = gpu_run(&gp, impl, &g, 9, 1, NULL);
            cr_assert(same_request(&g, &full, 9, &one, 0));
            one.out[KP_MLA_D_V * 100 + 7] ^= 1;
            cr_assert(!same_request(&g, &full, 9, &one, 0), "a flipped low bit went unseen");
            free_out(&one), free_out(&full), free_out(&b33), free_out(&b2);
            drop(&g);
        }
        { /* rows of different lengths, s_q 2, h_q 64, the sink: alone against 33 */
            gen g = make("mla(batch=33,h_q=64,profile=mixed,s_kv=1100,s_q=2,scale=pow2,seed=22,sink=on,topk=1024,topk_length=on)", false);
            upload_gen(&g);
            run_out full = gpu_run(&gp, impl, &g, 0, 33, NULL);
            static const int64_t probes[] = {0, 5, 17, 32};
            for (size_t p = 0; p < sizeof probes / sizeof *probes; p++) {
                run_out one = gpu_run(&gp, impl, &g, probes[p], 1, NULL);
                cr_assert(same_request(&g, &full, probes[p], &one, 0), "mixed: request %lld alone differs from the batch of 33's",
                          (long long)probes[p]);
                cr_assert_eq(one.splits[0], full.splits[probes[p]]);
                free_out(&one);
            }
            free_out(&full);
            drop(&g);
        }
    }
}

Test(gpu_mla, split_count_splits_and_bits_depend_on_the_batch, .timeout = 900) {
    gpu gp = gpu_open();
    const kp_impl *impl = impl_named("mla.split_count@cuda");
    gen g = make(BIG, false);
    upload_gen(&g);
    run_out alone = gpu_run(&gp, impl, &g, 0, 1, NULL), b2 = gpu_run(&gp, impl, &g, 0, 2, NULL),
            b33 = gpu_run(&gp, impl, &g, 0, 33, NULL), full = gpu_run(&gp, impl, &g, 0, 64, NULL);
    cr_assert_eq(alone.splits[0], 32);
    cr_assert(b2.splits[0] == 16 && b2.splits[1] == 16, "batch 2: %d and %d splits", b2.splits[0], b2.splits[1]);
    for (int64_t b = 0; b < 64; b++) cr_assert_eq(full.splits[b], 1, "batch 64: splits[%lld] = %d", (long long)b, full.splits[b]);
    /* batch 33 against the plan on the host */
    int64_t blocks[33], want[33];
    for (int b = 0; b < 33; b++) blocks[b] = 32;
    cr_assert_geq(kp_mla_split_count_plan(blocks, 33, kp_mla_sm_parts(SMS, 1, 128), want, NULL, 0), 0);
    for (int b = 0; b < 33; b++)
        cr_assert_eq(b33.splits[b], want[b], "batch 33: splits[%d] %d, the plan's %lld", b, b33.splits[b], (long long)want[b]);
    cr_assert(!same_request(&g, &full, 0, &alone, 0), "split_count gave request 0 the same bits with 32 and 1 splits: the control is vacuous");
    cr_assert(!same_request(&g, &full, 0, &b2, 0) || !same_request(&g, &b33, 0, &b2, 0), "16, 2-3 and 1 splits gave the same bits");
    const distance d = distance_of(&(run_out){1, alone.heads, full.out, full.lse, full.max, NULL}, &alone);
    fprintf(stderr, "split_count: request 0 alone (32 splits) against in 64 (1 split): %lld of %lld out elements' bits differ, "
                    "max |diff| %.3g, lse %.3g\n",
            (long long)d.out_bits, (long long)(alone.heads * KP_MLA_D_V), d.out_abs, d.lse_abs);
    free_out(&alone), free_out(&b2), free_out(&b33), free_out(&full);
    drop(&g);
}

Test(gpu_mla, both_repeat_bit_for_bit, .timeout = 900) {
    gpu gp = gpu_open();
    static const char *const names[] = {BIG, "mla(batch=6,h_q=128,profile=mixed,s_kv=1500,s_q=2,scale=pow2,seed=23,sink=on,"
                                              "topk=1024,topk_length=on)"};
    for (size_t c = 0; c < 2; c++) {
        gen g = make(names[c], false);
        upload_gen(&g);
        for (int i = 0; i < IMPLS; i++) {
            const kp_impl *impl = impl_named(impl_names[i]);
            run_out a = gpu_run(&gp, impl, &g, 0, g.mc.batch, NULL);
            for (int k = 0; k < 2; k++) {
                run_out b = gpu_run(&gp, impl, &g, 0, g.mc.batch, NULL);
                cr_assert(same_run(&a, &b), "%s on %s: run %d changed bits", impl->name, names[c], k + 2);
                free_out(&b);
            }
            free_out(&a);
        }
        drop(&g);
    }
}

/* split_size_wg runs items 2 p and 2 p + 1 of the plan as a cluster of two CTAs: a request of two splits that starts
 * at an even item combines through their shared memory, one at an odd item through the workspace, as every request of
 * more splits does. Rows of one and two splits mixed put requests of two splits at odd items in the batch, and each is
 * at item 0 alone: both ways must give the same bits (compute-sanitizer runs this too). */
Test(gpu_mla, split_pairs_combine_as_the_workspace_does) {
    gpu gp = gpu_open();
    const kp_impl *impl = impl_named("mla.split_size_wg@cuda");
    gen g = make("mla(batch=8,h_q=128,profile=mixed,s_kv=2100,scale=pow2,seed=26,topk=2048,topk_length=on)", false);
    upload_gen(&g);
    run_out full = gpu_run(&gp, impl, &g, 0, 8, NULL);
    int64_t item = 0, at_odd = 0, at_even = 0;
    for (int64_t b = 0; b < 8; item += full.splits[b], b++) {
        if (full.splits[b] != 2) continue;
        if (item & 1)
            at_odd++;
        else
            at_even++;
        run_out one = gpu_run(&gp, impl, &g, b, 1, NULL);
        cr_assert_eq(one.splits[0], 2);
        cr_assert(same_request(&g, &full, b, &one, 0), "request %lld (two splits from item %lld in the batch, 0 alone): the bits differ",
                  (long long)b, (long long)item);
        one.out[KP_MLA_D_V * 64 + 3] ^= 1; /* head 64 (the second head group's first): one bit is seen */
        cr_assert(!same_request(&g, &full, b, &one, 0), "request %lld: a flipped low bit went unseen", (long long)b);
        free_out(&one);
    }
    cr_assert(at_odd > 0 && at_even > 0, "requests of two splits at odd items %lld, at even %lld: a way went untested",
              (long long)at_odd, (long long)at_even);
    free_out(&full);
    drop(&g);
}

/* Once one split a CTA would take more CTAs than the device has SMs, split_size_wg runs each (request, query row, head
 * group) in one CTA, the request's splits one after another, the clusters then a request's two head groups, each
 * dequantizing half of every tile into both (sm_count 1 forces that way at any batch). The splits and the combine are
 * the same arithmetic either way: the tolerance test's h_q 128 profiles (dup with a sink, short at s_q 2 with
 * infinite sinks, mixed with topk_length, a bf16 cache at two splits), rows of one and two splits mixed, and rows of
 * up to 4 splits (topk 4096, holes, s_q 2) must give the bits of one split a CTA (compute-sanitizer runs this too). */
Test(gpu_mla, whole_runs_give_the_bits_of_split_runs, .timeout = 900) {
    gpu gp = gpu_open();
    const kp_impl *impl = impl_named("mla.split_size_wg@cuda");
    static const char *const names[] = {
        "mla(batch=2,h_q=128,profile=dup,s_kv=2100,scale=pow2,seed=11,sink=on,topk=2048)",
        "mla(batch=4,h_q=128,profile=short,s_kv=1000,s_q=2,scale=pow2,seed=12,sink=inf,topk=512,topk_length=on)",
        "mla(batch=5,h_q=128,profile=mixed,s_kv=1500,scale=pow2,seed=14,sink=on,topk=1024,topk_length=on)",
        "mla(batch=2,cache=bf16,h_q=128,profile=uniform,s_kv=2100,seed=16,sink=inf,topk=2048)",
        "mla(batch=8,h_q=128,profile=mixed,s_kv=2100,scale=pow2,seed=26,topk=2048,topk_length=on)",
        "mla(batch=3,h_q=128,profile=holes,s_kv=5000,s_q=2,scale=pow2,seed=27,topk=4096,topk_length=on)",
    };
    int64_t several = 0, most = 0;
    for (size_t c = 0; c < sizeof names / sizeof *names; c++) {
        gen g = make(names[c], false);
        upload_gen(&g);
        run_out split = gpu_run(&gp, impl, &g, 0, g.mc.batch, NULL);
        run_sms = 1;
        run_out whole = gpu_run(&gp, impl, &g, 0, g.mc.batch, NULL);
        run_sms = SMS;
        for (int64_t b = 0; b < g.mc.batch; b++) {
            several += split.splits[b] > 1;
            most = split.splits[b] > most ? split.splits[b] : most;
        }
        cr_assert(same_run(&split, &whole), "%s: a CTA running all of a request's splits changed bits", names[c]);
        whole.out[KP_MLA_D_V * (whole.heads - 1) + 5] ^= 1; /* the last head's: one bit is seen */
        cr_assert(!same_run(&split, &whole), "%s: a flipped low bit went unseen", names[c]);
        free_out(&split), free_out(&whole);
        drop(&g);
    }
    cr_assert(several > 0 && most >= 4, "requests of several splits %lld, at most %lld splits: the runs went untested",
              (long long)several, (long long)most);
}

/* ---- 4. indices outside [0, slots) ---- */

/* The host port refuses them; the kernels cannot without a sync, so such a slot does not count and is never read
 * (compute-sanitizer memcheck runs this): the bits equal those with -1 in its place, and differ from the case's. */
Test(gpu_mla, out_of_range_indices_do_not_count_and_are_never_read) {
    gpu gp = gpu_open();
    gen g = make("mla(batch=2,h_q=64,profile=uniform,s_kv=300,scale=pow2,seed=24,topk=256)", false);
    upload_gen(&g);
    const size_t count = (size_t)(g.s.rows * g.mc.topk);
    int32_t *bad = alloc_or_die(sizeof(int32_t) * count), *minus = alloc_or_die(sizeof(int32_t) * count);
    memcpy(bad, g.slots, sizeof(int32_t) * count), memcpy(minus, g.slots, sizeof(int32_t) * count);
    const int64_t at[] = {3, 70, 130, 200, 256 + 64};
    const int32_t planted[] = {(int32_t)g.cache_slots, -2, INT32_MAX, INT32_MIN, (int32_t)g.cache_slots + 1000};
    for (int k = 0; k < 5; k++) {
        cr_assert_neq(g.slots[at[k]], -1, "slot %lld must count in the case for the probe to move anything", (long long)at[k]);
        bad[at[k]] = planted[k], minus[at[k]] = -1;
    }
    int32_t *d_bad = upload(bad, sizeof(int32_t) * count), *d_minus = upload(minus, sizeof(int32_t) * count);
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        run_out o = gpu_run(&gp, impl, &g, 0, 2, d_bad), m = gpu_run(&gp, impl, &g, 0, 2, d_minus), c = gpu_run(&gp, impl, &g, 0, 2, NULL);
        cr_assert(same_run(&o, &m), "%s: out-of-range indices did not act as -1", impl->name);
        cr_assert(!same_run(&o, &c), "%s: dropping 5 counted slots moved nothing: the probe is vacuous", impl->name);
        free_out(&o), free_out(&m), free_out(&c);
    }
    CUDA_OK(cudaFree(d_bad));
    CUDA_OK(cudaFree(d_minus));
    free(bad), free(minus);
    drop(&g);
}

/* A tile scale whose bf16 times the kernel's power of two would overflow sends its block down the exact f32
 * dequantization path: bf16(scale) >= 2^16 in mla_attn.cuh (times 2^112), >= 2^8 in mla_wg.cuh (times 2^120). Planted on
 * counted tokens, every impl must still match the reference (a fast path with an infinite multiplier would not), and
 * scales at and just below each threshold (2^15, 2^8, 2^7) must too. */
Test(gpu_mla, large_tile_scales_take_the_exact_path) {
    gpu gp = gpu_open();
    gen g = make("mla(batch=2,h_q=64,profile=uniform,s_kv=200,scale=pow2,seed=25,topk=128)", false);
    static const struct { int slot, tile; float scale; } planted[] = { /* exact in bf16; slots 0.. row 0, 128.. row 1 */
        {0, 1, 1048576.0f}, {128 + 70, 2, 32768.0f}, {5, 3, 256.0f}, {128 + 9, 0, 128.0f}};
    uint8_t *cache = g.b.cache;
    for (size_t i = 0; i < sizeof planted / sizeof planted[0]; i++)
        memcpy(cache + (int64_t)g.slots[planted[i].slot] * KP_MLA_FP8_TOKEN_BYTES + KP_MLA_FP8_SCALES_AT + 4 * planted[i].tile,
               &planted[i].scale, 4);
    upload_gen(&g);
    ref rf = reference(&g);
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        run_out o = gpu_run(&gp, impl, &g, 0, 2, NULL);
        const verdict v = judge(&o, rf.out, rf.lse, rf.max);
        fprintf(stderr, "%s with tile scales 2^20, 2^15, 2^8 and 2^7: cos diff %.3g, worst lse %.3g of its tolerance, worst |out - ref| %.4g\n",
                impl->name, v.cos_diff, v.worst_lse, v.worst_abs);
        cr_assert_eq(v.why[0], 0, "%s: %s", impl->name, v.why);
        free_out(&o);
    }
    free_ref(&rf);
    drop(&g);
}

/* ---- 5. refusals ---- */

Test(gpu_mla, bad_args_are_refused_with_a_message) {
    gpu gp = gpu_open();
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        cr_assert_str_eq(impl->family, "mla");
        cr_assert_eq(impl->memory, KP_MEMORY_CUDA);
        const kp_mla_args good = {.batch = 2, .s_q = 1, .h_q = 128, .topk = 2048, .slots = 5000,
                                  .cache_format = KP_MLA_CACHE_FP8_DS_MLA, .sm_scale = 0.135234f, .sm_count = gp.sm_count,
                                  .stream = gp.stream};
        char msg[256] = "";
        cr_assert_eq(impl->supports(&good, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
        cr_assert_gt(impl->workspace_bytes(&good), 0);
        enum { BAD = 10 };
        kp_mla_args bad[BAD];
        const char *field[BAD] = {"h_q", "h_q", "topk", "topk", "topk", "batch", "cache_format", "sm_scale", "sm_scale", "aligned"};
        for (int k = 0; k < BAD; k++) bad[k] = good;
        bad[0].h_q = 48;
        bad[1].h_q = 0;
        bad[2].topk = 100; /* not a multiple of 64 */
        bad[3].topk = 0;
        bad[4].topk = 16384 + 64; /* past the combine's staging */
        bad[5].batch = 0;
        bad[6].cache_format = 7;
        bad[7].sm_scale = 0.0f;
        bad[8].sm_scale = INFINITY;
        bad[9].q = (const uint16_t *)(uintptr_t)8; /* misaligned for cp.async */
        for (int k = 0; k < BAD; k++) {
            msg[0] = 0;
            cr_assert_eq(impl->supports(&bad[k], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s accepted bad args %d", impl->name, k);
            cr_assert(strstr(msg, impl->name) && strstr(msg, field[k]), "%s: refusal %d's message '%s' names neither the impl nor %s",
                      impl->name, k, msg, field[k]);
            cr_assert_eq(impl->workspace_bytes(&bad[k]), 0);
            msg[0] = 0;
            cr_assert_eq(impl->run(&bad[k], msg, sizeof msg), KP_RUN_NOT_SUPPORTED, "%s ran bad args %d", impl->name, k);
            cr_assert_gt(strlen(msg), strlen(impl->name), "%s: run gave no reason for bad args %d", impl->name, k);
        }
        msg[0] = 0; /* a valid call without its workspace fails with a reason, touching nothing */
        cr_assert_eq(impl->run(&good, msg, sizeof msg), KP_RUN_FAILED, "%s ran without a workspace", impl->name);
        cr_assert(strstr(msg, "workspace"), "%s: '%s'", impl->name, msg);
        kp_mla_args small = good;
        small.workspace = (void *)(uintptr_t)256, small.workspace_bytes = impl->workspace_bytes(&good) - 1;
        msg[0] = 0;
        cr_assert_eq(impl->run(&small, msg, sizeof msg), KP_RUN_FAILED, "%s ran on a workspace one byte short", impl->name);
        cr_assert(strstr(msg, "workspace"), "%s: '%s'", impl->name, msg);
    }
}

/* ---- 6. timing (printed, not asserted) ---- */

/* DeepSeek-V3.2 decode on fp8_ds_mla: h_q 128, s_q 1, topk 2048; FLOPs 2 batch h_q topk (576 + 512). The mean of 20
 * calls after 3 warm-ups, timed with events around the calls on one stream (each call is the plan kernel and the
 * attention kernel). The candidate's first 64 requests of 128 are also checked against the batch of 64. */
Test(gpu_mla, timing_at_deepseek_v32_decode, .timeout = 900) {
    gpu gp = gpu_open();
    gen g = make("mla(batch=128,h_q=128,profile=uniform,s_kv=2048,scale=pow2,seed=31,topk=2048)", false);
    upload_gen(&g);
    static const int64_t batches[] = {1, 64, 128};
    run_out last[IMPLS][3];
    for (int i = 0; i < IMPLS; i++) {
        const kp_impl *impl = impl_named(impl_names[i]);
        for (int k = 0; k < 3; k++) {
            const int64_t n = batches[k];
            last[i][k] = gpu_run(&gp, impl, &g, 0, n, NULL);
            kp_mla_args a = args_of(&g, n);
            a.q = g.d_q, a.cache = g.d_cache, a.indices = g.d_slots, a.sm_count = gp.sm_count, a.stream = gp.stream;
            CUDA_OK(cudaMalloc((void **)&a.out, sizeof(uint16_t) * (size_t)(n * 128 * KP_MLA_D_V)));
            CUDA_OK(cudaMalloc((void **)&a.lse, sizeof(float) * (size_t)(n * 128)));
            CUDA_OK(cudaMalloc((void **)&a.max_logits, sizeof(float) * (size_t)(n * 128)));
            CUDA_OK(cudaMalloc((void **)&a.splits, sizeof(int32_t) * (size_t)n));
            a.workspace_bytes = impl->workspace_bytes(&a);
            CUDA_OK(cudaMalloc(&a.workspace, a.workspace_bytes));
            char msg[256] = "";
            for (int w = 0; w < 3; w++) cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s", msg);
            cudaEvent_t e0, e1;
            CUDA_OK(cudaEventCreate(&e0));
            CUDA_OK(cudaEventCreate(&e1));
            enum { REPS = 20 };
            CUDA_OK(cudaEventRecord(e0, gp.stream));
            for (int rep = 0; rep < REPS; rep++) cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s", msg);
            CUDA_OK(cudaEventRecord(e1, gp.stream));
            CUDA_OK(cudaEventSynchronize(e1));
            float ms = 0;
            CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1e3 * ms / REPS, flops = 2.0 * (double)n * 128 * 2048 * (576 + 512);
            int32_t splits0 = 0;
            CUDA_OK(cudaMemcpy(&splits0, a.splits, sizeof splits0, cudaMemcpyDeviceToHost));
            fprintf(stderr, "timing %s batch %3lld: %8.1f us, %6.1f TFLOP/s (splits[0] %d, %d SMs)\n", impl->name, (long long)n,
                    us, flops / (us * 1e-6) / 1e12, splits0, gp.sm_count);
            CUDA_OK(cudaEventDestroy(e0));
            CUDA_OK(cudaEventDestroy(e1));
            void *p[5] = {a.out, a.lse, a.max_logits, a.splits, a.workspace};
            for (int f = 0; f < 5; f++) CUDA_OK(cudaFree(p[f]));
        }
    }
    for (int i = 1; i < IMPLS; i++)
        cr_assert(!memcmp(last[i][1].out, last[i][2].out, sizeof(uint16_t) * (size_t)(64 * 128 * KP_MLA_D_V)) &&
                      same_request(&g, &last[i][2], 0, &last[i][0], 0),
                  "%s: requests differ between batches 1, 64 and 128", impl_names[i]);
    for (int i = 0; i < IMPLS; i++)
        for (int k = 0; k < 3; k++) free_out(&last[i][k]);
    drop(&g);
}

int main(int argc, char *argv[]) { return kpt_gpu_main(argc, argv, "test_gpu_mla_kernels", "mla.split_size@cuda"); }
