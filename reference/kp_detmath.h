/* kp_detmath.h: deterministic float64 math every reference shares: exp from basic operations only
 * and Neumaier's compensated sum, so reference digests are the same on every IEEE-754 machine. */
#ifndef KP_DETMATH_H
#define KP_DETMATH_H

#include <math.h> /* fabs only */

/* exp(x) with + - * / only, so every machine gets the same bits; within 1 ulp of libm over the whole
 * double range (0 below about -745.13, +inf above about 709.78, subnormal results kept). */
double kp_exp_det(double x);

/* ln(x) with + - * / only: 2^k m with m in [sqrt(1/2), sqrt(2)), then 2 atanh((m - 1) / (m + 1)) by its series;
 * within 2 ulp of libm (test_reference_detmath); -inf at 0, NaN below 0, +inf at +inf. */
double kp_log_det(double x);

/* Hot float64 loops of the references get an AVX2 clone beside the default one, chosen at run time: with no
 * FMA contraction (reference/ builds with -ffp-contract=off) and the same per-lane order, both give the
 * same bits. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define KP_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef KP_CLONES
#define KP_CLONES
#endif

/* Neumaier's compensated sum: the running value s + c is what every mass and sum reports.
 * Inline: the references add every token through it. */
typedef struct kp_nsum {
    double s, c;
} kp_nsum;

static inline void kp_nsum_add(kp_nsum *a, double x) {
    double t = a->s + x;
    if (fabs(a->s) >= fabs(x))
        a->c += (a->s - t) + x;
    else
        a->c += (x - t) + a->s;
    a->s = t;
}

static inline double kp_nsum_value(const kp_nsum *a) { return a->s + a->c; }

#endif
