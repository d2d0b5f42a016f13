/* kp_detmath.h: deterministic float64 math every reference shares: exp from basic operations only
 * and Neumaier's compensated sum, so reference digests are the same on every IEEE-754 machine. */
#ifndef KP_DETMATH_H
#define KP_DETMATH_H

#include <math.h> /* fabs only */

/* exp(x) with + - * / only, so every machine gets the same bits; within 1 ulp of libm over the whole
 * double range (0 below about -745.13, +inf above about 709.78, subnormal results kept). */
double kp_exp_det(double x);

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
