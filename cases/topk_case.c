/* topk_case.c: topk fields, their canonical form, windows and the seeded generator for every profile.
 * Built with -ffp-contract=off and no libm transcendental, so inputs are bit-identical anywhere. */
#include "topk_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kp_rng.h"

static const char *const profile_names[] = {"randn", "narrow", "relu", "bf16", "same", "bits", "nan", NULL};
static const char *const window_names[] = {"full", "prefill", "decode", NULL};
static const char *const base_names[] = {"row", "window", NULL};
static const char *const fill_names[] = {"-1", "int32_max", NULL};
static const int64_t fill_codes[] = {-1, INT32_MAX}; /* base stores its index: KP_TOPK_BASE_ROW, _WINDOW */

#define AT(member) KP_FIELD_AT(kp_topk_case, member)
static const kp_case_field fields[] = {
    {"rows", KP_FIELD_INT, AT(rows), .min = 1, .max = 65536, .help = "rows (queries)"},
    {"width", KP_FIELD_INT, AT(width), .min = 1, .max = 1 << 24, .help = "scores a row"},
    {"k", KP_FIELD_INT, AT(k), .min = 1, .max = 8192, .help = "entries selected a row"},
    {"seed", KP_FIELD_UINT, AT(seed), .help = "the generator's seed"},
    {"profile", KP_FIELD_NAME, AT(profile), .names = profile_names, .help = "the scores' shape (topk_case.h)"},
    {"stride", KP_FIELD_INT, AT(stride), .min = 1, .max = (1 << 24) + (1 << 20), .same_as = "width",
     .help = "row stride in elements, width to width + 2^20; the padding holds a NaN sentinel"},
    {"window", KP_FIELD_NAME, AT(window), .names = window_names, .fallback = "full", .help = "each row's window of scores"},
    {"next_n", KP_FIELD_INT, AT(next_n), .min = 1, .max = 1 << 24, .fallback = "1", .when = "window", .when_is = "decode",
     .help = "draft positions a request, up to ctx"},
    {"ctx", KP_FIELD_INT, AT(ctx), .min = 1, .max = 1 << 24, .same_as = "width", .when = "window", .when_is = "decode",
     .help = "a request's context length, up to width"},
    {"base", KP_FIELD_NAME, AT(index_base), .names = base_names, .fallback = "row",
     .help = "what output indices count from"},
    {"fill", KP_FIELD_NAME, AT(fill), .names = fill_names, .codes = fill_codes, .fallback = "-1",
     .help = "the index of an unused entry when a window is shorter than k"},
};
#undef AT

/* Bounds set by width and ctx. */
static int check(void *fields_, kp_error *err) {
    const kp_topk_case *tc = fields_;
    const kp_case_family *f = &kp_topk_case_family;
    int rc = kp_case_field_range(f, "stride", tc->stride, tc->width, tc->width + (1 << 20), err);
    if (!rc && tc->window == KP_TOPK_PREFILL && tc->width < 2)
        rc = kp_fail(err, KP_EXIT_USAGE, "case topk: field 'width': a prefill window starts past 0, so width >= 2");
    if (!rc && tc->window == KP_TOPK_DECODE) rc = kp_case_field_range(f, "ctx", tc->ctx, 1, tc->width, err);
    if (!rc && tc->window == KP_TOPK_DECODE && tc->next_n > tc->ctx)
        rc = kp_fail(err, KP_EXIT_USAGE, "case topk: field 'next_n': %lld draft positions do not fit ctx %lld",
                     (long long)tc->next_n, (long long)tc->ctx);
    return rc;
}

const kp_case_family kp_topk_case_family = {
    .name = "topk",
    .generator_version = KP_TOPK_GENERATOR_VERSION,
    KP_CASE_FIELDS(fields, kp_topk_case),
    .check = check,
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
