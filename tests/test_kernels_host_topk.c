/* test_kernels_host_topk.c: the topk host ports against the reference, and their shared pieces
 * (kernels/topk_radix.h): the order key, fp16 bits against the compiler's own conversion, the coarse
 * bin. radix_exact must give the reference's answer on every profile and convention, in any batch;
 * radix_buffer must show each defect it models, and only where it models it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cases/topk_case.h"
#include "../kernels/kp_registry.h"
#include "../kernels/topk_radix.h"
#include "../reference/topk_ref.h"
#include "kp_test_util.h"

/* The oracle: the compiler's own float -> binary16 conversion, _Float16, where it has one (GCC 12, clang 15 on
 * x86-64); else (clang 14 on x86-64: no _Float16, and its __fp16 calls a compiler-rt routine libgcc lacks) the CPU's,
 * F16C's vcvtps2ph rounding to nearest even (every x86-64 since 2012; without it the test is skipped, saying so). */
#if defined(__FLT16_MAX__)
static int oracle_available(void) { return 1; }
static uint16_t oracle_half_bits(float f) {
    const _Float16 h = (_Float16)f;
    uint16_t bits;
    memcpy(&bits, &h, sizeof bits);
    return bits;
}
#elif defined(__clang__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
static int oracle_available(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
__attribute__((target("f16c"))) static uint16_t oracle_half_bits(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#else
#error "no float -> binary16 oracle (_Float16, or F16C under clang). Hint: GCC 12 or clang 15"
#endif

Test(kernels_host_topk, fp16_bits_match_the_compilers_conversion_everywhere) {
    if (!oracle_available()) cr_skip_test("clang without _Float16 and a CPU without F16C: no oracle for fp16 bits");
    uint64_t seed = 5, bad = 0;
    for (uint64_t n = 0; n < 4000000; n++) {
        uint32_t b = n < (1u << 20) ? (uint32_t)(n << 12) : (uint32_t)kpt_splitmix(&seed); /* a sweep, then random bits */
        float f;
        memcpy(&f, &b, sizeof f);
        const uint16_t want = oracle_half_bits(f);
        const uint16_t got = kp_topk_f16_bits(f);
        if (isnan(f) ? (got & 0x7c00u) != 0x7c00u || !(got & 0x3ffu) : got != want) bad++;
    }
    cr_assert_eq(bad, 0, "%llu conversions differ from the compiler's", (unsigned long long)bad);
}

Test(kernels_host_topk, the_key_orders_like_the_rule_and_narrow_scores_share_one_coarse_bin) {
    const float order[] = {INFINITY, 3.0f, 1.0f, 0x1p-140f, 0.0f, -0x1p-140f, -2.0f, -INFINITY, NAN};
    for (size_t i = 0; i + 1 < sizeof order / sizeof *order; i++)
        cr_assert(kp_topk_key(order[i]) > kp_topk_key(order[i + 1]), "position %zu", i);
    cr_assert_eq(kp_topk_key(-0.0f), kp_topk_key(0.0f), "-0 and +0 are one value");
    cr_assert_eq(kp_topk_coarse_bin(1.0f), kp_topk_coarse_bin(1.2449999f));
    cr_assert_neq(kp_topk_coarse_bin(1.0f), kp_topk_coarse_bin(1.25f));
}

/* Run an impl on a case's rows, as the harness would; returns indices and values (malloc'd). */
static void run_case(const kp_impl *impl, const kp_topk_case *tc, int64_t rows, const float *x, const int32_t *s,
                     const int32_t *e, int32_t **idx, float **val) {
    *idx = malloc(sizeof **idx * (size_t)(rows * tc->k));
    *val = malloc(sizeof **val * (size_t)(rows * tc->k));
    kp_topk_args a = {.scores = x, .starts = s, .ends = e, .indices = *idx, .values = *val, .rows = rows,
                      .width = tc->width, .row_stride = tc->stride, .k = tc->k, .index_base = tc->index_base, .fill = tc->fill};
    char msg[256] = "";
    cr_assert_eq(impl->run(&a, msg, sizeof msg), KP_RUN_OK, "%s: %s", impl->name, msg);
}

static kp_topk_case make(const char *name, float **x, int32_t **s, int32_t **e) {
    kp_case c;
    kp_topk_case tc;
    kp_error err = {0};
    cr_assert_eq(kp_case_parse(name, &c, &err) || kp_case_normalize(&c, &err) || kp_topk_case_read(&c, &tc, &err), 0, "%s", err.msg);
    *x = malloc(sizeof **x * (size_t)(tc.rows * tc.stride));
    *s = malloc(sizeof **s * (size_t)tc.rows), *e = malloc(sizeof **e * (size_t)tc.rows);
    cr_assert_eq(kp_topk_case_rows(&tc, 0, tc.rows, *x, *s, *e, &err), 0, "%s", err.msg);
    return tc;
}

/* rows meeting the rule under (ties, order), and rows with dropped candidates */
static int64_t judged(const kp_topk_case *tc, const float *x, const int32_t *s, const int32_t *e, const int32_t *idx,
                      const float *val, kp_topk_ties ties, kp_topk_order order, int64_t *dropped_rows) {
    kp_topk_ref ref;
    kp_topk_judgement j;
    kp_error err = {0};
    cr_assert_eq(kp_topk_reference(x, tc->rows, tc->width, tc->stride, s, e, tc->k, tc->index_base, tc->fill,
                                   KP_TOPK_NAN_BELOW, &ref, &err), 0);
    cr_assert_eq(kp_topk_judge(&ref, x, tc->stride, idx, val, ties, order, &j, &err), 0);
    const int64_t ok = j.rows_rule_ok;
    if (dropped_rows) {
        *dropped_rows = 0;
        for (int64_t r = 0; r < j.rows; r++) *dropped_rows += j.row[r].dropped > 0;
    }
    kp_topk_judgement_free(&j);
    kp_topk_ref_free(&ref);
    return ok;
}

Test(kernels_host_topk, radix_exact_meets_the_rule_on_every_profile_and_convention, .timeout = 120) {
    const char *cases[] = {
        "topk(k=512,profile=randn,rows=5,seed=1,width=3000)",
        "topk(k=512,profile=relu,rows=5,seed=1,width=20000)",
        "topk(k=1024,profile=bf16,rows=5,seed=2,width=20000)",
        "topk(k=512,profile=same,rows=3,seed=3,width=2000)",
        "topk(k=512,profile=bits,rows=5,seed=4,width=3000,window=prefill)",
        "topk(base=window,k=512,profile=nan,rows=5,seed=5,width=3000,window=prefill)",
        "topk(ctx=700,fill=int32_max,k=1024,next_n=3,profile=randn,rows=6,seed=6,width=3000,window=decode)",
        "topk(base=window,ctx=100,k=2048,profile=narrow,rows=4,seed=7,width=3000,window=decode)",
        "topk(k=2048,profile=narrow,rows=33,seed=1,width=16385)",
    };
    const kp_impl *exact = kp_impl_find("topk.radix_exact@host");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        float *x;
        int32_t *s, *e, *idx;
        float *val;
        kp_topk_case tc = make(cases[i], &x, &s, &e);
        run_case(exact, &tc, tc.rows, x, s, e, &idx, &val);
        cr_assert_eq(judged(&tc, x, s, e, idx, val, KP_TOPK_TIES_LOWEST_INDEX, KP_TOPK_ORDER_INDEX, NULL), tc.rows, "%s", cases[i]);
        free(x), free(s), free(e), free(idx), free(val);
    }
}

Test(kernels_host_topk, radix_buffer_drops_candidates_only_past_its_buffer_and_only_above_32_rows, .timeout = 120) {
    const kp_impl *buffer = kp_impl_find("topk.radix_buffer@host");
    struct {
        const char *name;
        int drops;
    } cases[] = {
        {"topk(k=2048,profile=narrow,rows=33,seed=1,width=16384)", 0},  /* the buffer holds the whole bin */
        {"topk(k=2048,profile=narrow,rows=33,seed=1,width=16512)", 1},  /* 128 past it: rows lose candidates */
        {"topk(k=2048,profile=narrow,rows=32,seed=1,width=16512)", 0},  /* 32 rows: the exact path */
        {"topk(k=2048,profile=randn,rows=33,seed=1,width=65536)", 0},   /* spread scores: no bin overflows */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        float *x;
        int32_t *s, *e, *idx;
        float *val;
        int64_t dropped;
        kp_topk_case tc = make(cases[i].name, &x, &s, &e);
        run_case(buffer, &tc, tc.rows, x, s, e, &idx, &val);
        const int64_t ok = judged(&tc, x, s, e, idx, val, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY, &dropped);
        if (cases[i].drops) cr_assert(dropped > 0 && ok < tc.rows, "%s: %lld rows dropped", cases[i].name, (long long)dropped);
        else cr_assert(dropped == 0 && ok == tc.rows, "%s: %lld rows dropped", cases[i].name, (long long)dropped);
        free(x), free(s), free(e), free(idx), free(val);
    }
}

Test(kernels_host_topk, radix_buffer_takes_ties_in_a_new_arrival_order_each_call_and_radix_exact_never_varies) {
    float *x;
    int32_t *s, *e;
    kp_topk_case tc = make("topk(k=512,profile=relu,rows=4,seed=9,width=8000)", &x, &s, &e);
    for (int which = 0; which < 2; which++) {
        const kp_impl *impl = kp_impl_find(which ? "topk.radix_exact@host" : "topk.radix_buffer@host");
        int32_t *a, *b;
        float *va, *vb;
        run_case(impl, &tc, tc.rows, x, s, e, &a, &va);
        run_case(impl, &tc, tc.rows, x, s, e, &b, &vb);
        const int same = !memcmp(a, b, sizeof *a * (size_t)(tc.rows * tc.k));
        if (which) cr_assert(same, "radix_exact varied between calls");
        else cr_assert(!same, "radix_buffer gave the same order twice on a +0 plateau");
        /* either way every row meets the rule when any tie member and any order will do */
        cr_assert_eq(judged(&tc, x, s, e, b, vb, KP_TOPK_TIES_ANY, KP_TOPK_ORDER_ANY, NULL), tc.rows, "%s", impl->name);
        free(a), free(b), free(va), free(vb);
    }
    free(x), free(s), free(e);
}

/* Whether a row's k outputs agree bit for bit, indices and values both (the values are an output of their own: a
 * kernel could gather the right index and write a wrong value). */
static bool same_row_bits(const int32_t *idx_a, const float *val_a, const int32_t *idx_b, const float *val_b, int32_t k) {
    return !memcmp(idx_a, idx_b, sizeof *idx_a * (size_t)k) && !memcmp(val_a, val_b, sizeof *val_a * (size_t)k);
}

Test(kernels_host_topk, a_row_gives_the_same_bits_in_any_batch_for_radix_exact) {
    float *x;
    int32_t *s, *e;
    kp_topk_case tc = make("topk(k=1024,profile=bf16,rows=40,seed=3,width=9000,window=prefill)", &x, &s, &e);
    const kp_impl *exact = kp_impl_find("topk.radix_exact@host");
    int32_t *all, *one;
    float *vall, *vone;
    run_case(exact, &tc, tc.rows, x, s, e, &all, &vall);
    for (int64_t r = 0; r < tc.rows; r += 13) {
        run_case(exact, &tc, 1, x + r * tc.stride, s + r, e + r, &one, &vone);
        cr_assert(same_row_bits(one, vone, all + r * tc.k, vall + r * tc.k, tc.k), "row %lld alone", (long long)r);
        /* positive controls: one value's last bit, or one index, changed in the row alone must be seen */
        vone[tc.k / 2] = nextafterf(vone[tc.k / 2], INFINITY);
        cr_assert(!same_row_bits(one, vone, all + r * tc.k, vall + r * tc.k, tc.k), "row %lld: a planted value passed",
                  (long long)r);
        vone[tc.k / 2] = vall[r * tc.k + tc.k / 2];
        one[1] ^= 1;
        cr_assert(!same_row_bits(one, vone, all + r * tc.k, vall + r * tc.k, tc.k), "row %lld: a planted index passed",
                  (long long)r);
        free(one), free(vone);
    }
    free(all), free(vall), free(x), free(s), free(e);
}
