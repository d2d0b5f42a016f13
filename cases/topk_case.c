/* topk_case.c: topk fields, their canonical form, windows and the seeded generator for every profile.
 * Built with -ffp-contract=off and no libm transcendental, so inputs are bit-identical anywhere. */
#include "topk_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_rng.h"

static const char *const profile_names[KP_TOPK_PROFILE_COUNT] = {"randn", "narrow", "relu", "bf16",
                                                                 "same",  "bits",   "nan"};
static const char *const window_names[] = {"full", "prefill", "decode"};
static const char *const known_keys[] = {"rows", "width", "k", "seed", "profile", "stride", "window",
                                         "next_n", "ctx", "base", "fill"};

static int pick(const kp_case *c, const char *key, const char *const *names, int n, const char *fallback, int *out,
                kp_error *err) {
    const char *v = kp_case_get(c, key);
    if (!v) v = fallback;
    if (!v) return kp_fail(err, KP_EXIT_USAGE, "case topk: field '%s' is required", key);
    char known[160] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, names[i])) return *out = i, 0;
        size_t l = strlen(known);
        snprintf(known + l, sizeof known - l, "%s%s", i ? ", " : "", names[i]);
    }
    return kp_fail(err, KP_EXIT_USAGE, "case topk: field '%s': '%s' is unknown (%s)", key, v, known);
}

int kp_topk_case_read(const kp_case *c, kp_topk_case *out, kp_error *err) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < c->nparams; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof known_keys / sizeof *known_keys; k++) known |= !strcmp(c->params[i].key, known_keys[k]);
        if (!known)
            return kp_fail(err, KP_EXIT_USAGE, "case topk: field '%s' is unknown (known: rows, width, k, seed, profile, "
                           "stride, window, next_n, ctx, base, fill)", c->params[i].key);
    }
    int rc, profile = 0, window = 0, base = 0, fill = 0;
    int64_t k;
    static const char *const bases[] = {"row", "window"}, *const fills[] = {"-1", "int32_max"};
    if ((rc = kp_case_int(c, "rows", 1, 65536, &out->rows, err)) || (rc = kp_case_int(c, "width", 1, 1 << 24, &out->width, err)) ||
        (rc = kp_case_int(c, "k", 1, 8192, &k, err)) || (rc = kp_case_uint(c, "seed", &out->seed, err)) ||
        (rc = pick(c, "profile", profile_names, KP_TOPK_PROFILE_COUNT, NULL, &profile, err)) ||
        (rc = pick(c, "window", window_names, 3, "full", &window, err)) || (rc = pick(c, "base", bases, 2, "row", &base, err)) ||
        (rc = pick(c, "fill", fills, 2, "-1", &fill, err)))
        return rc;
    out->k = (int32_t)k, out->profile = (kp_topk_profile)profile, out->window = (kp_topk_window)window;
    out->index_base = base, out->fill = fill ? INT32_MAX : -1;
    out->stride = out->width;
    if (kp_case_get(c, "stride") && (rc = kp_case_int(c, "stride", out->width, out->width + (1 << 20), &out->stride, err)))
        return rc;
    if (out->window != KP_TOPK_DECODE && (kp_case_get(c, "next_n") || kp_case_get(c, "ctx")))
        return kp_fail(err, KP_EXIT_USAGE, "case topk: fields 'next_n' and 'ctx' only apply to window=decode");
    if (out->window == KP_TOPK_PREFILL && out->width < 2)
        return kp_fail(err, KP_EXIT_USAGE, "case topk: field 'width': a prefill window starts past 0, so width >= 2");
    out->next_n = 1, out->ctx = out->width;
    if (out->window == KP_TOPK_DECODE) {
        if ((kp_case_get(c, "ctx") && (rc = kp_case_int(c, "ctx", 1, out->width, &out->ctx, err))) ||
            (kp_case_get(c, "next_n") && (rc = kp_case_int(c, "next_n", 1, out->ctx, &out->next_n, err))))
            return rc;
        if (out->next_n > out->ctx)
            return kp_fail(err, KP_EXIT_USAGE, "case topk: field 'next_n': %lld draft positions do not fit ctx %lld",
                           (long long)out->next_n, (long long)out->ctx);
    }
    return 0;
}

static int set_int(kp_case *c, const char *key, int64_t v, kp_error *err) {
    char text[32];
    snprintf(text, sizeof text, "%lld", (long long)v);
    return kp_case_set(c, key, text, err);
}

/* Validate fields, rewrite values canonically, drop fields equal to their defaults. */
static int normalize(kp_case *c, kp_error *err) {
    kp_topk_case tc;
    int rc = kp_topk_case_read(c, &tc, err);
    if (rc) return rc;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)tc.seed);
    if ((rc = set_int(c, "rows", tc.rows, err)) || (rc = set_int(c, "width", tc.width, err)) ||
        (rc = set_int(c, "k", tc.k, err)) || (rc = kp_case_set(c, "seed", seed, err)))
        return rc;
    if (tc.stride == tc.width) kp_case_unset(c, "stride");
    else if ((rc = set_int(c, "stride", tc.stride, err))) return rc;
    if (tc.window == KP_TOPK_FULL) kp_case_unset(c, "window");
    if (tc.index_base == 0) kp_case_unset(c, "base");
    if (tc.fill == -1) kp_case_unset(c, "fill");
    if (tc.window == KP_TOPK_DECODE) {
        if (tc.next_n == 1) kp_case_unset(c, "next_n");
        else if ((rc = set_int(c, "next_n", tc.next_n, err))) return rc;
        if (tc.ctx == tc.width) kp_case_unset(c, "ctx");
        else if ((rc = set_int(c, "ctx", tc.ctx, err))) return rc;
    }
    return 0;
}

/* Every field, defaults included. */
static int fill_defaults(kp_case *c, kp_error *err) {
    kp_topk_case tc;
    int rc = kp_topk_case_read(c, &tc, err);
    if (!rc) rc = set_int(c, "stride", tc.stride, err);
    if (!rc) rc = kp_case_set(c, "window", window_names[tc.window], err);
    if (!rc) rc = kp_case_set(c, "base", tc.index_base ? "window" : "row", err);
    if (!rc) rc = kp_case_set(c, "fill", tc.fill == -1 ? "-1" : "int32_max", err);
    if (!rc && tc.window == KP_TOPK_DECODE) {
        rc = set_int(c, "next_n", tc.next_n, err);
        if (!rc) rc = set_int(c, "ctx", tc.ctx, err);
    }
    return rc;
}

const kp_case_family kp_topk_case_family = {
    .name = "topk",
    .generator_version = KP_TOPK_GENERATOR_VERSION,
    .fields_help = "rows width k seed profile [stride window next_n ctx base fill]; profiles: randn narrow relu "
                   "bf16 same bits nan; window: full prefill decode; base: row window; fill: -1 int32_max",
    .normalize = normalize,
    .fill_defaults = fill_defaults,
};

/* ---- generation ---------------------------------------------------------------------------- */

static float bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float round_bf16(float v) { /* to nearest even, in integer arithmetic */
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b += 0x7fffu + ((b >> 16) & 1u);
    return bits_to_float(b & 0xffff0000u);
}

static void window_of(const kp_topk_case *tc, int64_t r, int32_t *start, int32_t *end) {
    const int64_t q = tc->width / 8 > 1 ? tc->width / 8 : 1;
    switch (tc->window) {
    case KP_TOPK_PREFILL: {
        int64_t ks = 1 + (131 * r) % q, ke = tc->width - (97 * r) % q;
        if (ke <= ks) ke = ks + 1 <= tc->width ? ks + 1 : tc->width;
        *start = (int32_t)ks, *end = (int32_t)ke;
        break;
    }
    case KP_TOPK_DECODE:
        *start = 0, *end = (int32_t)(tc->ctx - tc->next_n + r % tc->next_n + 1);
        break;
    default:
        *start = 0, *end = (int32_t)tc->width;
        break;
    }
}

static float score(const kp_topk_case *tc, const uint32_t *d) {
    const double t = (kp_unit(d[0]) + kp_unit(d[1]) + kp_unit(d[2]) + kp_unit(d[3]) - 2.0) * 3.4641016151377544;
    switch (tc->profile) {
    case KP_TOPK_NARROW: return (float)(1.0 + 0.245 * kp_unit(d[0]));
    case KP_TOPK_RELU: {
        const double p = (double)tc->k / (2.0 * (double)tc->width);
        return kp_unit(d[0]) < (p < 0.5 ? p : 0.5) ? (float)(kp_unit(d[1]) * 4.0 + 0x1p-10) : 0.0f;
    }
    case KP_TOPK_BF16: return round_bf16((float)t);
    case KP_TOPK_SAME: return 1.0f;
    case KP_TOPK_BITS:
        switch (d[0] % 8) {
        case 0: return 0.0f;
        case 1: return bits_to_float(0x80000000u);
        case 2: return bits_to_float((d[1] & 0x007fffffu) | 1u);
        case 3: return bits_to_float(0x80000000u | (d[1] & 0x007fffffu) | 1u);
        case 4: return INFINITY;
        case 5: return -INFINITY;
        default: return (float)t;
        }
    case KP_TOPK_NAN: return d[1] < (1u << 26) ? bits_to_float(0x7fc00000u) : (float)t;
    default: return (float)t;
    }
}

typedef struct gen_job {
    const kp_topk_case *tc;
    int64_t first, n, block_rows;
    float *scores;
    int32_t *starts, *ends;
    int failed;
    kp_error err;
} gen_job;

/* Rows [first, first + n) from one generator: one seek (slot 0, row-major), then one read a row. */
static int gen_block(const kp_topk_case *tc, int64_t first, int64_t n, float *scores, int32_t *starts, int32_t *ends,
                     kp_error *err) {
    kp_rng rng;
    const int64_t W = tc->width, S = tc->stride;
    uint32_t *draws = kp_calloc((size_t)(4 * W), sizeof *draws, "topk draws", err);
    int rc = draws ? kp_rng_open(&rng, tc->seed, err) : err->code, opened = rc == 0;
    if (!rc) rc = kp_rng_seek(&rng, (uint64_t)first * (uint64_t)(4 * W), err);
    for (int64_t i = 0; !rc && i < n; i++) {
        const int64_t r = first + i;
        float *row = scores + i * S;
        if ((rc = kp_rng_next(&rng, draws, (size_t)(4 * W), err))) break;
        window_of(tc, r, &starts[i], &ends[i]);
        for (int64_t c = 0; c < S; c++)
            row[c] = c >= starts[i] && c < ends[i] ? score(tc, draws + 4 * c) : bits_to_float(KP_TOPK_PAD_BITS);
    }
    if (opened) kp_rng_close(&rng);
    free(draws);
    return rc;
}

static void gen_worker(void *ctx, int64_t b) {
    gen_job *job = ctx;
    const int64_t r0 = b * job->block_rows, n = job->n - r0 < job->block_rows ? job->n - r0 : job->block_rows;
    kp_error err = {0};
    if (gen_block(job->tc, job->first + r0, n, job->scores + r0 * job->tc->stride, job->starts + r0, job->ends + r0, &err) &&
        !__atomic_exchange_n(&job->failed, 1, __ATOMIC_SEQ_CST))
        job->err = err;
}

int kp_topk_case_rows(const kp_topk_case *tc, int64_t first, int64_t n, float *scores, int32_t *starts, int32_t *ends,
                      kp_error *err) {
    if (n <= 0) return 0;
    /* one block of rows per worker: a cuRAND host seek costs milliseconds, so seek as rarely as possible */
    const int64_t threads = kp_thread_count();
    gen_job job = {.tc = tc, .first = first, .n = n, .block_rows = (n + threads - 1) / threads, .scores = scores,
                   .starts = starts, .ends = ends};
    kp_parallel_for((n + job.block_rows - 1) / job.block_rows, gen_worker, &job);
    if (job.failed) {
        *err = job.err;
        return err->code;
    }
    return 0;
}
