/* test_reference_detmath.c: the deterministic math every reference shares: kp_exp_det against libm
 * over the whole double range with pinned bits, and the compensated sum against a naive one. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../reference/kp_detmath.h"
#include "kp_test_util.h"

static int64_t ulp_distance(double a, double b) {
    int64_t ia, ib;
    memcpy(&ia, &a, sizeof a);
    memcpy(&ib, &b, sizeof b);
    return ia > ib ? ia - ib : ib - ia; /* both non-negative here, so bit order is value order */
}

Test(reference_detmath, exp_det_within_two_ulp_of_libm) {
    int64_t worst = 0;
    double worst_x = 0;
    uint64_t seed = 99;
    for (int64_t k = 0; k < 3000000; k++) {
        double x;
        if (k < 1000000) x = -745.0 + 1455.0 * (double)k / 1000000.0; /* the whole finite range */
        else if (k < 2000000) x = -1.0 + 2.0 * kpt_unit(&seed);        /* |r| near the reduction edge */
        else x = -(double)(kpt_splitmix(&seed) % 745) - kpt_unit(&seed);   /* logit gaps, incl. subnormals */
        int64_t d = ulp_distance(kp_exp_det(x), exp(x));
        if (d > worst) {
            worst = d;
            worst_x = x;
        }
    }
    cr_assert(worst <= 2, "kp_exp_det is %lld ulp from libm at x = %a", (long long)worst, worst_x);
    cr_assert(kp_exp_det(0.0) == 1.0 && kp_exp_det(-0.0) == 1.0 && kp_exp_det(-INFINITY) == 0.0);
    cr_assert(kp_exp_det(-746.0) == 0.0 && kp_exp_det(-1e300) == 0.0 && isnan(kp_exp_det(NAN)));
    cr_assert(kp_exp_det(710.0) == INFINITY && kp_exp_det(1e-30) == 1.0);
    cr_assert(kp_exp_det(-745.0) > 0.0 && kp_exp_det(-745.0) < 0x1p-1070, "subnormal results survive");
    /* Pinned bits: fdlibm's scheme lands 1 ulp above e here; a change of scheme must show up. */
    cr_assert(ulp_distance(kp_exp_det(1.0), 0x1.5bf0a8b145769p+1) <= 1);
    cr_assert_eq(kp_exp_det(1.0), 0x1.5bf0a8b14576ap+1);
}

/* 1, then a million copies of 2^-53 (each lost against 1 in a plain sum), then -1: the exact answer
 * is 2^-33; a plain double sum says 0. */
Test(reference_detmath, compensated_sum_keeps_what_a_plain_sum_loses) {
    kp_nsum s = {0, 0};
    double plain = 0;
    const double tiny = 0x1p-53;
    kp_nsum_add(&s, 1.0);
    plain += 1.0;
    for (int i = 0; i < 1 << 20; i++) {
        kp_nsum_add(&s, tiny);
        plain += tiny;
    }
    kp_nsum_add(&s, -1.0);
    plain += -1.0;
    cr_assert_eq(plain, 0.0, "the control: a plain sum drops every small term");
    cr_assert_eq(kp_nsum_value(&s), 0x1p-33, "compensated: %a", kp_nsum_value(&s));
}

static int64_t log_ulps(double a, double b) {
    int64_t ia, ib;
    memcpy(&ia, &a, 8), memcpy(&ib, &b, 8);
    if (ia < 0) ia = INT64_MIN - ia;
    if (ib < 0) ib = INT64_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

static uint64_t log_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Within 2 ulp of libm's log over positive doubles of every exponent (subnormals included), values near 1 (where
 * the result is tiny), and the special values exactly. */
Test(reference_detmath, log_within_two_ulp_of_libm) {
    uint64_t st = 0x6d6c61;
    int64_t worst = 0;
    double at = 0;
    for (int i = 0; i < 400000; i++) {
        uint64_t bits = log_splitmix(&st);
        double x;
        if (i % 4 == 0) bits &= 0x7fffffffffffffffull; /* any positive bit pattern */
        else if (i % 4 == 1) bits = (bits & 0x000fffffffffffffull) | (0x3feull + (bits >> 63)) << 52; /* [0.5, 2) */
        else if (i % 4 == 2) bits = 0x3ff0000000000000ull + ((bits >> 20) - (1ull << 43)); /* 1 +- 2^-9 */
        else bits = (bits & 0x000fffffffffffffull) | ((bits >> 52) % 64 + 1000) << 52; /* around 2^-23 .. 2^40 */
        memcpy(&x, &bits, 8);
        if (!(x > 0) || isinf(x)) continue;
        const int64_t u = log_ulps(kp_log_det(x), log(x));
        if (u > worst) worst = u, at = x;
    }
    const double edge[] = {DBL_MIN, DBL_TRUE_MIN, DBL_MAX, 1.0 + DBL_EPSILON, 1.0 - DBL_EPSILON / 2, 2.0, 0.5, 0x1.6a09e667f3bcdp+0,
                           0x1.6a09e667f3bcdp-1, 0x1.5bf0a8b145769p+1, 10.0, 1e-300, 1e300, 0x1p-1074 * 3};
    for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
        const int64_t u = log_ulps(kp_log_det(edge[i]), log(edge[i]));
        if (u > worst) worst = u, at = edge[i];
    }
    cr_assert(worst <= 2, "kp_log_det is %lld ulp from log at %a", (long long)worst, at);
    cr_assert(kp_log_det(1.0) == 0.0 && !signbit(kp_log_det(1.0)));
    cr_assert(kp_log_det(0.0) == -INFINITY && kp_log_det(-0.0) == -INFINITY);
    cr_assert(isnan(kp_log_det(-1.0)) && isnan(kp_log_det(-INFINITY)) && isnan(kp_log_det(NAN)));
    cr_assert(kp_log_det(INFINITY) == INFINITY);
    for (int k = -1074; k <= 1023; k++) cr_assert(log_ulps(kp_log_det(ldexp(1.0, k)), log(ldexp(1.0, k))) <= 1, "2^%d", k);
}
